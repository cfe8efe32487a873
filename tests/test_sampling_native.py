"""Sampled call sites, as the library writes them: programs run under LD_PRELOAD with a
segment of their own, the profile read raw from the segment (the layout of heapsight.h).
The truth comes from hs-sampling, which writes every block it allocated (address, usable
bytes, freed or not), and from the symbol tables of the programs."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np
import pytest

from heapsight import layout as L
from heapsight.live import segment as S
from heapsight.native import LIB, program

BLOCK_DTYPE = np.dtype([("addr", "<u8"), ("usable", "<u8"), ("freed", "<u8")])
PERL_HASH = "my %h; $h{$_} = [$_, \"v$_\"] for 1..200000;"


@dataclass
class Profile:
    head: np.ndarray
    events: np.ndarray
    words: np.ndarray
    modules: np.ndarray
    seg_head: np.ndarray

    def stack(self, offset: int) -> list:
        n = int(self.words[offset])
        return [int(a) for a in self.words[offset + 1:offset + 1 + n]]

    def allocs(self) -> np.ndarray:
        return np.nonzero(self.events["kind"] == L.EVENT_ALLOC)[0]

    def module_of(self, addr: int, event: int):
        """The module holding addr for this event: the latest recorded before it."""
        best = None
        for m in self.modules:
            if int(m["lo"]) <= addr < int(m["hi"]) and int(m["first_event"]) <= event:
                if best is None or int(m["first_event"]) >= int(best["first_event"]):
                    best = m
        return best


def read_profile(path: str) -> Profile:
    with open(path, "rb") as f:
        raw = np.frombuffer(f.read(), np.uint8)
    b = L.PROFILE_OFFSET
    head = raw[b:b + L.PROFILE_HEADER_DTYPE.itemsize].view(L.PROFILE_HEADER_DTYPE)[0]
    n = min(int(head["events_used"]), L.PROFILE_EVENTS)
    e0 = b + L.PROFILE_EVENTS_OFFSET
    events = raw[e0:e0 + n * L.EVENT_DTYPE.itemsize].view(L.EVENT_DTYPE)
    w0 = b + L.PROFILE_STACKS_OFFSET
    words = raw[w0:w0 + int(head["stack_words_used"]) * 8].view("<u8")
    m0 = b + L.PROFILE_MODULES_OFFSET
    modules = raw[m0:m0 + int(head["modules_used"]) * L.MODULE_DTYPE.itemsize].view(L.MODULE_DTYPE)
    seg_head = raw[:L.HEADER_DTYPE.itemsize].view(L.HEADER_DTYPE)[0]
    return Profile(head, events, words, modules, seg_head)


def run_sampled(argv, sample_bytes, tmp_path, env=None, timeout=120):
    """Runs argv preloaded, with a segment; (completed process, profile)."""
    seg = S.Segment()
    try:
        e = {**os.environ, "LD_PRELOAD": LIB, "HEAPSIGHT_SEGMENT": seg.path,
             "HEAPSIGHT_SAMPLE_BYTES": str(sample_bytes), **(env or {})}
        p = subprocess.run(argv, env=e, capture_output=True, text=True, timeout=timeout,
                           cwd=tmp_path)
        return p, read_profile(seg.path)
    finally:
        seg.close()


def symbols(path: str) -> dict:
    """name -> (start, end) of the functions of an ELF file that nm can name (its symbol
    table, else its dynamic one: installed programs are stripped)."""
    if not shutil.which("nm"):
        pytest.skip("nm (binutils) is needed to read the programs' symbols")
    syms = {}
    for extra in ([], ["-D"]):
        out = subprocess.run(["nm", "-S", "--defined-only", *extra, path],
                             capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[2] in "tTwW":
                start, size = int(parts[0], 16), int(parts[1], 16)
                syms.setdefault(parts[3], (start, start + size))
    return syms


def function_at(prof: Profile, addr: int, event: int, path: str, syms: dict):
    """The function of `path` a return address lies in (its call instruction), or None."""
    m = prof.module_of(addr - 1, event)
    if m is None or os.path.realpath(bytes(m["path"]).split(b"\0")[0].decode()) != os.path.realpath(path):
        return None
    vaddr = addr - 1 - int(m["bias"])
    for name, (lo, hi) in syms.items():
        if lo <= vaddr < hi:
            return name
    return None


def sampling_run(tmp_path, *args, sample_bytes=524288, env=None):
    out = tmp_path / "blocks.bin"
    exe = program("hs-sampling")
    p, prof = run_sampled([exe, "--out", str(out), *args], sample_bytes, tmp_path, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    blocks = np.fromfile(out, BLOCK_DTYPE) if out.exists() else np.zeros(0, BLOCK_DTYPE)
    return exe, prof, blocks


def matched_samples(prof: Profile, blocks: np.ndarray, exe: str) -> dict:
    """ALLOC event index -> block index, for the samples of the program's own blocks: same
    address and usable size, the innermost frame in one of its sampling_* functions."""
    syms = symbols(exe)
    by_addr = {int(a): i for i, a in enumerate(blocks["addr"])}
    got = {}
    for i in prof.allocs():
        ev = prof.events[i]
        k = by_addr.get(int(ev["addr"]))
        if k is None or int(ev["size"]) != int(blocks["usable"][k]):
            continue
        frames = prof.stack(int(ev["stack"]))
        if frames and (function_at(prof, frames[0], i, exe, syms) or "").startswith("sampling_"):
            got[int(i)] = k
    return got


def horvitz_thompson(sizes, mean):
    """Estimated bytes from sampled sizes, p = 1 - exp(-s/M)."""
    s = np.asarray(sizes, dtype=np.float64)
    return float(np.sum(s / -np.expm1(-s / mean)))


def ht_sigma(all_sizes, mean):
    """Standard deviation of that estimate over the whole population (exact)."""
    s = np.asarray(all_sizes, dtype=np.float64)
    p = -np.expm1(-s / mean)
    return math.sqrt(float(np.sum(s * s * (1 - p) / p)))


def check_events_consistent(prof: Profile):
    """Every claimed event is published; a FREE names an earlier ALLOC, never twice."""
    kinds = prof.events["kind"]
    assert np.isin(kinds, [L.EVENT_ALLOC, L.EVENT_FREE]).all()
    freed = set()
    for i in np.nonzero(kinds == L.EVENT_FREE)[0]:
        j = int(prof.events["addr"][i])
        assert j < i and kinds[j] == L.EVENT_ALLOC, (i, j)
        assert j not in freed
        freed.add(j)
    return freed


def test_sampled_bytes_estimate_the_known_volume_and_frees_match(tmp_path):
    # GIVEN 4 threads allocating 80,000 blocks of 64 B, 4000 B and 200 KiB from known
    # functions, all live together, then main frees every other one
    exe, prof, blocks = sampling_run(tmp_path, "--threads", "4", "--blocks", "20000")
    mean = 524288
    assert int(prof.head["magic"]) == L.PROFILE_MAGIC and int(prof.head["mean_bytes"]) == mean
    assert int(prof.head["dropped_samples"]) == 0
    samples = matched_samples(prof, blocks, exe)
    # THEN the Horvitz-Thompson estimate of the blocks' usable bytes is within 4 sigma of
    # the truth, for all of them and for each size
    sizes = blocks["usable"].astype(np.float64)
    est = horvitz_thompson([prof.events["size"][i] for i in samples], mean)
    sigma = ht_sigma(sizes, mean)
    assert abs(est - sizes.sum()) <= 4 * sigma, (est, sizes.sum(), sigma)
    assert sigma < 0.05 * sizes.sum()  # the bound says something
    for usable in np.unique(blocks["usable"]):
        these = [i for i, k in samples.items() if blocks["usable"][k] == usable]
        truth = blocks["usable"][blocks["usable"] == usable].astype(np.float64)
        e = horvitz_thompson([float(usable)] * len(these), mean)
        assert abs(e - truth.sum()) <= 4 * ht_sigma(truth, mean) + 1, (usable, e, truth.sum())
    # AND every FREE names an ALLOC; a sampled block has a FREE exactly when it was freed
    freed = check_events_consistent(prof)
    assert samples
    for i, k in samples.items():
        assert (i in freed) == bool(blocks["freed"][k]), (i, k)
    # AND the innermost frame is the function that allocated, the next one the thread's
    syms = symbols(exe)
    want = {64: "sampling_small", 4000: "sampling_mid", 200 * 1024: "sampling_big"}
    for i, k in samples.items():
        frames = prof.stack(int(prof.events["stack"][i]))
        names = [function_at(prof, a, i, exe, syms) for a in frames[:2]]
        usable = int(blocks["usable"][k])
        requested = min(want, key=lambda r: abs(usable - r) if usable >= r else 1 << 40)
        assert names == [want[requested], "worker"], (names, usable)
    # AND the unwinder's cost was recorded
    assert int(prof.head["unwinds"]) >= len(samples)
    assert int(prof.head["unwind_frames"]) >= 3 * int(prof.head["unwinds"])
    assert int(prof.head["unwind_ns"]) > 0


def test_every_frame_lies_in_a_module_recorded_before_its_event(tmp_path):
    exe, prof, _ = sampling_run(tmp_path, "--threads", "2", "--blocks", "10000",
                                sample_bytes=65536)
    paths = {os.path.realpath(bytes(m["path"]).split(b"\0")[0].decode()) for m in prof.modules}
    assert os.path.realpath(exe) in paths
    assert any("libc.so" in p for p in paths)
    allocs = prof.allocs()
    assert len(allocs) > 100
    for i in allocs:
        for a in prof.stack(int(prof.events["stack"][i])):
            assert prof.module_of(a - 1, int(i)) is not None, (i, hex(a))


def test_perl_without_frame_pointers_gives_deep_stacks(tmp_path):
    perl = shutil.which("perl")
    if not perl:
        pytest.skip("perl is not installed")
    perl = os.path.realpath(perl)
    syms = symbols(perl)
    if "perl_run" not in syms:
        pytest.skip(f"{perl} exports no perl_run symbol to check the stacks against")
    # GIVEN perl building a hash (Debian's perl: no frame pointers; the interpreter is
    # linked into /usr/bin/perl itself)
    p, prof = run_sampled([perl, "-e", PERL_HASH], 65536, tmp_path)
    assert p.returncode == 0, p.stderr
    allocs = prof.allocs()
    assert len(allocs) > 50
    depths = [len(prof.stack(int(prof.events["stack"][i]))) for i in allocs]
    # THEN stacks are deeper than a few frames, and they pass through perl_run in perl's
    # executable down to libc's start-up code
    assert np.median(depths) >= 6, depths[:20]
    through_run = 0
    for i in allocs:
        # (the Perl program's own frames, tagged words in place of the runops loop, are
        # tests/test_interp_frames.py's: the native ones are checked here)
        frames = [a for a in prof.stack(int(prof.events["stack"][i])) if not a >> 63]
        names = [function_at(prof, a, int(i), perl, syms) for a in frames]
        libs = [bytes(prof.module_of(a - 1, int(i))["path"]) for a in frames]
        if "perl_run" in names and any(b"libc.so" in m for m in libs):
            through_run += 1
    assert through_run >= 0.8 * len(allocs), (through_run, len(allocs))


def test_sampling_off_writes_nothing(tmp_path):
    exe, prof, blocks = sampling_run(tmp_path, "--threads", "2", "--blocks", "5000",
                                     sample_bytes=0)
    assert len(blocks) == 10000
    assert int(prof.head["magic"]) == L.PROFILE_MAGIC
    assert int(prof.head["mean_bytes"]) == 0
    for field in ("events_used", "stack_words_used", "modules_used", "dropped_samples", "unwinds"):
        assert int(prof.head[field]) == 0, field
    # the counters still counted
    assert int(prof.seg_head["slots_used"]) >= 1


def test_a_forked_child_does_not_write_into_the_parents_profile(tmp_path):
    # GIVEN a parent that forks after its threads; the child frees all blocks of its copy
    # and allocates 140 MB of 7000 B blocks (about 270 samples at the default mean)
    exe, prof, blocks = sampling_run(tmp_path, "--threads", "2", "--blocks", "20000",
                                     "--fork", "1")
    assert int(prof.seg_head["forks"]) == 1
    samples = matched_samples(prof, blocks, exe)
    assert samples
    syms = symbols(exe)
    # THEN the parent's profile has no sample from the child's function, and no FREE of a
    # block only the child freed
    freed = check_events_consistent(prof)
    assert not any(i in freed for i in samples)
    for i in prof.allocs():
        frames = prof.stack(int(prof.events["stack"][i]))
        names = {function_at(prof, a, int(i), exe, syms) for a in frames}
        assert "sampling_in_child" not in names


def test_many_threads_past_the_slots_are_sampled_alike(tmp_path):
    # GIVEN 300 threads alive at once (45 have no slot of their own and share one)
    exe, prof, blocks = sampling_run(tmp_path, "--threads", "300", "--blocks", "1000",
                                     sample_bytes=131072)
    assert int(prof.seg_head["slot_overflows"]) > 0
    mean = 131072
    samples = matched_samples(prof, blocks, exe)
    sizes = blocks["usable"].astype(np.float64)
    est = horvitz_thompson([prof.events["size"][i] for i in samples], mean)
    assert abs(est - sizes.sum()) <= 4 * ht_sigma(sizes, mean), (est, sizes.sum())
    freed = check_events_consistent(prof)
    for i, k in samples.items():
        assert (i in freed) == bool(blocks["freed"][k])


def test_the_profile_starts_over_when_the_owner_execs(tmp_path):
    # GIVEN a program that allocates 4000 B and 200 KiB blocks, then execs itself into one
    # that allocates 20,000 blocks of 3000 B
    exe = program("hs-sampling")
    p, prof = run_sampled([exe, "--threads", "2", "--blocks", "20000", "--exec", "1"],
                          524288, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "exec=2" in p.stdout
    assert int(prof.seg_head["execs"]) == 1
    assert int(prof.head["magic"]) == L.PROFILE_MAGIC
    # THEN only the second image's blocks are in the profile, with their stacks
    syms = symbols(exe)
    allocs = prof.allocs()
    assert len(allocs) > 20
    sizes = set(int(s) for s in prof.events["size"][allocs])
    assert not sizes & {4008, 200 * 1024 + 4096 - 16, 208880}
    names = set()
    for i in allocs:
        frames = prof.stack(int(prof.events["stack"][i]))
        if frames:
            names.add(function_at(prof, frames[0], int(i), exe, syms))
    assert "sampling_after_exec" in names and "sampling_mid" not in names
    check_events_consistent(prof)


def test_a_full_profile_drops_samples_but_still_records_every_free(tmp_path):
    # GIVEN 1.2 million 64 B blocks sampled at a mean of 64 B (two in three are sampled:
    # more ALLOC and FREE events than the profile holds), half of them freed
    exe, prof, blocks = sampling_run(tmp_path, "--threads", "2", "--blocks", "600000",
                                     "--small", "1", sample_bytes=64)
    # THEN the library counted what it could not record, and wrote no more than fits
    assert int(prof.head["dropped_samples"]) > 0
    assert int(prof.head["events_used"]) <= L.PROFILE_EVENTS
    kinds = prof.events["kind"]
    assert np.isin(kinds, [L.EVENT_ALLOC, L.EVENT_FREE]).all()
    # AND every recorded sample of a freed block has its FREE (room was kept for it), and
    # no FREE names anything but an earlier ALLOC
    allocs = np.flatnonzero(kinds == L.EVENT_ALLOC)
    frees = np.flatnonzero(kinds == L.EVENT_FREE)
    target = prof.events["addr"][frees].astype(np.int64)
    assert (target < frees).all() and (kinds[target] == L.EVENT_ALLOC).all()
    assert len(np.unique(target)) == len(target)
    order = np.argsort(blocks["addr"])
    addrs = blocks["addr"][order]
    pos = np.searchsorted(addrs, prof.events["addr"][allocs])
    pos = np.minimum(pos, len(addrs) - 1)
    ours = addrs[pos] == prof.events["addr"][allocs]
    assert ours.sum() > 0.5 * L.PROFILE_EVENTS / 2
    was_freed = blocks["freed"][order][pos[ours]].astype(bool)
    has_free = np.isin(allocs[ours], target)
    assert (has_free == was_freed).all()
