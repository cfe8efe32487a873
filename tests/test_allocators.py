"""`heapsight run` over the other allocators `heapsight compare` uses: jemalloc, tcmalloc,
mimalloc (preloaded after libheapsight.so, as `LD_PRELOAD=lib heapsight run -- CMD` does)
and the page-per-allocation mmap baseline. Each is recognised, its own statistics reach
the run, the statistics thread never allocates, and the release at exit does what that
allocator does."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import scenario
from heapsight import allocators, record
from heapsight.native import BIN, lib_path

MiB = 1024 * 1024
KiB = 1024
SYSTEM_LIBS = Path("/usr/lib/x86_64-linux-gnu")
ALLOCATOR_LIBS = {
    "jemalloc": SYSTEM_LIBS / "libjemalloc.so.2",
    "tcmalloc": SYSTEM_LIBS / "libtcmalloc_minimal.so.4",
    "mimalloc": SYSTEM_LIBS / "libmimalloc.so.2",
    "mmap": Path(lib_path("libheapsight_mmap.so")),
}
MMAP_HEADER_BYTES = 16


def allocator_lib(name: str) -> str:
    lib = ALLOCATOR_LIBS[name]
    if not lib.exists():
        pytest.fail(f"{lib} is missing: `make test` installs the allocators (scripts/install-deps)")
    return str(lib)


def run_retention(hs, tmp_path, allocator, *args, env=None):
    """hs-retention under `allocator`; returns the result, its summary and its timeline."""
    r = hs(scenario("hs-retention"), *args, opts=["--stats-hz", "50"],
           env={"LD_PRELOAD": allocator_lib(allocator), **(env or {})})
    assert r.rc == 0, r.stderr
    s = r.summary
    saved = tmp_path / f"heapsight-hs-retention.{s['started_pid']}.hsrun.json.gz"
    timeline = record.load(str(saved))["timeline"]
    check_common(r, s, timeline, allocator)
    return r, s, timeline


def check_common(r, s, timeline, allocator):
    h, truth = s["heap"], r.truth("retention")
    assert h["allocator"] == allocator
    # the library's exit thread never allocated while calling the allocator's API
    assert h["helper_mallocs"] == 0
    # live bytes at exit are the kept blocks (plus the runtime's few: libstdc++'s 71 KiB
    # emergency pool comes with tcmalloc, which links libstdc++)
    live = h["live_requested_bytes"]
    assert int(truth["live_bytes"]) <= live <= int(truth["live_bytes"]) * 1.01 + 64 * KiB
    # what the allocator mapped arrived in the timeline, read from outside (the mappings it
    # made); its own statistics at exit
    assert any(x for x in timeline["alloc_mapped"] if x), "no allocator statistics"
    # the release at exit ran and is named for the allocator
    assert s["release"]["measured"]
    assert s["release"]["call"] == allocators.release_call(allocator)
    # the breakdown adds up to the RSS
    f = s["final"]
    parts = f["live_bytes"] + f["waste_bytes"] + f["metadata_bytes"] + f["retained_bytes"] + f["non_heap_bytes"]
    assert parts - f["untouched_bytes"] == f["rss_bytes"]


def last(values):
    return [x for x in values if x is not None][-1]


def test_jemalloc_purge_gives_back_the_dirty_pages(hs, tmp_path):
    # decay off: what jemalloc returns by itself before the exit depends on timing (it made
    # the verdict flip between RETENTION and FRAGMENTATION); the purge at exit does not
    r, s, tl = run_retention(hs, tmp_path, "jemalloc",
                             env={"MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"})
    h, f, rel = s["heap"], s["final"], s["release"]
    # what jemalloc held at exit is retention (bounded by stats.mapped at exit: the figure
    # arrived), and arena.4096.purge gives the dirty pages back: what is left is the slabs
    # the kept blocks pin (one 4 KiB slab each) and jemalloc's metadata. The verdict is
    # retention, or fragmentation when those two, which a purge cannot return, come to
    # more than half of what it kept: they lie close to half here (on a loaded machine the
    # program's own pauses stretch, and a hold while it runs may come first)
    kinds = [x["kind"] for x in s["findings"]]
    assert {"retention", "fragmentation"} & set(kinds[:2]), s["verdict"]
    assert kinds[0] in ("retention", "fragmentation", "hold"), s["verdict"]
    assert f["retained_bytes"] >= 16 * MiB
    assert rel["gave_back_bytes"] >= 8 * MiB
    assert rel["gave_back_bytes"] <= f["retained_bytes"] + MiB
    assert rel["rss_after_bytes"] <= 0.25 * s["peak_rss_bytes"]
    assert h["arenas"] >= 2  # arenas jemalloc initialised for the 8 threads
    # jemalloc maps its heaps itself: the terminal tells them as where the bytes above are,
    # not as memory mapped outside malloc (the same bytes twice, in two words)
    assert "jemalloc's heaps (its own mappings, which hold the live" in r.stderr, r.stderr
    assert "mapped outside malloc: jemalloc" not in r.stderr


@pytest.mark.parametrize("allocator,figure", [
    ("jemalloc", "jemalloc's stats.metadata"),
    ("tcmalloc", "tcmalloc's metadata (generic.total_physical_bytes less its page heap)")])
def test_the_metadata_at_exit_is_the_allocators_own_figure(hs, tmp_path, allocator, figure):
    # GIVEN hs-retention under another allocator, its figures at exit saved in the record
    r, s, _ = run_retention(hs, tmp_path, allocator)
    saved = tmp_path / f"heapsight-hs-retention.{s['started_pid']}.hsrun.json.gz"
    raw = record.load(str(saved))["capture"]["segment"]["alloc_stats"]["exit_stats_before"]["raw"]
    f, rel = s["final"], s["release"]
    # THEN the metadata row at exit is the allocator's own figure (0 before: neither keeps
    # a header per block), at most what its pages can hold beside what its release returned
    assert s["heap"]["metadata_figure"] == figure
    assert 256 * KiB <= f["metadata_bytes"] <= raw[5]
    assert f["metadata_bytes"] == raw[5] or f["retained_bytes"] == rel["gave_back_bytes"]
    # AND no byte is told twice: what a release gave back is retained, and the parts still
    # add up to RSS
    assert f["retained_bytes"] >= rel["gave_back_bytes"]
    parts = ("live_bytes", "waste_bytes", "metadata_bytes", "retained_bytes", "non_heap_bytes")
    assert abs(sum(f[k] for k in parts) - f["rss_bytes"]) <= f["untouched_bytes"] + 4096
    # AND the terminal says whose figure it is and when it was read
    assert f"allocator metadata at exit: {figure}" in " ".join(r.stderr.split())


MI_VERSION_SHIM = "int mi_version(void) { return 301; }\n"


def test_the_allocators_version_is_read_and_an_unknown_one_said(hs, tmp_path):
    # GIVEN the allocators as Debian ships them: each gives its version, and it is one
    # heapsight reads (no note)
    for allocator, version in (("jemalloc", "5.3.0"), ("tcmalloc", "gperftools 2.10"),
                               ("mimalloc", "2.0.9")):
        r = hs("true", env={"LD_PRELOAD": allocator_lib(allocator)})
        h = r.summary["heap"]
        assert h["allocator_version"].startswith(version) and h["version_note"] == "", h
        assert f"{allocator} {version}" in " ".join(r.stderr.split())
    # WHEN mimalloc says it is 3.0.1 (a shim ahead of it answers mi_version)
    shim = tmp_path / "shim.so"
    (tmp_path / "shim.c").write_text(MI_VERSION_SHIM)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "shim.c")], check=True)
    r = hs(scenario("hs-retention"), env={"LD_PRELOAD": f"{shim} {allocator_lib('mimalloc')}"})
    h = r.summary["heap"]
    # THEN the figures are still given, and what depends on the version is said
    assert h["allocator_version"] == "3.0.1" and h["live_blocks"] > 0
    assert h["version_note"].startswith("mimalloc 3.0.1 is not a version heapsight knows (2.0)")
    assert "note: mimalloc 3.0.1 is not a version heapsight knows" in " ".join(r.stderr.split())


def test_tcmalloc_release_free_memory_returns_the_page_heap(hs, tmp_path):
    r, s, tl = run_retention(hs, tmp_path, "tcmalloc")
    f, rel = s["final"], s["release"]
    # tcmalloc keeps the freed spans in its page heap: retention (bounded by
    # generic.heap_size at exit: the figure arrived), and
    # MallocExtension_ReleaseFreeMemory() returns most of it
    assert s["verdict"].startswith("RETENTION"), s["verdict"]
    assert f["retained_bytes"] >= 200 * MiB
    assert rel["gave_back_bytes"] >= 0.75 * f["retained_bytes"]
    assert rel["rss_after_bytes"] <= 64 * MiB


def test_mimalloc_pages_pinned_by_one_live_block_stay(hs, tmp_path):
    r, s, tl = run_retention(hs, tmp_path, "mimalloc")
    f, rel = s["final"], s["release"]
    # no call into mimalloc while the program ran (its statistics take its locks): no
    # in-use reading in the timeline; what it mapped was read from outside
    assert all(x is None for x in tl["alloc_in_use"]) and any(tl["alloc_mapped"])
    # 1 KiB blocks live in 64 KiB pages and every 64th block was kept: each page still
    # holds one, so mi_collect(true) has no empty page to give back: fragmentation
    assert f["retained_bytes"] >= 200 * MiB
    assert rel["gave_back_bytes"] <= 0.1 * f["retained_bytes"]
    assert s["verdict"].startswith("FRAGMENTATION"), s["verdict"]
    # (the exit's heap map: a live block in each of mimalloc's 64 KiB pages keeps them)
    (hm,) = [m for m in s["heapmaps"] if m["moment"] == "exit"]
    assert sum(a["interleaved_bytes"] for a in hm["arenas"]) >= 0.5 * f["retained_bytes"]


def test_mimalloc_keeping_what_other_threads_freed_is_retention_not_fragmentation(hs, tmp_path):
    # GIVEN every block freed by the 8 threads, which then end: nothing is live, and the
    # release at exit (mi_collect on the exiting thread) cannot reach their pages
    r, s, _ = run_retention(hs, tmp_path, "mimalloc", "--keep-every", "1000000000")
    f, rel = s["final"], s["release"]
    assert f["retained_bytes"] >= 200 * MiB and rel["gave_back_bytes"] <= 0.1 * f["retained_bytes"]
    # THEN the exit's heap map finds no live block keeping that memory: the verdict is
    # retention (it said fragmentation: "the free space is interleaved with live blocks")
    (hm,) = [m for m in s["heapmaps"] if m["moment"] == "exit"]
    assert sum(a["interleaved_bytes"] for a in hm["arenas"]) < MiB, hm["arenas"]
    assert s["verdict"].startswith("RETENTION"), s["verdict"]
    kept = next(x for x in s["findings"] if x["kind"] == "retention")
    assert "not fragmentation" in kept["detail"], kept["detail"]
    # AND mimalloc's own setting, applied, gives it back
    assert any("MIMALLOC_DECOMMIT_DELAY=0" in x for x in kept["suggestions"]), kept["suggestions"]
    _, s2, _ = run_retention(hs, tmp_path, "mimalloc", "--keep-every", "1000000000",
                             env={"MIMALLOC_DECOMMIT_DELAY": "0"})
    assert s2["final"]["retained_bytes"] <= 0.1 * f["retained_bytes"], s2["final"]


def test_mimalloc_collect_returns_empty_segments(hs, tmp_path):
    # GIVEN every block freed, and the program waits past mimalloc's 500 ms
    # segment_decommit_delay (mi_collect does not cut it short)
    r, s, tl = run_retention(hs, tmp_path, "mimalloc", "--keep-every", "1000000000",
                             "--hold-ms", "1000")
    f, rel = s["final"], s["release"]
    # THEN mi_collect(true) gives back nearly all of it
    assert f["retained_bytes"] >= 200 * MiB
    assert rel["gave_back_bytes"] >= 0.9 * f["retained_bytes"]
    assert s["verdict"].startswith("RETENTION"), s["verdict"]


def test_mmap_baseline_retains_nothing_and_costs_a_page_per_block(hs, tmp_path):
    r, s, tl = run_retention(hs, tmp_path, "mmap", "--mb", "64")
    h, f, rel = s["heap"], s["final"], s["release"]
    truth = r.truth("retention")
    blocks, kept = int(truth["blocks"]), int(truth["kept"])
    # the price: every 1 KiB block had a 4 KiB page of its own at the peak
    assert s["peak_rss_bytes"] >= 0.9 * blocks * 4096
    # nothing freed stays: no retention, nothing for a release to do
    assert f["retained_bytes"] <= 64 * KiB
    assert rel["gave_back_bytes"] <= 256 * KiB
    assert f["rss_bytes"] <= 0.1 * s["peak_rss_bytes"]
    # the kept blocks' pages show up as rounding waste, the 16-byte headers as metadata
    assert f["waste_bytes"] == pytest.approx(kept * (4096 - MMAP_HEADER_BYTES - 1024), rel=0.02, abs=64 * KiB)
    assert f["metadata_bytes"] == MMAP_HEADER_BYTES * h["live_blocks"]
    # what it mapped, read from outside while it ran (the mappings it made: a page or more
    # for each block at the peak); hs-test-mmap-alloc checks its own counters
    mapped = [m for m in tl["alloc_mapped"] if m]
    assert mapped and 0.9 * blocks * 4096 <= max(mapped) <= 1.2 * blocks * 4096 + 4 * MiB


def test_mmap_allocator_correctness(hs):
    # The C test links libheapsight_mmap.so (its malloc answers every call): alone, and
    # with libheapsight.so in front forwarding to it.
    prog = os.path.join(BIN, "hs-test-mmap-alloc")
    assert os.path.exists(prog), f"{prog} is missing: the build did not install it"
    p = subprocess.run([str(prog)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"(\d+) passed, 0 failed", p.stdout)
    assert m and int(m.group(1)) >= 100, p.stdout
    r = hs(str(prog))
    assert r.rc == 0, r.stdout + r.stderr
    assert f"{m.group(1)} passed, 0 failed" in r.stdout
    assert r.summary["heap"]["allocator"] == "mmap"
    assert r.summary["heap"]["helper_mallocs"] == 0
    assert r.summary["final"]["retained_bytes"] <= 64 * KiB


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc", "mimalloc"])
def test_entry_points_the_allocator_lacks_do_not_reach_glibc(hs, allocator):
    # jemalloc has no pvalloc, jemalloc and tcmalloc no reallocarray: found in glibc, their
    # blocks would reach the allocator's free (jemalloc alone crashes on pvalloc + free).
    code = ("import ctypes; c = ctypes.CDLL(None); c.pvalloc.restype = c.reallocarray.restype = "
            "ctypes.c_void_p\nfor i in range(100):\n"
            "    p = c.pvalloc(100 + i); c.free(ctypes.c_void_p(p))\n"
            "    q = c.reallocarray(None, 10, 10 + i); c.free(ctypes.c_void_p(q))\nprint('ok')")
    r = hs(sys.executable, "-c", code, env={"LD_PRELOAD": allocator_lib(allocator)})
    assert r.rc == 0, r.stderr
    assert "ok" in r.stdout
    assert r.summary["heap"]["allocator"] == allocator


def test_the_record_of_block_starts_is_heapsights_memory_not_the_programs(hs, tmp_path):
    # GIVEN 512 MiB in 64-byte blocks under jemalloc: the record of where each block starts
    # (a bit per 8 bytes: 8 MiB of bitmap) against a run without it (--no-heap-map)
    env = {"LD_PRELOAD": allocator_lib("jemalloc")}
    argv = [scenario("hs-retention"), "--mb", "512", "--block", "64"]
    with_record = hs(*argv, env=env)
    without = hs(*argv, env=env, opts=["--no-heap-map"])
    for r in (with_record, without):
        assert r.rc == 0, r.stderr
    a, b = with_record.summary, without.summary
    # THEN the bitmap is counted as heapsight's own memory, and left out of the program's:
    # its non-heap memory at the peak is the same with and without it
    assert a["heapsight_rss_bytes"] - b["heapsight_rss_bytes"] >= 7 * MiB, \
        (a["heapsight_rss_bytes"], b["heapsight_rss_bytes"])
    assert abs(a["peak"]["non_heap_bytes"] - b["peak"]["non_heap_bytes"]) < 2 * MiB


@pytest.mark.parametrize("allocator,mechanism,setting", [
    ("jemalloc", "dirty_decay_ms", "MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0"),
    ("tcmalloc", "page heap", "TCMALLOC_AGGRESSIVE_DECOMMIT=true"),
])
def test_why_it_stayed_names_the_allocators_mechanism_and_its_setting_gives_it_back(
        hs, tmp_path, allocator, mechanism, setting):
    # GIVEN the retention scenario under another allocator than glibc
    r, s, _ = run_retention(hs, tmp_path, allocator)
    kept = next(f for f in s["findings"] if f["kind"] in ("retention", "fragmentation"))
    # THEN the finding says why this allocator kept it, and what to try is its own setting
    # and release call (glibc's malloc_trim is not offered)
    assert mechanism in kept["detail"], kept["detail"]
    assert any(setting in x for x in kept["suggestions"]), kept["suggestions"]
    assert not any("malloc_trim" in x for x in kept["suggestions"]), kept["suggestions"]
    # AND the setting, applied to the program, returns at least half of what the copy's
    # release measured at exit
    name, value = setting.split("=", 1)
    r2, s2, _ = run_retention(hs, tmp_path, allocator, env={name: value})
    gave = s["release"]["gave_back_bytes"]
    assert gave > 8 * MiB, s["release"]
    lowered = s["final"]["retained_bytes"] - s2["final"]["retained_bytes"]
    assert lowered >= 0.5 * gave, (lowered, gave)


@pytest.mark.parametrize("allocator", ["jemalloc", "mimalloc"])
def test_the_allocators_heaps_are_named_as_its_own_not_glibcs_arenas(hs, tmp_path, allocator):
    # GIVEN hs-retention (8 threads) under an allocator whose heaps are 64 MiB-aligned
    # mappings with address space reserved after them, as glibc's thread arenas are
    r, s, _ = run_retention(hs, tmp_path, allocator)
    # THEN no mapping is called glibc's thread arena, in the summary or the terminal ...
    for kinds in (s["resident_by_kind"], s["resident_by_kind_peak"]):
        assert kinds and kinds["arena"] == 0, kinds
    lines = [x for x in r.stderr.splitlines() if "by mapping" in x]
    assert lines and not any("thread arenas" in x for x in lines), lines
    # ... and the mappings line names the allocator's heaps where it read them: the same
    # bytes as the line that says what they hold, not told again as "other anonymous"
    text = " ".join(r.stderr.split())
    # (the reading is near peak RSS when one came within a tenth of it, else "the last
    # reading ... before peak RSS": this peak lasts some 40 ms under jemalloc)
    m = re.search(rf"by mapping [^:]*: .*?{allocator}'s heaps ([0-9.]+ [KMG]iB)", text)
    assert m, text[:2000]
    held = re.search(rf"{allocator}'s heaps \(its own mappings, which hold [^)]*\): ([0-9.]+ [KMG]iB)",
                     text)
    assert held, text[:2000]
    # ... and they are the anonymous memory the program has, the aligned ones among them:
    # a heap at a 64 MiB-aligned address was left out of the allocator's and read as "other
    # anonymous" (mimalloc: 16.5 of its 66 MiB at one reading)
    own = next(o for o in s["mapped_by"] if o["owner"] == f"{allocator}'s own heaps")
    anon = s["resident_by_kind_peak"]["anon"]
    assert own["resident_peak_at_s"] == s["resident_by_kind_peak"]["at_s"]
    assert own["resident_peak_bytes"] >= 0.8 * anon, (own, s["resident_by_kind_peak"])


@pytest.mark.parametrize("allocator", ["jemalloc", "mimalloc"])
def test_a_metadata_figure_the_allocator_does_not_give_is_not_shown_as_none(hs, tmp_path, allocator):
    # GIVEN a run under an allocator that gives its metadata at exit only (jemalloc) or not
    # at all (mimalloc 2.0)
    r, s, _ = run_retention(hs, tmp_path, allocator)
    row = next(x for x in r.stderr.splitlines() if x.strip().startswith("allocator metadata "))
    cells = row.split("allocator metadata", 1)[1].split()
    # THEN where it gave none the row says "-", never "0 B" (which reads as none), and why
    assert "0" not in cells and "-" in cells, row
    if allocator == "mimalloc":
        assert set(cells) == {"-"}, row
        assert "mimalloc gives no figure of its own" in " ".join(r.stderr.split())
    else:   # its own figure at exit, the last column ("5.2 MiB 28%")
        assert cells[-2] in ("KiB", "MiB"), row
        assert "jemalloc's stats.metadata, which it gives at exit only" in " ".join(r.stderr.split())


@pytest.mark.parametrize("allocator", ["jemalloc", "mimalloc"])
def test_the_allocators_own_mappings_are_not_told_again_as_mapped_outside_malloc(hs, tmp_path,
                                                                                 allocator):
    # GIVEN a C program that maps nothing itself, under an allocator that maps its heaps
    # with mmap (the library records every mmap, by the stack that made it)
    r, s, _ = run_retention(hs, tmp_path, allocator)
    # THEN those mappings are the allocator's heaps (in the split, by the call sites that
    # allocated in them), not memory "mapped for" the program's code beside malloc: the
    # worker's 256 MiB were listed there again
    sites = (s.get("mapped_sites") or {}).get("moments") or []
    named = [x["site"] for m in sites for x in m["sites"]]
    assert not any(n.startswith("worker") for n in named), named
    assert "mapped for (at" not in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("allocator,part", [
    ("jemalloc", "dirty pages"), ("tcmalloc", "free pages in its page heap")])
def test_what_stayed_is_told_in_the_allocators_words_and_its_release_returns_it(
        hs, tmp_path, allocator, part):
    # GIVEN the retention scenario, jemalloc's decay off (what it returns by itself before
    # the exit depends on timing)
    r, s, _ = run_retention(hs, tmp_path, allocator,
                            env={"MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"})
    # THEN what it held free at exit is said in its own words, from its own statistics ...
    parts = dict(s["heap"]["kept_parts"])
    words = next(w for w in parts if w.startswith(part))
    assert f"retained at exit, in {allocator}'s words: " in " ".join(r.stderr.split())
    # ... and the part its release returns is what the release, measured in the copy at
    # the same moment, gave back (to 5%)
    gave = s["release"]["gave_back_bytes"]
    assert gave > 16 * MiB, s["release"]
    assert abs(parts[words] - gave) <= 0.05 * gave, (parts, gave)


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc", "mimalloc"])
def test_live_bytes_are_the_allocators_usable_sizes_after_a_churn_of_every_kind(hs, allocator):
    # GIVEN two threads that each make 150,000 blocks of 1 to 20,000 bytes by malloc,
    # calloc and realloc (one in three each, freeing what the slot held), and keep their
    # rings live; the program sums malloc_usable_size over what it keeps. The hooks take an
    # allocation's usable size from its request's class (the allocator asked once a class)
    # and a free's and a realloc's from the allocator: a class told wrong would add up.
    env = {"LD_PRELOAD": allocator_lib(allocator)}
    over = {}
    for ops in (0, 300000):
        r = hs(scenario("hs-churn"), "--mix", "1", "--ops", str(ops), "--slots", "4096",
               "--threads", "2", env=env, timeout=120)
        assert r.rc == 0, r.stderr
        assert r.summary["heap"]["allocator"] == allocator
        over[ops] = r.summary["heap"]["live_usable_bytes"] - int(r.truth("churn")["live_usable"])
    # THEN the live usable bytes at exit are what the program keeps, to the byte, beside the
    # runtime's own blocks (the same with no churn: 4.6-87 KiB)
    assert 0 <= over[0] < 128 * KiB, over
    assert over[300000] == over[0], over
