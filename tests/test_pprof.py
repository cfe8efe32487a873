"""pprof heap profiles of a run's sampled call sites (reporters/pprof.py), read back by the
real tool: `go tool pprof`."""

import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict

import pytest

from conftest import scenario

HS = [sys.executable, "-m", "heapsight"]
UNITS = {"B": 1, "kB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3}


def go() -> str:
    path = shutil.which("go") or ("/usr/local/go/bin/go" if shutil.which("/usr/local/go/bin/go") else None)
    if path is None:
        pytest.fail("go is missing: `make test` installs golang-go (scripts/install-deps)")
    return path


def pprof_top(path, *opts) -> dict:
    """`go tool pprof -top`: flat bytes per function."""
    r = subprocess.run([go(), "tool", "pprof", "-top", *opts, str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s*([\d.]+)(B|kB|MB|GB)\s+[\d.]+%\s+[\d.]+%\s+[\d.]+(?:B|kB|MB|GB)?\s+[\d.]+%\s+(.+)$", line)
        if m and float(m.group(1)) > 0:
            out[m.group(3).strip()] = float(m.group(1)) * UNITS[m.group(2)]
    return out


def by_function(summary, moment) -> dict:
    sites = summary["sites"]
    m = next(x for x in sites["moments"] if x["name"] == moment)
    out = defaultdict(int)
    for s in m["sites"]:
        out[s["site"].split(" (")[0]] += s["bytes"]
    return dict(out)


@pytest.fixture(scope="module")
def sites_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pprof")
    rec, js, pb = tmp / "r.hsrun.json.gz", tmp / "s.json", tmp / "p.pb.gz"
    r = subprocess.run([*HS, "run", "-q", "-o", str(rec), "--json", str(js), "--pprof", str(pb),
                        "--sample-bytes", "8K", "--", scenario("hs-sites")], capture_output=True,
                       text=True, timeout=120, cwd=tmp)
    assert r.returncode == 0, r.stderr
    return json.loads(js.read_text()), rec, pb, tmp


def test_go_tool_pprof_reads_the_same_top_functions(sites_run):
    s, _, pb, _ = sites_run
    # THEN pprof's flat column is heapsight's call sites at the peak, within its rounding
    ours, theirs = by_function(s, "peak"), pprof_top(pb)
    top = sorted(ours, key=ours.get, reverse=True)[:3]
    assert {"load_rows", "build_index", "keep_cache"} <= set(top) | set(ours), ours
    for fn in top:
        assert theirs.get(fn) == pytest.approx(ours[fn], rel=0.002, abs=600), (fn, ours, theirs)
    # the other sample types: what was allocated over the run, at least what was live
    alloc = pprof_top(pb, "-sample_index=alloc_space")
    assert sum(alloc.values()) >= sum(theirs.values())
    # and its mappings name the objects
    raw = subprocess.run([go(), "tool", "pprof", "-raw", str(pb)], capture_output=True,
                         text=True, timeout=120)
    assert raw.returncode == 0 and "hs-sites" in raw.stdout and "Mappings" in raw.stdout


def test_report_writes_the_same_profile_from_the_saved_record(sites_run):
    _, rec, pb, tmp = sites_run
    again = tmp / "again.pb.gz"
    r = subprocess.run([*HS, "report", "--pprof", str(again), str(rec)], capture_output=True,
                       text=True, timeout=120, cwd=tmp)
    assert r.returncode == 0, r.stderr
    assert again.read_bytes() == pb.read_bytes()
    assert not (tmp / "heapsight-report.html").exists()   # --pprof alone writes no page


def test_a_moment_that_is_not_there_is_refused_by_name(sites_run):
    _, rec, _, tmp = sites_run
    r = subprocess.run([*HS, "report", "--pprof", str(tmp / "x.pb.gz"), "--pprof-at", "lunch",
                        str(rec)], capture_output=True, text=True, timeout=120, cwd=tmp)
    assert r.returncode == 2 and "--pprof-at lunch: no such moment" in r.stderr
    assert "peak" in r.stderr and not (tmp / "x.pb.gz").exists()


def test_pprof_without_sampling_is_refused_before_the_run(tmp_path):
    r = subprocess.run([*HS, "run", "--no-save", "--pprof", str(tmp_path / "p.pb.gz"),
                        "--sample-bytes", "0", "--", "true"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--sample-bytes 0" in r.stderr
    assert not (tmp_path / "p.pb.gz").exists()


def test_the_header_states_the_sampling_scheme_of_an_adaptive_run(tmp_path):
    # an adaptive run (the default: finer at first) said "one per 524288 bytes on average";
    # the mean coarsens with the live sampled blocks, so a run may stop short of 524288
    from heapsight.reporters import pprof
    import gzip as gz
    for low, high, want in (
            (16384, None, b"adaptive: from one per 16384 to one per 524288 bytes on average, "
                          b"coarsening with the live sampled blocks"),
            (16384, 65536, b"adaptive: from one per 16384 to one per 65536 bytes on average, "
                           b"coarsening with the live sampled blocks"),
            (16384, 16384, b"adaptive: one per 16384 bytes on average (the mean coarsens with "
                           b"the live sampled blocks, up to 524288: not in this run)"),
            (524288, 524288, b"one per 524288 bytes on average")):
        summary = {"duration_s": 1.0, "sites": {
            "sample_bytes": 524288, "sample_bytes_min": low, "frames": [], "stacks": [],
            "moments": [{"name": "peak", "t_s": 0.5, "samples": 10, "sites": [],
                         "live_bytes": 0, "blocks": []}]}}
        if high is not None:
            summary["sites"]["sample_bytes_max"] = high
        try:
            data = pprof.encode(summary, "peak")
        except Exception as e:   # the test's summary is minimal: it must hold what encode reads
            pytest.fail(f"encode failed on a minimal summary: {e!r}")
        raw = data if not data[:2] == b"\x1f\x8b" else gz.decompress(data)
        assert want in raw, (low, high)
        assert b"adaptive" not in raw or low < 524288


def test_perls_main_is_not_merged_with_cs_main(tmp_path):
    script, out = tmp_path / "m.pl", tmp_path / "m.pprof"
    script.write_text('my @a; push @a, "x" x 100 for 1..200000; print scalar(@a), "\\n";\n')
    r = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "--no-save", "--pprof",
                        str(out), "--", "perl", str(script)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    top = pprof_top(out, "-sample_index=alloc_space")
    # THEN the script's own main holds the bytes, under a name of its own; C's main none
    assert top.get("main (m.pl)", 0) > 0.9 * sum(top.values()), top
    assert top.get("main", 0) == 0, top
