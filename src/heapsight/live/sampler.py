"""The sampler: runs in the CLI process and reads, every tick (100 Hz by default, up to
1 kHz), /proc/PID/status (statm between status reads above 100 Hz), smaps_rollup a few
times a second, and the stats segment."""

from __future__ import annotations

import math
import os
import re
import signal
import time

from heapsight import interrupts, mappings
from heapsight.live import procfs, readloop
from heapsight.layout import STATE_EXITING, STATS_UNKNOWN
from heapsight.live.segment import Segment, open_pagemap
from heapsight.timeline import COLUMNS, IDX, Timeline

CHILDREN_PER_S = 4          # the program's descendants: a walk of /proc, a few times a second
MAPPINGS_PER_S = 1          # /proc/PID/smaps classified (heapsight.mappings): ~10 µs per MiB
STATUS_PER_S = 100          # /proc/PID/status costs ~20 µs; statm (~4 µs) fills in above this
# Above this rate the ticks in between are taken in C (heapsight.live.readloop): a Python tick
# costs ~60 µs and more, 6% of a core at 1 kHz; the C tick a few µs. The Python tick still
# reads /proc/PID/status (peak RSS, threads), smaps and the children at its own rate.
PYTHON_TICKS_PER_S = 5
# Reading /proc/PID/smaps (and smaps_rollup) walks the program's page tables under its
# mmap lock: 8 ms at 400 MiB resident, and a brk or mmap of the program's waits for it (perl
# growing a hash to 400 MiB was blocked 50-78 ms of 1.5 s by the readings at each new high).
# The walks may hold it LOCK_SHARE of the run's time, and LOCK_ALLOWANCE_S more: a short
# program is read at each new high as before (one growing to 70 MiB in 0.6 s: 17
# readings, 8.4 ms of walks). Past that, a reading waits until the run's time pays for
# it (taken to cost what the last one did), but for the one at a pause in the growth (the
# peak's) and at exit. A walk's length is taken from RSS: 20 us per MiB resident (smaps
# and smaps_rollup read 7.5-10 ms at 400 MiB, the best of 5 each, from outside).
LOCK_SHARE = 0.01
LOCK_ALLOWANCE_S = 0.01
LOCK_S_PER_MIB = 20e-6
# CPython's executable or library among the program's mappings: its pymalloc pools are read
PYTHON_FILE = re.compile(r"(^|/)(lib)?python3\.\d+[^/]*$")
MAX_POOL_READINGS = 10000   # pymalloc readings kept
# pymalloc's pools are read this often (and at each reading of the mappings) while the lock
# budget allows: a drop of objects that leaves the arenas resident shows from the next one
POOLS_PERIOD_S = 0.25
MAX_VMAS = 20000            # anonymous mappings kept per reading (mapped.py: whose are resident)


WAKE = interrupts.WATCHED | interrupts.PASSED_ON | {signal.SIGCHLD}
# where the C tick's columns go in a row, and its live usable and requested bytes
_FAST_AT = [IDX[name] for name in readloop.COLUMNS]
_FAST_USABLE, _FAST_REQ = readloop.COLUMNS.index("live_usable"), readloop.COLUMNS.index("live_req")


def _with_first_argument(pid: int, name: str) -> str:
    """A child named as the command it runs under ("git" under git gc) named with its first
    argument too ("git pack-objects"), which --follow then picks it by; as it was when that
    is an option or there is none (python3's multiprocessing children: "-c")."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read(4096).split(b"\0")
    except OSError:
        return name
    first = words[1].decode(errors="replace") if len(words) > 1 else ""
    if not first or first.startswith("-") or " " in first or len(first) > 64:
        return name
    return f"{name} {first}"


def _hwm(pid: int) -> int:
    """A process's peak RSS so far (VmHWM in /proc/PID/status, bytes); 0 if not said (a
    kernel thread, a zombie)."""
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_kinds_above(tl) -> float:
    """The RSS above which the mappings are read again as the peak's: 10% and 1 MiB above
    the last such reading (so a program that grows to N MiB is read about 25 + log1.1(N)
    times at most, each reading ~10 us per MiB mapped)."""
    return 0.5 if tl.kinds_peak is None else 1.1 * tl.kinds_peak[2] + (1 << 20)


PAUSE_SAMPLES = 3


def _pausing(tl, rss_now: float) -> bool:
    """Whether RSS stopped growing: this reading within 0.1% of each of the PAUSE_SAMPLES
    samples before it."""
    n, flat = len(COLUMNS), tl.flat
    if len(flat) < PAUSE_SAMPLES * n:
        return False
    before = [flat[len(flat) - k * n + IDX["rss"]] for k in range(1, PAUSE_SAMPLES + 1)]
    return all(not math.isnan(b) and rss_now <= 1.001 * b for b in before)


def _less(value: float, own: float) -> float:
    """A reading less heapsight's own bytes (NaN stays NaN: not read)."""
    return value if math.isnan(value) else max(0.0, value - own)


class _Carry:
    """What one tick leaves the next: when each reading is due next (monotonic seconds),
    and the last values of the readings taken less often than every tick."""

    def __init__(self, start: float) -> None:
        self.tick = self.status = self.smaps = start
        self.poll = self.children = self.stats = start
        self.kinds = start + 0.05
        self.pools = start   # pymalloc's pools next (Sampler._read_pools)
        # the seconds the walks of smaps and smaps_rollup held the program's mmap lock (as
        # LOCK_S_PER_MIB puts them), and when the next may come (LOCK_SHARE)
        self.start, self.held, self.kinds_free = start, 0.0, start
        self.hwm = self.threads = self.children_rss = self.pss = math.nan
        self.best_usable = 0
        # this tick's RSS as read, with heapsight's own resident and private bytes in it
        self.rss_read: tuple | None = None
        self.exit_tried = self.early = self.retargeted = False

    def held_lock(self, rss: float) -> None:
        """A read of smaps or smaps_rollup held the program's mmap lock, RSS being rss (its
        walk's length, as LOCK_S_PER_MIB puts it: a time taken here would count the reader
        waiting for the interpreter's lock too): the next may come once the run's time pays
        for it, if it costs as much."""
        seconds = 0.0 if math.isnan(rss) else rss / (1 << 20) * LOCK_S_PER_MIB
        self.held += seconds
        owed = self.held + seconds - LOCK_ALLOWANCE_S
        self.kinds_free = self.start + max(0.0, owed) / LOCK_SHARE


class Sampler:
    python = False   # CPython maps its executable or library (PYTHON_FILE): _kinds sets it
    mapped_read = math.nan   # the allocator's mapped memory at its latest reading

    def __init__(self, proc, segment: Segment | None, hz: float = 100.0,
                 smaps_hz: float = 4.0, on_signal=None, snapshot_signal: int | None = None,
                 snapshot_at: tuple = (), snapshot_every_s: float = 0.0, on_snapshot=None,
                 on_tick=None, stats_hz: float = 10.0, on_first_tick=None):
        """proc is the started program (launch.Program: its pid, poll and returncode).
        on_signal(siginfo) is called for each of interrupts.WATCHED that arrives while
        the program runs; the caller blocks them (and SIGCHLD, which ends a wait at once
        when the program exits) before starting the program."""
        self.proc, self.segment = proc, segment
        self.on_signal = on_signal
        # on_tick(row, the allocator's mapped memory at its latest reading), a few times a
        # second (the exporter)
        self.on_tick = on_tick
        # called once the first tick is taken (the run's own work that can wait starts
        # then: the program's first moments are read first)
        self.on_first_tick = on_first_tick
        # snapshots: a sample taken and labelled at a signal (sent to heapsight), at given
        # times, or every so often; on_snapshot(label, t) runs right after it is taken
        self.snapshot_signal, self.on_snapshot = snapshot_signal, on_snapshot
        self.snapshot_due = sorted(snapshot_at)
        self.snapshot_every_s = snapshot_every_s
        self.pending = []
        self.period = 1.0 / hz
        self.smaps_period = 1.0 / smaps_hz if smaps_hz > 0 else math.inf
        # glibc's figures, read from outside at this rate (procfs.GlibcArenas)
        self.stats_period = 1.0 / stats_hz if stats_hz > 0 else math.inf
        self._arenas = None
        self._finalizing = None   # CPython's _PyRuntime._finalizing (procfs.Word)
        self.pid = proc.pid
        self.timeline = Timeline()
        self._own = set()   # pids of heapsight's own processes among the program's children
        self._started = None   # the started process's name (_started_name)
        # the segment's pages resident in the program at the last tick (they grow, but an
        # exec starts them again)
        self.segment_resident = 0.0

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
        tl.child_maxrss = ru.ru_maxrss * 1024
        if self.pid != self.proc.pid:
            # the process measured is not the one started: wait4's figures are the command's
            # (the started process and every descendant it waited for); the measured one's
            # are its own as last read (/proc, CPU in clock ticks)
            tl.child_user_s, tl.child_sys_s, tl.child_minflt = self._followed_usage
            tl.child_maxrss = 0
        return True

    # (user s, system s, minor faults) of the process measured when it is not our child
    _followed_usage = (0.0, 0.0, 0)

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
        peak is kept by pid with its name: its own high-water mark (VmHWM) as last read,
        which a reading after a spike still sees (a child's RSS alone, read a few times a
        second, missed one that came and went between two readings). They are the started
        process's: under --follow, the command's other processes (the process measured is
        walked through, not counted)."""
        total, seen, todo = 0, set(), [self.proc.pid]
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
                    if kid == self.pid:
                        continue
                    try:
                        with open(f"/proc/{kid}/comm", "rb") as f:
                            name = f.read().decode(errors="replace").strip()
                        if name == "hs-heapmap":   # heapsight's copy of the program (heapmap.c)
                            self._own.add(kid)
                            continue
                        if name == self._started_name():
                            name = _with_first_argument(kid, name)
                        with open(f"/proc/{kid}/statm", "rb") as f:
                            rss = int(f.read().split()[1]) * page
                        hwm = _hwm(kid)
                    except (OSError, ValueError, IndexError):
                        continue
                    total += rss
                    entry = self.timeline.children.setdefault(kid, [name, 0])
                    entry[0] = name   # after an exec, the new image's name
                    entry[1] = max(entry[1], rss, hwm)
        return float(total) if seen else 0.0

    def _started_name(self) -> str:
        """The name (comm) of the process heapsight started, read once."""
        if self._started is None:
            try:
                with open(f"/proc/{self.proc.pid}/comm", "rb") as f:
                    self._started = f.read().decode(errors="replace").strip()
            except OSError:
                return ""
        return self._started

    def _open(self, pid: int) -> None:
        self.pid = pid
        self.status, self.statm = procfs.status(pid), procfs.Statm(pid)
        self.rollup = procfs.smaps_rollup(pid)
        self.pagemap = open_pagemap(pid) if self.segment is not None else None

    def _close(self) -> None:
        for f in (self.status, self.statm, self.rollup):
            f.close()
        self._close_arenas()
        self._close_finalizing()
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

    def _own_resident(self) -> tuple:
        """heapsight's own bytes in the program's RSS now: (the segment's resident pages,
        its private memory: the sampled blocks' tables and byte map, the unwind rules)."""
        seg = self.segment
        if not self._segment_mapped():
            return 0.0, 0.0
        own, private = float(seg.resident_in_owner(self.pagemap)), float(seg.get("own_private_bytes"))
        self.segment_resident = own
        self.timeline.own_rss_bytes = max(self.timeline.own_rss_bytes, own + private)
        return own, private

    def _kinds(self) -> tuple:
        """(the program's resident memory by kind of mapping, heapsight's segment and private
        memory left out;
        its other anonymous mappings as (start, end, resident bytes)), (None, None) when
        /proc would not say."""
        try:
            own_map = self.segment.path if self.segment is not None else None
            maps = [m for m in procfs.smaps(self.pid) if m.path != own_map]
        except (OSError, ValueError):
            return None, None
        kinds = mappings.resident_by_kind(maps)
        self.python = self.python or any(PYTHON_FILE.search(m.path) for m in maps if m.path)
        if not any(kinds.values()):
            return None, None   # read as the process went: nothing
        # heapsight's tables and byte map are anonymous mappings of their own (or the
        # library's .bss): "other anonymous" without them
        if self._segment_mapped():
            kinds["anon"] = max(0, kinds["anon"] - int(self.segment.get("own_private_bytes")))
        # (a mapping shaped like glibc's thread arena is another allocator's heap as often:
        # jemalloc's and mimalloc's 64 MiB-aligned ones; the mmaps recorded say whose it is)
        anon = [(m.start, m.end, m.rss) for m in maps if m.kind in ("anon", "arena")][:MAX_VMAS]
        return kinds, anon

    def _follow_owner(self, c: "_Carry") -> tuple:
        """The segment's owner is another process than the one read so far (--follow's
        program, started by the command's own process): what was read until now was that
        other process's (its RSS, mappings, images, children). The timeline starts again at
        the owner, its time counted from now (the command's other processes, read all along,
        stay); (the new start in seconds, a new _Carry)."""
        self._close()
        self._open(self.segment.get("owner_pid"))
        children = self.timeline.children   # the command's, read from the started process
        self.timeline.restart(time.monotonic_ns())
        self.timeline.children = children
        self._image_seen_s, self._every_n = -1.0, 0
        start = self.timeline.start_ns / 1e9
        fresh = _Carry(start)
        fresh.retargeted, fresh.poll = True, c.poll
        return start, fresh

    def _next_snapshot_due(self, start: float) -> float:
        """When the next snapshot by time (--at, --every) is due, in monotonic seconds."""
        due = math.inf
        if self.snapshot_due:
            due = start + self.snapshot_due[0]
        if self.snapshot_every_s:
            due = min(due, start + self.snapshot_every_s * (self._every_n + 1))
        return due

    def _append_fast(self, rows: list, best_usable: float, hwm: float, threads: float,
                     pss: float, children_rss: float) -> float:
        """Appends the C ticks' rows, with the figures only the Python tick reads carried
        over; returns the most live usable bytes seen (the peak's requested/usable ratio is
        taken at it, from the row's live waste estimate)."""
        usable, req = _FAST_USABLE, _FAST_REQ
        carried = ((IDX["hwm"], hwm), (IDX["threads"], threads), (IDX["pss"], pss),
                   (IDX["children_rss"], children_rss))
        full = []
        for r in rows:
            row = [math.nan] * len(COLUMNS)
            for i, v in zip(_FAST_AT, r):
                row[i] = v
            for i, v in carried:
                row[i] = v
            full.append(row)
            live = r[usable]
            if live > best_usable:   # (NaN never is)
                best_usable = live
                self.timeline.peak_req_ratio = r[req] / live
        self.timeline.append_rows(full)
        self.timeline.ticks += len(rows)
        return best_usable

    def run(self) -> Timeline:
        """Samples the program until it ends: each tick reads /proc (_read_proc), the
        mappings when due (_read_mappings), the descendants and smaps_rollup at their rates
        (_read_slow) and the segment (_read_library), appends the row, and sleeps or lets
        the C reader take the ticks until the next Python one is due (_fast_ticks)."""
        tl, seg = self.timeline, self.segment
        self._open(self.pid)
        tl.start_ns = time.monotonic_ns()
        start = tl.start_ns / 1e9
        cpu0 = time.thread_time()
        c = _Carry(start)
        gone = 0.0   # when the process followed ended, if it is not the one started
        fast = None
        if self.period < 1.0 / PYTHON_TICKS_PER_S and readloop.available():
            fast = readloop.FastReader(seg, tl.start_ns, self.period,
                                       WAKE | ({self.snapshot_signal} if self.snapshot_signal else set()))
        while True:
            # a heapsight_snapshot() request is read before the tick's time: the program
            # waits in its call from the request on, so this row (taken after) is its moment;
            # one that comes during the tick is taken by the next (whose time follows it)
            live = c.retargeted or (seg is not None and seg.attached())
            if live and seg.get("owner_pid") not in (0, self.pid):
                start, c = self._follow_owner(c)
                if fast is not None:
                    fast.start_ns = tl.start_ns
            c.retargeted = c.retargeted or live
            req = seg.snapshot_request(self._asked) if live else None
            now = time.monotonic()
            row = [math.nan] * len(COLUMNS)
            row[IDX["t"]] = now - start
            st, own, own_here = self._read_proc(row, now, c)
            if self.pid != self.proc.pid and (st is None or not st.get("rss")):
                # the process followed ended (or is a zombie) while the command goes on
                # (gcc's next cc1, rustc after its linker): its time ends here
                gone = gone or now
            counted = live and not gone and self._read_library(row, now, c, req)
            self._read_mappings(row, now, start, c)
            self._read_pools(row, now, start, c)
            self._read_slow(row, now, c)
            # a tick right after one the fast reader took (it stopped early for a new high of
            # RSS, or the program's exit, to read the mappings) adds no row a hair after its
            # last: two samples a few µs apart would make "the sample at t" ambiguous
            n_cols = len(COLUMNS)
            crowded = (c.early and req is None and not self.pending and len(tl.flat) >= n_cols
                       and row[IDX["t"]] - tl.flat[len(tl.flat) - n_cols] < 0.5 * self.period)
            c.early = False
            if (st is not None or counted) and not crowded and not gone:
                tl.append_row(row)
                self._snapshots(row[IDX["t"]])
            tl.ticks += 1
            if self.on_first_tick is not None:
                self.on_first_tick()
                self.on_first_tick = None
            # waitpid costs as much as a /proc read: ask at most 100 times a second, or at
            # once when /proc says the process is gone.
            if (st is None or now >= c.poll) and self._reaped():
                break
            if now >= c.poll:
                c.poll = now + 0.01
            c.tick += self.period
            delay = c.tick - time.monotonic()
            if delay <= 0:
                # fell behind: do not try to catch up in a burst, nor take the next sample a
                # hair after this one (two samples 0.1 ms apart made "the sample at t"
                # ambiguous: the report's test of the peak's bands picked the other one)
                c.tick = max(time.monotonic(), now + 0.5 * self.period)
            if fast is not None and self.statm.fd is not None and not gone and \
                    self._fast_ticks(fast, now, start, own, own_here, c):
                continue
            if self._wait(max(0.0, delay)):
                c.poll = 0.0  # the program (or a child of it) changed state: reap now
        tl.duration_s = (gone or time.monotonic()) - start
        tl.sampler_cpu_s = time.thread_time() - cpu0
        self._close()
        return tl

    def _read_proc(self, row: list, now: float, c: "_Carry") -> tuple:
        """/proc/PID/status (or statm between its reads) into row, less heapsight's own
        pages: (the reading, None when the process is gone; heapsight's resident bytes in
        it; whether the program has the segment mapped)."""
        tl = self.timeline
        if now >= c.status:
            st = self.status.read()
            c.status = now + 1.0 / STATUS_PER_S
            if st is not None:
                c.hwm, c.threads = st.get("hwm", math.nan), st.get("threads", math.nan)
                self._image(now - tl.start_ns / 1e9)
                if self.pid != self.proc.pid:   # not our child: its CPU from /proc, as it goes
                    self._followed_usage = procfs.usage(self.pid) or self._followed_usage
                self._publish_threads(c.threads)
        else:
            st = self.statm.read()
        own, private = self._own_resident()
        own_here = self._segment_mapped()
        c.rss_read = (st["rss"], own, private) if st is not None and "rss" in st else None
        if st is not None:
            for k, v in st.items():
                if k in IDX:
                    row[IDX[k]] = v
            # the segment's pages are shared memory in the program's RSS, heapsight's
            # tables anonymous memory: left out. The kernel's peak (VmHWM) holds them too;
            # they only grow, so VmHWM less them now is the least the program's own peak
            # can have been
            row[IDX["rss"]] = _less(row[IDX["rss"]], own + private)
            row[IDX["shmem"]] = _less(row[IDX["shmem"]], own)
            row[IDX["anon"]] = _less(row[IDX["anon"]], private)
            row[IDX["hwm"]], row[IDX["threads"]] = _less(c.hwm, own + private), c.threads
        return st, own, own_here

    def _publish_threads(self, threads: float) -> None:
        """The program's thread count, for the library: a thread's first allocation sizes
        its share of the bytes threads may hold back by it (reading /proc itself there was
        a system call inside the program's malloc)."""
        seg = self.segment
        if seg is not None and seg.owned and not math.isnan(threads) and seg.attached():
            seg.header["threads_seen"] = int(threads)

    def _read_mappings(self, row: list, now: float, start: float, c: "_Carry") -> None:
        """The resident memory by kind of mapping: once a second, at each new high of RSS
        (10% above the last such reading) and as the program enters its exit."""
        tl, seg = self.timeline, self.segment
        rss_now = row[IDX["rss"]]
        # a new high, while the budget allows, or as the growth pauses (RSS as it was for the
        # last few samples: the peak may be this one)
        peak_due = (not math.isnan(rss_now) and rss_now > peak_kinds_above(tl)
                    and (now >= c.kinds_free or _pausing(tl, rss_now)))
        exiting = (not c.exit_tried and seg is not None and seg.attached()
                   and seg.get("state") >= STATE_EXITING)
        c.exit_tried = c.exit_tried or exiting
        if not ((now >= c.kinds and now >= c.kinds_free) or peak_due or exiting):
            return
        kinds, anon = self._kinds()
        c.held_lock(rss_now)
        c.kinds = now + 1.0 / MAPPINGS_PER_S
        # the reading's time is when smaps was read through (a loaded tick reads it ms after
        # the tick began): the mappings the program made meanwhile are in it, and the
        # library's records of them must be too (mapped.live_ranges at this time)
        t = time.monotonic() - start
        # once the program is past heapsight's exit probe its teardown unmaps as it goes: a
        # reading then is not kept
        torn = seg is not None and seg.attached() and seg.get("state") > STATE_EXITING
        if kinds is None or torn:
            return
        tl.kinds = (tl.kinds + [(t, kinds)])[-2:]   # the last two: the last may be cut
        pools = self._pools(anon, c)   # at the mappings' time t: owners_resident pairs them
        if pools is not None:
            c.pools = now + POOLS_PERIOD_S
            if len(tl.pools) < MAX_POOL_READINGS:
                tl.pools.append((t, *pools))
        tl.vmas = (tl.vmas + [(t, anon)])[-2:]
        if peak_due:
            tl.kinds_peak = (t, kinds, rss_now)
            tl.vmas_peak = (t, anon)
        if exiting:
            tl.kinds_exit = (t, kinds)
            tl.vmas_exit = (t, anon)

    def _read_pools(self, row: list, now: float, start: float, c: "_Carry") -> None:
        """pymalloc's objects and pools between the readings of the mappings, every
        POOLS_PERIOD_S while the budget allows, in the anonymous mappings of the last
        reading (an arena mapped since is not read: its objects count as not known). Not
        while RSS climbs to a new high: the mappings' readings there read the pools too, and
        the budget is theirs (the peak's reading needs it)."""
        tl = self.timeline
        if not (self.python and tl.vmas and now >= c.pools and now >= c.kinds_free):
            return
        rss_now = row[IDX["rss"]]
        if math.isnan(rss_now) or rss_now > peak_kinds_above(tl):
            return
        seg = self.segment
        if seg is not None and seg.attached() and seg.get("state") > STATE_EXITING:
            return   # the teardown's: not the run's
        c.pools = now + POOLS_PERIOD_S
        pools = self._pools(tl.vmas[-1][1], c)
        if pools is not None and len(tl.pools) < MAX_POOL_READINGS:
            tl.pools.append((time.monotonic() - start, *pools))

    def _pools(self, anon: list, c: "_Carry") -> tuple | None:
        """(objects' bytes, pools' bytes) of CPython's pymalloc in the anonymous mappings
        anon, read from its pools' headers (readloop.read_pools), when the program is
        CPython and has pools; None otherwise. The read takes the program's mmap lock a page
        at a time, and counts against the budget as twice a walk of those mappings (it took
        10 ms where smaps took 5.5, at 200 MiB of pools)."""
        if (not self.python or not anon or self.pagemap is None or not readloop.available()
                or self.timeline.py_finalizing_s is not None):
            return None   # (CPython's teardown frees its objects: not the run's)
        got = readloop.read_pools(self.pid, self.pagemap, anon)
        c.held_lock(2.0 * sum(v[2] for v in anon))
        if got is None or got[2] == 0:
            return None   # no pools: not pymalloc's layout (PYTHONMALLOC=malloc, CPython < 3.10)
        return got[0], got[1]

    def _read_slow(self, row: list, now: float, c: "_Carry") -> None:
        """The descendants' RSS and smaps_rollup's PSS, each at its own rate (the last
        reading carried in the rows between)."""
        tl = self.timeline
        if now >= c.children:
            c.children_rss = self._children()
            if self.on_tick is not None and tl.flat:
                self.on_tick(tl.flat[-len(COLUMNS):], self.mapped_read)
            c.children = now + 1.0 / CHILDREN_PER_S
        row[IDX["children_rss"]] = c.children_rss
        if now >= c.smaps and now >= c.kinds_free:
            roll = self.rollup.read()
            c.held_lock(row[IDX["rss"]])
            if roll is not None:
                c.pss = roll.get("pss", math.nan)
            c.smaps = now + self.smaps_period
        row[IDX["pss"]] = c.pss

    def _read_library(self, row: list, now: float, c: "_Carry", req) -> bool:
        """The library's counters into row (with the live waste estimated from the sampled
        blocks), the allocator's statistics when they are new, and a snapshot the program
        asked for; True (the row has the library's figures)."""
        seg, tl = self.segment, self.timeline
        if readloop.available() and c.rss_read is not None and self.statm.fd is not None:
            # the C tick's reading (no numpy while the program starts), of the same moment as
            # the row's RSS: RSS is read again after the counters, and both again while it
            # moved (the tick read the program's status, its segment's pages, before them)
            (usable, requested, n_alloc, n_free), after = readloop.steady_counters(
                seg, self.statm.fd, c.rss_read[0])
            if after is not None and after[0] != c.rss_read[0]:
                _, own, private = c.rss_read
                row[IDX["rss"]] = _less(after[0], own + private)
                row[IDX["anon"]] = _less(after[1], private)
        elif readloop.available():
            usable, requested, n_alloc, n_free = readloop.counters(seg)
        else:
            n = seg.counters()
            usable, requested = n.live_usable_bytes, n.live_requested_bytes
            n_alloc, n_free = n.n_alloc, n.n_free
        if usable > c.best_usable:
            c.best_usable = usable
            if usable > 0:
                tl.peak_req_ratio = requested / usable
        row[IDX["live_usable"]], row[IDX["live_req"]] = usable, requested
        row[IDX["n_alloc"]], row[IDX["n_free"]] = n_alloc, n_free
        if req is not None:   # the program called heapsight_snapshot(label)
            # calls made together (from several threads) are answered by this one sample:
            # its label is the last one's, and says how many it answered
            merged = req[0] - self._asked - 1
            self._asked = req[0]
            self.pending.append(req[1] + (f" (and {merged} more call{'s' * (merged > 1)} "
                                          "answered by this snapshot)" if merged > 0 else ""))
        # what the allocator holds, read from outside at --stats-hz: in the rows that read it
        # only (NaN elsewhere), so the record shows the rate it was read at
        if now >= c.stats:
            c.stats = now + self.stats_period
            self._read_allocator(row)
        word = self._finalizing_word()
        if word is not None:
            finalizing = word.read()
            if finalizing:
                tl.py_finalizing_s = row[IDX["t"]]
                self._close_finalizing()
            elif finalizing is not None:
                tl.py_running_s = row[IDX["t"]]
        return True

    def _finalizing_word(self):
        """CPython's _PyRuntime._finalizing in the program (procfs.Word), where the library
        says it is (py_finalizing_addr), until a tick has seen it set; None otherwise."""
        seg = self.segment
        if self.timeline.py_finalizing_s is not None or not self._segment_mapped():
            return None   # (after an exec into an image without the library: not its address)
        addr = seg.get("py_finalizing_addr")
        if not addr:
            return None
        # an execve gives the process a new memory: /proc/PID/mem is opened again for it
        key = (self.pid, addr, seg.get("execs"))
        if self._finalizing is None or self._finalizing.key != key:
            self._close_finalizing()
            try:
                self._finalizing = procfs.Word(self.pid, addr)
            except OSError:
                return None   # not ours to read (another user's, or gone)
            self._finalizing.key = key
        return self._finalizing

    def _close_finalizing(self) -> None:
        if self._finalizing is not None:
            self._finalizing.close()
            self._finalizing = None

    def _read_allocator(self, row: list) -> None:
        """What the allocator holds from the OS, read from outside the program (no call
        into it, no lock of its taken): glibc's arenas, or the mappings another allocator
        made itself (the hooks count every mmap by the object that made it). Its own
        statistics come at exit only: in use and free would need its locks or a walk
        (NaN)."""
        seg = self.segment
        if seg.get("glibc_main_arena"):
            self._read_glibc(row, seg.get("glibc_main_arena"))
            return
        from heapsight import allocators   # (its dataclasses: not before the program starts)
        own = allocators.own_heaps_of(seg.allocator_name())
        if own is None:
            return
        mapped = sum(o["mapped_bytes"] for o in seg.owners() if re.search(own, o["object"]))
        if mapped:
            row[IDX["alloc_mapped"]] = self.mapped_read = mapped

    def _read_glibc(self, row: list, main: int) -> None:
        """glibc's figures, where the library says they are (glibc_main_arena): the arenas
        and what they hold from the OS, and its mmapped chunks (counted by the hooks)."""
        seg = self.segment
        # an execve gives the process a new memory: /proc/PID/mem is opened again for it
        key = (self.pid, main, seg.get("execs"))
        if self._arenas is None or self._arenas.key != key:
            self._close_arenas()
            try:
                self._arenas = procfs.GlibcArenas(self.pid, main, seg.get("glibc_arena_next_off"),
                                                  seg.get("glibc_arena_sysmem_off"))
            except OSError:
                return   # not ours to read (another user's, or gone): no figures
            self._arenas.key = key
        got = self._arenas.read()
        if got is None:
            return
        arenas, system_mem = got
        row[IDX["alloc_in_use"]] = row[IDX["alloc_free"]] = math.nan
        row[IDX["alloc_mapped"]] = self.mapped_read = system_mem + seg.mmapped_chunk_bytes()
        row[IDX["arenas"]] = arenas

    def _close_arenas(self) -> None:
        if self._arenas is not None:
            self._arenas.close()
            self._arenas = None

    def _fast_ticks(self, fast, now: float, start: float, own: float, own_here: bool,
                    c: "_Carry") -> bool:
        """The ticks until the next Python tick is due, taken in C; False when none are
        (the Python tick is due first)."""
        tl = self.timeline
        # while a new high may not be read yet (LOCK_SHARE) the C ticks do not stop for one:
        # the Python tick looks again when the budget allows, and at its own rate for a pause
        # (and the readings of smaps due meanwhile wait with it)
        waiting = c.kinds_free > now
        due = min(now + 1.0 / PYTHON_TICKS_PER_S, c.children, max(c.smaps, c.kinds_free),
                  max(c.kinds, c.kinds_free), c.stats, self._next_snapshot_due(start),
                  c.kinds_free if waiting else math.inf)
        if due <= c.tick:
            return False
        word = self._finalizing_word()
        rows, why, nxt = fast.loop(self.statm.fd, int(c.tick * 1e9), int(due * 1e9),
                                        self._asked,
                                        self.pagemap if own_here else None, own, self.pid,
                                        watch_exit=not c.exit_tried,
                                        rss_above=math.inf if waiting else peak_kinds_above(tl),
                                        exe=tl.images[-1][1] if tl.images else "",
                                        finalizing=None if word is None else (word.fd, word.addr))
        own = fast.own[0]
        self.segment_resident = own
        tl.own_rss_bytes = max(tl.own_rss_bytes, fast.own[1])
        c.tick = nxt / 1e9
        if len(rows):
            c.best_usable = self._append_fast(rows, c.best_usable, _less(c.hwm, own),
                                              c.threads, c.pss, c.children_rss)
        if why == readloop.FINALIZING and len(rows):
            tl.py_finalizing_s = float(rows[-1][0])
            self._close_finalizing()
        # each row read _finalizing (the last one set, when that ended the loop)
        ran = len(rows) - (why == readloop.FINALIZING)
        if word is not None and ran > 0:
            tl.py_running_s = float(rows[ran - 1][0])
        c.early = why in (readloop.RSS, readloop.EXITING, readloop.EXEC, readloop.FINALIZING)
        if why == readloop.EXEC:
            c.status = 0.0   # the next tick reads the new image
        if why == readloop.SIGNAL and self._wait(0.0):
            c.poll = 0.0
        elif why == readloop.GONE:
            c.poll = 0.0
        return True


def add_exit_begun_row(tl: Timeline, seg: Segment | None, segment_resident: float) -> bool:
    """The library's reading as the program's exit began (main returned or exit() was
    called: native/src/counters.c, _hs_exit_begun_read) as a row of the timeline, in its
    place by time: the "end" moment is then that instant, not the last tick before it (a
    program that frees a cache just before main returns, or ends within a tick). RSS less
    heapsight's own (the segment's pages as the last tick read them, its private bytes as
    the library counted them then), glibc's mapped memory as a tick reads it (under another
    allocator: unknown, bounded by the readings around it), the live requested bytes
    estimated as every row's;
    what only the Python tick reads carried from the row before. True when a row was added
    (the library took the reading, and read RSS: not under a seccomp filter)."""
    if seg is None or not tl.start_ns or not seg.attached() or not seg.get("exit_begun_read"):
        return False
    h = seg.header
    ns, rss = int(h["exit_begun_ns"]), float(h["exit_begun_rss"])
    if not ns or not rss:
        return False
    from heapsight.analysis import live_waste
    ua, uf = int(h["exit_begun_usable_alloc"]), int(h["exit_begun_usable_free"])
    live = max(0, ua - uf)
    waste, _ = live_waste(h["hist"], live, ua, int(h["exit_begun_req_alloc"]))
    private = float(h["exit_begun_own_private"])
    row = [math.nan] * len(COLUMNS)
    row[IDX["t"]] = max(0.0, (ns - tl.start_ns) / 1e9)   # as summary._since: the end's time
    row[IDX["rss"]] = _less(rss, segment_resident + private)
    row[IDX["anon"]] = _less(float(h["exit_begun_anon"]), private)
    row[IDX["live_usable"]], row[IDX["live_req"]] = float(live), float(max(0, live - waste))
    row[IDX["n_alloc"]] = float(h["exit_begun_n_alloc"])
    row[IDX["n_free"]] = float(h["exit_begun_n_free"])
    if int(h["exit_begun_alloc_mapped"]) != STATS_UNKNOWN:   # glibc's, read then
        row[IDX["alloc_mapped"]] = float(h["exit_begun_alloc_mapped"])
        row[IDX["arenas"]] = float(h["exit_begun_arenas"])
    tl.insert_row(row, carried=("hwm", "threads", "pss", "children_rss"))
    return True
