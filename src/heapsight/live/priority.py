"""The priority of what heapsight does beside the program while it runs: below the program's.

While the program runs, a thread of heapsight's prepares the end (live/measure.py's
_Meanwhile: the analysis' modules imported, the symbolizer started and sent the sampled
addresses). That is CPU work, and on a 2-core machine it took the core the program would
have run on: python3 building 250k dicts (0.1-0.16 s) waited 7-43 ms on the run queue
under `heapsight run` (its /proc/self/schedstat; 0.1 ms with no such thread, 0.01 ms bare).
So that thread, and the threads and processes it starts, run at nice 19 while the program
runs (3.9 ms of waiting) and at heapsight's own priority once it has ended: the end waits
for their work. Where this process may not raise a priority back (no CAP_SYS_NICE, an
RLIMIT_NICE that forbids it), they run at nice 10 throughout instead (9 ms of waiting), as
the symbolizer always has: at 19 they could be kept for seconds behind other work at the
end."""

from __future__ import annotations

import os
import threading

LOW = 19        # while the program runs, where the end can raise it back
LOW_KEPT = 10   # where it cannot: kept to the end


def may_raise(to: int) -> bool:
    """Whether this process may set a thread's nice value back down to `to`: with
    CAP_SYS_NICE, or an RLIMIT_NICE soft limit of at least 20 - to (setpriority(2))."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
        if soft == resource.RLIM_INFINITY or soft >= 20 - to:
            return True
    except (ImportError, AttributeError, OSError, ValueError):
        pass
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 23 & 1)   # CAP_SYS_NICE
    except (OSError, ValueError, IndexError):
        pass
    return False


def nice_of(tid: int) -> int | None:
    """A thread's nice value, from /proc (None if it is gone)."""
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            return int(f.read().rpartition(b")")[2].split()[16])
    except (OSError, ValueError, IndexError):
        return None


class Helper:
    """The priority of a helper thread: lower() on it as it starts, restore() from any
    thread once the program has ended (a lower() after it does nothing)."""

    def __init__(self) -> None:
        self.base = os.getpriority(os.PRIO_PROCESS, 0)   # this thread's (Linux: per thread)
        self.lock = threading.Lock()
        self.ended = False
        self.low: int | None = None   # the nice value set, if it is to be raised back

    def lower(self) -> None:
        """On the helper thread: its nice value (and so that of every thread and process it
        starts) raised to LOW, or to LOW_KEPT where it could not be brought back."""
        with self.lock:
            if self.ended:
                return
            back = may_raise(self.base)
            low = max(self.base, LOW if back else LOW_KEPT)
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), low)
            except OSError:
                return
            self.low = low if back and low != self.base else None

    def restore(self) -> None:
        """The program has ended: every thread of heapsight's at the lowered value (the
        helper, and the symbolizer's reader and writer it started) back at heapsight's
        priority. The symbolizer's process keeps its own (symbolize.py: nice 10)."""
        with self.lock:
            self.ended = True
            if self.low is None:
                return
            try:
                tids = [int(t) for t in os.listdir("/proc/self/task")]
            except (OSError, ValueError):
                return
            for tid in tids:
                if nice_of(tid) == self.low:
                    try:
                        os.setpriority(os.PRIO_PROCESS, tid, self.base)
                    except OSError:
                        pass
