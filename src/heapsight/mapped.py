"""How much of the memory a program mapped itself (outside malloc) is resident, by the
object that mapped it. The library records every such mapping (address, size, when mapped
and unmapped, the stack that mapped it: profile.Profile.maps); the sampler reads the
program's anonymous mappings with their resident bytes (smaps) at the moments it
classifies them. A runtime that reserves address space (the JVM: gigabytes mapped
PROT_NONE, committed as it grows) then shows what it uses beside what it reserved.

A range mapped twice (a commit with MAP_FIXED over a reservation) counts once, for the
later mapping; a mapping's resident bytes are its share of each smaps entry it overlaps
(an entry is one kind of protection, so a reservation's entry has none)."""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from heapsight import profile

OWN_LIBRARY = "libheapsight"   # the hook's own frames, above the caller of mmap


def live_ranges(prof, t_ns: int) -> list:
    """(start, end, module path of the caller of mmap) of the mappings live at t_ns,
    disjoint (a later mapping over an earlier one wins its range)."""
    maps = prof.maps
    live = (maps["time_ns"] <= np.uint64(t_ns)) & ((maps["free_ns"] == profile.NEVER)
                                                   | (maps["free_ns"] > np.uint64(t_ns)))
    rows = maps[live]
    if not len(rows):
        return []
    callers = caller_modules(prof, rows)
    # a sweep over the boundaries: each elementary range goes to the latest mapping over it
    events = sorted([(int(r["addr"]), 0, i) for i, r in enumerate(rows)]
                    + [(int(r["addr"]) + int(r["size"]), 1, i) for i, r in enumerate(rows)])
    order = np.argsort(rows["time_ns"], kind="stable")
    rank = np.empty(len(rows), dtype=np.int64)
    rank[order] = np.arange(len(rows))
    active, gone, out, last = [], set(), [], None
    for addr, kind, i in events:
        while active and active[0][1] in gone:
            heapq.heappop(active)
        if active and last is not None and addr > last:
            top = active[0][1]
            if out and out[-1][1] == last and out[-1][2] == callers[top]:
                out[-1] = (out[-1][0], addr, callers[top])
            else:
                out.append((last, addr, callers[top]))
        last = addr
        if kind == 0:
            heapq.heappush(active, (-int(rank[i]), i))
        else:
            gone.add(i)
    return out


def caller_modules(prof, rows) -> list:
    """For each mapping's row, the path of the object that called mmap: the first frame of
    its stack outside heapsight's library ("" when the stack was not unwound). The objects
    of every stack are found at once (a search per row was 6 ms of a python3 run's end)."""
    addrs, n = prof.stacks(rows["stack"])
    if not n.sum():
        return [""] * len(n)
    idx = prof.module_index(addrs, np.repeat(np.asarray(rows["index"], dtype=np.uint64), n)).tolist()
    paths = [m.path for m in prof.modules]
    own = [OWN_LIBRARY in p.rsplit("/", 1)[-1] for p in paths]
    out, at = [], 0
    for k in n.tolist():
        out.append(next((paths[i] if i >= 0 else "" for i in idx[at:at + k]
                         if i < 0 or not own[i]), ""))
        at += k
    return out


def resident_by_object(ranges: list, vmas: list) -> dict:
    """Object path -> resident bytes of its ranges, each range given its share of every
    smaps entry (start, end, rss) it overlaps."""
    out: dict = {}
    if not ranges or not vmas:
        return out
    vmas = sorted(vmas)
    starts = [v[0] for v in vmas]
    for lo, hi, who in ranges:
        k = max(0, bisect.bisect_right(starts, lo) - 1)
        while k < len(vmas) and vmas[k][0] < hi:
            v_lo, v_hi, rss = vmas[k]
            overlap = min(hi, v_hi) - max(lo, v_lo)
            if overlap > 0 and v_hi > v_lo:
                out[who] = out.get(who, 0) + rss * overlap / (v_hi - v_lo)
            k += 1
    return {who: int(round(b)) for who, b in out.items()}
