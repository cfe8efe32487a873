"""`heapsight lab arenas`: threaded workers, glibc's per-thread arenas and malloc_trim."""

import json
import os
import subprocess
import sys

import pytest

from heapsight.allocators import PRESET
from heapsight.lab import arenas, common
from heapsight.lab.common import DEPENDS, FAILS, HOLDS
from heapsight.reporters import terminal

MIB = 1024 * 1024
CAP = 8 * (os.cpu_count() or 1)


def arenas_run(config="glibc", **opts):
    """One hs-lab-arenas process, short rounds; returns its summary line."""
    argv = [common.lab_program(arenas.PROGRAM), "--rounds", "2", "--hold-ms", "20"]
    for k, v in opts.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    lines = common.run_program(argv, PRESET[config], timeout_s=120)
    (summary,) = [x for x in lines if x.get("event") == "summary"]
    summary["arena_lines"] = [x for x in lines if x.get("event") == "arena"]
    return summary


@pytest.fixture(scope="module")
def four_30():
    return arenas_run(w30=4)


@pytest.fixture(scope="module")
def cli_doc():
    p = subprocess.run([sys.executable, "-m", "heapsight", "lab", "arenas", "--quick", "--no-save",
                        "--configs", "glibc", "--json", "-"],
                       capture_output=True, text=True, timeout=300)
    return p, (json.loads(p.stdout) if p.stdout.strip().startswith("{") else None)


def kept(s):
    return s["rss_after"] - s["rss_base"]


def test_arena_count_never_exceeds_8_per_core():
    # GIVEN more workers than 8 x cores, all alive at once (1 MiB blocks keep memory small)
    s = arenas_run(w30=CAP + 8, mb_a=1)
    # THEN glibc made exactly 8 x cores arenas (the main one included), no more
    assert s["threads"] == CAP + 8
    assert s["arenas"] == CAP
    assert len([x for x in s["arena_lines"] if x["phase"] == "after_workers"]) == CAP


def test_each_30_mib_worker_gets_an_arena_that_keeps_its_block(four_30):
    # GIVEN four 30 MiB workers that freed everything and ended
    # THEN there are 4 thread arenas + the main one, and more than 60 MiB stayed resident
    assert four_30["arenas"] == 5
    assert kept(four_30) > 60_000_000
    assert four_30["arena_largest"] >= 30 * MIB


def test_100_mib_workers_leave_almost_nothing():
    # GIVEN four 100 MiB workers (above the 32 MiB cap of glibc's dynamic mmap threshold)
    s = arenas_run(w100=4)
    # THEN their blocks were munmapped at free: under 30 MiB stays, though blocks were resident
    assert s["rss_peak"] > 100 * MIB * 0.9
    assert kept(s) < 30_000_000


def test_malloc_trim_leaves_the_top_of_thread_heaps(four_30):
    # GIVEN the four 30 MiB blocks were freed into the tops of their thread heaps
    # WHEN malloc_trim(0) ran
    # THEN it gave back less than half of them (it shrinks only the main arena's top)
    assert four_30["released"] == 1
    assert four_30["rss_after"] - four_30["rss_release"] < 0.5 * kept(four_30)


def test_malloc_trim_gives_back_free_chunks_below_live_blocks():
    # GIVEN each worker left a 1 KiB block above its freed 30 MiB one
    s = arenas_run(w30=4, pin_kb=1)
    assert kept(s) > 4 * 30 * MIB * 0.8
    # WHEN malloc_trim(0) ran
    # THEN more than half of the thread arenas' memory went back (madvise of free chunks)
    assert s["rss_after"] - s["rss_release"] > 0.5 * kept(s)


def test_arena_max_1_gives_one_arena():
    # GIVEN four workers under glibc.malloc.arena_max=1
    s = arenas_run("glibc-arena1", w30=4)
    # THEN they all used the main arena
    assert s["arenas"] == 1


def test_bad_arguments_exit_2():
    # GIVEN no workers at all
    p = subprocess.run([common.lab_program(arenas.PROGRAM), "--w30", "0"], capture_output=True,
                       text=True, timeout=10)
    # THEN a message and exit code 2, nothing on stdout
    assert p.returncode == 2 and "--w30" in p.stderr and p.stdout == ""


def test_cli_quick_prints_the_claims(cli_doc):
    # GIVEN the quick experiment under glibc only
    p, doc = cli_doc
    # THEN it exits 0 and prints every claim with a verdict
    assert p.returncode == 0, p.stderr
    (exp,) = doc["experiments"]
    assert len(exp["claims"]) == 5
    assert "claims:" in p.stderr
    flat = " ".join(p.stderr.split())   # (a claim wraps to the terminal's width)
    for c in exp["claims"]:
        assert c["verdict"] in (HOLDS, FAILS, DEPENDS) and c["evidence"]
        assert f"\"{c['text']}\"" in flat
    # and on this glibc the trim claim depends on where the freed memory lies
    trim = next(c for c in exp["claims"] if "malloc_trim" in c["text"])
    assert trim["verdict"] == DEPENDS and "live block" in trim["depends_on"]


def test_tables_claims_charts_survive_missing_runs(cli_doc):
    # GIVEN saved data with one case gone and an allocator that never ran
    _, doc = cli_doc
    data = json.loads(json.dumps(doc["experiments"][0]["data"]))
    data["configs"][0]["runs"].pop("4x100")
    data["configs"].append({"name": "jemalloc", "allocator": "jemalloc", "env": {},
                            "arena_max": 0, "errors": ["library missing"], "runs": {}})
    # WHEN it is re-read
    tables = arenas.tables(data)
    claims = arenas.claims(data)
    charts = arenas.charts(data)
    # THEN the gaps show as n/a and errors, and the pairs that remain still give verdicts
    text = "\n".join(terminal.render_table(t.to_dict()) for t in tables)
    assert "n/a" in text and "library missing" in text
    hundred = next(c for c in claims if "100 MB" in c.text)
    assert "4x100" not in hundred.evidence and "1x100" in hundred.evidence
    assert {c["id"] for c in charts} == {"arenas-retained", "arenas-trim", "arenas-count"}
