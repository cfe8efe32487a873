"""heapmap.interleaved: the free bytes a live block keeps resident, in the allocator's units
(glibc's pages; another allocator's 64 KiB at most), which tells fragmentation from free
memory the allocator kept whole."""

import numpy as np

from heapsight import heapmap as H

PAGE = 4096


def heap(start: int, live: list, flags: list) -> H.Heap:
    live = np.asarray(live, dtype=np.uint32)
    return H.Heap(start=start, arena=0, kind="allocator", walked=True, top_bytes=0,
                  live_bytes=int(live.sum()), inuse_chunks=0, free_chunks=0, tcache_chunks=0,
                  live=live, flags=np.asarray(flags, dtype=np.uint8))


def test_glibc_counts_the_free_bytes_of_each_resident_page_with_a_live_byte():
    # four pages: live 100 (resident), none (resident), full (resident), live 50 on a page
    # never written (not resident: no free bytes of it are kept)
    h = heap(0x10000, [100, 0, 4096, 50], [H.AFTER, H.AFTER, H.AFTER, 0])
    assert H.interleaved(h, PAGE, H.unit_bytes("glibc", PAGE)) == PAGE - 100


def test_another_allocators_unit_is_kept_whole_by_one_live_block():
    # 32 pages from a 64 KiB boundary: one 64-byte block in the first unit keeps its 16
    # resident pages; the second unit has no live byte: whole free pages, no fragmentation
    h = heap(0x40000, [64] + [0] * 31, [H.AFTER] * 32)
    assert H.interleaved(h, PAGE, H.unit_bytes("mimalloc", PAGE)) == 16 * PAGE - 64
    # a heap that starts inside a unit: the units are the addresses', not the heap's
    h = heap(0x40000 + 15 * PAGE, [0, 64] + [0] * 15, [H.AFTER] * 17)
    assert H.interleaved(h, PAGE, H.unit_bytes("jemalloc", PAGE)) == 16 * PAGE - 64
