"""The sampler: runs in the CLI process and reads, every tick (100 Hz by default, up to
1 kHz), /proc/PID/status (statm between status reads above 100 Hz), smaps_rollup a few
times a second, and the stats segment."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time

import numpy as np

from heapsight import interrupts, mappings, procfs, readloop
from heapsight.segment import STATE_EXITING, Segment, open_pagemap
from heapsight.timeline import COLUMNS, IDX, Timeline

CHILDREN_PER_S = 4          # the program's descendants: a walk of /proc, a few times a second
MAPPINGS_PER_S = 1          # /proc/PID/smaps classified (heapsight.mappings): ~10 µs per MiB
CLASS_ESTIMATES_PER_S = 50  # the per-class live-requested estimate costs ~20 µs
STATUS_PER_S = 100          # /proc/PID/status costs ~20 µs; statm (~4 µs) fills in above this
# Above this rate the ticks in between are taken in C (heapsight.readloop): a Python tick
# costs ~60 µs and more, 6% of a core at 1 kHz; the C tick a few µs. The Python tick still
# reads /proc/PID/status (peak RSS, threads), smaps and the children at its own rate.
PYTHON_TICKS_PER_S = 5


WAKE = interrupts.WATCHED | {signal.SIGCHLD}


def peak_kinds_above(tl) -> float:
    """The RSS above which the mappings are read again as the peak's: 10% and 1 MiB above
    the last such reading (so a program that grows to N MiB is read about 25 + log1.1(N)
    times at most, each reading ~10 us per MiB mapped)."""
    return 0.5 if tl.kinds_peak is None else 1.1 * tl.kinds_peak[2] + (1 << 20)


def _less(value: float, own: float) -> float:
    """A reading less heapsight's own bytes (NaN stays NaN: not read)."""
    return value if math.isnan(value) else max(0.0, value - own)


class Sampler:
    def __init__(self, proc: subprocess.Popen, segment: Segment | None, hz: float = 100.0,
                 smaps_hz: float = 4.0, on_signal=None, snapshot_signal: int | None = None,
                 snapshot_at: tuple = (), snapshot_every_s: float = 0.0, on_snapshot=None,
                 on_tick=None):
        """on_signal(siginfo) is called for each of interrupts.WATCHED that arrives while
        the program runs; the caller blocks them (and SIGCHLD, which ends a wait at once
        when the program exits) before starting the program."""
        self.proc, self.segment = proc, segment
        self.on_signal = on_signal
        self.on_tick = on_tick        # on_tick(row), a few times a second (the exporter)
        # snapshots: a sample taken and labelled at a signal (sent to heapsight), at given
        # times, or every so often; on_snapshot(label, t) runs right after it is taken
        self.snapshot_signal, self.on_snapshot = snapshot_signal, on_snapshot
        self.snapshot_due = sorted(snapshot_at)
        self.snapshot_every_s = snapshot_every_s
        self.pending = []
        self.period = 1.0 / hz
        self.smaps_period = 1.0 / smaps_hz if smaps_hz > 0 else math.inf
        self.pid = proc.pid
        self.timeline = Timeline()
        self._own = set()   # pids of heapsight's own processes among the program's children

    def _reaped(self) -> bool:
        """waitpid with the program's resource usage (CPU time, faults) on the way."""
        try:
            pid, status, ru = os.wait4(self.proc.pid, os.WNOHANG)
        except ChildProcessError:
            return self.proc.poll() is not None
        if pid == 0:
            return False
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        tl = self.timeline
        tl.child_user_s, tl.child_sys_s, tl.child_minflt = ru.ru_utime, ru.ru_stime, ru.ru_minflt
        return True

    def _wait(self, seconds: float) -> bool:
        """Sleeps until the next tick, taking the signals the caller blocked; True when
        SIGCHLD came (the program may have ended: no need to sleep out a long period)."""
        if self.on_signal is None:
            time.sleep(seconds)
            return False
        deadline = time.monotonic() + seconds
        while True:
            wake = WAKE | ({self.snapshot_signal} if self.snapshot_signal else set())
            info = signal.sigtimedwait(wake, max(0.0, deadline - time.monotonic()))
            if info is None:
                return False
            if info.si_signo == signal.SIGCHLD:
                return True
            if info.si_signo == self.snapshot_signal:
                self._signal_n += 1
                self.pending.append(f"{signal.Signals(info.si_signo).name} #{self._signal_n}")
                return True   # take it now
            self.on_signal(info)

    def _snapshots(self, t: float) -> None:
        """Labels the sample just taken when a snapshot is due (asked for by signal, at a
        time, or every so often)."""
        while self.snapshot_due and t >= self.snapshot_due[0]:
            self.pending.append(f"--at {self.snapshot_due.pop(0):g}")
        if self.snapshot_every_s and t >= self.snapshot_every_s * (self._every_n + 1):
            self._every_n = int(t // self.snapshot_every_s)
            self.pending.append(f"--every {self.snapshot_every_s:g} #{self._every_n}")
        for label in self.pending:
            self.timeline.snapshots.append((label, t))
            if self.on_snapshot:
                self.on_snapshot(label, t)
        self.pending = []
        if self._asked and self.segment is not None:
            self.segment.ack_snapshot(self._asked)   # the program's call returns

    _every_n = 0
    _signal_n = 0
    _asked = 0      # the last heapsight_snapshot() request taken

    def _image(self, t: float) -> None:
        """Notes the executable the program runs, each time it changes (an execve)."""
        try:
            exe = os.readlink(f"/proc/{self.pid}/exe")
        except OSError:
            return
        tl = self.timeline
        if not tl.images or tl.images[-1][1] != exe:
            tl.images.append((round(t, 3), exe))
            tl.image_before_s.append(self._image_seen_s)
        self._image_seen_s = t

    _image_seen_s = -1.0    # when the executable was last read (the one before a change)

    def _children(self) -> float:
        """The RSS of the program's descendants (compilers' cc1, a shell's commands: they
        run beside it with their own heaps and are not counted in its figures); each one's
        peak is kept by pid with its name."""
        total, seen, todo = 0, set(), [self.pid]
        page = os.sysconf("SC_PAGE_SIZE")
        while todo:
            parent = todo.pop()
            try:
                tids = os.listdir(f"/proc/{parent}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                        kids = [int(x) for x in f.read().split()]
                except (OSError, ValueError):
                    continue
                for kid in kids:
                    if kid in seen or kid in self._own:
                        continue
                    seen.add(kid)
                    todo.append(kid)
                    try:
                        with open(f"/proc/{kid}/comm", "rb") as f:
                            name = f.read().decode(errors="replace").strip()
                        if name == "hs-heapmap":   # heapsight's copy of the program (heapmap.c)
                            self._own.add(kid)
                            continue
                        with open(f"/proc/{kid}/statm", "rb") as f:
                            rss = int(f.read().split()[1]) * page
                    except (OSError, ValueError, IndexError):
                        continue
                    total += rss
                    entry = self.timeline.children.setdefault(kid, [name, 0])
                    entry[0] = name   # after an exec, the new image's name
                    entry[1] = max(entry[1], rss)
        return float(total) if seen else 0.0

    def _open(self, pid: int) -> None:
        self.pid = pid
        self.status, self.statm = procfs.status(pid), procfs.Statm(pid)
        self.rollup = procfs.smaps_rollup(pid)
        self.pagemap = open_pagemap(pid) if self.segment is not None else None

    def _close(self) -> None:
        for f in (self.status, self.statm, self.rollup):
            f.close()
        if self.pagemap is not None:
            os.close(self.pagemap)
            self.pagemap = None

    def _segment_mapped(self) -> bool:
        """Whether the program has the segment mapped where the library said: it owns it,
        and runs the image that attached (after an exec into one without the library, that
        address holds something else)."""
        seg, images = self.segment, self.timeline.images
        if seg is None or not seg.attached() or seg.get("owner_pid") != self.pid:
            return False
        image = seg.image()
        return not images or (bool(image) and images[-1][1].endswith(image))

    def _own_resident(self) -> float:
        """heapsight's own bytes in the program's RSS now (the segment's resident pages)."""
        seg = self.segment
        if not self._segment_mapped():
            return 0.0
        own = float(seg.resident_in_owner(self.pagemap))
        self.timeline.own_rss_bytes = max(self.timeline.own_rss_bytes, own)
        return own

    def _kinds(self) -> dict | None:
        """The program's resident memory by kind of mapping (heapsight's segment left
        out), None when /proc would not say."""
        try:
            own_map = self.segment.path if self.segment is not None else None
            kinds = mappings.resident_by_kind([m for m in mappings.read(self.pid)
                                               if m.path != own_map])
        except (OSError, ValueError):
            return None
        return kinds if any(kinds.values()) else None   # read as the process went: nothing

    def _retarget(self) -> None:
        """Follow the process that owns the segment when it is not the one we started
        (a wrapper that forked the real program)."""
        owner = self.segment.get("owner_pid") if self.segment else 0
        if owner and owner != self.pid:
            self._close()
            self._open(owner)

    def _next_snapshot_due(self, start: float) -> float:
        """When the next snapshot by time (--at, --every) is due, in monotonic seconds."""
        due = math.inf
        if self.snapshot_due:
            due = start + self.snapshot_due[0]
        if self.snapshot_every_s:
            due = min(due, start + self.snapshot_every_s * (self._every_n + 1))
        return due

    def _append_fast(self, rows: np.ndarray, best_usable: float, hwm: float, threads: float,
                     pss: float, children_rss: float) -> float:
        """Appends the C ticks' rows, with the figures only the Python tick reads carried
        over; returns the most live usable bytes seen (the peak's requested/usable ratio is
        taken at it, from the row's exact per-class estimate)."""
        full = np.full((len(rows), len(COLUMNS)), math.nan)
        for i, name in enumerate(readloop.COLUMNS):
            full[:, IDX[name]] = rows[:, i]
        full[:, IDX["hwm"]], full[:, IDX["threads"]] = hwm, threads
        full[:, IDX["pss"]], full[:, IDX["children_rss"]] = pss, children_rss
        live = rows[:, readloop.COLUMNS.index("live_usable")]
        if not np.isnan(live).all():
            k = int(np.nanargmax(live))
            if live[k] > best_usable:
                best_usable = float(live[k])
                if live[k] > 0:
                    self.timeline.peak_req_ratio = float(rows[k, 4] / live[k])
        self.timeline.append_rows(full)
        self.timeline.ticks += len(rows)
        return best_usable

    def run(self) -> Timeline:
        tl, seg = self.timeline, self.segment
        self._open(self.pid)
        tl.start_ns = time.monotonic_ns()
        start = tl.start_ns / 1e9
        cpu0 = time.thread_time()
        next_tick, next_smaps, next_classes, next_status = start, start, start, start
        next_poll, next_children, children_rss = start, start, math.nan
        next_kinds = start + 0.05
        hwm, threads, best_usable = math.nan, math.nan, 0
        exit_tried, early = False, False
        waste_ratio, pss, stats_seq, retargeted = 0.0, math.nan, -1, False
        blank = [math.nan] * len(COLUMNS)
        I = IDX
        fast = None
        if self.period < 1.0 / PYTHON_TICKS_PER_S and readloop.available():
            fast = readloop.FastReader(seg, tl.start_ns, self.period,
                                       WAKE | ({self.snapshot_signal} if self.snapshot_signal else set()))
        while True:
            # a heapsight_snapshot() request is read before the tick's time: the program
            # waits in its call from the request on, so this row (taken after) is its moment;
            # one that comes during the tick is taken by the next (whose time follows it)
            live = retargeted or (seg is not None and seg.attached())
            req = seg.snapshot_request(self._asked) if live else None
            now = time.monotonic()
            row = blank[:]
            row[I["t"]] = now - start
            if now >= next_status:
                st = self.status.read()
                next_status = now + 1.0 / STATUS_PER_S
                if st is not None:
                    hwm, threads = st.get("hwm", math.nan), st.get("threads", math.nan)
                    self._image(now - start)
            else:
                st = self.statm.read()
            own = self._own_resident()
            own_here = self._segment_mapped()
            if st is not None:
                for k, v in st.items():
                    if k in I:
                        row[I[k]] = v
                # the segment's pages are shared memory in the program's RSS: left out. The
                # kernel's peak (VmHWM) holds them too; they only grow, so VmHWM less them
                # now is the least the program's own peak can have been
                for k in ("rss", "shmem"):
                    row[I[k]] = _less(row[I[k]], own)
                row[I["hwm"]], row[I["threads"]] = _less(hwm, own), threads
            rss_now = row[I["rss"]]
            peak_due = not math.isnan(rss_now) and rss_now > peak_kinds_above(tl)
            exiting = (not exit_tried and seg is not None and seg.attached()
                       and seg.get("state") >= STATE_EXITING)
            exit_tried = exit_tried or exiting
            if now >= next_kinds or peak_due or exiting:
                next_kinds = now + 1.0 / MAPPINGS_PER_S
                kinds = self._kinds()
                # once the program is past heapsight's exit probe its teardown unmaps as it
                # goes: a reading then is not kept
                torn = seg is not None and seg.attached() and seg.get("state") > STATE_EXITING
                if kinds is not None and not torn:
                    tl.kinds = (tl.kinds + [(now - start, kinds)])[-2:]   # the last two: the last may be cut
                    if peak_due:
                        tl.kinds_peak = (now - start, kinds, rss_now)
                    if exiting:
                        tl.kinds_exit = (now - start, kinds)
            if now >= next_children:
                children_rss = self._children()
                if self.on_tick is not None and tl.flat:
                    self.on_tick(tl.flat[-len(COLUMNS):])
                next_children = now + 1.0 / CHILDREN_PER_S
            row[I["children_rss"]] = children_rss
            if now >= next_smaps:
                roll = self.rollup.read()
                if roll is not None:
                    pss = roll.get("pss", math.nan)
                next_smaps = now + self.smaps_period
            row[I["pss"]] = pss
            counted = False
            if live:
                if not retargeted or seg.get("owner_pid") != self.pid:
                    self._retarget()
                    retargeted = True
                exact = now >= next_classes
                c = seg.counters(classes=exact, waste_ratio=waste_ratio)
                if c.live_usable_bytes > best_usable:
                    best_usable = c.live_usable_bytes
                    if not exact:
                        c, exact = seg.counters(classes=True), True
                    if c.live_usable_bytes > 0:
                        tl.peak_req_ratio = c.live_requested_bytes / c.live_usable_bytes
                if exact:
                    next_classes = now + 1.0 / CLASS_ESTIMATES_PER_S
                    waste_ratio = c.waste_bytes / c.live_usable_bytes if c.live_usable_bytes > 0 else 0.0
                row[I["live_usable"]], row[I["live_req"]] = c.live_usable_bytes, c.live_requested_bytes
                row[I["n_alloc"]], row[I["n_free"]] = c.n_alloc, c.n_free
                counted = True
                # the allocator's statistics go in the row that first sees a new reading
                # only (NaN elsewhere), so the record shows the rate they were taken at
                if req is not None:   # the program called heapsight_snapshot(label)
                    # calls made together (from several threads) are answered by this one
                    # sample: its label is the last one's, and says how many it answered
                    merged = req[0] - self._asked - 1
                    self._asked = req[0]
                    self.pending.append(req[1] + (f" (and {merged} more call{'s' * (merged > 1)} "
                                                  "answered by this snapshot)" if merged > 0 else ""))
                seq = seg.get("stats_seq")
                if seq != stats_seq:
                    stats = seg.alloc_stats()
                    if stats is not None:   # None: torn by a writer, read it next tick
                        stats_seq = seq
                        row[I["alloc_in_use"]] = math.nan if stats.in_use_bytes is None else stats.in_use_bytes
                        row[I["alloc_free"]] = math.nan if stats.free_bytes is None else stats.free_bytes
                        row[I["alloc_mapped"]], row[I["arenas"]] = stats.mapped_bytes, stats.arenas
            # a tick right after one the fast reader took (it stopped early for a new high of
            # RSS, or the program's exit, to read the mappings) adds no row a hair after its
            # last: two samples a few µs apart would make "the sample at t" ambiguous
            n_cols = len(COLUMNS)
            crowded = (early and req is None and not self.pending and len(tl.flat) >= n_cols and
                       row[I["t"]] - tl.flat[len(tl.flat) - n_cols] < 0.5 * self.period)
            early = False
            if (st is not None or counted) and not crowded:
                tl.append_row(row)
                self._snapshots(row[I["t"]])
            tl.ticks += 1
            # waitpid costs as much as a /proc read: ask at most 100 times a second, or at
            # once when /proc says the process is gone.
            if (st is None or now >= next_poll) and self._reaped():
                break
            if now >= next_poll:
                next_poll = now + 0.01
            next_tick += self.period
            delay = next_tick - time.monotonic()
            if delay <= 0:
                next_tick = time.monotonic()  # fell behind: do not try to catch up in a burst
            if fast is not None and self.statm.fd is not None:
                # the ticks until the next Python tick is due are taken in C
                due = min(now + 1.0 / PYTHON_TICKS_PER_S, next_children, next_smaps,
                          next_kinds, self._next_snapshot_due(start))
                if due > next_tick:
                    rows, why, nxt, seq = fast.loop(self.statm.fd, int(next_tick * 1e9),
                                                    int(due * 1e9), self._asked, stats_seq,
                                                    self.pagemap if own_here else None, own,
                                                    self.pid, watch_exit=not exit_tried,
                                                    rss_above=peak_kinds_above(tl),
                                                    exe=tl.images[-1][1] if tl.images else "")
                    own = fast.own[0]
                    tl.own_rss_bytes = max(tl.own_rss_bytes, fast.own[1])
                    if seq != max(0, stats_seq):
                        stats_seq = seq
                    next_tick = nxt / 1e9
                    if len(rows):
                        best_usable = self._append_fast(rows, best_usable, _less(hwm, own),
                                                        threads, pss, children_rss)
                    early = why in (readloop.RSS, readloop.EXITING, readloop.EXEC)
                    if why == readloop.EXEC:
                        next_status = 0.0   # the next tick reads the new image
                    if why == readloop.SIGNAL and self._wait(0.0):
                        next_poll = 0.0
                    elif why == readloop.GONE:
                        next_poll = 0.0
                    continue
            if self._wait(max(0.0, delay)):
                next_poll = 0.0  # the program (or a child of it) changed state: reap now
        tl.duration_s = time.monotonic() - start
        tl.sampler_cpu_s = time.thread_time() - cpu0
        self._close()
        return tl
