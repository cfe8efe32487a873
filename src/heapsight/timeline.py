"""The timeline: a run's samples, row after row, and what the sampler noted beside them
(images, children, the mappings by kind, snapshots). A data type only: the sampler
(live/sampler.py) fills it while a program runs; the analysis (summary.py) reads it, also from a
saved run (capture.py)."""

from __future__ import annotations

import math
from array import array

COLUMNS = ("t", "rss", "hwm", "anon", "file", "shmem", "pss", "live_usable", "live_req",
           "n_alloc", "n_free", "alloc_in_use", "alloc_free", "alloc_mapped", "arenas", "threads",
           "children_rss")

IDX = {c: i for i, c in enumerate(COLUMNS)}
# At most this many samples are kept (16 columns of 8 bytes: 12 MiB); past it the older
# half is thinned (Timeline.compact), so an hour at 1 kHz stays within it.
MAX_ROWS = 100_000
THIN_BUCKET = 8


class Timeline:
    """Samples in one flat array (row after row: one extend per tick is the cheapest way
    to record at 1 kHz); columns gives them column by column. Its fields are FIELDS, each
    given by name or left at its default (a plain class: the sampler makes one before the
    program starts, where the dataclasses module would cost 10-25 ms)."""

    def __init__(self, **given) -> None:
        unknown = set(given) - set(FIELDS) if given else ()
        if unknown:
            raise TypeError(f"Timeline has no {', '.join(sorted(unknown))}")
        self.flat = array("d")
        self.sampler_cpu_s = 0.0
        self.ticks = 0
        self.duration_s = 0.0
        # requested/usable of live blocks at the sample with the most live usable bytes,
        # computed exactly there: it converts the library's exact usable peak to requested
        # bytes
        self.peak_req_ratio = 1.0
        self.child_user_s = 0.0     # from wait4 when the program ended
        self.child_sys_s = 0.0
        self.child_minflt = 0
        # the most RSS of the program and of each descendant it waited for (wait4's
        # ru_maxrss, bytes; 0: not read): a child that came and went between two of the
        # sampler's readings of the descendants is in it
        self.child_maxrss = 0
        self.start_ns = 0           # CLOCK_MONOTONIC at the first sample (the library's clock too)
        self._columns = None
        self.thinned = 0            # samples dropped by thinning (see compact)
        self.snapshots = []         # (label, t) of the samples asked for
        self.images = []            # (t, executable): each image the program ran
        # for each of images: when the one before it was last seen (-1 for the first), so the
        # exec happened between that and its t (the executable is read on the Python ticks only)
        self.image_before_s = []
        self.children = {}          # pid -> [name, peak RSS] of its descendants
        # [pid, name] of those still running once the program ended, heapsight's library in
        # them (a daemon that left its parent: procfs.outliving)
        self.outlived = []
        self.kinds = []             # (t, resident bytes by mappings.KINDS)
        self.kinds_peak = None      # (t, kinds, RSS) read when RSS was highest so far
        self.kinds_exit = None      # (t, kinds) read as the program entered its exit
        # (t, [(start, end, resident bytes)]) of the other anonymous mappings, at the readings
        # of kinds above: the last two, the peak's and the exit's (mapped.py: whose are resident)
        self.vmas = []
        self.vmas_peak = None
        self.vmas_exit = None
        # (t, objects' bytes, pools' bytes) of CPython's object allocator (pymalloc), read from
        # its pools' headers at each reading of kinds above while it had pools (pools.c):
        # how much of its arenas is objects in use
        self.pools = []
        # heapsight's own pages resident in the program (the segment's), left out of every RSS
        # figure above; the most seen at any tick
        self.own_rss_bytes = 0.0
        # when CPython began finalizing (_PyRuntime._finalizing set: its atexit callbacks
        # done, its teardown begun): the first sample that read it so, None when none did
        self.py_finalizing_s = None
        # the last sample that read CPython's _finalizing unset (None: no sample read it):
        # when none saw it set, CPython finalized after this one, between two ticks
        self.py_running_s = None
        self.max_rows = MAX_ROWS
        self.capture = None         # capture.take's: what the analysis read, for the record
        for k, v in given.items():
            setattr(self, k, v)

    def restart(self, start_ns: int) -> None:
        """Every sample and reading so far goes, and the time starts again at start_ns: they
        were of another process than the one measured from now on (sampler: --follow)."""
        self.__init__(start_ns=start_ns, max_rows=self.max_rows)

    def append_row(self, row: list) -> None:
        self.flat.extend(row)
        self._columns = None
        if len(self.flat) > self.max_rows * len(COLUMNS):
            self.compact()

    def insert_row(self, row: list, carried: tuple = ()) -> None:
        """A row read apart from the ticks (the library's own reading), in its place by
        time: after every row at or before its t; the columns named in carried taken from
        the row before it (figures that reading does not have)."""
        n, t = len(COLUMNS), row[0]
        k = len(self.flat) // n
        while k > 0 and self.flat[(k - 1) * n] > t:
            k -= 1
        row = list(row)
        if k > 0:
            for c in carried:
                row[IDX[c]] = self.flat[(k - 1) * n + IDX[c]]
        self.flat[k * n:k * n] = array("d", row)
        self._columns = None

    def append_rows(self, rows) -> None:
        """Rows as sequences of len(COLUMNS) floats each."""
        for row in rows:
            self.flat.extend(row)
        self._columns = None
        if len(self.flat) > self.max_rows * len(COLUMNS):
            self.compact()

    def compact(self) -> None:
        """Keeps memory bounded however long the run: the older half of the samples is
        thinned to, per stretch of THIN_BUCKET samples, its first sample and the samples
        where RSS, live bytes and the allocator's mapped memory are lowest and highest. Every extreme of the run stays exact (it is an extreme of its
        stretch) and the kept samples are real ones, so their columns still agree."""
        import numpy as np
        from heapsight.arrays import isin
        n = len(COLUMNS)
        rows = len(self.flat) // n
        half = rows // 2 // THIN_BUCKET * THIN_BUCKET
        if half == 0:
            return
        old = np.frombuffer(self.flat, dtype=float, count=half * n).reshape(half, n)
        keep = np.zeros(half, dtype=bool)
        keep[::THIN_BUCKET] = True
        keep |= isin(old[:, IDX["t"]], [t for _, t in self.snapshots])   # snapshots stay
        base = np.arange(0, half, THIN_BUCKET)
        for c in ("rss", "live_usable", "alloc_mapped"):
            col = old[:, IDX[c]].reshape(-1, THIN_BUCKET)
            if np.isnan(col).all():
                continue
            for fill, pick in ((-np.inf, np.argmax), (np.inf, np.argmin)):
                keep[base + pick(np.where(np.isnan(col), fill, col), axis=1)] = True
        kept = old[keep].ravel().tolist()
        self.thinned += half - int(keep.sum())
        del old
        self.flat = array("d", kept) + self.flat[half * n:]
        self._columns = None

    @property
    def columns(self) -> dict:
        if self._columns is None:
            n = len(COLUMNS)
            self._columns = {c: array("d", self.flat[i::n]) for i, c in enumerate(COLUMNS)}
        return self._columns

    def __len__(self) -> int:
        return len(self.flat) // len(COLUMNS)

    def cut_after(self, t_s: float) -> None:
        """Drops the samples taken after t_s (seconds from the first sample)."""
        n = len(COLUMNS)
        keep = sum(1 for v in self.flat[0::n] if v <= t_s)
        del self.flat[keep * n:]
        self._columns = None

    def last(self, column: str, default=None):
        arr = self.columns[column]
        for v in reversed(arr):
            if not math.isnan(v):
                return v
        return default


# every field of a Timeline, in order (the record keeps them: capture.py)
FIELDS = tuple(vars(Timeline()))
