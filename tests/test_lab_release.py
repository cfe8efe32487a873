"""`heapsight lab release`: the size sweep, measured on this machine's allocators."""

import json
import subprocess
import sys

import pytest

from heapsight.allocators import PRESET, Config
from heapsight.lab import release
from heapsight.lab.common import DEPENDS, FAILS, HOLDS, Context

KB, MB = 1024, 1024 * 1024


@pytest.fixture(scope="module")
def cli():
    """`heapsight lab release --quick`: one sweep (blocks up to 200 MiB, three orders) under
    four configurations."""
    return subprocess.run([sys.executable, "-m", "heapsight", "lab", "release", "--quick",
                           "--no-save", "--configs", "glibc,glibc-mmap128k,jemalloc,mmap",
                           "--json", "-"], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def data(cli):
    assert cli.returncode == 0, cli.stderr
    return json.loads(cli.stdout)["experiments"][0]["data"]


def block(data, config, order, size):
    run = release.ok_runs(data, config)[order]
    return release.by_size(run)[size], run["page"]


def share(data, config, order, size, kind="rss"):
    b, page = block(data, config, order, size)
    return release.kept_share(b, page, kind)


def program(*args):
    return subprocess.run([release.common.lab_program("hs-lab-release"), *args],
                          capture_output=True, text=True, timeout=60)


def test_every_configuration_ran_under_the_allocator_it_asked_for(data):
    # GIVEN the sweep under glibc, a tuned glibc, jemalloc and the mmap baseline
    # THEN every run worked, and each was answered by the allocator it asked for
    for c in data["configs"]:
        assert c["error"] is None
        for order in release.ORDERS:
            run = c["runs"][order]
            assert run["error"] is None, run["error"]
            assert run["answered"] == c["allocator"]
            assert sorted(b["size"] for b in run["blocks"]) == [
                2 * KB, 20 * KB, 200 * KB, 2 * MB, 20 * MB, 200 * MB]


def test_glibc_returns_a_2mb_block_in_ascending_order(data):
    # GIVEN glibc's defaults, blocks allocated smallest first
    # WHEN the 2 MiB block is freed (the threshold is only 200 KiB by then)
    # THEN it was mmapped and its pages went back
    b, _ = block(data, "glibc", "ascending", 2 * MB)
    assert b["mmapped_during"] >= 2 * MB
    assert share(data, "glibc", "ascending", 2 * MB) < release.RETURNED_BELOW


def test_glibc_keeps_2mb_and_200kb_after_a_20mb_block_in_descending_order(data):
    # GIVEN glibc's defaults, blocks allocated largest first
    # WHEN the 20 MiB block has been mmapped and freed (the threshold rose to 20 MiB)
    big, _ = block(data, "glibc", "descending", 20 * MB)
    assert big["mmapped_during"] >= 20 * MB
    # THEN the 2 MiB and 200 KiB blocks come from the heap and stay resident after free
    for size in (2 * MB, 200 * KB):
        b, _ = block(data, "glibc", "descending", size)
        assert b["mmapped_during"] == 0
        assert share(data, "glibc", "descending", size) > release.STAYS_ABOVE


def test_fixed_mmap_threshold_returns_the_2mb_block_in_descending_order(data):
    # GIVEN glibc with mmap_threshold fixed at 128 KiB, blocks largest first
    # THEN the 2 MiB and 200 KiB blocks are still mmapped and go back on free
    for size in (2 * MB, 200 * KB):
        assert share(data, "glibc-mmap128k", "descending", size) < release.RETURNED_BELOW


def test_glibc_keeps_small_blocks_in_every_order(data):
    # GIVEN glibc's defaults
    # THEN the 2 KiB and 20 KiB blocks stay resident after free, whatever the order
    for order in release.ORDERS:
        for size in (2 * KB, 20 * KB):
            assert share(data, "glibc", order, size) > release.STAYS_ABOVE, (order, size)


def test_mmap_baseline_returns_every_block_and_its_address_space(data):
    # GIVEN the allocator that mmaps each block and munmaps it on free
    # THEN every block, 2 KiB included, gives back its pages and its address space
    for order in release.ORDERS:
        for b in release.ok_runs(data, "mmap")[order]["blocks"]:
            for kind in ("rss", "vm"):
                assert share(data, "mmap", order, b["size"], kind) < release.RETURNED_BELOW


def test_jemalloc_returns_the_pages_of_a_20mb_block_but_keeps_it_mapped(data):
    # GIVEN jemalloc 5 with its default decay
    for order in release.ORDERS:
        # THEN a freed 20 MiB block's pages go back at once, its address space stays mapped,
        assert share(data, "jemalloc", order, 20 * MB) < release.RETURNED_BELOW
        assert share(data, "jemalloc", order, 20 * MB, "vm") > release.STAYS_ABOVE
        # while a 2 MiB block stays resident (it waits for decay)
        assert share(data, "jemalloc", order, 2 * MB) > release.STAYS_ABOVE


def test_claims_are_computed_from_the_sweep(data):
    # WHEN the claims are judged from the quick sweep
    verdicts = {c.text: c for c in release.claims(data)}
    cutoff = next(c for t, c in verdicts.items() if t.startswith("blocks above about 200 KB"))
    tunables = next(c for t, c in verdicts.items() if t.startswith("the GLIBC tunables"))
    mmap = next(c for t, c in verdicts.items() if t.startswith("an allocator that mmaps"))
    # THEN glibc's cut-off depends on the order, the tunable changes it, the baseline returns all
    assert cutoff.verdict == DEPENDS and "dynamic mmap threshold" in cutoff.depends_on
    assert tunables.verdict == FAILS and "glibc-mmap128k" in tunables.evidence
    assert mmap.verdict == HOLDS
    assert all(c.source == release.SOURCE for c in verdicts.values())


def test_tables_and_charts_describe_every_order(data):
    # WHEN the tables and charts are built from the data alone, after a JSON round trip
    saved = json.loads(json.dumps(data))
    titles = [t.title for t in release.tables(saved)]
    charts = release.charts(saved)
    # THEN there is one RSS table per order plus the virtual-memory one, and 2-4 charts
    assert [t for t in titles if t.startswith("RSS kept")] == [
        f"RSS kept after free, {o} order" for o in release.ORDERS]
    assert any(t.startswith("virtual memory") for t in titles)
    assert 2 <= len(charts) <= 4
    assert all(s["x"] and len(s["x"]) == len(s["y"]) for c in charts for s in c["series"])


def test_a_missing_allocator_is_an_error_in_its_column_not_an_abort():
    # GIVEN glibc and an allocator whose library does not exist
    broken = Config("broken", "jemalloc", {}, "", library="/nonexistent/libjemalloc.so.2")
    data = release.collect(Context(quick=True, configs=[PRESET["glibc"], broken]))
    # THEN glibc ran, the broken one carries its error, and the tables say so
    assert release.ok_runs(data, "glibc")
    assert "missing" in release.config(data, "broken")["error"]
    table = release.tables(data)[0]
    assert all(row[table.columns.index("broken")] == "error" for row in table.rows)
    # (in the note of the first table the terminal shows)
    assert "broken" in next(t for t in release.tables(data) if not t.detail).note
    assert release.charts(data) and release.claims(data)


def test_the_shuffled_order_is_seeded():
    # GIVEN the same seed twice and another seed
    def order(seed):
        p = program("--order", "shuffled", "--max-mb", "2", "--seed", str(seed))
        assert p.returncode == 0, p.stderr
        return [json.loads(x)["size"] for x in p.stdout.splitlines() if '"block"' in x]
    # THEN the same seed gives the same order, and every size appears once
    assert order(7) == order(7)
    assert sorted(order(8)) == [2 * KB, 20 * KB, 200 * KB, 2 * MB]


def test_bad_arguments_exit_2_with_a_message():
    # WHEN the order is not one of the three
    p = program("--order", "sideways", "--max-mb", "2")
    # THEN exit 2 and stderr says what is wrong
    assert p.returncode == 2 and "--order must be" in p.stderr and p.stdout == ""


def test_cli_prints_the_tables_and_every_claim(cli):
    # WHEN `heapsight lab release --quick` runs under four configurations
    p = cli
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)["experiments"][0]
    # THEN stderr holds the tables and each claim with its verdict
    assert "RSS kept after free, descending order" in p.stderr
    assert len(result["claims"]) >= 3
    flat = " ".join(p.stderr.split())   # (a claim wraps to the terminal's width)
    for c in result["claims"]:
        verdict = c["verdict"].upper() + (f" on {c['depends_on']}" if c["depends_on"] else "")
        assert f"[{verdict}] \"{c['text']}\"" in flat
