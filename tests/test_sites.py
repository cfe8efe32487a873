"""Sampled call sites: the profile read from the segment, the estimates and their error,
and `heapsight run` naming the functions that hold known shares of hs-sites' memory at the
peak, at its snapshots and of what it never frees."""

from __future__ import annotations

import gzip
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from heapsight import profile as P
from heapsight import record, sites, symbolize
from heapsight import layout as L
from heapsight.live import segment as S
from heapsight.errors import HeapsightError

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


# ------------------------------------------------------------ a profile written here

def write_profile(seg: S.Segment, mean: int, events: list, stacks: list, modules: list,
                  dropped: int = 0) -> None:
    """Writes hs_profile_t into a segment as the library would. events: (kind, addr, size,
    time_ns, stack number or None); stacks: lists of return addresses; modules: (lo, hi,
    bias, first_event, path)."""
    fd = os.open(seg.path, os.O_RDWR)
    m = mmap.mmap(fd, L.SEGMENT_BYTES)
    os.close(fd)
    words, offsets = [0], []
    for st in stacks:
        offsets.append(len(words))
        words += [len(st), *st]
    ev = np.zeros(len(events), L.EVENT_DTYPE)
    for i, (kind, addr, size, t, st) in enumerate(events):
        ev[i] = (addr, size, t, offsets[st] if st is not None else 0, kind)
    md = np.zeros(len(modules), L.MODULE_DTYPE)
    for i, (lo, hi, bias, first, path) in enumerate(modules):
        md[i] = (lo, hi, bias, first, path.encode())
    w = np.array(words, "<u8")
    head = np.zeros((), L.PROFILE_HEADER_DTYPE)
    head["magic"], head["mean_bytes"], head["events_used"] = L.PROFILE_MAGIC, mean, len(events)
    head["stack_words_used"], head["modules_used"] = len(words), len(modules)
    head["dropped_samples"] = dropped
    for off, arr in ((L.PROFILE_EVENTS_OFFSET, ev), (L.PROFILE_STACKS_OFFSET, w),
                     (L.PROFILE_MODULES_OFFSET, md), (0, head)):   # the header last
        at = L.PROFILE_OFFSET + off
        m[at:at + arr.nbytes] = arr.tobytes()
    m.close()


def no_names(lookups):
    return symbolize.Result({k: symbolize.unknown(*k) for k in lookups}, "none")


def test_the_profile_skips_unpublished_events_and_folds_frees_into_their_block():
    seg = S.Segment()
    try:
        # GIVEN allocations, a free of the first, an event still EMPTY (a writer stopped
        # halfway), and frees naming an EMPTY event, a FREE event and no event at all
        ALLOC, FREE, EMPTY = L.EVENT_ALLOC, L.EVENT_FREE, L.EVENT_EMPTY
        write_profile(seg, 4096, [(ALLOC, 0x1000, 100, 10, 0), (ALLOC, 0x2000, 200, 20, 1),
                                  (EMPTY, 0x3000, 300, 25, 0), (FREE, 0, 0, 30, None),
                                  (FREE, 2, 0, 31, None), (FREE, 3, 0, 32, None),
                                  (FREE, 99, 0, 33, None)],
                      [[0x401000], [0x401010, 0x401020]], [(0x400000, 0x500000, 0x400000, 0, "/x")],
                      dropped=5)
        prof = seg.profile()
    finally:
        seg.close()
    # THEN the two published allocations, the first freed at 30, the rest ignored
    assert prof.allocs["index"].tolist() == [0, 1]
    assert prof.allocs["size"].tolist() == [100, 200]
    assert prof.allocs["free_ns"].tolist() == [30, P.NEVER]
    assert prof.frees_matched == 1 and prof.dropped == 5 and prof.mean_bytes == 4096
    assert prof.stack(int(prof.allocs["stack"][1])).tolist() == [0x401010, 0x401020]
    assert prof.modules[0].path == "/x"


def test_a_segment_without_a_profile_or_with_sampling_off_has_none():
    seg = S.Segment()
    try:
        assert seg.profile() is None          # the library never set it up
        write_profile(seg, 0, [], [], [])
        assert seg.profile() is None          # --sample-bytes 0
    finally:
        seg.close()


def test_a_module_reloaded_at_the_same_addresses_names_the_stacks_after_it():
    # GIVEN liba.so unloaded and libb.so loaded at its addresses from event 2 on
    allocs = np.zeros(2, P.ALLOC_DTYPE)
    allocs["index"], allocs["size"], allocs["stack"] = [0, 3], [64, 64], [1, 3]
    allocs["free_ns"] = P.NEVER
    words = np.array([0, 1, 0x7000_1000, 1, 0x7000_1000], dtype=np.uint64)
    mods = (P.Module(0x7000_0000, 0x7001_0000, 0x7000_0000, 0, "/liba.so"),
            P.Module(0x7000_0000, 0x7001_0000, 0x7000_0000, 2, "/libb.so"))
    prof = P.Profile(4096, allocs, 0, words, mods, 0)
    # THEN the stack first used at event 0 is liba's, the one first used at event 3 libb's
    st = sites.Stacks(prof, no_names)
    assert [st.frames[s[0]].object for s in st.stacks] == ["/liba.so", "/libb.so"]
    assert st.frames[0].address == 0x1000 - 1   # the call: the byte before the return address


def test_the_stacks_read_at_once_are_each_stacks_words_and_their_objects_found():
    # GIVEN a stack region with two stacks, and offsets that hold none: 0 (not unwound), one
    # past the region, one whose count runs past it, one whose count is no count at all
    words = np.array([0, 2, 0x7000_1000, 0x9000_0010, 1, 0x5000, 7, 2**63 + 5],
                     dtype=np.uint64)
    mods = (P.Module(0x9000_0000, 0x9001_0000, 0x9000_0000, 0, "/libc.so"),
            P.Module(0x4000, 0x6000, 0x4000, 0, "/prog"),
            P.Module(0x7000_0000, 0x7001_0000, 0x7000_0000, 0, "/liba.so"))
    prof = P.Profile(4096, np.zeros(0, P.ALLOC_DTYPE), 0, words, mods, 0)
    offsets = [1, 0, 4, 99, 6, 7]
    addrs, n = prof.stacks(offsets)
    # THEN each is what stack() reads, one after the other
    assert n.tolist() == [len(prof.stack(o)) for o in offsets] == [2, 0, 1, 0, 0, 0]
    assert addrs.tolist() == [0x7000_1000, 0x9000_0010, 0x5000]
    # and each address's object is the one that spans it, -1 outside every one
    found = prof.module_index(np.array([0x5000, 0x9000_0010, 0x7000_1000, 0x6000, 0x3fff],
                                       dtype=np.uint64), np.zeros(5, np.uint64))
    assert found.tolist() == [1, 0, 2, -1, -1]


def synthetic(sizes, mean, rng, stack_of, level=None):
    """A Profile of blocks sampled as the library samples them (Poisson by bytes); level:
    per block, the adaptive sampling's level (its mean is mean / 2^level)."""
    level = np.zeros(len(sizes), dtype=np.uint8) if level is None else level
    p = -np.expm1(-sizes.astype(float) / (mean / np.exp2(level.astype(float))))
    hit = rng.random(len(sizes)) < p
    allocs = np.zeros(int(hit.sum()), P.ALLOC_DTYPE)
    allocs["index"] = np.arange(len(allocs))
    allocs["level"] = level[hit]
    allocs["size"], allocs["time_ns"] = sizes[hit], 1
    allocs["stack"] = stack_of[hit] * 2 + 1
    allocs["free_ns"] = P.NEVER
    words = np.array([0, 1, 0x401000, 1, 0x402000], dtype=np.uint64)
    mods = (P.Module(0x400000, 0x500000, 0x400000, 0, "/prog"),)
    return P.Profile(mean, allocs, 0, words, mods, 0)


def test_the_estimates_are_unbiased_and_their_95_percent_interval_holds_95_percent():
    # GIVEN 40 MiB in blocks of 16 B to 64 KiB from two call sites (3:1 by bytes), sampled
    # 200 times over at a mean of 64 KiB
    rng = np.random.default_rng(7)
    sizes = rng.choice([16, 48, 200, 1000, 5000, 65536], size=60_000).astype(np.uint64)
    site = (rng.random(len(sizes)) < 0.25).astype(np.int64)
    truth = [int(sizes[site == s].sum()) for s in (0, 1)]
    inside, est = 0, []
    for _ in range(200):
        prof = synthetic(sizes, 65536, rng, site)
        st = sites.Stacks(prof, no_names)
        m = sites.estimate(prof, st, sites.Moment("exit", None, 1.0, int(sizes.sum())))
        got = {x["frame"]: x for x in m["sites"]}
        first = got[st.site_of[0]]
        inside += abs(first["bytes"] - truth[0]) <= first["error_bytes"]
        est.append(first["bytes"])
    # THEN the mean estimate is the truth within its own standard error, and the interval
    # covers the truth in about 95% of the runs (binomial: 190 +- 6)
    assert abs(np.mean(est) - truth[0]) < 3 * np.std(est) / np.sqrt(len(est))
    assert 180 <= inside <= 199, inside


def test_adaptive_sampling_stays_unbiased_and_its_interval_holds():
    # GIVEN the same 40 MiB, the first third of the blocks sampled at a mean 16 times finer
    # (4 KiB), the next third at 16 KiB, the rest at 64 KiB: adaptive sampling's levels
    rng = np.random.default_rng(11)
    sizes = rng.choice([16, 48, 200, 1000, 5000, 65536], size=60_000).astype(np.uint64)
    site = (rng.random(len(sizes)) < 0.25).astype(np.int64)
    level = np.repeat(np.array([4, 2, 0], dtype=np.uint8), 20_000)
    truth = [int(sizes[site == s].sum()) for s in (0, 1)]
    inside, est, err = 0, [], []
    for _ in range(200):
        prof = synthetic(sizes, 65536, rng, site, level)
        st = sites.Stacks(prof, no_names)
        m = sites.estimate(prof, st, sites.Moment("exit", None, 1.0, int(sizes.sum())))
        first = {x["frame"]: x for x in m["sites"]}[st.site_of[0]]
        inside += abs(first["bytes"] - truth[0]) <= first["error_bytes"]
        est.append(first["bytes"])
        err.append(first["error_bytes"])
    # THEN each sample weighted by its own level's probability: unbiased, and the 95%
    # interval covers the truth in about 95% of the runs; narrower than at 64 KiB alone
    assert abs(np.mean(est) - truth[0]) < 3 * np.std(est) / np.sqrt(len(est))
    assert 180 <= inside <= 199, inside
    fixed = [sites.estimate(p, sites.Stacks(p, no_names), sites.Moment("exit", None, 1.0, 1))
             for p in [synthetic(sizes, 65536, rng, site)]][0]
    assert np.mean(err) < 0.9 * max(x["error_bytes"] for x in fixed["sites"])


def test_a_samples_level_is_signed_a_mean_coarser_than_the_default_where_below_0():
    # GIVEN samples drawn at level 5 (the mean 16 KiB of 512 KiB) and at level -1 (1 MiB:
    # adaptive sampling goes past the mean where the profile's room runs low), bits 8-15
    seg = S.Segment()
    try:
        A = L.EVENT_ALLOC
        write_profile(seg, 524288, [(A | 5 << 8, 0x1000, 100, 10, 0),
                                    (A | 0xff << 8, 0x2000, 100, 20, 0)],
                      [[0x401000]], [(0x400000, 0x500000, 0x400000, 0, "/x")])
        prof = seg.profile()
    finally:
        seg.close()
    # THEN their means are 16 KiB and 1 MiB
    assert prof.allocs["level"].tolist() == [5, -1]
    assert prof.means().tolist() == [16384.0, 1048576.0]


def test_each_sites_floor_comes_from_the_means_its_own_samples_were_drawn_at():
    # GIVEN two sites each known by one block far above any mean (sampled for certain: no
    # variance of their own), one drawn at 16 KiB (level 5 of 512 KiB), one at 512 KiB
    rng = np.random.default_rng(3)
    sizes = np.full(2, 64 * MiB, dtype=np.uint64)
    prof = synthetic(sizes, 524288, rng, np.array([0, 1]), np.array([5, 0], dtype=np.uint8))
    st = sites.Stacks(prof, no_names)
    m = sites.estimate(prof, st, sites.Moment("peak", None, 0.0, int(sizes.sum())))
    # THEN each interval is what sampling could not see at its own mean: 3 x 16 KiB for the
    # first (it read 3 x 512 KiB, the run's coarsest, for every site)
    got = {x["frame"]: x["error_bytes"] for x in m["sites"]}
    assert got[st.site_of[0]] == 3 * 16384 and got[st.site_of[1]] == 3 * 524288
    # AND a site whose samples had several means: their harmonic mean weighted by the bytes
    # each stands for (1 MiB seen at 16 KiB, 3 MiB at 512 KiB: 4 MiB / (64 + 6))
    assert sites.site_mean(4 * MiB, MiB / 16384 + 3 * MiB / 524288, 524288) == 4 * MiB / 70
    assert sites.site_mean(0.0, 0.0, 524288) == 524288


def test_blocks_far_above_the_mean_are_counted_exactly():
    rng = np.random.default_rng(1)
    sizes = np.full(50, 64 * MiB // 50 * 40, dtype=np.uint64)   # 50 blocks of ~51 MiB
    prof = synthetic(sizes, 65536, rng, np.zeros(50, dtype=np.int64))
    st = sites.Stacks(prof, no_names)
    m = sites.estimate(prof, st, sites.Moment("peak", None, 0.0, int(sizes.sum())))
    assert m["samples"] == 50 and m["estimated_bytes"] == int(sizes.sum())
    assert m["sites"][0]["blocks"] == 50
    # the samples' own error is 0: the interval is what sampling cannot see, 3 means (small
    # blocks of the site's that none was sampled in)
    assert m["sites"][0]["error_bytes"] == 3 * 65536


def test_the_live_set_at_a_moment():
    allocs = np.zeros(3, P.ALLOC_DTYPE)
    allocs["time_ns"], allocs["free_ns"] = [10, 20, 40], [30, P.NEVER, P.NEVER]
    assert sites.live_mask(allocs, 25).tolist() == [True, True, False]
    assert sites.live_mask(allocs, 30).tolist() == [False, True, False]  # freed at 30: gone
    assert sites.live_mask(allocs, None).tolist() == [False, True, True]


def test_the_call_site_is_the_first_frame_outside_the_allocator_and_its_wrappers():
    F = symbolize.Frame
    wrapped = [F("malloc", None, None, "/lib/libc.so.6", 1), F("Perl_safesysmalloc", None, None, "/usr/bin/perl", 2),
               F("xmalloc", "x.c", 3, "/p", 3), F("operator new(unsigned long)", None, None, "/libstdc++.so.6", 4),
               F("std::__new_allocator<int>::allocate(unsigned long, void const*)", "a.h", 1, "/p", 5),
               F("PyMem_Malloc", None, None, "/usr/bin/python3.11", 6), F("_PyObject_GC_New", None, None, "/p", 7),
               F("sqlite3MemMalloc", None, None, "/usr/lib/libsqlite3.so.0", 8), F("g_malloc0", None, None, "/g", 9),
               F("hs_malloc", None, None, "/x/_lib/libheapsight.so", 10), F("strdup", None, None, "/lib/libc.so.6", 11)]
    for f in wrapped:
        assert sites.is_allocator(f), f
    for f in (F("load_rows", "sites.c", 38, "/p", 1), F(None, None, None, "/p", 1),
              F("Perl_sv_grow", None, None, "/usr/bin/perl", 1), F("mallocator_run", None, None, "/p", 1),
              F("PyList_Append", None, None, "/p", 1)):
        assert not sites.is_allocator(f), f


# ------------------------------------------------------------ real runs of hs-sites

@pytest.fixture(scope="module")
def sites_bin(tmp_path_factory):
    """hs-sites with its debug info (the installed copy is stripped), built with the
    scenarios' flags (-O2 -g)."""
    out = tmp_path_factory.mktemp("bin") / "hs-sites"
    subprocess.run(["cc", "-O2", "-g", "-Wall", "-Wextra", "-I", str(ROOT / "scenarios"), "-o",
                    str(out), str(ROOT / "scenarios" / "sites.c")], check=True, timeout=120)
    return str(out)


# 8 KiB: about 6,000 samples over hs-sites' 128 MiB (a few milliseconds of unwinding),
# which puts a share's 95% interval near half a point at the 96 MiB peak and near one point
# for the 34 MiB never freed (the default 512 KiB gives four to eight points: ample for a
# person reading the top sites, too loose to tell a misattribution of a few points).
SAMPLE = "8K"


def run(tmp, *command, opts=()):
    rec, js = tmp / "r.hsrun.json.gz", tmp / "s.json"
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "-o", str(rec), "--json",
                        str(js), *opts, "--", *command], capture_output=True, text=True,
                       cwd=tmp, timeout=180)
    assert p.returncode == 0, p.stderr
    truth = {}
    for line in p.stdout.splitlines():
        if line.startswith("sites:"):
            truth = {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    return json.loads(js.read_text()), p.stderr, truth, rec


@pytest.fixture(scope="module")
def hs_sites(tmp_path_factory, sites_bin):
    return run(tmp_path_factory.mktemp("run"), sites_bin, opts=["--sample-bytes", SAMPLE])


def by_function(moment: dict, frames: list) -> dict:
    """A moment's sites summed by function: {function: (share, variance of its bytes)}
    (the sites' variances add: their samples are independent)."""
    out = {}
    for s in moment["sites"]:
        fn = frames[s["frame"]]["function"] if s["frame"] is not None else None
        share, var = out.get(fn, (0.0, 0.0))
        out[fn] = (share + s["share"], var + (s["error_bytes"] / 1.96) ** 2)
    return out


def check_shares(moment, frames, truth: dict):
    """Each function's estimated share within four standard errors of its true share (one
    failure in 15,000 checks), the bound itself tight enough to mean something (under 5
    points). A share R = X / T is a ratio of two estimates from the same samples: its
    variance is ((1 - R)^2 Var X + R^2 Var(T - X)) / T^2 (the delta method). Half a point
    more allows for the exact denominator (the counters' live bytes) against the estimate's."""
    got = by_function(moment, frames)
    total = moment["estimated_bytes"]
    var_all = sum(v for _, v in got.values())
    for fn, true_bytes in truth.items():
        assert fn in got, (fn, sorted(map(str, got)))
        share, var = got[fn]
        sd = ((1 - share) ** 2 * var + share ** 2 * (var_all - var)) ** 0.5 / total
        bound = 4 * sd + 0.005
        assert bound < 0.05, (fn, bound)
        true_share = true_bytes / moment["live_bytes"]
        assert abs(share - true_share) <= bound, (fn, share, true_share, bound)


def test_the_three_functions_shares_at_the_peak(hs_sites):
    s, _, truth, _ = hs_sites
    sites_ = s["sites"]
    assert sites_["sample_bytes"] == 8 * 1024 and sites_["samples"] > 4000
    assert sites_["symbolizer"] == "llvm-symbolizer"
    peak = sites.moment(sites_, "peak")
    # the exact live bytes at the peak, and the estimate within its interval of them
    assert abs(peak["live_bytes"] - sum(truth[f] for f in ("load_rows", "build_index", "keep_cache"))) < MiB
    top3 = [sites_["frames"][x["frame"]]["function"] for x in peak["sites"][:3]]
    assert top3 == ["load_rows", "build_index", "keep_cache"]
    check_shares(peak, sites_["frames"], {f: truth[f] for f in ("load_rows", "build_index", "keep_cache")})
    # the site is the function's own line (sites.c), found past malloc in every stack
    assert peak["sites"][0]["site"].startswith("load_rows (sites.c:")


def test_what_was_never_freed_is_the_leaking_function_and_the_kept_cache(hs_sites):
    s, _, truth, _ = hs_sites
    never = sites.moment(s["sites"], "never freed")
    assert never["sites"][0]["site"].startswith("leak_names (sites.c:")
    check_shares(never, s["sites"]["frames"], {"leak_names": truth["exit_leak_names"],
                                               "keep_cache": truth["exit_keep_cache"]})
    assert sites.moment(s["sites"], "exit")["estimated_bytes"] == never["estimated_bytes"]


def test_each_snapshot_is_a_moment_with_its_own_live_set(hs_sites):
    s, _, truth, _ = hs_sites
    names = [m["name"] for m in s["sites"]["moments"]]
    assert names[:3] == ["peak", "exit", "never freed"]
    assert "snapshot: loaded" in names and "snapshot: freed" in names
    loaded = sites.moment(s["sites"], "snapshot: loaded")
    check_shares(loaded, s["sites"]["frames"], {f: truth[f] for f in ("load_rows", "build_index", "keep_cache")})
    # after the frees only one cache block in 8 is left: keep_cache holds it all
    freed = sites.moment(s["sites"], "snapshot: freed")
    assert abs(freed["live_bytes"] - truth["exit_keep_cache"]) < 64 * 1024
    check_shares(freed, s["sites"]["frames"], {"keep_cache": truth["exit_keep_cache"]})
    snap_t = {x["label"]: x["at_s"] for x in s["snapshots"]}
    assert loaded["t_s"] == pytest.approx(snap_t["loaded"], abs=0.002)


def test_the_terminal_shows_the_top_sites_with_their_error_and_share(hs_sites):
    s, err, _, _ = hs_sites
    lines = err.splitlines()
    head = next(i for i, x in enumerate(lines) if x.strip().startswith("call sites at peak live"))
    rows = lines[head + 1:head + 4]
    for row, fn in zip(rows, ("load_rows", "build_index", "keep_cache")):
        assert fn in row and "\u00b1" in row and "%" in row, row
    assert any("estimated from" in x and "sampled blocks" in x for x in lines[head:head + 10])
    assert any(x.strip().startswith("call sites of the bytes never freed") for x in lines)
    # the width of a pipe (commands to copy are one line whatever their length)
    assert max(len(x) for x in lines if not x.strip().startswith("try:")) <= 100
    # and the finding about never-freed bytes names its sites, not other tools
    why = err[err.index("why, and what to try"):]
    finding = " ".join(why[why.index("kept until exit, still reachable\n"):].split())
    assert "Where it was allocated (estimated from" in finding
    assert "leak_names (sites.c:" in finding.split("* ", 1)[0]
    assert "heaptrack" not in err and "valgrind" not in err


def test_the_record_carries_the_sites_and_a_damaged_one_is_refused(hs_sites, tmp_path):
    s, _, _, rec = hs_sites
    doc = record.load(str(rec))
    assert doc["summary"]["sites"] == s["sites"]
    # an index past the frames is named, not a traceback in a reader
    i = next(i for i, st in enumerate(doc["summary"]["sites"]["stacks"]) if st)
    doc["summary"]["sites"]["stacks"][i][0] = len(s["sites"]["frames"]) + 5
    bad = tmp_path / "bad.hsrun.json.gz"
    bad.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(HeapsightError) as e:
        record.load(str(bad))
    assert f"summary.sites.stacks[{i}][0]" in e.value.message
    # a record from before sites (and heap maps) loads as it did
    del doc["summary"]["sites"], doc["summary"]["heapmaps"]
    old = tmp_path / "old.hsrun.json.gz"
    old.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert "sites" not in record.load(str(old))["summary"]


def test_sample_bytes_0_takes_no_samples(tmp_path, sites_bin, monkeypatch):
    from heapsight.live import measure
    seen, real_read = [], S.Segment.profile

    def read(seg):   # the profile's header in the file, as the run ends
        with open(seg.path, "rb") as f:
            f.seek(L.PROFILE_OFFSET)
            seen.append(f.read(L.PROFILE_HEADER_DTYPE.itemsize))
        return real_read(seg)
    monkeypatch.setattr(S.Segment, "profile", read)
    summary, _ = measure.measure([sites_bin], measure.Options(warn=False, sample_bytes=0,
                                                              stdout=subprocess.DEVNULL))
    assert summary.sites is None and summary.heap.n_alloc > 40_000
    # the segment was made without the profile's tables: nothing could be recorded
    assert seen == [b""]
    s, err, _, _ = run(tmp_path, sites_bin, opts=["--sample-bytes", "0"])
    assert s["sites"] is None and "call sites" not in err


def test_json_lists_every_site_and_the_terminal_the_top_five(tmp_path):
    # GIVEN python3 building a dict: many call sites in the interpreter
    s, err, _, _ = run(tmp_path, "/usr/bin/python3", "-c",
                       "d = {i: str(i) * 3 for i in range(300000)}; l = [[i] for i in range(100000)]",
                       opts=["--sample-bytes", "16K"])
    peak = sites.moment(s["sites"], "peak")
    assert len(peak["sites"]) > 5
    # every site is there: their shares (rounded to 4 decimals each) add up to 1
    assert sum(x["share"] for x in peak["sites"]) == pytest.approx(1.0, abs=len(peak["sites"]) * 5e-5)
    assert sum(x["bytes"] for x in peak["sites"]) == pytest.approx(peak["estimated_bytes"], abs=len(peak["sites"]))
    lines = err.splitlines()
    head = next(i for i, x in enumerate(lines) if x.strip().startswith("call sites at peak live"))
    end = next(i for i in range(head, len(lines)) if "sampled blocks" in lines[i])
    block = " ".join(x.strip() for x in lines[head + 1:end])   # a long name folds onto a next line
    for x in peak["sites"][:5]:
        assert x["site"][:20] in block, (x["site"], block)
    assert f"top 5 of {len(peak['sites'])}" in lines[head]
    assert sum(1 for x in lines[head + 1:end] if "\u00b1" in x) == 5


def test_sample_bytes_takes_sizes_and_refuses_what_the_library_would_ignore(tmp_path, sites_bin):
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "--no-save", "--sample-bytes",
                        "10", "--", sites_bin], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--sample-bytes 10: give 0 (off) or a size from 64" in p.stderr
    assert "sites:" not in p.stdout   # refused before the program ran
    s, _, _, _ = run(tmp_path, sites_bin, "--mb", "16", opts=["--sample-bytes", "1.5M"])
    assert s["sites"]["sample_bytes"] == 1536 * 1024


def test_the_never_freed_finding_names_its_sites_and_asks_for_more_samples_when_few():
    from heapsight import analysis
    m = {"name": "never freed", "samples": 3,
         "sites": [{"site": f"f{i} (x.c:{i})", "bytes": (5 - i) << 20, "error_bytes": 1 << 19}
                   for i in range(5)]}
    text, tries = analysis.where_allocated({"sample_bytes": 524288, "moments": [m]}, "./x")
    assert "estimated from 3 sampled blocks): f0 (x.c:0) 5.0 MiB \u00b1512.0 KiB; f1" in text
    assert "and 2 more call site(s)" in text
    assert tries == ("heapsight run --sample-bytes 64K -- ./x",)
    m["samples"] = 300
    assert analysis.where_allocated({"sample_bytes": 524288, "moments": [m]}, "./x")[1] == ()
    # no sites (sampling off): the tools that find them
    assert analysis.where_allocated(None, "./x")[1][0] == "heaptrack ./x"


def test_live_blocks_for_the_pinners_index_the_same_stacks_and_name_the_same_sites():
    # GIVEN blocks from two stacks (malloc <- parse, and parse <- main), one freed at 30
    allocs = np.zeros(3, P.ALLOC_DTYPE)
    allocs["index"], allocs["addr"], allocs["size"] = [0, 1, 2], [0x1000, 0x2000, 0x3000], [64, 640, 64]
    allocs["time_ns"], allocs["free_ns"] = [10, 20, 40], [30, P.NEVER, P.NEVER]
    allocs["stack"] = [4, 1, 4]
    words = np.array([0, 2, 0x402000, 0x403000, 2, 0x403000, 0x401000], dtype=np.uint64)
    prof = P.Profile(4096, allocs, 1, words, (P.Module(0x400000, 0x500000, 0x400000, 0, "/p"),), 0)

    def names(lookups):
        fn = {0x401fff: "malloc", 0x402fff: "parse", 0x400fff: "main"}
        return symbolize.Result({k: [symbolize.Frame(fn.get(k[1] + 0x400000), None, None, k[0], k[1])]
                                 for k in lookups}, "test")
    built = sites.build(prof, [sites.Moment("exit", None, 1.0, 0)], symbolizer=names)
    blocks = sites.live_blocks(prof, 35)
    # THEN the blocks live at 35, their probability, and stacks as build() numbers them
    assert blocks["addr"].tolist() == [0x2000]
    assert blocks["p"][0] == pytest.approx(1 - np.exp(-640 / 4096))
    st = int(blocks["stack"][0])
    assert sites.site_of_stack(built, st) == "parse (p)"
    exit_sites = {built["stacks"][x["stack"]][0]: x for x in built["moments"][0]["stacks"]}
    assert len(exit_sites) == 2


# ------------------------------------------------------------ heap maps and their pinners

def test_each_snapshot_and_the_exit_have_a_heap_map_whose_pinners_are_named(hs_sites):
    s, err, truth, _ = hs_sites
    maps = s["heapmaps"]
    assert [m["moment"] for m in maps] == ["snapshot: loaded", "snapshot: freed", "exit"]
    assert all(m["status"] == "mapped" for m in maps), [m["status"] for m in maps]
    snap_t = {x["label"]: x["at_s"] for x in s["snapshots"]}
    # each taken while the program waits in heapsight_snapshot(): after its snapshot and
    # before the program's next step (the next snapshot, its exit), however loaded the
    # machine (a fixed 0.1 s failed beside a busy loop: 0.102 s)
    ends = [snap_t["freed"], maps[2]["t_s"]]
    for m, until in zip(maps[:2], ends):
        assert 0 <= m["t_s"] - snap_t[m["moment"].split(": ")[1]] and m["t_s"] <= until, (
            m["t_s"], snap_t, until)
    # at "loaded" everything is live: a release gives back little; at "freed" most of the
    # heap is free and the one cache block in 8 still live pins pages of it
    assert maps[0]["release_measured_bytes"] < 0.05 * truth["load_rows"]
    freed = maps[1]
    assert freed["release_measured_bytes"] > 8 * MiB
    assert freed["pinners"] and freed["pinners"][0]["site"].startswith("keep_cache (sites.c:")
    assert record.load(str(hs_sites[3]))["summary"]["heapmaps"] == maps


@pytest.fixture(scope="module")
def pin_bin(tmp_path_factory):
    out = tmp_path_factory.mktemp("pin") / "hs-pin"
    subprocess.run(["cc", "-O2", "-g", "-Wall", "-Wextra", "-pthread", "-I", str(ROOT / "scenarios"),
                    "-o", str(out), str(ROOT / "scenarios" / "pin.c")], check=True, timeout=120)
    return str(out)


def test_the_pinners_of_a_freed_heap_are_its_keepers_with_the_bytes_they_pin(tmp_path, pin_bin):
    # GIVEN hs-pin: 32 MiB freed but for one small keeper block per 16 KiB, each at the
    # start of its page; sampled at 64 bytes (every keeper is sampled with p = 0.53: the
    # estimate's error is a few percent)
    s, err, _, _ = run(tmp_path, pin_bin, "--mib", "32", "--every", "16384",
                       opts=["--sample-bytes", "64"])
    (m,) = [m for m in s["heapmaps"] if m["moment"] == "exit"]
    pins = m["pinners"]
    line = source_line_of(ROOT / "scenarios" / "pin.c", "void *keeper(size_t bytes)") + 2
    assert pins[0]["site"] == f"keeper (pin.c:{line})", pins[:2]
    # THEN the pinned pages' free bytes are the keepers' (each pins its page but for the
    # bytes it holds), within the estimate's error
    page = m["page_bytes"]
    pinned_pages = sum(a["pinned_pages"] for a in m["arenas"])
    keepers = 32 * MiB // 16384
    assert abs(pinned_pages - keepers) <= keepers * 0.02
    truth = pinned_pages * (page - 48)          # a 40-byte keeper: a 48-byte chunk
    assert abs(pins[0]["pinned_bytes"] - truth) <= 2 * pins[0]["error_bytes"] + 0.02 * truth
    assert abs(pins[0]["blocks"] - keepers) <= 0.15 * keepers and pins[0]["block_bytes"] == 40
    # and the terminal names them under the map
    text = " ".join(err.split())
    assert f"pinned at exit: {pinned_pages * page / MiB:.1f} MiB of heap pages" in text
    assert f"keeper (pin.c:{line})" in text.split("pinned at exit:", 1)[1]


def source_line_of(path: Path, needle: str) -> int:
    return next(i for i, t in enumerate(path.read_text().splitlines(), 1) if needle in t)


def test_no_heap_map_takes_none(tmp_path, sites_bin):
    s, err, _, _ = run(tmp_path, sites_bin, "--mb", "16", opts=["--no-heap-map"])
    assert s["heapmaps"] == [] and "pinned at" not in err
