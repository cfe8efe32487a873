"""From measurements to conclusions: the RSS breakdown at a moment, and the findings and
verdict for a run. How each figure is computed is written out in docs/numbers.md."""

from __future__ import annotations

import math
import shlex

from heapsight import allocators
from heapsight.fmt import human, pct
from heapsight.model import Breakdown, Finding, HeapFigures, Release
from heapsight.segment import AllocStats

MiB = 1024 * 1024


def breakdown(at_s: float, rss: int, anon: int, baseline_anon: int, live_req: int,
              live_usable: int, live_blocks: int, allocator: str,
              alloc_mapped: float = math.nan) -> Breakdown:
    """Split one moment's RSS. Anonymous memory above the pre-main baseline is the heap's
    unless the allocator cannot account for it; file-backed memory is never the heap's."""
    file_bytes = max(0, rss - anon)
    heap_anon = max(0, anon - baseline_anon)
    waste = max(0, live_usable - live_req)
    metadata = allocators.header_bytes(allocator) * max(0, live_blocks)
    unexplained = heap_anon - live_req - waste - metadata
    if not math.isnan(alloc_mapped):
        # malloc can hold at most what it obtained from the OS less what is live; anonymous
        # memory beyond that is not malloc's (stacks, the program's own mmap).
        held = max(0.0, alloc_mapped - live_usable - metadata)
        retained = int(min(max(0, unexplained), held))
    else:
        retained = max(0, unexplained)
    other_anon = max(0, unexplained - retained)
    untouched = max(0, -unexplained)
    non_heap = file_bytes + min(baseline_anon, anon) + other_anon
    return Breakdown(round(at_s, 3), rss, live_req, waste, metadata, retained, non_heap,
                     file_bytes, min(baseline_anon, anon), other_anon, untouched)


def findings(command: list, final: Breakdown | None, release: Release,
             heap: HeapFigures) -> list:
    """Each finding names what holds the memory, how much, and what to try. Sorted by size."""
    if final is None:
        return []
    allocator, arenas, threads = heap.allocator, heap.arenas, heap.threads_seen
    n_large_heap, size_classes = heap.n_large_heap, heap.size_classes
    cmd = shlex.join(command)
    out = []
    rss = max(final.rss_bytes, 1)
    heap_total = final.live_bytes + final.waste_bytes + final.metadata_bytes + final.retained_bytes

    # Leak: blocks still allocated when the program ended.
    if final.live_bytes >= MiB and final.live_bytes >= 0.5 * (heap_total or 1):
        out.append(Finding(
            "leak", final.live_bytes,
            f"{human(final.live_bytes)} was still allocated at exit (never freed)",
            "These blocks were malloc'ed and not freed before the program ended. That is a leak, "
            "or data the program keeps until exit on purpose; no allocator setting can give it "
            "back. Find where it was allocated:",
            (f"heaptrack {cmd}",
             f"valgrind --leak-check=full --show-leak-kinds=definite {cmd}")))

    # Retention: freed memory the allocator keeps resident.
    if final.retained_bytes >= MiB and final.retained_bytes >= 0.1 * rss:
        given = release.gave_back_bytes
        mechanisms = []
        if allocator == "glibc":
            if arenas > 1:
                mechanisms.append(f"{arenas} malloc arenas (glibc gives each thread that "
                                  f"allocates its own, up to 8 per core; {threads} threads seen)")
            if n_large_heap:
                mechanisms.append(f"{n_large_heap} blocks of 128 KiB or more came from the heap "
                                  "instead of their own mmap: freeing an mmapped block raised "
                                  "the dynamic mmap threshold")
            mechanisms.append("free chunks stay in the arenas' bins and tcache until "
                              "malloc_trim or a top-of-heap shrink")
        suggestions = []
        if allocator == "glibc":
            suggestions.append("call malloc_trim(0) after freeing a large structure "
                               "(#include <malloc.h>), or from gdb now: "
                               "gdb -p PID -batch -ex 'call (int)malloc_trim(0)'")
            if arenas > 1:
                suggestions.append(f"MALLOC_ARENA_MAX=2 heapsight run -- {cmd}")
            if n_large_heap:
                suggestions.append("GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072 "
                                   f"heapsight run -- {cmd}")
            suggestions.append("LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 "
                               "MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 "
                               f"heapsight run -- {cmd}   # apt install libjemalloc2")
        if release.measured and given >= 0.5 * final.retained_bytes:
            out.append(Finding(
                "retention", final.retained_bytes,
                f"{human(final.retained_bytes)} freed by the program but kept by {allocator}",
                f"Not a leak: the program freed it, the allocator kept it resident. The release "
                f"at exit ({release.call}) gave back {human(given)} "
                f"({pct(given, final.retained_bytes)} of it). "
                + ("Why it stayed: " + "; ".join(mechanisms) + "." if mechanisms else ""),
                tuple(suggestions)))
        else:
            how = (f"the release at exit ({release.call}) gave back only {human(given)}"
                   if release.measured else f"no release could be measured ({release.why_not})")
            kind = "fragmentation" if release.measured else "retention"
            out.append(Finding(
                kind, final.retained_bytes,
                f"{human(final.retained_bytes)} freed by the program but kept by {allocator}",
                f"Freed memory the allocator still holds; {how}. "
                + ("The free space is interleaved with live blocks, so whole pages cannot be "
                   "returned (fragmentation). " if release.measured else "")
                + ("Why it stayed: " + "; ".join(mechanisms) + "." if mechanisms else ""),
                tuple(suggestions)))

    # Waste: rounding of small requests.
    usable = final.live_bytes + final.waste_bytes
    if final.waste_bytes >= MiB and final.waste_bytes >= 0.25 * usable:
        top = max(size_classes, key=lambda c: c[2] * c[3], default=(0, 0, 0, 0))
        out.append(Finding(
            "waste", final.waste_bytes,
            f"{human(final.waste_bytes)} lost to rounding: {pct(final.waste_bytes, usable)} "
            "of the usable bytes of live blocks were not requested",
            f"Most of it is in blocks of {top[0]}+ usable bytes ({top[2]:,} live), which waste "
            f"{top[3]:.1f} bytes each on average: every block is rounded up to the allocator's "
            "size class (glibc: 24 usable bytes at least, in steps of 16) and carries a header. "
            "Allocate many small objects together (an array, a pool or arena allocator) "
            "instead of one malloc each.", ()))

    if final.other_anon_bytes >= 4 * MiB and final.other_anon_bytes >= 0.1 * rss:
        out.append(Finding(
            "non-heap", final.other_anon_bytes,
            f"{human(final.other_anon_bytes)} of anonymous memory did not come from malloc",
            "Thread stacks, the program's own mmap calls, or an interpreter's own allocator "
            "(Python's pymalloc, a JIT) hold it; malloc settings will not change it.", ()))

    out.sort(key=lambda f: -f.bytes)
    return out


def verdict(found: list, final: Breakdown | None, preload_active: bool) -> str:
    if final is None:
        return "no samples: the program ended before the first measurement"
    if not preload_active:
        return ("heap figures unavailable (the preload library was not active); RSS only: "
                f"final {human(final.rss_bytes)}")
    if not found:
        return (f"healthy: no leak, little retention or waste (final RSS {human(final.rss_bytes)}, "
                f"of which {human(final.live_bytes)} live)")
    words = {"leak": "LEAK", "retention": "RETENTION", "fragmentation": "FRAGMENTATION",
             "waste": "SMALL-OBJECT WASTE", "non-heap": "NON-HEAP MEMORY"}
    top = found[0]
    rest = ", ".join(words[f.kind].lower() for f in found[1:])
    return f"{words[top.kind]}: {top.title}" + (f" (also: {rest})" if rest else "")


def alloc_mapped_nan(stats: AllocStats | None) -> float:
    return math.nan if stats is None else float(stats.mapped_bytes)
