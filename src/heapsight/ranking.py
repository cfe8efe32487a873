"""compare's figures read: what it ranks (METRICS), each figure's median and spread over
the repeats, glibc's defaults as the baseline, whether two figures differ beyond the noise
of their repeats, and the recommendation. Pure: the formats read it; live/comparison.py runs
the programs."""

from __future__ import annotations

import statistics

from heapsight.allocators import BASELINE
from heapsight.fmt import MiB

METRICS = (("peak_rss", "peak RSS"), ("held_rss", "held RSS"), ("end_rss", "end RSS"),
           ("final_rss", "RSS at exit"), ("retained", "retained"),
           ("given_back", "given back"), ("wall_s", "wall"), ("cpu_s", "CPU"),
           ("minor_faults", "minor faults"))
# the moment compare ranks by (moments.py) and the figure of it
RANK_KEY = {"peak": "peak_rss", "held": "held_rss", "end": "end_rss", "exit": "final_rss"}
RANK_WORDS = {"peak": "peak RSS",
              "held": "held RSS (through the stretch glibc held memory, else the longest "
                      "steady one)",
              "end": "end RSS (as the exit began)",
              "exit": "RSS at exit (after exit handlers and teardown)"}


def stats_of(runs: list) -> dict:
    out = {}
    for key, _ in METRICS:
        vals = [r[key] for r in runs if r.get(key) is not None]
        if vals:
            out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out


# below these, a change in percent says more about noise than about the allocator
DELTA_FLOOR = {"wall_s": 0.01, "cpu_s": 0.01, "minor_faults": 100}


def change(key: str, st: dict, base: dict | None):
    """A configuration's figure against the baseline's, as the table shows it: None when
    nothing is to be said (no baseline, a figure too small to compare, given-back bytes,
    under 0.5%), "~" when the repeats' ranges overlap (about the same), else the relative
    change of the medians (a float, -0.18 for 18% less)."""
    b = base["median"] if base is not None else None
    if b is None or not b or key == "given_back" or abs(b) < DELTA_FLOOR.get(key, MiB):
        return None
    c = st["median"] / b - 1
    if abs(c) < 0.005:
        return None
    return c if separated(st, base) else "~"


def change_text(c) -> str:
    """A change as words: "~", "+12%", "-50%", "×3"."""
    if c is None or c == "~":
        return c or ""
    return f"{c * 100:+.0f}%" if abs(c) < 10 else f"\u00d7{c + 1:.0f}"


def baseline(rows: list) -> dict | None:
    """The row the others are measured against: glibc's defaults, if they ran."""
    return next((r for r in rows if r["name"] == BASELINE and r["ok"]), None)


def recommend(rows: list, rank_by: str = "exit") -> str:
    """The configuration to use, ranked by the RSS at the moment rank_by (moments.NAMES):
    the lowest among those costing at most AFFORDABLE more wall time (the best trade-off),
    and beside it, when another is lower still, the lowest with its cost."""
    key = RANK_KEY[rank_by]
    title = RANK_WORDS[rank_by].split(" (")[0]
    base = baseline(rows)
    if base is None:
        listed = next((r for r in rows if r["name"] == BASELINE), None)
        if listed is None:
            return "no recommendation: add glibc to --configs to have a baseline to compare with"
        return f"no recommendation: the glibc baseline failed ({listed['error']})"
    b = base["stats"]
    ok = [r for r in rows if r["ok"] and r is not base and key in r["stats"] and key in b]

    def change(r, k):
        """The change of the medians, or 0.0 when it is noise: a difference is one only
        when the repeats' ranges (min to max) do not overlap."""
        if not separated(r["stats"][k], b[k]):
            return 0.0
        return (r["stats"][k]["median"] - b[k]["median"]) / b[k]["median"] if b[k]["median"] else 0.0

    def said(r, k, what):
        if not separated(r["stats"][k], b[k]):
            return f"{what} as glibc's within the repeats' spread"
        return f"{change(r, k) * 100:+.0f}% {what}"
    better = [r for r in ok if change(r, key) <= -0.10]
    if not better:
        return (f"keep glibc's defaults: no configuration lowered the {title} by 10% or more "
                "beyond the spread of the repeats")
    affordable = [r for r in better if change(r, "wall_s") <= AFFORDABLE]

    def pick_of(cands):
        # the lowest at the moment, and of those about the same (repeats that overlap it,
        # or within a MiB or a tenth of it) the lowest peak RSS, then the least time: on a
        # thread heap's free top, glibc-trim128k and glibc-mmap128k left 2.1 and 2.0 MiB at
        # exit, with peaks of 4.6 and 12.9 MiB
        lowest = min(cands, key=lambda r: r["stats"][key]["median"])
        low = lowest["stats"][key]
        tied = [r for r in cands if not separated(r["stats"][key], low)
                or r["stats"][key]["median"] - low["median"] < max(MiB, 0.1 * low["median"])]
        return min(tied, key=lambda r: (r["stats"]["peak_rss"]["median"], r["stats"]["wall_s"]["median"]))

    lowest = pick_of(better)
    pick = pick_of(affordable) if affordable else lowest
    text = (f"{pick['name']}: {said(pick, key, title)}, {said(pick, 'peak_rss', 'peak RSS')}, "
            f"{said(pick, 'wall_s', 'wall time')} against glibc's defaults ({pick['about']})")
    if not affordable:
        text += (f"; every configuration that lowered the {title} cost more than "
                 f"{AFFORDABLE:.0%} more time")
    if lowest is not pick and lowest["stats"][key]["median"] < pick["stats"][key]["median"]:
        text += (f"; lowest memory: {lowest['name']}, {said(lowest, key, title)} at "
                 f"{said(lowest, 'wall_s', 'wall time')} ({lowest['how']})")
    return f"{text}; run it with: {pick['how']}"


# a configuration may cost this much more wall time than glibc's defaults and still be the
# trade-off recommended (the lowest memory beyond it is named beside it, with its cost)
AFFORDABLE = 0.25


def separated(a: dict, b: dict) -> bool:
    """Whether two figures' repeats (stats_of: median, min, max) do not overlap: a
    difference of their medians is then more than the noise of the runs."""
    return a["min"] > b["max"] or a["max"] < b["min"]
