"""`heapsight lab remedies`: the settings a remedy rule may suggest, measured on this machine.

The claims are heapsight's own rules ("for this pattern, this setting lowers the memory;
these do not"): each must hold here, on real allocators. When one does not, its evidence
(the figures measured) is the assertion's message."""

import json
import subprocess
import sys

import pytest

from heapsight.allocators import PRESET, Config
from heapsight.lab import common, remedies
from heapsight.lab.common import DEPENDS, HOLDS, Context


@pytest.fixture(scope="module")
def quick():
    p = subprocess.run([sys.executable, "-m", "heapsight", "lab", "remedies", "--quick",
                        "--no-save", "--json", "-"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    (exp,) = json.loads(p.stdout)["experiments"]
    return exp


def test_every_rule_the_remedies_state_holds_here(quick):
    # GIVEN both patterns run quick under every setting, bare, one process per run
    claims = {c["text"]: c for c in quick["claims"]}
    # THEN each claim, by its stable id, is there and holds, with its figures as evidence
    assert list(claims) == list(remedies.CLAIM_IDS.values())
    for cid, text in remedies.CLAIM_IDS.items():
        assert claims[text]["verdict"] == HOLDS, f"{cid}: {claims[text]['evidence']}"


def test_every_row_ran_under_the_allocator_it_asked_for(quick):
    data = quick["data"]
    # THEN every row of both patterns ran once (--quick), without error, and did the work
    want = ([remedies.row_id("threads", n, t) for n, t in remedies.THREADS_ROWS]
            + [remedies.row_id("pymalloc", n, t) for n, t in remedies.PYMALLOC_ROWS])
    assert [e["name"] for e in data["configs"]] == want
    for e in data["configs"]:
        assert not e["errors"] and len(e["runs"]) == 1, e
        (r,) = e["runs"]
        assert r["allocator"] == e["allocator"] and r["trim"] == int(e["trim"])
        if e["pattern"] == "threads":
            assert r["kept_blocks"] == 8 * 6 * (60_000 // 500)
        else:
            assert r["kept_objects"] == 480_000 // 200
            assert r["pythonmalloc"] == e["env"].get("PYTHONMALLOC", "")
    # and a table per pattern with a row per setting, a chart per pattern
    assert [len(t["rows"]) for t in quick["tables"]] == [6, 4]
    assert [c["id"] for c in quick["charts"]] == ["remedies-threads", "remedies-pymalloc"]


def test_a_missing_allocator_library_is_a_row_with_its_error():
    # GIVEN --configs with glibc and a jemalloc build whose library is not there
    mine = Config("mine", "jemalloc", {"MALLOC_CONF": "dirty_decay_ms:0"}, "user-defined",
                  library="/nonexistent/libjemalloc.so.2")
    ctx = Context(quick=True, configs=[PRESET["glibc"], mine])
    # WHEN the experiment runs
    data = remedies.collect(ctx)
    # THEN the glibc rows ran (with malloc_trim(0) on glibc for the threads), the missing
    # library is an error row in each pattern, and nothing else ran
    by_name = {e["name"]: e for e in data["configs"]}
    assert list(by_name) == ["threads/glibc", "threads/mine", "threads/glibc+trim",
                             "pymalloc/glibc", "pymalloc/mine"]
    for name in ("threads/mine", "pymalloc/mine"):
        assert not by_name[name]["runs"]
        assert "/nonexistent/libjemalloc.so.2 is missing" in by_name[name]["errors"][0]
    assert by_name["threads/glibc+trim"]["runs"] and by_name["pymalloc/glibc"]["runs"]
    # and its row in the table says why; the claims whose rows did not run depend on them
    (threads, _) = remedies.tables(data)
    (row,) = [r for r in threads.rows if r[0] == "mine"]
    assert row[1].startswith("error: jemalloc library /nonexistent/libjemalloc.so.2 is missing")
    verdicts = {cid: remedies.claim_by_id(data, cid) for cid in remedies.CLAIM_IDS}
    assert verdicts["threads-malloc-trim"].verdict == HOLDS
    for cid in ("threads-jemalloc-eager", "threads-glibc-tunables", "pymalloc-jemalloc-eager",
                "pymalloc-python-malloc", "pymalloc-malloc-trim"):
        assert verdicts[cid].verdict == DEPENDS and verdicts[cid].depends_on, cid


def test_the_programs_report_what_they_measured():
    # GIVEN the threads program with malloc_trim(0), small
    out = common.run_program([common.lab_program(remedies.THREADS_PROGRAM), "--threads", "2",
                              "--waves", "2", "--per-wave", "20000", "--trim", "1"],
                             PRESET["glibc"], timeout_s=60)
    (r,) = out
    # THEN it kept 1 block in 500, and the trim gave back most of what the waves left
    assert r["kept_blocks"] == 2 * 2 * 40
    assert r["rss_after"] - r["rss_trim"] > 0.5 * (r["rss_after"] - r["rss_start"]) > 0
    # and a bad option is refused with exit 2
    p = subprocess.run([common.lab_program(remedies.THREADS_PROGRAM), "--threads", "x"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "bad value" in p.stderr
