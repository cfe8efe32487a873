"""`heapsight lab waste`: the internal-fragmentation table, measured by hs-lab-waste in a
fresh child per case, and the claims computed from it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import scenario
from heapsight.allocators import PRESET, Config
from heapsight.errors import HeapsightError
from heapsight.lab import common, waste

KB = 1024
MB = 1024 * 1024
SMALL_FIXED = (1, 2, 8, 24, 25, 1024, 2048)
SMALL_RANDOM = (32, 2048)
JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")


def run_waste(config: str, *args) -> list:
    """hs-lab-waste under a compare preset; the JSON lines it printed."""
    return common.run_program([scenario("hs-lab-waste"), *map(str, args)], PRESET[config],
                              timeout_s=120)


def cases(lines: list) -> dict:
    """(mode, param) -> case, from one run with a single target."""
    return {(c["mode"], c["param"]): c for c in lines if c.get("kind") == "case"}


@pytest.fixture(scope="module")
def glibc_small():
    # 1 MiB of each of a few fixed sizes and two random ranges, glibc's default malloc
    lines = run_waste("glibc", "--target-kb", 1024, "--fixed", ",".join(map(str, SMALL_FIXED)),
                      "--random-max", ",".join(map(str, SMALL_RANDOM)))
    return lines[0], cases(lines)


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """`heapsight lab waste --quick --configs glibc` in an empty folder: the experiment's own
    quick collection (1 MiB, every size) for glibc only, from the command line."""
    cwd = tmp_path_factory.mktemp("waste-cli")
    p = subprocess.run([sys.executable, "-m", "heapsight", "lab", "waste", "--quick",
                        "--no-save", "--configs", "glibc", "--json", "-"],
                       capture_output=True, text=True, cwd=cwd, timeout=300)
    return p, cwd


@pytest.fixture(scope="module")
def quick_glibc_data(cli):
    p, _ = cli
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["experiments"][0]["data"]


def test_the_program_says_glibc_answered(glibc_small):
    meta, by_case = glibc_small
    assert meta["kind"] == "meta" and meta["allocator"] == "glibc"
    assert len(by_case) == len(SMALL_FIXED) + len(SMALL_RANDOM)


def test_one_byte_blocks_waste_over_90_percent_on_glibc(glibc_small):
    # GIVEN 1 MiB requested in 1-byte blocks under glibc
    _, by_case = glibc_small
    # WHEN waste is computed the write-up's way (allocated - requested - free)
    f = waste.figures(by_case[("fixed", 1)])
    # THEN more than 90% of what glibc obtained is waste
    assert f["waste_pct"] > 90, f


def test_malloc_1_has_a_usable_size_of_24(glibc_small):
    # GIVEN the 1-byte case: usable sizes summed right after each malloc
    _, by_case = glibc_small
    c = by_case[("fixed", 1)]
    # THEN every block is 24 bytes usable, 23 of them rounding
    assert c["usable"] == 24 * c["count"]
    assert waste.figures(c)["rounding"] == 23 * c["count"]


def test_waste_is_under_2_percent_from_1_kb_blocks(glibc_small):
    # GIVEN 1 MiB of 1024- and of 2048-byte blocks
    _, by_case = glibc_small
    for size in (1024, 2048):
        # THEN waste stays under 2% of what glibc obtained
        assert waste.figures(by_case[("fixed", size)])["waste_pct"] < 2.0, size


def test_requested_total_reaches_the_target_by_less_than_one_block(glibc_small):
    # GIVEN every case of the small run (fixed and random sizes)
    _, by_case = glibc_small
    for (mode, param), c in by_case.items():
        # THEN the blocks requested reach 1 MiB and overshoot by less than one block
        assert MB <= c["total"] < MB + c["max"], (mode, param, c["total"])
        assert 1 <= c["min"] <= c["max"] <= param


def test_each_case_starts_from_the_same_small_heap(glibc_small):
    # GIVEN cases run one after another by the same program
    _, by_case = glibc_small
    bases = {c["base_in_use"] for c in by_case.values()}
    # THEN each child's heap held the same few bytes before its blocks: nothing carried over
    assert len(bases) == 1, bases
    assert 0 <= bases.pop() < 4 * KB


def test_rss_growth_agrees_with_mallinfo2_for_10_mb_of_1_byte_blocks():
    # GIVEN 10 MiB requested in 1-byte blocks (about 320 MiB of chunks)
    (c,) = [x for x in run_waste("glibc", "--target-kb", 10 * KB, "--fixed", 1,
                                 "--random-max", "none") if x.get("kind") == "case"]
    # THEN the child's RSS growth, measured independently of malloc, is within 10% of
    # the bytes mallinfo2 says glibc obtained
    assert abs(c["rss_growth"] - c["allocated"]) <= 0.10 * c["allocated"], c
    # and int mallinfo still agrees at this size
    assert c["mi_arena"] == c["mi2_arena"]


def test_jemalloc_gives_its_own_column():
    if not JEMALLOC.exists():
        print(f"skipped: {JEMALLOC} is missing (Debian package libjemalloc2)")
        pytest.skip("libjemalloc2 is not installed")
    # GIVEN the same 1 MiB cases under jemalloc
    lines = run_waste("jemalloc", "--target-kb", 1024, "--fixed", "1,8,1024",
                      "--random-max", "none")
    by_case = cases(lines)
    # THEN jemalloc answered, with its own statistics (stats.active >= stats.allocated)
    assert lines[0]["allocator"] == "jemalloc"
    one = by_case[("fixed", 1)]
    assert one["allocated"] >= one["in_use"] >= one["usable"] > 0 and "mi2_arena" not in one
    # its smallest size class is 8 bytes, so a 1-byte block wastes 7 of 8
    assert one["usable"] == 8 * one["count"]
    assert 80 < waste.figures(one)["waste_pct"] < 90
    # and the per-allocator table has a jemalloc column filled from this data
    data = {"targets_kb": [1024], "fixed": [1, 8, 1024], "random_max": [],
            "configs": [{"name": "jemalloc", "allocator": "jemalloc", "errors": [],
                         "cases": [c for c in lines if c.get("kind") == "case"]}]}
    table, _ = waste.per_allocator_tables(data)
    col = table.columns.index("jemalloc")
    assert [r[col] for r in table.rows] == [round(waste.figures(by_case[("fixed", s)])["waste_pct"], 2)
                                            for s in (1, 8, 1024)]


def test_quick_claims_on_glibc(quick_glibc_data):
    # GIVEN the quick collection (1 MiB) under glibc
    one_byte, large, mallinfo, others = waste.claims(quick_glibc_data)
    # THEN the 1-byte and 1 KiB+ claims hold here,
    assert one_byte.verdict == common.HOLDS, one_byte.evidence
    assert large.verdict == common.HOLDS, large.evidence
    # the mallinfo overflow needs a heap over 2 GiB, which the quick run does not reach,
    assert mallinfo.verdict == common.DEPENDS and "2 GiB" in mallinfo.depends_on
    # and with glibc alone there is nothing to compare it with
    assert others.verdict == common.DEPENDS and "another allocator" in others.depends_on


def test_a_missing_allocator_is_an_error_in_its_column(quick_glibc_data):
    # GIVEN a configuration whose library does not exist
    ghost = Config("ghost", "jemalloc", {}, "missing", library="/nonexistent/libjemalloc.so.2")
    ctx = common.Context(quick=True, configs=[ghost])
    # WHEN it is the only one: nothing ran, so collect refuses
    with pytest.raises(HeapsightError, match="no waste case ran"):
        waste.collect(ctx)
    # WHEN it sits beside glibc's data: the tables and claims still come out, the ghost
    # column reads n/a and the note names the missing library
    data = dict(quick_glibc_data)
    data["configs"] = quick_glibc_data["configs"] + [
        {"name": "ghost", "allocator": "jemalloc", "errors": ["library missing"], "cases": []}]
    table, usable = waste.per_allocator_tables(data)
    col = table.columns.index("ghost")
    assert {r[col] for r in table.rows} == {"n/a"} and "ghost: library missing" in table.note
    assert {r[col] for r in usable.rows} == {"n/a"}
    assert all(c.evidence for c in waste.claims(data))
    assert waste.charts(data)


def test_bad_arguments_exit_2():
    for args in (["--fixed", "0"], ["--target-kb", "x"], ["--random-max", "8,,9"], ["--nope", "1"]):
        p = subprocess.run([scenario("hs-lab-waste"), *args], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 2 and p.stderr and not p.stdout, args


def test_cli_quick_glibc_prints_the_table_and_the_claims(cli):
    # WHEN the experiment runs from the command line, quick, glibc only
    p, cwd = cli
    # THEN it succeeds and prints every claim with a verdict, naming the table of waste by
    # block size (drawn with --verbose and on the page: beside the claims it takes more
    # than the experiment's screen)
    assert p.returncode == 0, p.stderr
    assert "tables (--verbose, the page): waste % by block size, per allocator" in \
        " ".join(p.stderr.split()), p.stderr
    assert p.stderr.count("[HOLDS") + p.stderr.count("[FAILS") + p.stderr.count("[DEPENDS") == 4
    assert list(cwd.iterdir()) == []  # --no-save wrote nothing
