"""The live blocks' waste, estimated from the sampled size histogram (analysis.live_waste):
the sums built here by hand, as the library builds them (each sampled block weighted by
1/p), with the truth known."""

import math

import numpy as np

from heapsight import layout as L
from heapsight import analysis


def hist(blocks, live=None):
    """The histogram of sampled blocks: (usable, requested, p) each; live: which of them
    are not freed (all by default)."""
    h = np.zeros((), L.HIST_DTYPE)
    live = [True] * len(blocks) if live is None else live
    for (u, r, p), alive in zip(blocks, live):
        c = u >> 4  # the class of a usable size below 1 KiB (hs_class_of)
        w, v = 1 / p, (1 - p) / p ** 2
        h["alloc_w"][c] += w
        h["waste_w"][c] += w * (u - r)
        if alive:
            h["live_w"][c] += w
            h["live_u_w"][c] += w * u
            h["live_var"][c] += v
            h["live_var_u"][c] += v * u
            h["live_var_uu"][c] += v * u * u
            h["live_samples"] += 1
    return h


def test_blocks_that_all_waste_alike_give_the_share_exactly_with_no_error():
    # GIVEN 1-byte requests (24 usable bytes each), sampled at all sorts of probabilities
    h = hist([(24, 1, p) for p in (0.001, 0.002, 0.01, 0.05)])
    # WHEN 24 MB of them are live
    waste, error = analysis.live_waste(h, 24_000_000, 0, 0)
    # THEN 23 of every 24 bytes are waste, with no sampling error: every sample says the same
    assert waste == 23_000_000 and error == 0


def test_a_mix_weighs_each_class_by_its_estimated_live_bytes():
    # GIVEN two sizes: 48-byte blocks wasting 8 bytes (p 0.1) and 512-byte blocks wasting none
    # (p 0.5), equal live bytes of each in the estimate
    blocks = [(48, 40, 0.1)] * 10 + [(512, 512, 0.5)] * 94
    h = hist(blocks)
    live_48, live_512 = 10 / 0.1 * 48, 94 / 0.5 * 512
    share = (10 / 0.1 * 8) / (live_48 + live_512)
    waste, error = analysis.live_waste(h, 1_000_000, 0, 0)
    # THEN the share is the 48-byte blocks' waste over all the live bytes
    assert waste == math.floor(1_000_000 * share + 0.5)
    # AND the error is the ratio estimate's: both classes contribute, so it is not 0
    assert 0 < error < waste


def test_nothing_sampled_live_falls_back_on_every_allocations_share():
    # GIVEN sampled blocks all freed, and 1,000 of 4,000 usable bytes ever allocated not requested
    h = hist([(48, 40, 0.1)] * 3, live=[False] * 3)
    waste, error = analysis.live_waste(h, 800, 4000, 3000)
    # THEN a quarter of the live bytes, exact (no error given)
    assert (waste, error) == (200, 0)
