"""Watching a running process over time: /proc/PID/status every interval, the
allocator's figures (attach.inspect: glibc's from a copy, the others' through gdb) as
often as their pause allows (next_reading_s), into a timeline and a run
record that `heapsight report` draws. Ends at the given duration, at Ctrl-C (the record
is kept) or when the process exits."""

from __future__ import annotations

import math
import signal
import time

from heapsight import analysis, interrupts
from heapsight.live import attach, procfs
from heapsight.errors import HeapsightError
from heapsight.model import Release, Summary
from heapsight.timeline import COLUMNS, IDX, Timeline


# The allocator's figures are read again as often as keeps the process's pause for them
# under this share of the time (glibc's, from a copy: a few ms), at least every interval
# and at most every STATS_EVERY_MAX_S; gdb's readings (0.2-0.8 s each) every
# STATS_EVERY_MAX_S
PAUSE_SHARE = 0.01
STATS_EVERY_MAX_S = 30.0


def next_reading_s(a: attach.Attached, interval_s: float, every_s: float | None) -> float:
    """Seconds until the allocator's figures are read again (every_s: the user's, else
    from the last reading's pause)."""
    if every_s is not None:
        return every_s
    if a.copy_pause_ms is None:
        return STATS_EVERY_MAX_S
    return min(STATS_EVERY_MAX_S, max(interval_s, a.copy_pause_ms / 1000 / PAUSE_SHARE))


class Watch:
    def __init__(self, pid: int, first: attach.Attached, interval_s: float = 1.0,
                 stats_every_s: float | None = None, use_gdb: bool = True, on_sample=None):
        self.pid, self.first, self.last = pid, first, first
        self.interval_s, self.stats_every_s, self.use_gdb = interval_s, stats_every_s, use_gdb
        self.on_sample = on_sample
        self.timeline = Timeline()
        self.inspections = [first]
        self.interrupted = self.ended = False
        self._start = None
        self.cpu = (0.0, 0.0)   # the process's CPU over the watch: user, system
        self.in_use_at = 0.0    # when (s into the watch) the allocator's figures were last read

    def elapsed(self) -> float:
        """Seconds since the watch began."""
        return time.monotonic() - self._start if self._start is not None else 0.0

    def run(self, duration_s: float | None) -> None:
        status = procfs.status(self.pid)
        cpu0 = procfs.cpu_seconds(self.pid) or (0.0, 0.0)
        start = self._start = time.monotonic()
        self.timeline.start_ns = time.monotonic_ns()
        next_stats = start + next_reading_s(self.first, self.interval_s, self.stats_every_s)
        with interrupts.deferred():
            if self.on_sample:
                self.on_sample(self.first)
            try:
                while True:
                    now = time.monotonic()
                    st = status.read()
                    if st is None or "rss" not in st:   # gone, or a zombie (no Vm lines)
                        self.ended = True
                        break
                    row = [math.nan] * len(COLUMNS)
                    row[IDX["t"]] = now - start
                    for k, v in st.items():
                        if k in IDX:
                            row[IDX[k]] = v
                    fresh = len(self.timeline) == 0   # the first inspection's moment
                    if self.use_gdb and now >= next_stats:
                        try:
                            self.last = attach.inspect(self.pid)
                            self.inspections.append(self.last)
                            fresh = True
                        except HeapsightError:
                            self.ended = True
                            break
                        next_stats = now + next_reading_s(self.last, self.interval_s,
                                                          self.stats_every_s)
                    # the allocator's figure where it was read, not carried to the samples
                    # after it (the timeline shows when it is known)
                    if fresh and self.last.in_use_bytes is not None:
                        row[IDX["alloc_in_use"]] = self.last.in_use_bytes
                        self.in_use_at = now - start
                    self.timeline.append_row(row)
                    if self.on_sample:
                        self.on_sample(self.last, st.get("rss"))
                    if duration_s is not None and now - start >= duration_s:
                        break
                    # one that came earlier is pending: it ends the watch at once
                    info = signal.sigtimedwait(interrupts.WATCHED, self.interval_s)
                    if info is not None:
                        self.interrupted = True
                        break
            finally:
                status.close()
                self.timeline.duration_s = time.monotonic() - start
                cpu1 = procfs.cpu_seconds(self.pid)
                if cpu1 is not None:
                    self.cpu = (max(0.0, cpu1[0] - cpu0[0]), max(0.0, cpu1[1] - cpu0[1]))

    def record(self) -> dict:
        """A run record of what was watched: /proc figures per sample (drawn by report),
        and each of the allocator's readings."""
        cols = self.timeline.columns
        rss = [v for v in cols["rss"] if not math.isnan(v)]
        parts = analysis.timeline_split(cols, 0, None) if rss else None

        def at(i):
            return analysis.Breakdown(round(float(cols["t"][i]), 3),
                                      **{f: int(parts[f][i]) for f in analysis.PART_FIELDS})
        peak_i = max(range(len(cols["rss"])), key=lambda i: cols["rss"][i]) if rss else None
        a = self.last
        summary = Summary(
            command=tuple(a.command.split(" ")), pid=self.pid, started_pid=self.pid, exit_code=0,
            exit_signal=0, preload="attached",
            preload_note=f"attached to a running process ({a.allocator}); /proc figures per "
                         "sample, the allocator's figures in 'attach'",
            duration_s=round(self.timeline.duration_s, 3), samples=len(self.timeline),
            sample_hz=round(1 / self.interval_s, 3), sampler_cpu_s=0.0,
            peak_rss_bytes=int(max(rss)) if rss else a.rss_bytes,
            final_rss_bytes=int(rss[-1]) if rss else a.rss_bytes,
            peak=at(peak_i) if rss else None, final=at(len(rss) - 1) if rss else None,
            release=Release(bool(a.trim), (a.trim or {}).get("call", "none"),
                            "" if a.trim else "no release asked for (--trim)"),
            heap=None, forks=0, execs=0, other_processes=0, verdict=a.verdict,
            cpu_user_s=round(self.cpu[0], 3), cpu_sys_s=round(self.cpu[1], 3),
            program_cpu_s=round(sum(self.cpu), 3), still_running=not self.ended,
            interrupted=self.interrupted)
        from heapsight import record
        doc = record.to_json_dict(summary, self.timeline)
        doc["attach"] = [i.to_dict() for i in self.inspections]
        return doc
