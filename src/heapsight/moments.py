"""The moments a run is read at, each with a name a user can mean (docs/numbers.md):

  peak  the sample with the most RSS;
  held  the most RSS the process kept throughout a stretch of its run (at least
        HOLD_MIN_S and HOLD_MIN_SHARE of it, the hold rule's length): what an idle service
        sits at, what a program keeps between its waves; defined for any timeline, so a
        run under another allocator, or a bare one, has it too;
  end   the last sample before the program's exit began (main returned, exit() was called,
        or CPython began finalizing): what the program held when its work was done, before
        exit handlers and an interpreter's teardown freed things;
  exit  the exit probe's reading, after that teardown.

The table, the page, diff, the gates and compare read these names and these figures; a
verdict says which moment it is about (about()). Pure: numbers in, numbers out."""

from __future__ import annotations

from collections import deque

import numpy as np

from heapsight.model import Breakdown, Moment

NAMES = ("peak", "held", "end", "exit")
TITLE = {"peak": "peak RSS", "held": "held", "end": "end", "exit": "exit"}
# a stretch is held when it lasts at least this long and this share of the run (the hold
# rule's lengths: analysis.HOLD_MIN_S, HOLD_MIN_SHARE)
HOLD_MIN_S = 0.2
HOLD_MIN_SHARE = 0.05


def window_s(duration_s: float) -> float:
    """How long a stretch must last to count as held, for a run of duration_s."""
    return max(HOLD_MIN_S, HOLD_MIN_SHARE * duration_s)


def held(t, rss, duration_s: float) -> tuple | None:
    """(level index, first index, last index): the most RSS kept throughout some stretch
    of window_s(duration_s), the sample at that level, and the whole stretch around it
    where RSS stayed at the level or above; None when the samples span less than a window.
    The max over windows of the window's min, in one pass (a monotonic queue)."""
    t, rss = np.asarray(t, dtype=float), np.asarray(rss, dtype=float)
    ok = np.flatnonzero(~np.isnan(rss))
    t, rss = t[ok], rss[ok]
    w = window_s(duration_s)
    n = len(t)
    if n < 2 or t[-1] - t[0] < w:
        return None
    best, best_i, mins, r = -1.0, None, deque(), 0
    for left in range(n):
        while r < n and (r == 0 or t[r - 1] - t[left] < w):
            while mins and rss[mins[-1]] >= rss[r]:
                mins.pop()
            mins.append(r)
            r += 1
        if t[r - 1] - t[left] < w:
            break   # no window from here on spans w
        while mins[0] < left:
            mins.popleft()
        if rss[mins[0]] > best:
            best, best_i = float(rss[mins[0]]), mins[0]
    if best_i is None:
        return None
    lo = hi = best_i
    while lo > 0 and rss[lo - 1] >= best:
        lo -= 1
    while hi + 1 < n and rss[hi + 1] >= best:
        hi += 1
    return int(ok[best_i]), int(ok[lo]), int(ok[hi])


def build(t, rss, breakdown_at, duration_s: float, peak_i: int | None, last_i: int | None,
          final: Breakdown | None, end_s: float | None, end_how: str) -> tuple:
    """The run's moments (model.Moment), in NAMES order, those that exist: breakdown_at(i)
    gives the split at sample i; peak_i the sample of most RSS; last_i the last sample;
    final the exit probe's split; end_s when the exit began (None: not seen)."""
    t = np.asarray(t, dtype=float)
    out = []
    if peak_i is not None:
        out.append(Moment("peak", float(t[peak_i]), breakdown_at(peak_i), how="the most RSS sampled"))
    before = np.flatnonzero((t < end_s) & ~np.isnan(np.asarray(rss, dtype=float))) \
        if end_s is not None else None
    end_i = (int(before[-1]) if before is not None and len(before) else last_i)
    # held: while the program ran, so before its end
    stop = (end_i + 1) if end_i is not None else len(t)
    h = held(t[:stop], np.asarray(rss, dtype=float)[:stop], duration_s)
    if h is not None:
        i, lo, hi = h
        out.append(Moment("held", float(t[i]), breakdown_at(i), start_s=float(t[lo]),
                          end_s=float(t[hi]),
                          how=f"the most RSS kept {window_s(duration_s):.2f} s or longer"))
    if end_i is not None:
        how = (f"the last sample before {end_how}" if end_s is not None and end_how
               else "the last sample")
        out.append(Moment("end", float(t[end_i]), breakdown_at(end_i), how=how))
    if final is not None:
        out.append(Moment("exit", final.at_s, final, how="after exit handlers and teardown"))
    return tuple(out)


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


def words(m) -> str:
    """A moment in a few words: "held 0.31-3.02 s", "end 2.98 s", "peak RSS 0.97 s"."""
    d = m if isinstance(m, dict) else {"name": m.name, "at_s": m.at_s, "start_s": m.start_s,
                                       "end_s": m.end_s}
    if d["name"] == "held" and d.get("end_s", 0) > d.get("start_s", 0):
        return f"held {d['start_s']:.2f}-{d['end_s']:.2f} s"
    return f"{TITLE[d['name']]} {d['at_s']:.2f} s"
