"""Sampled allocations, read side: hs_profile_t (native/include/heapsight.h) decoded from
the tables heapsight.live.segment copies out of a run's segment as numpy arrays, once the
program has ended and before the segment file is removed.

The library appends an ALLOC event for each sampled block (its usable size, time and
stack) and a FREE event naming the ALLOC event's index when that block is freed; events
are published by storing their kind last, so one still EMPTY (a thread stopped halfway,
a program killed) is skipped. Here the FREE events are folded into their ALLOC event's
free_ns, which is what every estimate needs (sites.py)."""

from __future__ import annotations

from dataclasses import field

import numpy as np

from heapsight.dataclass import dataclass
from heapsight import layout

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

    def stacks(self, offsets: np.ndarray) -> tuple:
        """The stacks at these word offsets (as stack(), each), concatenated: (their return
        addresses, each stack's length), without a slice a stack (python3's compileall: 2,300
        stacks)."""
        w = self.stack_words
        offsets = np.asarray(offsets, dtype=np.int64)
        ok = (offsets > 0) & (offsets < len(w))
        n = np.zeros(len(offsets), dtype=np.int64)
        n[ok] = w[offsets[ok]].astype(np.int64)
        n[~ok | (n < 0) | (n > S_MAX_FRAMES) | (offsets + n >= len(w))] = 0
        starts = np.repeat(offsets + 1 - (np.cumsum(n) - n), n)
        return w[starts + np.arange(int(n.sum()), dtype=np.int64)].astype(np.uint64), n

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

# An interpreter's frame in a stack: layout.IFRAME_* (heapsight.h's HS_IFRAME_*).
INTERP_NAMES = {layout.INTERP_PYTHON: "python", layout.INTERP_PERL: "perl"}
# why the interpreter's frames were not read (interp_status), for the summary's note
INTERP_WHY = {layout.INTERP_STATUS_VERSION: "its version is not one heapsight reads: CPython "
                                           "3.8-3.13, threaded Perl 5.36",
              layout.INTERP_STATUS_SYMBOLS: "its symbols are not exported (a stripped or static build)",
              layout.INTERP_STATUS_READS: "this system refuses a process's reads of itself "
                                          "(process_vm_readv)",
              layout.INTERP_STATUS_OFF: "HEAPSIGHT_INTERP_FRAMES=0"}


@dataclass(frozen=True)
class IFrame:
    interp: str       # "python", "perl"
    function: str
    file: str
    line: int


def iframe(words: np.ndarray, word: int) -> IFrame | None:
    if not word & layout.IFRAME_TAG:
        return None
    o = word & layout.IFRAME_OFFSET_MASK
    if o + 5 > len(words) or int(words[o]) != layout.IFRAME_MAGIC:
        return None
    info = int(words[o + 4])
    line = info & 0xffffffff
    nlen = (info >> layout.IFRAME_NAME_SHIFT) & 0xffff
    flen = info >> layout.IFRAME_FILE_SHIFT
    nwords = (nlen + flen + 7) // 8
    if o + 5 + nwords > len(words):
        return None
    raw = words[o + 5:o + 5 + nwords].tobytes()
    name = raw[:nlen].decode(errors="replace")
    file = raw[nlen:nlen + flen].decode(errors="replace")
    kind = INTERP_NAMES.get((word >> layout.IFRAME_KIND_SHIFT) & 0x7f, "interpreter")
    return IFrame(kind, name, file, line if line < 0x80000000 else 0)


def decode(head: dict, events: np.ndarray, words: np.ndarray, mods: np.ndarray) -> Profile | None:
    """The profile from its tables as the library wrote them (the header's fields by name,
    the used events, stack words and modules: heapsight.live.segment reads them), or None
    when sampling was off."""
    if not head["mean_bytes"]:
        return None
    ev, n = events, len(events)
    kind = ev["kind"] & np.uint32(layout.EVENT_KIND_MASK)   # above it: an ALLOC's level
    allocs, matched = _with_frees(ev, kind, layout.EVENT_ALLOC, n)
    bits = (ev["kind"][allocs["index"].astype(np.int64)] >> np.uint32(layout.EVENT_LEVEL_SHIFT)) \
        & np.uint32(layout.EVENT_KIND_MASK)
    allocs["level"] = bits.astype(np.uint8).view(np.int8)   # signed (profile.c: level_bits)
    maps, _ = _with_frees(ev, kind, layout.EVENT_MAP, n)
    modules = tuple(Module(int(m["lo"]), int(m["hi"]), int(m["bias"]), int(m["first_event"]),
                           bytes(m["path"]).split(b"\0")[0].decode(errors="surrogateescape"))
                    for m in mods if int(m["hi"]) > int(m["lo"]))
    interp = {k[len("interp_"):]: head[k] for k in head if k.startswith("interp_")}
    unwind = {k: head["unwind_" + k] for k in ("cached", "checked", "mismatches")}
    return Profile(head["mean_bytes"], allocs, matched, words, modules, head["dropped_samples"],
                   head["unwind_ns"], head["unwinds"], head["unwind_frames"], maps,
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
    frees = ev[kind == layout.EVENT_FREE]
    target = frees["addr"]
    ok = target < np.uint64(n)
    target, when = target[ok].astype(np.int64), frees["time_ns"][ok]
    ok = kind[target] == which
    target, when = target[ok], when[ok]
    np.minimum.at(rows["free_ns"], np.searchsorted(idx, target), when)
    return rows, len(target)
