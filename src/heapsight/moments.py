"""The moments a run is read at, each with a name a user can mean (docs/numbers.md):

  peak  the sample with the most RSS;
  held  where the run held memory beyond its live bytes: the stretch of its largest hold
        (analysis.holds) before its end, read at one of its samples (level()); in a run that held
        nothing, the RSS the process sat at for the longest stretch of its run (a stretch
        where RSS stayed within STEADY of one level, at least HOLD_MIN_S long): what an
        idle service sits at, what a program keeps after its waves, never the climb to its
        peak (a climb is not steady); defined for any timeline, so a run under another
        allocator, or a bare one, has it too. A hold names the moment even when the
        process sat longer elsewhere (four threads holding 70 MiB between their rounds, then
        0.5 s idle at 14 MiB: the verdict and the advice are about the rounds);
  end   the moment the program's exit began (main returned, exit() was called, or CPython
        began finalizing): what the program held when its work was done, before exit
        handlers and an interpreter's teardown freed things; the library's own reading of
        that instant where it took one (main, exit()), else the last sample before it;
  exit  the exit probe's reading, after that teardown.

The table, the page, diff, the gates and compare read these names and these figures; a
verdict says which moment it is about (about()). Pure: numbers in, numbers out."""

from __future__ import annotations

from collections import deque

import numpy as np

from heapsight.arrays import median
from heapsight.layout import EXIT_BEGUN_HOW, EXIT_BEGUN_PY_FINALIZING
from heapsight.model import Breakdown, Moment

NAMES = ("peak", "held", "end", "exit")
TITLE = {"peak": "peak RSS", "held": "held", "end": "end", "exit": "exit"}
# a stretch is steady while its RSS stays within this share of its lowest (or 1 MiB, for
# small programs' page-by-page noise). "The most RSS kept through a twentieth of the run"
# read the climb to the peak: a Python service under jemalloc returning pages at once
# idled at 73 MiB (its own reading) and "held" 140 MiB on its way up
STEADY = 0.10
STEADY_MIN_BYTES = 1 << 20
HOLD_MIN_S = 0.2


def held(t, rss, duration_s: float = 0.0, exact=None) -> tuple | None:
    """(level index, first index, last index) of the longest steady stretch (its RSS within
    STEADY of its lowest): the sample that reads it (level()), and the stretch; of
    stretches as long, the one at the most RSS; None when none lasts HOLD_MIN_S. One pass
    (two pointers, monotonic queues for the window's min and max). exact: per sample, how
    much of what its split is bounded by was read there (level())."""
    t, rss = np.asarray(t, dtype=float), np.asarray(rss, dtype=float)
    ok = np.flatnonzero(~np.isnan(rss))
    t, rss = t[ok], rss[ok]
    n = len(t)
    best, lo_q, hi_q, left = None, deque(), deque(), 0
    for right in range(n):
        while lo_q and rss[lo_q[-1]] >= rss[right]:
            lo_q.pop()
        lo_q.append(right)
        while hi_q and rss[hi_q[-1]] <= rss[right]:
            hi_q.pop()
        hi_q.append(right)
        while rss[hi_q[0]] - rss[lo_q[0]] > max(STEADY * rss[lo_q[0]], STEADY_MIN_BYTES):
            left += 1
            if lo_q[0] < left:
                lo_q.popleft()
            if hi_q[0] < left:
                hi_q.popleft()
        span = t[right] - t[left]
        key = (round(span, 6), rss[lo_q[0]])
        if span >= HOLD_MIN_S and (best is None or key > best[0]):
            best = (key, left, right)
    if best is None:
        return None
    _, lo, hi = best
    ex = None if exact is None else np.asarray(exact, dtype=float)[ok]
    return int(ok[level(t, rss, np.arange(lo, hi + 1), ex)]), int(ok[lo]), int(ok[hi])


# a sample this near a stretch's median RSS reads it as well as the nearest one does
LEVEL_NEAR = 0.01
LEVEL_NEAR_BYTES = 64 << 10


def level(t, rss, inside, exact=None) -> int:
    """The sample that reads a stretch (indices inside, in time order): of those whose RSS
    is nearest its median (within LEVEL_NEAR, or LEVEL_NEAR_BYTES), those where the most is
    known (exact, where given: per sample, how many of the figures its split is bounded by
    are known there, summary.known_at: the allocator's mapped memory, pymalloc's objects),
    the one nearest the stretch's middle. Not its first: after a big free the first samples of a
    flat stretch are between a reading with the freed blocks and one without, and read the
    whole of the anonymous memory malloc did not give as retained (python3 with numpy:
    7.0 MiB of pymalloc's arenas, against 0.3 MiB at the next reading)."""
    inside = np.asarray(inside)
    r = rss[inside]
    med = median(r)
    off = np.abs(r - med)
    near = inside[off <= max(off.min(), LEVEL_NEAR * med, LEVEL_NEAR_BYTES)]
    if exact is not None:
        score = np.asarray(exact, dtype=float)[near]
        near = near[score == score.max()]
    middle = (t[inside[0]] + t[inside[-1]]) / 2
    return int(near[np.argmin(np.abs(t[near] - middle))])


def within(t, rss, start_s: float, end_s: float, exact=None) -> tuple | None:
    """(level index, first index, last index) of a given stretch of the run (a hold's): the
    sample that reads it (level()), as held() reads its own; None when no sample is in it."""
    t, rss = np.asarray(t, dtype=float), np.asarray(rss, dtype=float)
    ms = 5e-4   # a hold's times are rounded to the ms
    inside = np.flatnonzero((t >= start_s - ms) & (t <= end_s + ms) & ~np.isnan(rss))
    if not len(inside):
        return None
    return level(t, rss, inside, exact), int(inside[0]), int(inside[-1])


HELD_HOW = {"hold": "the stretch of its largest hold",
            "steady": "the RSS it sat at longest, steady within a tenth"}


def end_row(t, rss, end_s: float | None, last_i: int | None,
            end_read: int | None = None) -> int | None:
    """The row the end moment is read at: the library's own reading of the moment the exit
    began (end_read), else the last sample with a reading before end_s, else last_i."""
    if end_read is not None:
        return end_read
    if end_s is not None:
        before = np.flatnonzero((np.asarray(t, dtype=float) < end_s)
                                & ~np.isnan(np.asarray(rss, dtype=float)))
        if len(before):
            return int(before[-1])
    return last_i


def build(t, rss, breakdown_at, duration_s: float, peak_i: int | None, last_i: int | None,
          final: Breakdown | None, end_s: float | None, end_how: str,
          end_read: int | None = None, hold: tuple | None = None, exact=None) -> tuple:
    """The run's moments (model.Moment), in NAMES order, those that exist: breakdown_at(i)
    gives the split at sample i; peak_i the sample of most RSS; last_i the last sample;
    final the exit probe's split; end_s when the exit began (None: not seen); end_read the
    row the library read at that very moment (None: it took none, and the end is the last
    sample before it); hold the (start, end) seconds of the run's largest hold, which is
    then the held moment (None: the run held nothing, and held is its longest steady
    stretch); exact, per sample, how much of what its split is bounded by was read there
    (level())."""
    t = np.asarray(t, dtype=float)
    out = []
    if peak_i is not None:
        at_peak = breakdown_at(peak_i)
        if final is not None and final.rss_bytes > at_peak.rss_bytes:
            # a program shorter than a few samples: its most RSS was at the exit reading
            out.append(Moment("peak", final.at_s, final, how="the most RSS read: at exit"))
        else:
            out.append(Moment("peak", float(t[peak_i]), at_peak, how="the most RSS sampled"))
    end_i = end_row(t, rss, end_s, last_i, end_read)
    # held: while the program ran, so before its end
    stop = (end_i + 1) if end_i is not None else len(t)
    h = (within(t[:stop], np.asarray(rss, dtype=float)[:stop], *hold,
                exact=None if exact is None else np.asarray(exact, dtype=float)[:stop])
         if hold is not None else None)
    kind = "hold" if h is not None else "steady"
    if h is None:
        h = held(t[:stop], np.asarray(rss, dtype=float)[:stop], duration_s,
                 None if exact is None else np.asarray(exact, dtype=float)[:stop])
    if h is not None:
        i, lo, hi = h
        out.append(Moment("held", float(t[i]), breakdown_at(i), start_s=float(t[lo]),
                          end_s=float(t[hi]), how=HELD_HOW[kind]))
    if end_i is not None:
        how = (f"the last sample before {end_how}" if end_s is not None and end_how
               else "the last sample")
        step = median(np.diff(t)) if len(t) > 1 else 0.01
        if end_read is not None:
            out.append(Moment("end", float(t[end_i]), breakdown_at(end_i),
                              how=f"read as {READ_AS.get(end_how, end_how)}"))
        elif (end_s is not None and final is not None and end_s - t[end_i] > 2 * step
              and end_how != EXIT_BEGUN_HOW[EXIT_BEGUN_PY_FINALIZING]):
            # no sample near the end (a program shorter than a few samples): the exit's
            # reading is nearer to it than a sample of its start (not CPython's: its exit
            # reading follows its teardown, which freed what its work held)
            out.append(Moment("end", final.at_s, final,
                              how="the exit reading (no sample near the end of the work)"))
        else:
            out.append(Moment("end", float(t[end_i]), breakdown_at(end_i), how=how))
    if final is not None:
        # (the split's time is rounded to the ms: the exit never reads as before the end)
        at = max(final.at_s, out[-1].at_s) if out and out[-1].name == "end" else final.at_s
        out.append(Moment("exit", at, final, how="after exit handlers and teardown"))
    return tuple(out)


# the library's reading of the moment the exit began, by how it began (layout.EXIT_BEGUN_HOW)
READ_AS = {"main returned": "main returned", "exit() called": "the program called exit()",
           "CPython began finalizing": "CPython began finalizing"}


# Which moment a verdict is about, by its first finding's kind: a hold is while running;
# memory the allocator keeps or wastes is the program's when its work is done; what was
# never freed is counted at exit; a child's peak is its peak.
ABOUT = {"hold": "held", "retention": "end", "fragmentation": "end", "waste": "end",
         "non-heap": "end", "leak": "exit", "kept": "exit", "never-freed": "exit",
         "child": "peak"}


def about(findings) -> str:
    """The moment the verdict is about: its first finding's, "peak" when there is none."""
    return ABOUT.get(findings[0].kind, "peak") if findings else "peak"


def rss_of(moments, name: str) -> int | None:
    """The RSS at a named moment of a run (Moment objects or their JSON dicts); None when
    the run has no such moment."""
    for m in moments:
        d = m if isinstance(m, dict) else {"name": m.name, "breakdown": m.breakdown}
        if d["name"] == name and d.get("breakdown"):
            b = d["breakdown"]
            return int(b["rss_bytes"] if isinstance(b, dict) else b.rss_bytes)
    return None


def held_share(moments, duration_s: float) -> tuple | None:
    """(start, end) of a run's held stretch as shares of its duration (Moment objects or
    their JSON dicts); None when it has no held moment."""
    for m in moments:
        d = m if isinstance(m, dict) else {"name": m.name, "start_s": m.start_s, "end_s": m.end_s}
        if d["name"] == "held" and duration_s > 0:
            return d["start_s"] / duration_s, d["end_s"] / duration_s
    return None


def rss_over(t, rss, duration_s: float, share: tuple) -> int | None:
    """The median RSS a run sampled over a stretch given as shares of its duration (t and
    rss: its timeline's columns): where a run that held nothing sat while another run of the
    same program held memory (the stretch of that run's held moment, held_share). Its peak
    would count the live bytes of the program's work; its end, a moment the stretch may not
    be. The nearest sample when none falls inside; None without samples."""
    lo, hi = share[0] * duration_s, share[1] * duration_s
    pairs = [(float(a), float(b)) for a, b in zip(t, rss) if b is not None and b == b]
    inside = [b for a, b in pairs if lo <= a <= hi]
    if not inside and pairs:
        mid = (lo + hi) / 2
        inside = [min(pairs, key=lambda p: abs(p[0] - mid))[1]]
    return int(median(inside)) if inside else None


def words(m) -> str:
    """A moment in a few words: "held 0.31-3.02 s", "end 2.98 s", "peak RSS 0.97 s"."""
    d = m if isinstance(m, dict) else {"name": m.name, "at_s": m.at_s, "start_s": m.start_s,
                                       "end_s": m.end_s}
    if d["name"] == "held" and d.get("end_s", 0) > d.get("start_s", 0):
        return f"held {d['start_s']:.2f}-{d['end_s']:.2f} s"
    return f"{TITLE[d['name']]} {d['at_s']:.2f} s"
