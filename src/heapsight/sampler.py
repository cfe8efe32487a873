"""The sampler: runs in the CLI process, reads /proc/PID/status every tick (100 Hz by
default), smaps_rollup a few times a second, and the stats segment every tick."""

from __future__ import annotations

import math
import os
import subprocess
import time
from array import array
from dataclasses import dataclass, field

from heapsight import procfs
from heapsight.segment import Segment

COLUMNS = ("t", "rss", "hwm", "anon", "file", "shmem", "pss", "live_usable", "live_req",
           "n_alloc", "n_free", "alloc_in_use", "alloc_free", "alloc_mapped", "arenas", "threads")
CLASS_ESTIMATES_PER_S = 50  # the per-class live-requested estimate costs ~30 µs


@dataclass
class Timeline:
    columns: dict = field(default_factory=lambda: {c: array("d") for c in COLUMNS})
    sampler_cpu_s: float = 0.0
    ticks: int = 0
    duration_s: float = 0.0

    def append(self, row: dict) -> None:
        for c, arr in self.columns.items():
            arr.append(row.get(c, math.nan))

    def __len__(self) -> int:
        return len(self.columns["t"])

    def last(self, column: str, default=None):
        arr = self.columns[column]
        for v in reversed(arr):
            if not math.isnan(v):
                return v
        return default


class Sampler:
    def __init__(self, proc: subprocess.Popen, segment: Segment | None, hz: float = 100.0,
                 smaps_hz: float = 4.0):
        self.proc, self.segment = proc, segment
        self.period = 1.0 / hz
        self.smaps_period = 1.0 / smaps_hz if smaps_hz > 0 else math.inf
        self.pid = proc.pid
        self.timeline = Timeline()

    def _retarget(self, status, rollup):
        """Follow the process that owns the segment when it is not the one we started
        (a wrapper that forked the real program)."""
        owner = self.segment.get("owner_pid") if self.segment else 0
        if owner and owner != self.pid:
            status.close(); rollup.close()
            self.pid = owner
            return procfs.status(owner), procfs.smaps_rollup(owner)
        return status, rollup

    def run(self) -> Timeline:
        tl, seg = self.timeline, self.segment
        status, rollup = procfs.status(self.pid), procfs.smaps_rollup(self.pid)
        start = time.monotonic()
        cpu0 = time.thread_time()
        next_tick, next_smaps, next_classes = start, start, start
        waste_ratio, pss, stats, stats_seq, retargeted = 0.0, math.nan, None, -1, False
        while True:
            now = time.monotonic()
            row = {"t": now - start}
            st = status.read()
            if st is not None:
                row.update(st)
            if now >= next_smaps:
                roll = rollup.read()
                if roll is not None:
                    pss = roll.get("pss", math.nan)
                next_smaps = now + self.smaps_period
            row["pss"] = pss
            if seg is not None and seg.attached():
                if not retargeted:
                    status, rollup = self._retarget(status, rollup)
                    retargeted = True
                exact = now >= next_classes
                c = seg.counters(classes=exact, waste_ratio=waste_ratio)
                if exact:
                    next_classes = now + 1.0 / CLASS_ESTIMATES_PER_S
                    waste_ratio = c.waste_bytes / c.live_usable_bytes if c.live_usable_bytes > 0 else 0.0
                row.update(live_usable=c.live_usable_bytes, live_req=c.live_requested_bytes,
                           n_alloc=c.n_alloc, n_free=c.n_free)
                seq = seg.get("stats_seq")
                if seq != stats_seq:
                    stats, stats_seq = seg.alloc_stats(), seq
                if stats is not None:
                    row.update(alloc_in_use=stats.in_use_bytes, alloc_free=stats.free_bytes,
                               alloc_mapped=stats.mapped_bytes, arenas=stats.arenas)
            if st is not None or "live_usable" in row:
                tl.append(row)
            tl.ticks += 1
            if self.proc.poll() is not None:
                break
            next_tick += self.period
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_tick = time.monotonic()  # fell behind: do not try to catch up in a burst
        tl.duration_s = time.monotonic() - start
        tl.sampler_cpu_s = time.thread_time() - cpu0
        status.close(); rollup.close()
        return tl
