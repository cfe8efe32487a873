"""A slot's usable bytes (L.slot_usable, settled): the hot path adds none, its
countdowns count usable + 8 bytes per block, and the owner folds them into the slot's
chunk totals between two steps of seq. Built here by hand, as the library keeps them."""

import numpy as np

from heapsight import layout as L
from heapsight.live import segment as S


def slot(blocks_before, blocks_since, freed_before, freed_since, limit=65536):
    """A slot after allocating usable sizes `blocks_before` (folded in) and `blocks_since`
    (counted by the countdown since), and the same of its frees."""
    s = np.zeros(1, L.SLOT_DTYPE)
    s["alloc_chunk_bytes"] = sum(u + L.BLOCK_EXTRA for u in blocks_before)
    s["left_base"] = limit
    s["left"] = limit - sum(u + L.BLOCK_EXTRA for u in blocks_since)
    s["n_alloc"] = len(blocks_before) + len(blocks_since)
    s["free_chunk_bytes"] = sum(u + L.BLOCK_EXTRA for u in freed_before)
    s["free_base"] = limit
    s["free_left"] = limit - sum(u + L.BLOCK_EXTRA for u in freed_since)
    s["n_free"] = len(freed_before) + len(freed_since)
    return s


def test_the_usable_bytes_are_the_folded_and_the_counted_less_8_a_block():
    s = slot([24, 40, 1000], [56, 56, 200000], [24], [40])
    alloc, freed = L.slot_usable(s)
    assert int(alloc[0]) == 24 + 40 + 1000 + 56 + 56 + 200000
    assert int(freed[0]) == 24 + 40


def test_a_countdown_past_zero_still_reads_right():
    # the block that ran the countdown out, before the owner folds it in
    s = slot([], [60000, 10000], [], [70000])
    alloc, freed = L.slot_usable(s)
    assert (int(alloc[0]), int(freed[0])) == (70000, 70000)


def test_rows_read_during_a_fold_are_read_again_and_a_stopped_owner_does_not_hang():
    s = np.concatenate([slot([8], [], [], []), slot([16], [], [], []), slot([32], [], [], [])])
    s["seq"] = [4, 7, 2]  # the second owner is in the middle of a fold, and stays there
    got = S.settled(s, tries=12)
    assert list(got["seq"]) == [4, 7, 2]
    assert [int(a) for a in L.slot_usable(got)[0]] == [8, 16, 32]
