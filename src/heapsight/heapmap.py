"""Heap maps: the allocator's heaps page by page, and a measured "what would a release give
back right now", taken by the library in a fork()ed copy of the program (the file format
and the per-page rules are in native/src/heapmap.c). And the pinners: the call sites whose
live blocks keep otherwise-free pages resident.

Here: the file's format (parse) and what is read from maps. How the CLI asks for maps while
the program runs, and collects the files, is heapsight.live.heapmaps."""

from __future__ import annotations

import base64
import math
from dataclasses import field

import numpy as np

from heapsight.dataclass import dataclass
from heapsight import allocators
from heapsight.fmt import human, printable
from heapsight.layout import MAP_EXIT

MAGIC = 0x313050414d485348   # "HSHMAP01"
END = 0x4e4550414d485348     # "HSHMAPEN"
VERSION = 3
U8 = np.dtype("<u8")
HEADER_DTYPE = np.dtype([
    ("magic", U8), ("version", U8), ("header_bytes", U8), ("file_bytes", U8), ("status", U8),
    ("allocator", U8), ("page_bytes", U8), ("time_ns", U8), ("rss_before", U8),
    ("rss_after", U8), ("anon_before", U8), ("anon_after", U8), ("release_ns", U8),
    ("walk_ns", U8), ("fork_ns", U8), ("child_ns", U8), ("n_heaps", U8),
    ("tcache_key_found", U8), ("released_pages", U8), ("child_minflt", U8),
    ("child_cpu_ns", U8), ("reach_bytes", U8), ("py_objects_bytes", U8), ("py_pool_bytes", U8),
    ("py_pools", U8), ("release_counted", U8), ("fast_chunks", U8), ("reserved", U8, (1,)),
    ("why", "S160"),
])
HEAP_DTYPE = np.dtype([
    ("start", U8), ("pages", U8), ("arena", U8), ("kind", U8), ("walked", U8),
    ("top_bytes", U8), ("live_bytes", U8), ("inuse_chunks", U8), ("free_chunks", U8),
    ("tcache_chunks", U8), ("reserved", U8, (2,)),
])
# The reach section (native/src/reach.c's classes, in this order), then the blocks not
# reachable by address.
REACH_DTYPE = np.dtype([
    ("status", U8), ("reach_ns", U8), ("root_bytes", U8), ("n_blocks", U8),
    ("bytes", U8, (4,)), ("blocks", U8, (4,)), ("n_listed", U8), ("n_unlisted", U8),
    ("mmapped_missing_bytes", U8), ("workers", U8), ("reserved", U8, (2,)), ("why", "S128"),
])
BLOCK_DTYPE = np.dtype([("addr", U8), ("usable", U8), ("state", U8)])
# memcheck's words for them, by reach.c's state numbers
REACH_CLASSES = ("definitely_lost", "possibly_lost", "still_reachable", "indirectly_lost")

# A page's flags: resident before the release, after it, holds part of the top chunk,
# holds allocator bytes a release keeps (a chunk header, a free chunk's links), holds a
# block parked in a thread's tcache.
BEFORE, AFTER, TOP, ALLOC, TCACHE = 1, 2, 4, 8, 16
# a heap's kind (HS_HEAP_*; "allocator": one of another allocator's mappings)
HEAP_MAIN, HEAP_THREAD, HEAP_ALLOCATOR = 0, 1, 2
KINDS = {HEAP_MAIN: "main", HEAP_THREAD: "thread", HEAP_ALLOCATOR: "allocator"}

# What this module mirrors of native/src/heapmap_file.h, for the compiler to check
# (tests/test_native.py, as heapsight.layout's).
C_HEADER = "heapmap_file.h"
C_STRUCTS = {"hs_map_header_t": HEADER_DTYPE, "hs_map_heap_t": HEAP_DTYPE,
             "hs_map_reach_t": REACH_DTYPE, "hs_map_block_t": BLOCK_DTYPE}
C_CONSTANTS = {"HS_MAP_MAGIC": MAGIC, "HS_MAP_END": END, "HS_MAP_VERSION": VERSION,
               "HS_PAGE_BEFORE": BEFORE, "HS_PAGE_AFTER": AFTER, "HS_PAGE_TOP": TOP,
               "HS_PAGE_ALLOC": ALLOC, "HS_PAGE_TCACHE": TCACHE,
               "HS_HEAP_MAIN": HEAP_MAIN, "HS_HEAP_THREAD": HEAP_THREAD,
               "HS_HEAP_ALLOCATOR": HEAP_ALLOCATOR,
               **{f"HS_REACH_{c}": REACH_CLASSES.index(name) for c, name in (
                   ("LOST", "definitely_lost"), ("POSSIBLE", "possibly_lost"),
                   ("REACHABLE", "still_reachable"), ("INDIRECT", "indirectly_lost"))}}
# A page is pinned when it stays resident after the release though fewer than this share
# of its bytes are live.
PIN_FRACTION = 0.25
EXIT = MAP_EXIT


@dataclass
class Heap:
    """One heap: glibc's main heap ([heap], kind "main") or a thread arena's heap ("thread");
    under another allocator one of its mappings ("allocator": the hooks' record of them,
    native/src/heapother.c)."""
    start: int
    arena: int
    kind: str
    walked: bool          # every chunk read; otherwise live and flags 4/8/16 are empty
    top_bytes: int
    live_bytes: int
    inuse_chunks: int
    free_chunks: int
    tcache_chunks: int
    live: np.ndarray      # uint32 per page: live (usable) bytes of in-use chunks on it
    flags: np.ndarray     # uint8 per page: BEFORE | AFTER | TOP | ALLOC | TCACHE

    @property
    def pages(self) -> int:
        return len(self.live)

    def end(self, page: int) -> int:
        return self.start + self.pages * page


@dataclass
class Reach:
    """The copy's reachability marking (native/src/reach.c): bytes and blocks by memcheck's
    class, usable bytes; the blocks not reachable (BLOCK_DTYPE, by address; state is the
    index in REACH_CLASSES), all but n_unlisted of them."""
    marked: bool
    why: str                  # why not, when not marked
    reach_ns: int
    root_bytes: int           # the roots scanned
    n_blocks: int
    bytes: dict
    blocks: dict
    unreached: np.ndarray
    n_unlisted: int
    # glibc's mmapped chunks the hooks counted live that the copy did not find (so not in
    # any class): 0 when every one was found
    mmapped_missing_bytes: int = 0
    workers: int = 1          # the processes that marked (two at exit, past 16 MiB of blocks)

    def to_json(self) -> dict:
        if not self.marked:
            return {"marked": False, "why": self.why}
        return {"marked": True, "ms": round(self.reach_ns / 1e6, 1),
                "root_bytes": self.root_bytes, "blocks_marked": self.n_blocks,
                **{f"{c}_bytes": self.bytes[c] for c in REACH_CLASSES},
                **{f"{c}_blocks": self.blocks[c] for c in REACH_CLASSES},
                **({"mmapped_missing_bytes": self.mmapped_missing_bytes}
                   if self.mmapped_missing_bytes else {}),
                **({"workers": self.workers} if self.workers > 1 else {})}

    def classes_of(self, addrs) -> np.ndarray:
        """The class (index in REACH_CLASSES) of blocks by their user address: a listed
        block's, else still reachable (or not a block the copy saw)."""
        addrs = np.asarray(addrs, dtype=np.uint64)
        out = np.full(len(addrs), REACH_CLASSES.index("still_reachable"), dtype=np.int64)
        if len(self.unreached) and len(addrs):
            at = np.searchsorted(self.unreached["addr"], addrs)
            ok = at < len(self.unreached)
            hit = np.zeros(len(addrs), dtype=bool)
            hit[ok] = self.unreached["addr"][at[ok]] == addrs[ok]
            out[hit] = self.unreached["state"][at[hit]].astype(np.int64)
        return out


@dataclass
class HeapMap:
    status: str               # "mapped", or "not mapped: WHY"
    allocator: str
    page_bytes: int
    time_ns: int              # CLOCK_MONOTONIC when the copy was taken (the library's clock)
    rss_before: int           # the copy's VmRSS and RssAnon around the release
    rss_after: int
    anon_before: int
    anon_after: int
    release_ns: int
    walk_ns: int
    fork_ns: int              # fork() until the copy ran: the program could not allocate
    child_ns: int
    tcache_key_found: bool
    released_pages: int       # pages of the heaps resident before the release, not after
    child_minflt: int
    child_cpu_ns: int
    note: str = ""
    heaps: list = field(default_factory=list)
    reach: "Reach | None" = None   # what the program could still reach (glibc only)
    # CPython's objects in use in pymalloc's pools in the copy, and the pools' bytes (None:
    # not CPython, or no pools found: native/src/heapmap.c copy_pools)
    py_objects_bytes: int | None = None
    py_pool_bytes: int | None = None
    # glibc: the chunks in its fastbins when the release was counted from the pages by
    # malloc_trim's rule rather than run (running it merges each of them first: slow past
    # ~65k), else 0 (native/src/heapmap.c: count_release)
    counted_fast_chunks: int = 0

    @property
    def release_measured_bytes(self) -> int:
        """What the release gave back in the copy: its anonymous RSS before less after."""
        return max(0, self.anon_before - self.anon_after)


def parse(data: bytes, path: str) -> HeapMap:
    """A map file's bytes (path: its name, for the errors); ValueError when they are not a
    map or are cut short (a stopped child)."""
    if len(data) < HEADER_DTYPE.itemsize + 8:
        raise ValueError(f"{path}: {len(data)} bytes, too short for a heap map")
    h = np.frombuffer(data, HEADER_DTYPE, count=1)[0]
    if int(h["magic"]) != MAGIC or int(h["version"]) != VERSION:
        raise ValueError(f"{path}: not a heap map of this heapsight")
    if int(h["file_bytes"]) != len(data) or int(np.frombuffer(data[-8:], U8)[0]) != END:
        raise ValueError(f"{path}: cut short ({len(data)} of {int(h['file_bytes'])} bytes)")
    why = bytes(h["why"]).split(b"\0")[0].decode(errors="replace")
    status = "mapped" if int(h["status"]) == 0 else f"not mapped: {why}"
    hm = HeapMap(status, allocators.BY_SEGMENT_ID.get(int(h["allocator"]), "unknown"), int(h["page_bytes"]),
                 int(h["time_ns"]), int(h["rss_before"]), int(h["rss_after"]),
                 int(h["anon_before"]), int(h["anon_after"]), int(h["release_ns"]),
                 int(h["walk_ns"]), int(h["fork_ns"]), int(h["child_ns"]),
                 bool(h["tcache_key_found"]), int(h["released_pages"]), int(h["child_minflt"]),
                 int(h["child_cpu_ns"]), why if int(h["status"]) == 0 else "")
    if int(h["release_counted"]):
        hm.counted_fast_chunks = max(1, int(h["fast_chunks"]))
    if int(h["py_pools"]):
        hm.py_objects_bytes, hm.py_pool_bytes = int(h["py_objects_bytes"]), int(h["py_pool_bytes"])
    at = HEADER_DTYPE.itemsize
    for _ in range(int(h["n_heaps"])):
        r = np.frombuffer(data, HEAP_DTYPE, count=1, offset=at)[0]
        at += HEAP_DTYPE.itemsize
        n = int(r["pages"])
        live = np.frombuffer(data, np.dtype("<u4"), count=n, offset=at).copy()
        flags = np.frombuffer(data, np.uint8, count=n, offset=at + 4 * n).copy()
        at += (5 * n + 7) // 8 * 8
        hm.heaps.append(Heap(int(r["start"]), int(r["arena"]), KINDS.get(int(r["kind"]), "thread"),
                             bool(r["walked"]), int(r["top_bytes"]), int(r["live_bytes"]),
                             int(r["inuse_chunks"]), int(r["free_chunks"]), int(r["tcache_chunks"]),
                             live, flags))
    if int(h["reach_bytes"]):
        r = np.frombuffer(data, REACH_DTYPE, count=1, offset=at)[0]
        at += REACH_DTYPE.itemsize
        n = int(r["n_listed"])
        blocks = np.frombuffer(data, BLOCK_DTYPE, count=n, offset=at).copy()
        at += n * BLOCK_DTYPE.itemsize
        hm.reach = Reach(int(r["status"]) == 0,
                         bytes(r["why"]).split(b"\0")[0].decode(errors="replace"),
                         int(r["reach_ns"]), int(r["root_bytes"]), int(r["n_blocks"]),
                         {c: int(r["bytes"][i]) for i, c in enumerate(REACH_CLASSES)},
                         {c: int(r["blocks"][i]) for i, c in enumerate(REACH_CLASSES)},
                         blocks, int(r["n_unlisted"]), int(r["mmapped_missing_bytes"]),
                         max(1, int(r["workers"])))
    if at + 8 != len(data):
        raise ValueError(f"{path}: {len(data) - at - 8} bytes unaccounted for")
    return hm


def pinned(heap: Heap, page: int) -> np.ndarray:
    """Per page: resident after the release, with live bytes, under PIN_FRACTION of it."""
    return ((heap.flags & AFTER) != 0) & (heap.live > 0) & (heap.live < page * PIN_FRACTION)


# The unit an allocator frees pages in, at most: glibc returns any free page of a chunk;
# mimalloc a 64 KiB page of its only once every block on it is free; jemalloc's slabs and
# tcmalloc's spans are no larger than that for small blocks.
OTHER_UNIT_BYTES = 64 << 10


def unit_bytes(allocator: str, page: int) -> int:
    return page if allocator == "glibc" else max(page, OTHER_UNIT_BYTES)


def interleaved(heap: Heap, page: int, unit: int) -> int:
    """The bytes resident after the release, with no live byte, in units of `unit` bytes
    (address-aligned) that hold a live byte: free space a live block keeps, which no
    release returns (fragmentation), as against whole free units the allocator kept."""
    n = heap.pages
    if not n:
        return 0
    per = max(1, unit // page)
    first = (heap.start // page) % per   # the heap's first page's place in its unit
    idx = (np.arange(n) + first) // per
    after = (heap.flags & AFTER) != 0
    live_in = np.bincount(idx, weights=heap.live.astype(np.float64), minlength=idx[-1] + 1)
    resident_in = np.bincount(idx, weights=after.astype(np.float64), minlength=idx[-1] + 1)
    held = live_in > 0   # (a live block's page never written is not resident: no free bytes)
    return int(np.maximum(0.0, resident_in[held] * page - live_in[held]).sum())


def occupancy(heap: Heap, page: int) -> np.ndarray:
    """Per page, uint8: 0 for no live byte, else ceil(live * 255 / page)."""
    return np.minimum(255, -(-heap.live.astype(np.int64) * 255 // page)).astype(np.uint8)


def to_json(hm: HeapMap, moment: str = EXIT, start_ns: int | None = None) -> dict:
    """The summary's "heapmaps" entry (the caller adds "pinners"). An arena's pages:
    free_resident_pages were resident before the release with no live byte and outside
    the top chunk; top_resident_pages the same inside it; pinned_pages see pinned();
    interleaved_bytes see interleaved(). A heap whose walk failed ("walked": false)
    has its residency flags only: its occupancy is unknown, written as zeros."""
    page = hm.page_bytes
    arenas: dict = {}
    for h in hm.heaps:
        a = arenas.setdefault(h.arena, {"arena": h.arena, "pages": 0, "free_resident_pages": 0,
                                        "pinned_pages": 0, "top_bytes": 0, "live_bytes": 0,
                                        "top_resident_pages": 0, "interleaved_bytes": 0,
                                        "walked": True, "heaps": []})
        a["pages"] += h.pages
        if h.walked:
            free = ((h.flags & BEFORE) != 0) & (h.live == 0) & ((h.flags & TOP) == 0)
            a["free_resident_pages"] += int(free.sum())
            a["pinned_pages"] += int(pinned(h, page).sum())
            a["top_bytes"] += h.top_bytes
            # the top chunk's pages resident before the release (with no live byte): in a
            # thread arena, what malloc_trim leaves (glibc shrinks its top only on a free)
            a["top_resident_pages"] += int((((h.flags & BEFORE) != 0) & ((h.flags & TOP) != 0)
                                            & (h.live == 0)).sum())
            a["live_bytes"] += h.live_bytes
            a["interleaved_bytes"] += interleaved(h, page, unit_bytes(hm.allocator, page))
        a["walked"] = a["walked"] and h.walked
        a["heaps"].append({"start": hex(h.start), "kind": h.kind, "pages": h.pages,
                           "walked": h.walked,
                           "occupancy": base64.b64encode(occupancy(h, page).tobytes()).decode("ascii"),
                           "flags": base64.b64encode(h.flags.tobytes()).decode("ascii")})
    t_s = round((hm.time_ns - start_ns) / 1e9, 3) if start_ns else None
    return {"moment": moment, "t_s": t_s, "status": hm.status, "allocator": hm.allocator,
            "page_bytes": page, "release_measured_bytes": hm.release_measured_bytes,
            "rss_before": hm.rss_before, "rss_after": hm.rss_after,
            "anon_before": hm.anon_before, "anon_after": hm.anon_after,
            "released_pages": hm.released_pages, "note": hm.note,
            "fork_ms": round(hm.fork_ns / 1e6, 2), "map_ms": round(hm.child_ns / 1e6, 1),
            "py_objects_bytes": hm.py_objects_bytes, "py_pool_bytes": hm.py_pool_bytes,
            "reach": hm.reach.to_json() if hm.reach is not None else
            {"marked": False, "why": "the copy had no record of the blocks to mark (this "
                                     f"run's allocator: {hm.allocator}; HEAPSIGHT_REACH=0 "
                                     "turns the record off)"} if hm.allocator != "glibc" else None,
            "arenas": [arenas[k] for k in sorted(arenas)]}


def _block_arrays(blocks):
    if isinstance(blocks, np.ndarray) and blocks.dtype.names:
        return (blocks["addr"].astype(np.int64), blocks["size"].astype(np.int64),
                blocks["p"].astype(np.float64), blocks["stack"].astype(np.int64))
    rows = list(blocks)
    if not rows:
        z = np.zeros(0, np.int64)
        return z, z, np.zeros(0), z
    a = np.array([(r[0], r[1], r[3]) for r in rows], dtype=np.int64)
    p = np.array([r[2] for r in rows], dtype=np.float64)
    return a[:, 0], a[:, 1], p, a[:, 2]


def pinners(hm: HeapMap, blocks, page_bytes: int | None = None) -> list:
    """Who pins the pinned pages. blocks: the live sampled blocks at the map's moment, a
    structured array with fields addr, size, p, stack (or (addr, size, p, stack) tuples),
    size in usable bytes and p the block's sampling probability. Each pinned page's
    non-live bytes are shared among the live blocks on it in proportion to their bytes
    there; a sampled block counts share / p bytes and 1 / p blocks (Horvitz-Thompson), the
    error its variance sum share^2 (1 - p) / p^2, 95%; all scaled down, keeping their
    shares, when they add up to more than the pinned bytes the map measured. Returns one
    entry per stack, most
    pinned bytes first: {"stack", "blocks", "block_bytes", "pinned_bytes", "error_bytes"}
    (the caller names the site)."""
    page = page_bytes or hm.page_bytes
    addr, size, p, stack = _block_arrays(blocks)
    heaps = sorted((h for h in hm.heaps if h.walked), key=lambda h: h.start)
    if not len(addr) or not heaps:
        return []
    starts = np.array([h.start for h in heaps], dtype=np.int64)
    which = np.searchsorted(starts, addr, side="right") - 1
    share = np.zeros(len(addr))
    for i, h in enumerate(heaps):
        sel = np.nonzero((which == i) & (addr < h.end(page)) & (size > 0))[0]
        if not len(sel):
            continue
        pin = pinned(h, page)
        if not pin.any():
            continue
        live = h.live.astype(np.float64)
        lo, hi = addr[sel] - h.start, np.minimum(addr[sel] + size[sel], h.end(page)) - h.start
        first, last = lo // page, (hi - 1) // page
        # only a block's first and last pages can be pinned: the pages between are full
        on_first = np.minimum(hi, (first + 1) * page) - lo
        on_last = np.where(last > first, hi - last * page, 0)
        for pg, on in ((first, on_first), (last, on_last)):
            ok = pin[pg] & (on > 0)
            pg_ok = pg[ok]
            share[sel[ok]] += (page - live[pg_ok]) * on[ok] / live[pg_ok]
    hit = share > 0
    # The map knows the pinned bytes exactly: estimates that add up to more (few samples of
    # small blocks, each standing for hundreds) are scaled down to it, keeping their shares.
    exact = sum(float((page - h.live[pinned(h, page)].astype(np.float64)).sum()) for h in heaps)
    raw = float(np.sum(share[hit] / p[hit]))
    scale = min(1.0, exact / raw) if raw > 0 else 1.0
    out = []
    for s in np.unique(stack[hit], return_index=True)[0]:  # no numpy.ma import
        m = hit & (stack == s)
        pi, sh = p[m], share[m]
        n = float(np.sum(1.0 / pi))
        out.append({"stack": int(s), "blocks": int(round(n * scale)),
                    "block_bytes": int(round(float(np.sum(size[m] / pi)) / n)),
                    "pinned_bytes": int(round(float(np.sum(sh / pi)) * scale)),
                    "error_bytes": int(round(scale * 1.96 * math.sqrt(
                        float(np.sum(sh * sh * (1 - pi) / (pi * pi))))))})
    out.sort(key=lambda e: -e["pinned_bytes"])
    return out


# A snapshot's map copied this much after the snapshot says when it was copied
LATE_S = 0.05


def moment_words(m: dict, snapshots) -> str:
    """Where a heap map's moment is named: "at exit", or "at snapshot: LABEL", with when the
    copy was made when that was later than the snapshot (a program that made no allocator
    call between: its heap was as it was at the snapshot). snapshots: (label, at_s) pairs."""
    if m.get("moment") == EXIT:
        return "at exit"
    words = f"at {printable(str(m.get('moment')))}"
    at = next((t for label, t in snapshots if m.get("moment") == f"snapshot: {label}"), None)
    if at is not None and m.get("t_s") is not None and m["t_s"] - at > LATE_S:
        words += (f" (copied at {m['t_s']:.2f} s, at the program's first allocator call after "
                  "the snapshot: its heap as it was then)")
    return words


def reach_line(r: dict | None) -> str:
    """A heap map's reach (Reach.to_json) in one line, as the terminal and the page say it;
    "" for none."""
    if not r:
        return ""
    if not r.get("marked"):
        return f"not checked: {r.get('why', '')}"
    parts = ", ".join(f"{name} {human(r[key + '_bytes'])} ({r[key + '_blocks']:,} "
                      f"block{'s' * (r[key + '_blocks'] != 1)})"
                      for key, name in (("definitely_lost", "definitely lost"),
                                        ("indirectly_lost", "indirectly lost"),
                                        ("possibly_lost", "possibly lost"),
                                        ("still_reachable", "still reachable")))
    missing = r.get("mmapped_missing_bytes", 0)
    hole = (f"; not found in the copy, so in no class: {human(missing)} of blocks glibc "
            "served with their own mmap" if missing else "")
    diff = r.get("classes_minus_counted", 0)
    if diff > 0:
        hole += (f"; {diff:,} block{'s' * (diff != 1)} more than the hooks counted live "
                 "(allocated before heapsight's hooks were ready: the loader's)")
    elif diff < 0:
        hole += (f"; {-diff:,} block{'s' * (diff != -1)} the hooks counted live that the copy "
                 "did not find (in no class)")
    return f"{parts}; marked in a copy of the program in {r['ms']:.1f} ms{hole}"
