"""`heapsight compare`: the matrix of allocators and tunables on one program."""

import json
import subprocess
import sys

from conftest import scenario


def compare(*args, timeout=600):
    p = subprocess.run([sys.executable, "-m", "heapsight", "compare", "--no-save", "--json", "-",
                        *args], capture_output=True, text=True, timeout=timeout)
    doc = json.loads(p.stdout) if p.stdout.strip().startswith("{") else None
    return p, doc


def rows(doc):
    return {r["name"]: r for r in doc["configs"]}


def final(row):
    return row["stats"]["final_rss"]["median"]


def test_retention_scenario_orders_allocators_as_the_field_notes_say():
    # GIVEN the retention scenario (128 MiB allocated, 63 of 64 blocks freed)
    p, doc = compare("--repeat", "1", "--configs", "glibc,jemalloc-eager,tcmalloc,mmap", "--",
                     scenario("hs-retention"), "--mb", "128")
    assert p.returncode == 0, p.stderr
    r = rows(doc)
    assert all(x["ok"] for x in r.values()), [x["error"] for x in r.values()]
    # THEN eager jemalloc and the mmap baseline end far below glibc's default,
    assert final(r["jemalloc-eager"]) < 0.5 * final(r["glibc"])
    assert final(r["mmap"]) < 0.5 * final(r["glibc"])
    # tcmalloc's default keeps its page heap,
    assert final(r["tcmalloc"]) > 0.8 * final(r["glibc"])
    # each row is the allocator it asked for, and the recommendation names a better one
    assert doc["recommendation"].split(":")[0] in ("jemalloc-eager", "mmap")
    # ranked by the moment glibc's run's verdict is about (retention: its end), said so
    assert doc["rank_by"] == "end" and "end RSS*" in p.stderr and "ranked by* end RSS" in p.stderr
    assert "recommendation:" in p.stderr


def test_ignored_preload_is_an_error_row_not_a_number():
    p, doc = compare("--repeat", "1", "--configs", "glibc,jemalloc", "--", scenario("hs-static"))
    r = rows(doc)
    for name in ("glibc", "jemalloc"):
        assert not r[name]["ok"] and "preload was ignored" in r[name]["error"]
        assert "stats" not in r[name]
    assert "glibc: the preload was ignored" in p.stderr
    assert p.returncode == 1  # nothing could be compared


def test_missing_allocator_library_names_the_fix_and_the_rest_runs():
    p, doc = compare("--repeat", "1", "--configs", "glibc",
                     "--config", "mine:/nonexistent/libjemalloc.so.2:MALLOC_CONF=narenas:2",
                     "--", scenario("hs-leak"), "--mb", "5")
    # a row that errors makes the exit code 1 (for CI), and the others still ran
    assert p.returncode == 1, p.stderr
    assert "1 configuration(s) failed: mine" in p.stderr
    r = rows(doc)
    assert r["glibc"]["ok"] and not r["mine"]["ok"]
    assert "missing" in r["mine"]["error"]
    assert r["mine"]["env"] == {"MALLOC_CONF": "narenas:2"}


def test_a_real_program_nobody_here_wrote():
    p, doc = compare("--repeat", "1", "--configs", "glibc,jemalloc-eager", "--",
                     "perl", "-e", "my %h; $h{$_} = 'x' x 200 for 1..300000; undef %h; sleep 0;")
    assert p.returncode == 0, p.stderr
    r = rows(doc)
    assert r["glibc"]["ok"] and r["jemalloc-eager"]["ok"], p.stderr
    assert r["glibc"]["stats"]["peak_rss"]["median"] > 50 * 1024 * 1024


def test_bad_config_is_refused():
    p = subprocess.run([sys.executable, "-m", "heapsight", "compare", "--config", "nocolon",
                        "--", "true"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "expected NAME:ALLOC" in p.stderr


def test_csv_has_one_row_per_configuration_in_base_units(tmp_path):
    out = tmp_path / "cmp.csv"
    p, _ = compare("--repeat", "2", "--configs", "glibc,glibc-arena2", "--csv", str(out), "--",
                   scenario("hs-leak"), "--mb", "5")
    assert p.returncode == 0, p.stderr
    import csv
    table = list(csv.DictReader(out.open()))
    assert [r["configuration"] for r in table] == ["glibc", "glibc-arena2"]
    for r in table:
        assert r["ok"] == "1" and r["runs"] == "2"
        assert float(r["final_rss_min"]) <= float(r["final_rss_median"]) <= float(r["final_rss_max"])
        assert float(r["peak_rss_median"]) > 5 * 1024 * 1024   # bytes, not MiB


def test_cpython_gets_its_own_presets_and_others_are_refused_them():
    # GIVEN a CPython program that holds pymalloc arenas, under the default matrix
    p, doc = compare("--repeat", "1", "--", "/usr/bin/python3", "-c",
                     "l = [{'a': i} for i in range(200000)]\nkeep = l[::500]\ndel l\n")
    assert p.returncode == 0, p.stderr
    r = rows(doc)
    # THEN the CPython presets ran too, with their environment
    assert r["python-malloc"]["ok"] and r["python-malloc"]["env"] == {"PYTHONMALLOC": "malloc"}
    assert r["python-malloc-jemalloc-eager"]["ok"]
    # and with malloc answering for Python's objects, the allocator keeps what pymalloc held
    assert r["python-malloc"]["stats"]["retained"]["median"] > 10 * 1024 * 1024
    # WHEN a CPython preset is asked for another program THEN it is refused before any run
    p2 = subprocess.run([sys.executable, "-m", "heapsight", "compare", "--configs",
                         "glibc,python-malloc", "--", "true"], capture_output=True, text=True,
                        timeout=60)
    assert p2.returncode == 2 and "made for CPython programs" in p2.stderr
