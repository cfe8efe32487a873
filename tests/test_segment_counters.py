"""The segment's reader on counters it did not expect: frees the hooks saw of blocks they
never saw allocated must not come out as negative live figures."""

import mmap
import os

import numpy as np

from heapsight import layout as L
from heapsight.live import segment as S


def writable(seg):
    """The segment as the library sees it: (mapping, header, slots), to write into."""
    fd = os.open(seg.path, os.O_RDWR)
    m = mmap.mmap(fd, L.SEGMENT_BYTES)
    os.close(fd)
    return (m, np.ndarray((), L.HEADER_DTYPE, buffer=m, offset=0),
            np.ndarray((L.MAX_SLOTS,), L.SLOT_DTYPE, buffer=m, offset=L.SLOTS_OFFSET))


def test_more_frees_than_allocations_read_as_nothing_live():
    seg = S.Segment()
    try:
        # GIVEN a slot that counted 10 allocations and 25 frees (15 of blocks allocated past
        # the hooks), more usable bytes freed than allocated
        m, head, slots = writable(seg)
        head["slots_used"] = 2
        # (the usable bytes folded in: 8 more per block, HS_BLOCK_EXTRA)
        slots[1]["alloc_chunk_bytes"], slots[1]["free_chunk_bytes"] = 480 + 80, 1200 + 200
        slots[1]["n_alloc"], slots[1]["n_free"], slots[1]["req_alloc_bytes"] = 10, 25, 400
        # WHEN it is read
        got = seg.counters()
        # THEN the totals are as counted and the live figures are 0, not negative
        assert (got.n_alloc, got.n_free) == (10, 25)
        assert (got.live_blocks, got.live_usable_bytes, got.live_requested_bytes) == (0, 0, 0)
        del slots, head
        m.close()
    finally:
        seg.close()


def test_exit_figures_the_probe_did_not_take_read_as_none_with_the_reason():
    seg = S.Segment()
    try:
        m, head, _ = writable(seg)
        # GIVEN a run whose exit probe found the allocator locked and had no sample to keep
        head["state"], head["exit_probe_status"] = L.STATE_DONE, L.PROBE_ALLOCATOR_LOCKED
        # THEN there are no exit figures (not zeros), and the reason is there to show
        assert seg.alloc_stats("exit_stats_before") is None
        assert "lock was held" in seg.exit_probe_why_not()
        # GIVEN instead a measured exit
        head["exit_probe_status"] = L.PROBE_DONE
        head["exit_stats_before"]["time_ns"] = 123
        head["exit_stats_before"]["mapped_bytes"] = 4096
        assert seg.alloc_stats("exit_stats_before").mapped_bytes == 4096
        assert seg.exit_probe_why_not() == ""
        del head
        m.close()
    finally:
        seg.close()
