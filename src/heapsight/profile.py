"""Sampled allocations, read side: hs_profile_t (native/include/heapsight.h) copied out of
a run's segment as numpy arrays, once the program has ended and before the segment file
is removed.

The library appends an ALLOC event for each sampled block (its usable size, time and
stack) and a FREE event naming the ALLOC event's index when that block is freed; events
are published by storing their kind last, so one still EMPTY (a thread stopped halfway,
a program killed) is skipped. Here the FREE events are folded into their ALLOC event's
free_ns, which is what every estimate needs (sites.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from heapsight import segment

# How the library unwinds (native/src/profile.c, unwind.c): reported beside its measured cost.
UNWINDER = "libgcc (_Unwind_Backtrace)"
CACHED = "unwind rules cached per return address"


def unwinder(prof: "Profile") -> str:
    """How this run's stacks were walked: from the rules cached per return address, with
    libgcc's walk for stacks through a frame those rules do not cover."""
    cached, total = int(prof.unwind.get("cached", 0)), int(prof.unwinds or 0)
    if not cached:
        return UNWINDER
    if cached >= total:
        return CACHED
    return f"{CACHED} ({cached:,} of {total:,} stacks; {UNWINDER} for the rest)"
# never freed (free_ns), and "applies to every event" (module lookups)
NEVER = np.iinfo(np.uint64).max

# The ALLOC events, one row each: its index among all events, the block, its usable
# size, when, its stack (word offset) and when it was freed (NEVER: not by the end).
# level: the sample was drawn at the mean mean_bytes / 2^level (adaptive sampling starts
# finer and coarsens with what is live, profile.c; a negative level is coarser than
# mean_bytes, where the profile's room ran low): its inclusion probability is
# 1 - exp(-size / that mean)
ALLOC_DTYPE = np.dtype([("index", "<u8"), ("addr", "<u8"), ("size", "<u8"),
                        ("time_ns", "<u8"), ("stack", "<u4"), ("free_ns", "<u8"),
                        ("level", "<i1")])


@dataclass(frozen=True)
class Module:
    """An object the stacks reach: its addresses [lo, hi), its load bias (address in the
    file = address - bias), and the first event it applies to (a later module may reuse
    the addresses of one unloaded before)."""
    lo: int
    hi: int
    bias: int
    first_event: int
    path: str


@dataclass
class Profile:
    mean_bytes: int          # the sampling mean M (HEAPSIGHT_SAMPLE_BYTES); adaptive: where
                             # the live set takes it at the most (means())
    allocs: np.ndarray       # ALLOC_DTYPE, in event order
    frees_matched: int       # FREE events that named a published ALLOC event
    stack_words: np.ndarray  # the stack region as written (uint64)
    modules: tuple           # Module, in the order recorded
    dropped: int             # samples the library could not record (a region was full)
    unwind_ns: int = 0
    unwinds: int = 0
    unwind_frames: int = 0
    # the MAP events (anonymous memory the program mapped itself, every mapping), in
    # ALLOC_DTYPE rows: size is the length mapped
    maps: np.ndarray = field(default_factory=lambda: np.zeros(0, ALLOC_DTYPE))
    # the interpreter's frames (native/src/interp.c): which interpreter (INTERP_*), whether
    # they were read (INTERP_STATUS), its version, and what reading them cost in all
    interp: dict = field(default_factory=dict)
    # the walks from cached unwind rules (native/src/unwind.c): "cached" stacks, and with
    # HEAPSIGHT_UNWIND_CHECK=1 "checked" against libgcc's walk and "mismatches"
    unwind: dict = field(default_factory=dict)

    def means(self, allocs: np.ndarray | None = None) -> np.ndarray:
        """The sampling mean each sampled block was drawn at (bytes, float)."""
        a = self.allocs if allocs is None else allocs
        return float(self.mean_bytes) / np.exp2(a["level"].astype(float))

    def mapped(self) -> "Profile | None":
        """The mappings as a profile of their own, every one "sampled" (a mean of one byte:
        p = 1), for sites.build; None when there are none."""
        if not len(self.maps):
            return None
        return Profile(1, self.maps, 0, self.stack_words, self.modules, 0, interp=self.interp,
                       unwind=self.unwind)

    def iframe(self, word: int) -> "IFrame | None":
        """The interpreter frame a tagged stack word names (its record in the stack
        region), or None when the word is no such frame or its record cannot be read."""
        return iframe(self.stack_words, word)

    def stack(self, offset: int) -> np.ndarray:
        """The return addresses of the stack at a word offset, innermost first; empty for
        offset 0 (unwinding failed) or an offset that does not hold a whole stack."""
        w = self.stack_words
        if offset <= 0 or offset >= len(w):
            return w[:0]
        n = int(w[offset])
        if n > S_MAX_FRAMES or offset + n >= len(w):
            return w[:0]
        return w[offset + 1:offset + 1 + n]

    def module_index(self, addrs: np.ndarray, events: np.ndarray) -> np.ndarray:
        """For each return address (with the index of an event whose stack holds it), the
        index in modules of the object it is in, -1 for none: the latest module recorded
        at or before that event that spans it, else any that spans it."""
        addrs = np.asarray(addrs, dtype=np.uint64)
        events = np.asarray(events, dtype=np.uint64)
        out = np.full(len(addrs), -1, dtype=np.int64)
        later = np.full(len(addrs), -1, dtype=np.int64)
        for i, m in enumerate(self.modules):   # recorded in order: later ones win
            inside = (addrs >= np.uint64(m.lo)) & (addrs < np.uint64(m.hi))
            out[inside & (events >= np.uint64(m.first_event))] = i
            later[inside & (later < 0)] = i
        return np.where(out >= 0, out, later)


S_MAX_FRAMES = 64   # HS_MAX_FRAMES

# An interpreter's frame in a stack (heapsight.h: HS_IFRAME_*): the word is TAG | kind << 56
# | the word offset of its record: MAGIC, three identifying words, line | name bytes << 32
# | file bytes << 48, then the name's UTF-8 bytes and the file's.
IFRAME_TAG = 1 << 63
IFRAME_MAGIC = 0x454d415246534823
IFRAME_OFFSET_MASK = (1 << 56) - 1
INTERP_NAMES = {1: "python", 2: "perl"}
# why the interpreter's frames were not read (interp_status), for the summary's note
INTERP_WHY = {1: "its version is not one heapsight reads: CPython 3.8-3.13, threaded Perl 5.36",
              2: "its symbols are not exported (a stripped or static build)",
              3: "this system refuses a process's reads of itself (process_vm_readv)",
              4: "HEAPSIGHT_INTERP_FRAMES=0"}


@dataclass(frozen=True)
class IFrame:
    interp: str       # "python", "perl"
    function: str
    file: str
    line: int


def iframe(words: np.ndarray, word: int) -> IFrame | None:
    if not word & IFRAME_TAG:
        return None
    o = word & IFRAME_OFFSET_MASK
    if o + 5 > len(words) or int(words[o]) != IFRAME_MAGIC:
        return None
    info = int(words[o + 4])
    line, nlen, flen = info & 0xffffffff, (info >> 32) & 0xffff, info >> 48
    nwords = (nlen + flen + 7) // 8
    if o + 5 + nwords > len(words):
        return None
    raw = words[o + 5:o + 5 + nwords].tobytes()
    name = raw[:nlen].decode(errors="replace")
    file = raw[nlen:nlen + flen].decode(errors="replace")
    kind = INTERP_NAMES.get((word >> 56) & 0x7f, "interpreter")
    return IFrame(kind, name, file, line if line < 0x80000000 else 0)


def read(seg: segment.Segment) -> Profile | None:
    """The profile of a run's segment, or None when the library never set it up (an older
    library, a static program, a program that never started) or sampling was off."""
    try:
        fd = os.open(seg.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read(fd)
    finally:
        os.close(fd)


def _region(fd: int, offset: int, dtype, count: int) -> np.ndarray:
    want = count * np.dtype(dtype).itemsize
    raw = os.pread(fd, want, segment.PROFILE_OFFSET + offset) if want else b""
    return np.frombuffer(raw, dtype=dtype, count=len(raw) // np.dtype(dtype).itemsize).copy()


def _read(fd: int) -> Profile | None:
    lay = segment.profile_layout(os.fstat(fd).st_size)
    if lay is None:   # made without the profile's tables: the run sampled nothing
        return None
    head = _region(fd, 0, segment.PROFILE_HEADER_DTYPE, 1)
    if len(head) != 1 or int(head["magic"][0]) != segment.PROFILE_MAGIC:
        return None
    h = {k: int(head[k][0]) for k in segment.PROFILE_HEADER_DTYPE.names}
    if not h["mean_bytes"]:
        return None
    n = min(h["events_used"], lay.events)
    ev = _region(fd, lay.events_offset, segment.EVENT_DTYPE, n)
    kind = ev["kind"] & np.uint32(0xff)   # bits 8-15: an ALLOC's level
    allocs, matched = _with_frees(ev, kind, segment.EVENT_ALLOC, n)
    bits = (ev["kind"][allocs["index"].astype(np.int64)] >> np.uint32(8)) & np.uint32(0xff)
    allocs["level"] = bits.astype(np.uint8).view(np.int8)   # signed (profile.c: level_bits)
    maps, _ = _with_frees(ev, kind, segment.EVENT_MAP, n)
    words = _region(fd, lay.stacks_offset, "<u8", min(h["stack_words_used"], lay.stack_words))
    mods = _region(fd, lay.modules_offset, segment.MODULE_DTYPE, min(h["modules_used"], lay.modules))
    modules = tuple(Module(int(m["lo"]), int(m["hi"]), int(m["bias"]), int(m["first_event"]),
                           bytes(m["path"]).split(b"\0")[0].decode(errors="surrogateescape"))
                    for m in mods if int(m["hi"]) > int(m["lo"]))
    interp = {k[len("interp_"):]: h[k] for k in h if k.startswith("interp_")}
    unwind = {k: h["unwind_" + k] for k in ("cached", "checked", "mismatches")}
    return Profile(h["mean_bytes"], allocs, matched, words, modules, h["dropped_samples"],
                   h["unwind_ns"], h["unwinds"], h["unwind_frames"], maps,
                   interp if interp.get("kind") else {}, unwind)


def _with_frees(ev: np.ndarray, kind: np.ndarray, which: int, n: int) -> tuple:
    """The events of one kind (ALLOC or MAP) as ALLOC_DTYPE rows with the time of the FREE
    event that names each (NEVER if none), and how many FREE events named one of them."""
    idx = np.flatnonzero(kind == which)
    rows = np.zeros(len(idx), ALLOC_DTYPE)
    rows["index"] = idx
    for f in ("addr", "size", "time_ns", "stack"):
        rows[f] = ev[f][idx]
    rows["free_ns"] = NEVER
    # a FREE event names its event's index; one naming anything else is ignored
    frees = ev[kind == segment.EVENT_FREE]
    target = frees["addr"]
    ok = target < np.uint64(n)
    target, when = target[ok].astype(np.int64), frees["time_ns"][ok]
    ok = kind[target] == which
    target, when = target[ok], when[ok]
    np.minimum.at(rows["free_ns"], np.searchsorted(idx, target), when)
    return rows, len(target)
