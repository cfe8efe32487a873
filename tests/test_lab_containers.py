"""`heapsight lab containers`: C++ containers of strings with std::allocator and
__gnu_cxx::__pool_alloc, RSS in scope and out of scope, on this machine's glibc."""

import json
import subprocess
import sys

import pytest

from heapsight.allocators import PRESET, Config
from heapsight.lab import containers
from heapsight.lab.common import FAILS, HOLDS, Context

from conftest import scenario

N = 100_000
KS = (32, 112, 136, 512)
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def data():
    """One small matrix under glibc: 3 containers x 2 allocators, random and all-zero
    strings, and the layout probe (about a second in all)."""
    ctx = Context(quick=True, configs=[PRESET["glibc"]])
    d = containers.measure(ctx, N, KS)
    return json.loads(json.dumps(d))  # what a saved lab gives back


def point(data, container, alloc, k, strings="random"):
    run = containers.find(data, container, alloc, strings)
    assert run, f"{container}/{alloc}/{strings} did not run"
    return next(p for p in run["points"] if p["k"] == k)


def test_in_scope_rss_grows_with_the_strings(data):
    # GIVEN every container with both allocators
    for c in containers.CONTAINERS:
        for a in containers.ALLOCS:
            # WHEN the strings grow from 32 to 512 characters
            grew = point(data, c, a, 512)["rss_in"] - point(data, c, a, 32)["rss_in"]
            # THEN in-scope RSS grows by at least half of the extra characters
            assert grew >= N * (512 - 32) / 2, (c, a, grew)


def test_only_list_nodes_reach_the_pool(data):
    # GIVEN the pool-allocator runs
    node = data["sizes"]["list_node_bytes"]
    # WHEN we look at the requests each container made of its allocator
    for k in KS:
        # THEN a list asks for one node per string, each within the pool's 128 bytes,
        assert point(data, "list", "pool", k)["pool_small_bytes"] == N * node
        assert point(data, "list", "pool", k)["max_request"] <= containers.POOL_MAX_BYTES
        # while a vector's array and a deque's blocks go past the pool (a few small ones aside)
        for c in ("vector", "deque"):
            p = point(data, c, "pool", k)
            assert p["pool_small_bytes"] < 1024 and p["pool_large_bytes"] >= N * 32, (c, p)


def test_the_pool_still_holds_the_list_nodes_after_destruction(data):
    # GIVEN list<string> with std::allocator and with __pool_alloc
    node = data["sizes"]["list_node_bytes"]
    for k in KS:
        # WHEN the list has been destroyed
        held_pool = containers.malloc_held(point(data, "list", "pool", k))
        held_std = containers.malloc_held(point(data, "list", "std", k))
        # THEN malloc still has the pool's nodes allocated, and nothing with std::allocator
        assert held_pool - held_std >= 0.9 * N * node, (k, held_pool, held_std)
        assert held_std < 1 * MIB


def test_vector_and_deque_keep_the_same_with_either_allocator(data):
    # GIVEN vector and deque, whose allocations never enter the pool
    for c in ("vector", "deque"):
        for k in KS:
            # WHEN they have been destroyed
            std, pool = point(data, c, "std", k), point(data, c, "pool", k)
            # THEN out-of-scope RSS is the same with both allocators, to 1 MiB
            assert abs(std["rss_out"] - pool["rss_out"]) < 1 * MIB, (c, k)


def test_glibc_gives_a_vectors_long_strings_back_but_keeps_a_lists(data):
    # GIVEN strings of 32 and then 512 characters (the latter too big for glibc's fastbins)
    vec32, vec512 = point(data, "vector", "std", 32), point(data, "vector", "std", 512)
    lst = point(data, "list", "std", 512)
    # WHEN the containers have been destroyed
    # THEN the vector's extra 45 MiB of strings went back to the OS (out of scope RSS did
    # not rise from k=32 to k=512),
    assert vec512["rss_in"] - vec32["rss_in"] > 40 * MIB
    assert vec512["rss_out"] - vec32["rss_out"] < 1 * MIB
    # while the list's strings, between fastbin nodes that are never merged, stay resident
    assert lst["rss_out"] >= 0.9 * lst["rss_in"]


def test_all_zero_strings_hold_the_same_memory_as_random_ones(data):
    # GIVEN each container and allocator filled with random and with all-'0' strings
    for c in containers.CONTAINERS:
        for a in containers.ALLOCS:
            for k in KS:
                # WHEN destroyed
                rnd, zero = point(data, c, a, k), point(data, c, a, k, "zero")
                # THEN what stays resident does not depend on the characters, to 1 MiB
                assert abs(rnd["rss_out"] - zero["rss_out"]) < 1 * MIB, (c, a, k)


def test_claims_are_computed_from_the_numbers(data):
    # GIVEN the small glibc matrix
    # WHEN the claims are checked
    by_text = {c.text: c for c in containers.claims(data)}
    pool_keeps, = [c for t, c in by_text.items() if t.startswith("the pool allocator keeps")]
    zero, = [c for t, c in by_text.items() if t.startswith("all-zero strings")]
    overlap, = [c for t, c in by_text.items() if t.startswith("std::allocator keeps")]
    # THEN the pool keeps the list's nodes, zero strings change nothing, and std and pool
    # overlap for vector and deque but not for list
    assert pool_keeps.verdict == HOLDS and "list" in pool_keeps.evidence
    assert zero.verdict == FAILS
    assert overlap.verdict != HOLDS
    assert all(c.source == "STL and malloc's Pool Effect" for c in by_text.values())


def test_tables_claims_and_charts_survive_a_missing_container(data):
    # GIVEN saved data from which every list run is gone
    partial = dict(data, runs=[r for r in data["runs"] if r["container"] != "list"])
    # WHEN it is re-read
    tables = containers.tables(partial)
    claims = containers.claims(partial)
    charts = containers.charts(partial)
    # THEN nothing crashes, the list table is absent, and the list claim says it was not measured
    assert not any(t.title.startswith("list") for t in tables)
    grows, = [c for c in claims if "list's RSS keeps growing" in c.text]
    assert grows.verdict == "depends" and "missing" in grows.depends_on
    assert [c["id"] for c in charts] == ["containers-vector", "containers-deque",
                                         "containers-out-of-scope"]
    assert all(len(s["x"]) == len(KS) for c in charts for s in c["series"])


def test_a_missing_allocator_is_an_error_row_and_the_rest_runs():
    # GIVEN glibc plus an allocator whose library is not there
    ghost = Config("ghost", "jemalloc", {}, "not installed", library="/nonexistent/libjemalloc.so.2")
    ctx = Context(quick=True, configs=[PRESET["glibc"], ghost])
    # WHEN the experiment runs (vector only, tiny)
    d = containers.measure(ctx, 20_000, (32, 256), zero_containers=(), containers=("vector",))
    # THEN the ghost's run is an error naming the library, glibc's ran, and the table says so
    ghost_runs = [r for r in d["runs"] if r["config"] == "ghost"]
    assert ghost_runs and all(not r["ok"] and "/nonexistent" in r["error"] for r in ghost_runs)
    assert containers.find(d, "vector", "std") and containers.find(d, "vector", "pool")
    assert "/nonexistent" in containers.tables(d)[-1].note


def test_program_refuses_bad_arguments():
    prog = scenario("hs-lab-containers")
    for args in (["--container", "set"], ["--alloc", "arena"], ["--k-list", "8,,16"],
                 ["--k-list", "0"], ["--zero", "2"], ["--bogus", "1"]):
        # WHEN the program gets a bad argument
        p = subprocess.run([prog, *args], capture_output=True, text=True, timeout=30)
        # THEN it says so on stderr and exits 2, printing nothing on stdout
        assert p.returncode == 2 and p.stderr and not p.stdout, args


def test_cli_quick_run_prints_the_claims():
    # GIVEN the quick experiment under glibc alone
    p = subprocess.run([sys.executable, "-m", "heapsight", "lab", "containers", "--quick",
                        "--no-save", "--configs", "glibc"],
                       capture_output=True, text=True, timeout=300)
    # THEN it succeeds and prints the tables and every claim with a verdict
    assert p.returncode == 0, p.stderr
    flat = " ".join(p.stderr.split())   # (titles and claims wrap to the terminal's width)
    assert "what the pool sees, per fill (MiB)" in flat
    assert flat.count('"the pool allocator keeps') == 1
    assert "claims:" in p.stderr and "[HOLDS]" in p.stderr
