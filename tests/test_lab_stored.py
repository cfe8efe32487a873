"""The lab's pure functions (tables, claims, charts) on stored data, without a process.

tests/data/lab/<name>.json.gz is the `data` of one quick run of each experiment on a
2-core machine with glibc 2.36, jemalloc 5.3, tcmalloc and mimalloc 2.0: every
configuration ran. They were recorded before --quick was cut to a minute: they hold more
cases than a quick run makes now (two waste targets, every container under every malloc...),
which the pure functions read alike. The tests read verdicts and figures that data implies, then edit a
copy of it so that a claim's verdict must change."""

import copy
import gzip
import html
import json
from pathlib import Path

import pytest

from heapsight import lab, output, record
from heapsight.errors import HeapsightError
from heapsight.lab import arenas, common, containers, perl, release, remedies, waste
from heapsight.lab.common import DEPENDS, FAILS, HOLDS, MIB
from heapsight.model import SCHEMA_VERSION
from heapsight.report import build_page

DATA = Path(__file__).resolve().parent / "data" / "lab"
KB, MB = 1024, 1024 * 1024


def stored(name: str) -> dict:
    """A fresh copy of one experiment's stored data, as a saved lab gives it back."""
    return json.loads(gzip.open(DATA / f"{name}.json.gz", "rt").read())


def claim(mod, data: dict, starts: str):
    """The one claim of mod whose text starts so, judged on data."""
    (c,) = [c for c in mod.claims(data) if c.text.startswith(starts)]
    return c


def experiment(name: str) -> dict:
    """One experiment's entry of a lab document, as `heapsight lab` builds it."""
    mod = lab.experiment(name)
    data = stored(name)
    return {"name": name, "title": mod.TITLE, "source": mod.SOURCE, "about": mod.ABOUT,
            "quick": True, "duration_s": 1.0, "data": data,
            "tables": [t.to_dict() for t in mod.tables(data)],
            "claims": [c.to_dict() for c in mod.claims(data)],
            "charts": mod.charts(data)}


# ---------------------------------------------------------------- every experiment

CHART_IDS = {
    "release": ["release-shuffled", "release-glibc-order", "release-virtual"],
    "waste": ["waste-fixed", "waste-random", "waste-glibc-allocated"],
    "arenas": ["arenas-retained", "arenas-trim", "arenas-count"],
    "containers": ["containers-vector", "containers-list", "containers-deque",
                   "containers-out-of-scope"],
    "perl": ["perl-glibc-cases", "perl-kept-per-config", "perl-boundary", "perl-repeat"],
    "remedies": ["remedies-threads", "remedies-pymalloc"],
}

VERDICTS = {  # what this data says of each claim, in the order claims() gives them
    "release": [DEPENDS, FAILS, DEPENDS, FAILS, HOLDS, HOLDS],
    "waste": [HOLDS, HOLDS, DEPENDS, FAILS],
    "arenas": [DEPENDS, DEPENDS, HOLDS, DEPENDS, DEPENDS],
    # (the list under jemalloc grew, but in a run shorter than jemalloc's decay)
    "containers": [HOLDS, DEPENDS, DEPENDS, FAILS, FAILS],
    "perl": [DEPENDS, FAILS, HOLDS, DEPENDS, DEPENDS],
    "remedies": [HOLDS] * 6,
}


@pytest.mark.parametrize("name", lab.NAMES)
def test_claims_on_stored_data_have_the_verdicts_the_data_implies(name):
    # GIVEN one stored quick run
    mod = lab.experiment(name)
    # WHEN its claims are judged
    claims = mod.claims(stored(name))
    # THEN each has this data's verdict, its write-up as source, evidence, and an "on what"
    # exactly when it depends
    assert [c.verdict for c in claims] == VERDICTS[name]
    for c in claims:
        assert c.source == mod.SOURCE and c.evidence
        assert bool(c.depends_on) == (c.verdict == DEPENDS), c


@pytest.mark.parametrize("name", lab.NAMES)
def test_charts_on_stored_data_are_whole(name):
    # WHEN the charts are drawn from stored data
    charts = lab.experiment(name).charts(stored(name))
    # THEN they are the experiment's charts, and every series has a y for every x (line
    # charts) or for every category (bar charts), all numbers
    assert [c["id"] for c in charts] == CHART_IDS[name]
    for c in charts:
        assert c["kind"] in ("line", "bar") and c["title"] and c["note"]
        for s in c["series"]:
            n = len(s["x"]) if c["kind"] == "line" else len(c["x"]["categories"])
            assert n > 0 and len(s["y"]) == n, (c["id"], s["name"])
            if "x" in s:
                assert len(s["x"]) == len(s["y"]), (c["id"], s["name"])
            assert all(isinstance(v, (int, float)) for v in s["y"] if v is not None)


@pytest.mark.parametrize("name", lab.NAMES)
def test_tables_on_stored_data_have_a_cell_for_every_column(name):
    tables = lab.experiment(name).tables(stored(name))
    assert tables
    for t in tables:
        assert t.rows, t.title
        assert all(len(r) == len(t.columns) for r in t.rows), t.title


@pytest.mark.parametrize("name", lab.NAMES)
def test_tables_claims_and_charts_survive_a_json_round_trip(name):
    # GIVEN what a saved lab keeps of one experiment
    exp = experiment(name)
    again = json.loads(json.dumps(exp))
    # WHEN it is read back and judged again
    mod = lab.experiment(name)
    # THEN the same tables, claims and charts come out
    assert [t.to_dict() for t in mod.tables(again["data"])] == again["tables"]
    assert [c.to_dict() for c in mod.claims(again["data"])] == again["claims"]
    assert mod.charts(again["data"]) == again["charts"]


def test_a_page_of_all_five_stored_experiments_draws_every_chart(tmp_path):
    # GIVEN a lab document of the five stored experiments, saved and loaded back as
    # `heapsight report` reads it
    doc = {"kind": "heapsight-lab", "schema_version": SCHEMA_VERSION, "quick": True,
           "machine": {"cores": 2, "kernel": "6.1", "libc": "glibc 2.36", "python": "3.11"},
           "started": "2026-01-01T00:00:00",
           "experiments": [experiment(n) for n in lab.NAMES]}
    path = tmp_path / "lab.json.gz"
    output.save_doc(str(path), doc)
    # WHEN the page is built
    page = build_page([record.load(str(path))])
    # THEN it holds each experiment's charts, in order, each with its figure and its series
    want = [(n, c) for n in lab.NAMES for c in doc["experiments"][lab.NAMES.index(n)]["charts"]]
    assert len(page.charts) == len(want) == sum(len(v) for v in CHART_IDS.values())
    for drawn, (name, c) in zip(page.charts, want):
        assert drawn["id"].endswith(c["id"]) and name in drawn["id"]
        assert drawn["title"] == c["title"]
        assert [s["name"] for s in drawn["series"]] == [s["name"] for s in c["series"]]
        assert f'data-chart="{drawn["id"]}"' in page.html
    # and every claim, with its verdict and evidence
    for e in doc["experiments"]:
        for c in e["claims"]:
            assert f'<div class="text">\u201c{html.escape(c["text"])}\u201d</div>' in page.html
            assert html.escape(c["evidence"]) in page.html


# ---------------------------------------------------------------- release

def glibc_block(data, order, size, name="glibc"):
    return release.by_size(release.ok_runs(data, name)[order])[size]


def give_back(b: dict, page: int = 4096) -> None:
    """Edits a block so the free gave every page and all its address space back."""
    whole = release.block_bytes(b, page)
    b["rss_during"] = max(b["rss_during"], b["rss_before"] + whole)
    b["vm_during"] = max(b["vm_during"], b["vm_before"] + whole)
    b["rss_after"], b["vm_after"] = b["rss_before"], b["vm_before"]


def test_release_tables_show_glibc_keeping_2mb_only_after_a_larger_block():
    data = stored("release")
    tables = release.tables(data)
    # one RSS table per order and the VmSize one, a row per block up to 200 MiB
    assert [t.title for t in tables] == [
        f"RSS kept after free, {o} order" for o in release.ORDERS
    ] + ["virtual memory (VmSize) kept after free"]
    names = [c["name"] for c in data["configs"]]
    assert tables[0].columns == ["block"] + names
    asc = {r[0]: r for r in tables[1].rows}
    desc = {r[0]: r for r in tables[2].rows}
    assert list(asc) == ["2 KiB", "20 KiB", "200 KiB", "2 MiB", "20 MiB", "200 MiB"]
    assert list(desc) == list(reversed(list(asc)))
    g, mm = names.index("glibc") + 1, names.index("mmap") + 1
    # ascending: the 2 MiB block is mmapped and returned; descending: after the 20 MiB one
    # raised the threshold it comes from the heap and all of it stays
    assert asc["2 MiB"][g] == "0 KiB" and desc["2 MiB"][g] == "2,048 KiB"
    assert asc["2 KiB"][g] == "4 KiB" and asc["2 KiB"][mm] == "0 KiB"


def test_release_claims_name_the_figures_behind_them():
    data = stored("release")
    cutoff = claim(release, data, "blocks above about 200 KB")
    assert cutoff.depends_on == "allocation order (glibc's dynamic mmap threshold)"
    assert "holds in ascending order; not in shuffled, descending" in cutoff.evidence
    tunables = claim(release, data, "the GLIBC tunables")
    assert tunables.evidence.startswith("8 of 24 blocks of 128 KiB and up changed outcome")
    virtual = claim(release, data, "with jemalloc, physical memory")
    assert virtual.depends_on == "block size (from 20 MiB up)"
    assert "20 MiB: RSS kept 0 KiB, VM kept 20,480 KiB" in virtual.evidence
    assert "all 18 blocks" in claim(release, data, "an allocator that mmaps").evidence


def test_release_glibc_cutoff_holds_once_glibc_returns_the_2mb_block_in_every_order():
    # GIVEN the stored sweep, edited so the 2 MiB block went back after a larger one too
    data = stored("release")
    for order in ("shuffled", "descending"):
        give_back(glibc_block(data, order, 2 * MB))
    # THEN the cut-off claim holds in every order
    assert claim(release, data, "blocks above about 200 KB").verdict == HOLDS


def test_release_claims_flip_when_glibc_keeps_nothing():
    # GIVEN the stored sweep, edited so glibc gave every block back in every order
    data = stored("release")
    for run in release.ok_runs(data, "glibc").values():
        for b in run["blocks"]:
            give_back(b, run["page"])
    # THEN its small blocks no longer stay: the cut-off fails in every order, and "small
    # blocks stay" now depends on the allocator (glibc among those that returned them)
    cutoff = claim(release, data, "blocks above about 200 KB")
    assert cutoff.verdict == FAILS and cutoff.evidence.startswith("in no order")
    small = claim(release, data, "small memory allocations")
    assert small.verdict == DEPENDS and small.depends_on == "allocator"
    assert "not under glibc (" in small.evidence
    # and the table shows nothing kept in glibc's column
    t = release.tables(data)[0]
    col = t.columns.index("glibc")
    assert {r[col] for r in t.rows} == {"0 KiB"}


def test_release_tunables_change_nothing_when_the_tuned_runs_match_the_default():
    data = stored("release")
    for name in ("glibc-mmap128k", "glibc-trim128k"):
        common.config(data, name)["runs"] = copy.deepcopy(common.config(data, "glibc")["runs"])
    c = claim(release, data, "the GLIBC tunables")
    assert c.verdict == HOLDS and c.evidence.startswith("none of 24 blocks")


def test_release_a_configuration_that_did_not_run_is_an_error_column_and_a_note():
    # GIVEN the stored sweep where jemalloc's library was missing
    data = stored("release")
    je = common.config(data, "jemalloc")
    je["error"], je["runs"] = "jemalloc library is missing", {}
    # THEN its column reads "error", the note of the first table the terminal shows names
    # it, and its claims go
    tables = release.tables(data)
    col = tables[0].columns.index("jemalloc")
    assert {r[col] for r in tables[0].rows} == {"error"}
    shown = next(t for t in tables if not t.detail)
    assert "errors: jemalloc: jemalloc library is missing" in shown.note
    texts = [c.text for c in release.claims(data)]
    assert len(texts) == 4 and not any("jemalloc" in t for t in texts)


# ---------------------------------------------------------------- waste

def waste_case(data, name, mode, target_kb, param):
    cfg = common.config(data, name)
    return waste.find(cfg, mode, target_kb * KB, param)


def test_waste_tables_and_figures_of_the_stored_run():
    data = stored("waste")
    fixed, random, pct, usable = waste.tables(data)
    # a row per fixed size and target, per random range and target, per size and range
    assert len(fixed.rows) == len(waste.FIXED) * 2 and len(random.rows) == len(waste.RANDOM_MAX) * 2
    assert len(pct.rows) == len(usable.rows) == len(waste.FIXED) + len(waste.RANDOM_MAX)
    assert pct.columns == usable.columns == ["blocks", "glibc", "jemalloc", "tcmalloc", "mimalloc"]
    # glibc's 1-byte blocks: 24 usable bytes each, 96.85% waste at 10 MiB
    assert {r[0]: r for r in pct.rows}["1 B"][1] == 96.85
    assert {r[0]: r for r in usable.rows}["1 B"][1] == 24
    # the terminal shows the tiny sizes and a few more without --verbose, the page all
    assert [pct.rows[i][0] for i in pct.brief_rows][:9] == [f"{n} B" for n in range(1, 9)] + ["16 B"]
    assert fixed.detail and random.detail and usable.detail and not pct.detail
    assert fixed.rows[0][:2] == ["1 MiB", 1 * MB]   # 1 MiB of 1-byte blocks: a million of them


def test_waste_one_byte_claim_flips_with_the_waste_it_reads():
    # GIVEN the stored run, edited so glibc's 1-byte blocks waste only half what it got
    data = stored("waste")
    for t in data["targets_kb"]:
        c = waste_case(data, "glibc", "fixed", t, 1)
        c["allocated"] = 2 * (c["total"] + max(c.get("free", -1), 0))
    # THEN "about 97%" fails
    c = claim(waste, data, "1-byte allocations")
    assert c.verdict == FAILS and "50.00% at 1 MiB, 50.00% at 10 MiB" in c.evidence
    # and with only the 10 MiB case edited back it depends on the target size
    data2 = stored("waste")
    c10 = waste_case(data2, "glibc", "fixed", 10240, 1)
    c10["allocated"] = 2 * (c10["total"] + max(c10.get("free", -1), 0))
    c = claim(waste, data2, "1-byte allocations")
    assert c.verdict == DEPENDS and c.depends_on == "the target size"


def test_waste_mallinfo_claim_holds_on_a_heap_that_wrapped():
    # GIVEN a glibc case whose heap passed 2 GiB, int mallinfo off by 2^32 and negative
    data = stored("waste")
    c = waste_case(data, "glibc", "fixed", 10240, 1)
    c["mi2_arena"] = 3 * 2 ** 30
    c["mi_arena"] = c["mi2_arena"] - 2 ** 32
    # THEN the overflow claim holds
    m = claim(waste, data, "mallinfo reports")
    assert m.verdict == HOLDS and "1 negative" in m.evidence


def test_waste_others_claim_depends_when_one_allocator_wastes_like_glibc():
    # GIVEN jemalloc's tiny blocks edited to waste exactly what glibc's do
    data = stored("waste")
    for s in range(1, waste.TINY_MAX_BYTES + 1):
        g = waste_case(data, "glibc", "fixed", 10240, s)
        je = waste_case(data, "jemalloc", "fixed", 10240, s)
        je.update({k: g[k] for k in ("allocated", "total", "free", "usable")})
    # THEN "as much as glibc" depends on the allocator, jemalloc alone alike
    c = claim(waste, data, "other allocators waste")
    assert c.verdict == DEPENDS and c.depends_on == "the allocator (as much: jemalloc)"
    assert "glibc 85.9%, jemalloc 85.9%" in c.evidence


def test_waste_without_glibc_every_claim_depends_on_a_glibc_run():
    data = stored("waste")
    data["configs"] = [c for c in data["configs"] if c["allocator"] != "glibc"]
    claims = waste.claims(data)
    assert [c.verdict for c in claims] == [DEPENDS] * 4
    assert "no glibc configuration ran" in waste.tables(data)[0].note


# ---------------------------------------------------------------- arenas

def arenas_run(data, name, cid):
    return arenas.run_of(common.config(data, name), cid)


def test_arenas_figures_of_the_stored_run():
    data = stored("arenas")
    matrix = arenas.tables(data)[0]
    assert matrix.columns == ["case"] + [c["name"] for c in data["configs"]]
    assert [r[0] for r in matrix.rows] == [c["id"] for c in data["cases"]]
    # 32 workers on 2 cores share glibc's 16 arenas
    r = arenas_run(data, "glibc", "32x30")
    assert (r["threads"], r["arenas"], data["cap"]) == (32, 16, 16)
    cap = claim(arenas, data, "the number of arenas is capped")
    assert "32x30: 32 workers shared 16 arenas" in cap.evidence
    count = arenas.charts(data)[2]
    assert count["series"][-1] == {"name": "8 x cores = 16", "x": [1, 4, 32], "y": [16] * 3}


def test_arenas_cap_claim_depends_once_a_run_has_more_arenas_than_the_cap():
    data = stored("arenas")
    arenas_run(data, "glibc", "32x30")["arenas"] = data["cap"] + 1
    c = claim(arenas, data, "the number of arenas is capped")
    assert c.verdict == DEPENDS and c.depends_on == "the configuration"


def test_arenas_arena_max_bounds_memory_once_no_worker_pins_its_arena():
    # GIVEN the stored runs without the pinned case (a live block above the freed one)
    data = stored("arenas")
    data["cases"] = [c for c in data["cases"] if c["variant"] != "pinned"]
    for cfg in data["configs"]:
        cfg["runs"].pop("4x30/pinned", None)
    # THEN arena_max bounds what stays, and malloc_trim gives back no more than the main arena
    assert claim(arenas, data, "limiting the arenas").verdict == HOLDS
    assert claim(arenas, data, "malloc_trim(0) returns only").verdict == HOLDS


def test_arenas_100_vs_30_holds_without_the_one_arena_4x30_run():
    # GIVEN the stored runs, less glibc-arena1's 4 x 30 MiB, where one shared arena trimmed
    data = stored("arenas")
    c = claim(arenas, data, "blocks of 100 MB")
    assert c.depends_on == "the configuration and mix: not under glibc-arena1 4x30"
    del common.config(data, "glibc-arena1")["runs"]["4x30"]
    # THEN 30 MiB blocks stay and 100 MiB ones go in every pair that remains
    assert claim(arenas, data, "blocks of 100 MB").verdict == HOLDS


def test_arenas_without_glibc_the_claims_say_what_did_not_run():
    data = stored("arenas")
    data["configs"] = [c for c in data["configs"] if c["allocator"] != "glibc"]
    data["configs"][0]["errors"] = ["jemalloc library is missing"]
    claims = arenas.claims(data)
    assert [c.verdict for c in claims] == [DEPENDS] * 5
    assert "no glibc (default settings) ran here" in claims[0].evidence
    assert "errors: jemalloc: jemalloc library is missing" in arenas.tables(data)[0].note
    assert [c["id"] for c in arenas.charts(data)] == ["arenas-retained"]


# ---------------------------------------------------------------- containers

def shift(data, container, alloc, strings, key, by):
    run = containers.find(data, container, alloc, strings)
    for p in run["points"]:
        p[key] += by


def test_containers_figures_of_the_stored_run():
    data = stored("containers")
    titles = [t.title for t in containers.tables(data)]
    assert [t.split(",")[0] for t in titles[:3]] == ["vector<string>", "list<string>",
                                                    "deque<string>"]
    assert titles[3].startswith("what the pool sees") and titles[4].startswith("layout probe")
    pool = containers.tables(data)[3]
    lst = {r[0]: r for r in pool.rows}["list"]
    # 200,000 list nodes of 48 bytes reach the pool: 9.2 MiB, all kept through k = 112
    assert lst[2] == "9.2" and lst[-1] == "112"
    c = claim(containers, data, "std::allocator keeps about as much")
    assert c.depends_on == "container: holds for vector, fails for list, holds for deque"


def test_containers_zero_strings_claim_depends_once_one_cell_holds_more():
    # GIVEN list with std::allocator, edited to keep 8 MiB more with all-zero strings
    data = stored("containers")
    shift(data, "list", "std", "zero", "rss_out", 8 * MIB)
    c = claim(containers, data, "all-zero strings")
    assert c.verdict == DEPENDS and c.depends_on == "container and allocator: more for list/std"


def test_containers_deque_overhead_holds_at_the_scaled_30_mb():
    # GIVEN deque's in-scope RSS raised by the write-up's 30 MiB scaled to N = 200,000
    data = stored("containers")
    shift(data, "deque", "std", "random", "rss_in", 6 * MIB)
    c = claim(containers, data, "compared with vector, deque")
    assert c.verdict == HOLDS and "deque - vector = 6.3 MiB" in c.evidence


def test_containers_list_growth_under_jemalloc_is_undecided_in_a_run_shorter_than_its_decay():
    # GIVEN the stored quick run: the list grew under every malloc, jemalloc's in under a second
    data = stored("containers")
    c = claim(containers, data, "with the default allocator a list")
    # THEN jemalloc's is undecided, which the claim says, and why
    assert c.verdict == DEPENDS and "undecided in a short run under jemalloc" in c.depends_on
    assert "shorter than jemalloc's 10 s decay" in c.evidence
    # WHEN its run had lasted longer than the decay, the growth would decide: it holds
    for r in data["runs"]:
        if r.get("ok") and r["container"] == "list" and r["config"] == "jemalloc":
            r["seconds"] = 60.0
    assert claim(containers, data, "with the default allocator a list").verdict == HOLDS


def test_containers_list_growth_fails_once_every_malloc_gives_back():
    # GIVEN every list under std::allocator edited to give back all it held
    data = stored("containers")
    for r in data["runs"]:
        if r.get("ok") and r["container"] == "list" and r["alloc"] == "std":
            for p in r["points"]:
                p["rss_out"] = r["baseline_rss"]
    assert claim(containers, data, "with the default allocator a list").verdict == FAILS


# ---------------------------------------------------------------- perl

def test_perl_figures_of_the_stored_run():
    data = stored("perl")
    p = data["probe"]
    assert p["boundary"] == perl.KIB128 - 25 == perl.predicted_boundary(perl.GLIBC64)
    probes = [t for t in perl.tables(data) if t.title.startswith("boundary probes")][0]
    assert probes.note.startswith("located boundary: 131,047 characters (128 KiB - 25)")
    c = claim(perl, data, "blocks of 128 KiB and more")
    assert "round(s) 2, 4, 6 kept it" in c.evidence
    keys = claim(perl, data, "hash keys shared")
    assert "glibc 59.5 vs 75.8 MB (21% less, 85 B per key)" in keys.evidence


def test_perl_boundary_claim_holds_at_the_write_ups_boundary():
    data = stored("perl")
    data["probe"]["boundary"] = perl.WRITEUP_BOUNDARY
    assert claim(perl, data, "the boundary is at").verdict == HOLDS


def test_perl_threshold_claim_holds_when_every_repeated_round_goes_back():
    # GIVEN the repeated probe under glibc edited so every round gave its array back
    data = stored("perl")
    for r in data["repeat"]["configs"]["glibc"]["rounds"]:
        r["after"]["rss"] = r["before"]["rss"]
    c = claim(perl, data, "blocks of 128 KiB and more")
    assert c.verdict == HOLDS and "round(s)" not in c.evidence


def test_perl_allocators_claim_holds_when_the_others_keep_nothing():
    # GIVEN jemalloc and mimalloc edited to keep nothing after cases 2 and 6
    data = stored("perl")
    for name in ("jemalloc", "mimalloc"):
        for case in ("2", "6"):
            r = common.config(data, name)["cases"][case]
            r["after"]["rss"] = r["before"]["rss"]
    c = claim(perl, data, "other allocators return")
    assert c.verdict == HOLDS and c.depends_on == ""


def test_perl_a_configuration_that_did_not_run_is_a_table_of_its_own():
    data = stored("perl")
    m = common.config(data, "mimalloc")
    m["error"], m["cases"] = "mimalloc library is missing", {}
    titles = [t.title for t in perl.tables(data)]
    assert "mimalloc: not run" in titles
    kept = perl.charts(data)[1]
    assert [s["name"] for s in kept["series"]] == ["glibc", "glibc-mmap128k", "jemalloc",
                                                   "jemalloc-eager"]


# ---------------------------------------------------------------- remedies

def set_kept(data: dict, name: str, share_of_default: float) -> None:
    """Edits every run of one row to keep this share of its pattern's default RSS."""
    pattern = name.split("/")[0]
    base = remedies.kept(common.config(data, f"{pattern}/glibc"))
    for r in common.config(data, name)["runs"]:
        r["rss_after"] = r["rss_trim"] = int(base * share_of_default)


def test_remedies_thresholds_and_claim_ids_are_what_the_rules_import():
    assert (remedies.LOWERS, remedies.DOES_NOT_LOWER) == (0.30, 0.10)
    assert list(remedies.CLAIM_IDS) == [
        "threads-jemalloc-eager", "threads-malloc-trim", "threads-glibc-tunables",
        "pymalloc-python-malloc", "pymalloc-jemalloc-eager", "pymalloc-malloc-trim"]
    data = stored("remedies")
    # each id names the claim of that text, in the order claims() gives them
    assert [c.text for c in remedies.claims(data)] == list(remedies.CLAIM_IDS.values())
    for cid, text in remedies.CLAIM_IDS.items():
        assert remedies.claim_by_id(data, cid).text == text


def test_remedies_a_remedy_that_lowers_the_rss_less_than_30_percent_fails():
    # GIVEN jemalloc-eager edited to keep 71% of glibc's RSS (29% less), and 70% (30% less)
    data = stored("remedies")
    set_kept(data, "threads/jemalloc-eager", 0.71)
    c = claim(remedies, data, "threads keeping a few long-lived blocks: jemalloc")
    assert c.verdict == FAILS and "29% less" in c.evidence and "at least 30%" in c.evidence
    set_kept(data, "threads/jemalloc-eager", 0.70)
    assert claim(remedies, data, "threads keeping a few long-lived blocks: jemalloc").verdict == HOLDS


def test_remedies_a_tunable_that_lowers_it_by_30_percent_makes_the_claim_depend_on_it():
    data = stored("remedies")
    set_kept(data, "threads/glibc-arena2", 0.6)
    c = claim(remedies, data, "threads keeping a few long-lived blocks: MALLOC_ARENA_MAX=2")
    assert c.verdict == DEPENDS and "MALLOC_ARENA_MAX=2" in c.depends_on
    for name in ("threads/glibc-trim128k", "threads/glibc-mmap128k"):
        set_kept(data, name, 0.5)
    c = claim(remedies, data, "threads keeping a few long-lived blocks: MALLOC_ARENA_MAX=2")
    assert c.verdict == FAILS and c.depends_on == ""


def test_remedies_python_malloc_lowering_it_by_10_percent_fails_the_does_not_claim():
    data = stored("remedies")
    set_kept(data, "pymalloc/python-malloc", 0.95)
    assert claim(remedies, data, "pymalloc arenas pinned by survivors: PYTHONMALLOC=malloc "
                                 "alone").verdict == HOLDS
    set_kept(data, "pymalloc/python-malloc", 0.9)
    c = claim(remedies, data, "pymalloc arenas pinned by survivors: PYTHONMALLOC=malloc alone")
    assert c.verdict == FAILS and "10% less" in c.evidence


def test_remedies_a_missing_library_is_an_error_row_and_its_claims_depend():
    # GIVEN jemalloc's library missing: both jemalloc rows could not run
    data = stored("remedies")
    for name in ("threads/jemalloc-eager", "pymalloc/python-malloc-jemalloc-eager"):
        e = common.config(data, name)
        e["errors"], e["runs"] = ["jemalloc library /usr/lib/libjemalloc.so.2 is missing"], []
    # THEN each table has the row, with the error; the chart leaves it out
    for t in remedies.tables(data):
        (row,) = [r for r in t.rows if "jemalloc" in r[0]]
        assert row[1] == "error: jemalloc library /usr/lib/libjemalloc.so.2 is missing"
        assert row[2:] == ["n/a"] * 3 and "errors: " in t.note
    assert all("jemalloc" not in cat for ch in remedies.charts(data)
               for cat in ch["x"]["categories"])
    # and the jemalloc claims depend on a run of it, the others still hold
    verdicts = {cid: remedies.claim_by_id(data, cid) for cid in remedies.CLAIM_IDS}
    for cid in ("threads-jemalloc-eager", "pymalloc-jemalloc-eager"):
        assert verdicts[cid].verdict == DEPENDS and "jemalloc" in verdicts[cid].depends_on
        assert "is missing" in verdicts[cid].evidence
    assert [v.verdict for cid, v in verdicts.items() if "jemalloc" not in cid] == [HOLDS] * 4


# ---------------------------------------------------------------- common

def test_errors_note_reads_both_entry_shapes():
    data = {"configs": [
        {"name": "a", "error": "library missing", "runs": {}},
        {"name": "b", "error": None, "runs": {"descending": {"error": "exited with 1"},
                                              "ascending": {"error": None}}},
        {"name": "c", "errors": ["10 MiB: timed out", "asked for x"], "runs": []},
        {"name": "d", "errors": [], "runs": {"4x30": {"arenas": 5}}}]}
    assert common.errors_note(data) == ("errors: a: library missing; b (descending): exited "
                                        "with 1; c: 10 MiB: timed out; c: asked for x")
    assert common.errors_note({"configs": [data["configs"][3]]}) == ""
    err = common.nothing_ran(data, "thing")
    assert isinstance(err, HeapsightError)
    assert err.message == ("no thing ran: a: library missing; b: exited with 1; c: 10 MiB: "
                           "timed out, asked for x; d: no output")


def test_verdicts_and_the_bound_claim():
    assert common.verdict_of([True, True]) == HOLDS
    assert common.verdict_of([False]) == FAILS
    assert common.verdict_of([True, False]) == DEPENDS
    assert common.verdict_of([]) == DEPENDS
    assert common.verdict_split(["a"], []) == HOLDS
    assert common.verdict_split([], ["b"]) == FAILS
    make = common.claim_for("a write-up")
    c = make("text", FAILS, "figures", "ignored unless it depends")
    assert (c.source, c.verdict, c.depends_on) == ("a write-up", FAILS, "")
    assert make("text", DEPENDS, "figures", "the order").depends_on == "the order"


def test_size_helpers():
    assert [common.size_label(n) for n in (2 * KB, 200 * KB, 2 * MB, 2048 * MB, 100)] == [
        "2 KiB", "200 KiB", "2 MiB", "2 GiB", "100 B"]
    assert common.mib(1536 * MIB) == "1,536.0 MiB" and common.in_mib(MIB // 2) == "0.5"


# ---------------------------------------------------------------- the terminal, 80 columns

LAB_LINES = 250      # all of `heapsight lab --quick` at 80 columns (issue 38)
COMMAND_LINES = 12   # what the command adds to the experiments' own: a line as each starts,
#                      the claims' tally, and where the tables whole and the evidence are


def rendered(monkeypatch, width: int, verbose: bool = False) -> str:
    """The six stored experiments as `heapsight lab` prints them, at this width."""
    import io

    from heapsight.reporters import terminal
    monkeypatch.setenv("COLUMNS", str(width))
    buf = io.StringIO()
    for name in lab.NAMES:
        terminal.render_lab(experiment(name), buf, verbose=verbose)
    return buf.getvalue()


@pytest.mark.parametrize("verbose", [False, True])
def test_every_experiment_fits_80_columns_and_every_table_stays_a_table(monkeypatch, verbose):
    from heapsight.reporters import terminal
    # GIVEN every stored experiment, its key rows (or with --verbose all of it), at 80 columns
    text = rendered(monkeypatch, 80, verbose)
    # THEN no line is wider (claims, titles and notes wrap; tables fit or are redrawn)
    assert [x for x in text.splitlines() if len(x) > 80] == []
    # and no table is stacked one value a line: each is drawn as grids (as it is, with its
    # unit in the title, transposed or split), with a header, a rule and rows
    for name in lab.NAMES:
        for t in experiment(name)["tables"]:
            title, grids, how = terminal.lab_table_lines(t, 80)
            assert how != "stacked" and grids, (name, t["title"])
            for g in grids:
                rule = next(i for i, x in enumerate(g) if set(x.strip()) == {"-"})
                assert 0 < rule < len(g) - 1, (name, t["title"])
    # and without --verbose it all stays within the lab's line budget, the command's own
    # lines beside it; every claim is there with its verdict
    if not verbose:
        assert len(text.splitlines()) <= LAB_LINES - COMMAND_LINES
    n = sum(len(experiment(name)["claims"]) for name in lab.NAMES)
    assert sum(text.count(f"[{v}") for v in ("HOLDS", "FAILS", "DEPENDS")) == n


def test_release_reads_as_a_table_at_80_columns_without_repeating_its_unit():
    from heapsight.reporters import terminal
    # GIVEN the sweep's table in ascending order, seven configurations wide
    t = release.tables(stored("release"))[1].to_dict()
    lines = terminal.render_table(t, 80).splitlines()
    # THEN its unit is said once, in the title, and each block is one row of seven figures
    assert lines[0] == "RSS kept after free, ascending order (KiB)"
    row = next(x for x in lines if x.startswith("  2 MiB "))
    assert row.split() == ["2", "MiB", "0", "0", "0", "2,048", "2,048", "2,048", "0"]
    assert not any(" 0 KiB" in x or "2,048 KiB" in x for x in lines)


def test_a_wide_table_is_transposed_or_split_never_cropped():
    from heapsight.reporters import terminal
    # GIVEN a table of three rows and nine wide columns
    t = {"title": "t", "columns": ["config"] + [f"size {i}" for i in range(9)],
         "rows": [[f"cfg{r}"] + [f"{r * 10**6 + i:,} KiB" for i in range(9)] for r in range(3)]}
    # WHEN it is drawn at 80 columns: transposed (a row per size) since it fits so
    title, grids, how = terminal.lab_table_lines(t, 80)
    assert (how, title, len(grids)) == ("transposed", "t (KiB)", 1)
    assert grids[0][0].split() == ["config", "cfg0", "cfg1", "cfg2"]
    # and with forty rows, as two or more grids that each repeat the label column, every
    # figure in one of them
    t["rows"] = [[f"cfg{r}"] + [f"{r * 10**6 + i:,} KiB" for i in range(9)] for r in range(40)]
    title, grids, how = terminal.lab_table_lines(t, 80)
    assert how == "split" and len(grids) >= 2
    assert all(g[0].split()[0] == "config" and max(map(len, g)) <= 80 for g in grids)
    cells = " ".join(" ".join(g) for g in grids).split()
    assert all(f"{r * 10**6 + i:,}" in cells for r in range(40) for i in range(9))


def test_the_terminal_keeps_each_experiment_to_a_screen_and_names_what_it_left_out(monkeypatch):
    from heapsight.reporters import terminal
    # GIVEN each experiment as the lab prints it at 80 columns, without --verbose
    text = " ".join(rendered(monkeypatch, 80).split())
    for name in lab.NAMES:
        one = one_experiment(monkeypatch, name)
        # THEN it takes a screen at most, unless its claims alone take more
        claims = one[one.index("claims:"):]
        assert len(one) <= max(terminal.LAB_SCREEN_LINES, len(claims) + 4), (name, len(one))
    # waste's table of 47 block sizes does not fit beside its claims: it is named
    assert "tables (--verbose, the page): waste % by block size" in text
    # and with --verbose, every row of every table and each claim's whole evidence
    full = " ".join(rendered(monkeypatch, 80, verbose=True).split())
    assert "1..48 B" in full and "1..48 B" not in text
    tunables = release.claims(stored("release"))[1]
    assert tunables.figure in text and tunables.evidence not in text
    assert " ".join(tunables.evidence.split()) in full


def one_experiment(monkeypatch, name: str) -> list:
    """One stored experiment as the lab prints it at 80 columns, as lines."""
    import io

    from heapsight.reporters import terminal
    monkeypatch.setenv("COLUMNS", "80")
    buf = io.StringIO()
    terminal.render_lab(experiment(name), buf)
    return buf.getvalue().strip("\n").splitlines()


def test_the_progress_line_gives_up_its_middle_to_fit():
    from heapsight.commands.lab import estimate
    from heapsight.fmt import middle_cut
    line = ("containers [13/21]: glibc, vector<string> with std::allocator, random strings, heap "
            "shifted by 16 B, N=200,000, 14 values of k")
    cut = middle_cut(line, 64)
    assert len(cut) == 64 and cut.startswith("containers [13/21]: glibc") and "..." in cut
    assert cut.endswith("14 values of k")
    assert middle_cut("short", 64) == "short"
    # and the estimate at the start is the experiments' QUICK_SECONDS, summed
    quick = sum(lab.experiment(n).QUICK_SECONDS for n in lab.NAMES)
    assert estimate(list(lab.NAMES), True) == f"about {quick} s"
    assert estimate(list(lab.NAMES), False).endswith(" min")
