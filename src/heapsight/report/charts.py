"""Chart descriptions for the report, built from run records and comparisons; lab
experiments bring their own. Every chart on the page, whatever made it, uses the CHARTS
format of heapsight.lab.common, which the renderer (assets/report.js) draws. The report
adds to that format:

  kind "stacked"     series drawn as areas stacked bottom-up in the order given; they
                     share their x values (the first series' x is used for all). A series
                     with "stack": false is drawn as a line over the stack (e.g. RSS).
  "markers"          [{"x": 1.25, "label": "release at exit"}]: labelled vertical lines on
                     line and stacked charts.
  series "color"     a CSS colour for that series (otherwise the renderer's palette).
  series "step"      true: drawn as steps (a value holds until the next sample).
  series "dash"      true: a dashed line.
  unit "/s"          a rate: counts per second (y of the allocation-rate chart).
  x/y "min"          the axis starts at this value at most (e.g. 0 for a bar of bytes).

Values may be null (not measured): lines break there, stacked areas count it as 0.
Two kinds of chart are not in that format: "flame" and "heapmap" (a run's call sites and
heap maps), described in holders.py.
"""

from __future__ import annotations

import math
import re

import numpy as np

from heapsight import analysis
from heapsight.fmt import human
from heapsight.model import resident
from heapsight.report.decimate import BUCKETS, as_array, bucket_rates, extreme_rows

# The page's colours for the parts of RSS: one meaning, one colour, on every chart.
PART_COLORS = {"live": "#4e79a7", "waste": "#f28e2b", "retained": "#e15759",
               "non-heap": "#a0a4a8", "rss": "#222222"}


def clean(v):
    """JSON-safe: NaN and infinities become None, numpy numbers plain numbers."""
    if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        if all(type(x) is int for x in v):   # the long lists of the flame graph: fast
            return list(v)
        return [clean(x) for x in v]
    if isinstance(v, np.ndarray):
        return clean(v.tolist())
    if isinstance(v, (np.floating, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    return v


def _nums(arr: np.ndarray, digits: int | None = None) -> list:
    """An array as a JSON list: rounded (None for NaN) to keep the page small."""
    out = np.round(arr, digits) if digits is not None else np.round(arr)
    vals = out.tolist()
    if digits is None:
        return [None if x != x else int(x) for x in vals]
    return [None if x != x else x for x in vals]


def chart_id(*parts) -> str:
    """An id usable as an HTML id and a file name."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(str(p) for p in parts if p)).strip("-") or "chart"


# ---------------------------------------------------------------------------- run records

def columns(doc: dict, names) -> dict:
    tl = doc.get("timeline") or {}
    n = len(tl.get("t") or [])
    return {c: as_array(tl[c]) if c in tl else np.full(n, np.nan) for c in names}


def split_rows(doc: dict, rows: np.ndarray, cols: dict | None = None) -> dict:
    """The RSS of each chosen sample split by analysis.timeline_split, the one definition
    the summary uses too, over the whole timeline (the allocator's readings around each
    sample bound its retained memory), then taken at rows. {field: array} plus "t"."""
    s = doc.get("summary") or {}
    heap = s.get("heap")
    cols = cols or columns(doc, ("t", "rss", "anon", "live_req", "live_usable", "n_alloc",
                                 "n_free", "alloc_mapped"))
    rows = np.asarray(rows, dtype=int)
    baseline = max((s.get(k) or {}).get("baseline_anon_bytes", 0) for k in ("peak", "final"))
    final_mapped = (heap or {}).get("mapped_at_exit_bytes")
    pools = ((doc.get("capture") or {}).get("timeline") or {}).get("pools") or ()
    parts = analysis.timeline_split(cols, baseline, heap.get("allocator", "unknown") if heap else None,
                                    math.nan if final_mapped is None else float(final_mapped),
                                    pools, _resident_at_end(s, cols))
    return {f: np.asarray(v, dtype=float)[rows] for f, v in parts.items()} | {"t": cols["t"][rows]}


def _resident_at_end(s: dict, cols: dict):
    """analysis.resident_at_end from a summary's figures, as the summary applied it."""
    heap, final = s.get("heap") or {}, s.get("final") or {}
    end = next((m for m in s.get("moments") or () if m.get("name") == "end"), None)
    if heap.get("resident_at_exit_bytes") is None or end is None or not final \
            or not {"n_alloc", "n_free", "anon"} <= set(cols):
        return math.nan
    exit_anon = final["rss_bytes"] - final["file_bytes"]   # (the split's file: RSS less anon)
    return analysis.resident_at_end(cols, heap["resident_at_exit_bytes"], end["at_s"],
                                    heap["n_alloc"], heap["n_free"], exit_anon)


def _fmt_release(rel: dict) -> str:
    copy = f" ({analysis.release_how(rel)})" if analysis.release_how(rel) else ""
    return (f"release at exit: {rel.get('call')} {human(rel.get('rss_before_bytes', 0))}"
            f" \u2192 {human(rel.get('rss_after_bytes', 0))}{copy}")


def run_charts(doc: dict, prefix: str, buckets: int = BUCKETS, label: str = "") -> list:
    """The charts of one run: RSS split over time, allocation rate, arenas and threads."""
    s = doc.get("summary") or {}
    cols = columns(doc, ("t", "rss", "anon", "live_req", "live_usable", "n_alloc", "n_free",
                         "alloc_mapped", "arenas", "threads"))
    t, rss = cols["t"], cols["rss"]
    valid = ~np.isnan(rss) & ~np.isnan(t)
    idx = np.flatnonzero(valid)
    what = f" ({label})" if label else ""
    out = []
    if len(idx):
        keep = idx[extreme_rows([rss[idx], cols["live_req"][idx]], buckets)]
        parts = split_rows(doc, keep, cols)
        x = _nums(parts["t"], 4)
        if s.get("heap") is not None:
            live, waste, metadata = resident(parts["live_bytes"], parts["waste_bytes"],
                                             parts["metadata_bytes"], parts["untouched_bytes"])
            bands = (("live", live, PART_COLORS["live"]),
                     ("waste + metadata", waste + metadata, PART_COLORS["waste"]),
                     ("retained (freed, kept)", parts["retained_bytes"], PART_COLORS["retained"]),
                     ("non-heap", parts["non_heap_bytes"], PART_COLORS["non-heap"]))
        else:
            bands = (("anonymous", parts["rss_bytes"] - parts["file_bytes"], "#76b7b2"),
                     ("file-backed", parts["file_bytes"], PART_COLORS["non-heap"]))
        series = [{"name": n, "x": x, "y": _nums(v), "color": c} for n, v, c in bands]
        series.append({"name": "RSS", "x": x, "y": _nums(parts["rss_bytes"]), "stack": False,
                       "color": PART_COLORS["rss"]})
        markers = []
        # the peak column is the live bytes' peak (a sample), not peak RSS: each is named
        peak = s.get("peak")
        if peak:
            markers.append({"x": peak["at_s"], "label": f"peak live {human(peak['live_bytes'])}"})
        peak_rss = next((m for m in s.get("moments") or () if m.get("name") == "peak"), None)
        if peak_rss and s.get("peak_rss_bytes"):
            markers.append({"x": peak_rss["at_s"],
                            "label": f"peak RSS {human(s['peak_rss_bytes'])}"})
        for snap in s.get("snapshots") or []:
            markers.append({"x": snap["at_s"], "label": f"snapshot {snap['label']}"})
        rel = s.get("release") or {}
        fin = s.get("final")
        if rel.get("measured") and fin:
            markers.append({"x": fin["at_s"], "label": _fmt_release(rel)})
            # the drop the release made (or would make: measured in the exit map's copy),
            # measured by the library around its call
            end = fin["at_s"] + max(float(rel.get("seconds") or 0), 1e-3)
            series.append({"name": "RSS through the release", "x": [fin["at_s"], round(end, 4)],
                           "y": [rel.get("rss_before_bytes"), rel.get("rss_after_bytes")],
                           "stack": False, "dash": True, "color": PART_COLORS["rss"]})
        elif fin:
            markers.append({"x": fin["at_s"], "label": "exit"})
        note = ("Each sample's RSS split as in the summary; the solid line is RSS"
                + ((", the dashed one its drop through the release at exit"
                    + (f" ({analysis.release_how(rel)}). "
                       if analysis.release_how(rel) else ". ")) if rel.get("measured") else ". ")
                if s.get("heap") is not None else
                f"{analysis.NOT_ACTIVE.capitalize()}: /proc figures only. ")
        if len(keep) < len(idx):
            note += f"{len(idx):,} samples thinned to {len(keep):,} (the lowest and highest of each stretch kept)."
        out.append({"id": chart_id(prefix, "memory"), "title": f"Where the RSS went, over time{what}",
                    "kind": "stacked",
                    "x": {"label": "time", "unit": "s", "log": False, "min": 0},
                    "y": {"label": "resident memory", "unit": "bytes", "log": False, "min": 0},
                    "series": series, "markers": markers, "note": note.strip()})
    if s.get("heap") is not None:
        ra = [bucket_rates(t, cols[c], buckets) for c in ("n_alloc", "n_free")]
        if len(ra[0][0]):
            out.append({"id": chart_id(prefix, "rate"), "title": f"Allocation rate{what}",
                        "kind": "line",
                        "x": {"label": "time", "unit": "s", "log": False, "min": 0},
                        "y": {"label": "calls per second", "unit": "/s", "log": False, "min": 0},
                        "series": [{"name": "allocations", "x": _nums(ra[0][0], 4), "y": _nums(ra[0][1]),
                                    "color": "#4e79a7"},
                                   {"name": "frees", "x": _nums(ra[1][0], 4), "y": _nums(ra[1][1]),
                                    "color": "#e15759"}],
                        "note": "Change of the allocation and free counters between samples."})
    series = []
    for c, name, color in (("arenas", "malloc arenas", "#59a14f"), ("threads", "threads", "#9c755f")):
        v = cols[c]
        ok = np.flatnonzero(~np.isnan(v) & ~np.isnan(t))
        if len(ok) and np.nanmax(v[ok]) > 0:
            k = ok[extreme_rows([v[ok]], buckets)]
            series.append({"name": name, "x": _nums(t[k], 4), "y": _nums(v[k]), "step": True,
                           "color": color})
    arenas = any(x["name"] == "malloc arenas" for x in series)
    busy = any(max((v for v in x["y"] if v is not None), default=0) > 1 for x in series)
    if series and (arenas or busy):
        out.append({"id": chart_id(prefix, "arenas"),
                    "title": (f"Arenas and threads{what}" if arenas else f"Threads{what}"),
                    "kind": "line",
                    "x": {"label": "time", "unit": "s", "log": False, "min": 0},
                    "y": {"label": "count", "unit": "count", "log": False, "min": 0},
                    "series": series,
                    "note": ("glibc gives each thread that allocates an arena of its own, up to 8 per core."
                             if arenas else "Threads of the process, from /proc.")})
    return out


# ---------------------------------------------------------------------------- comparisons

def compare_charts(doc: dict, prefix: str, buckets: int = BUCKETS) -> list:
    """Grouped bars of memory and time per configuration (medians, whiskers at the min and
    max of the repeats), and each configuration's RSS over its median run."""
    rows = [r for r in doc.get("configs") or [] if r.get("ok") and r.get("stats")]
    out = []
    if rows:
        names = [r["name"] for r in rows]
        def bars(metrics):
            return [{"name": label, "x": names,
                     "y": [r["stats"][k]["median"] for r in rows],
                     "lo": [r["stats"][k]["min"] for r in rows],
                     "hi": [r["stats"][k]["max"] for r in rows], "color": color}
                    for k, label, color in metrics]
        rep = doc.get("repeat", 1)
        spread = f"medians of {rep} runs, whiskers at the lowest and highest" if rep > 1 else "one run each"
        failed = [r.get("name", "?") for r in doc.get("configs") or [] if r not in rows]
        if failed:
            spread += f"; not shown (no figures, see the table): {', '.join(failed)}"
        out.append({"id": chart_id(prefix, "memory"), "title": "Memory per configuration",
                    "kind": "bar",
                    "x": {"label": "configuration", "unit": "", "log": False, "categories": names},
                    "y": {"label": "bytes", "unit": "bytes", "log": False, "min": 0},
                    "series": bars((("peak_rss", "peak RSS", "#4e79a7"),
                                    ("final_rss", "RSS at exit", "#f28e2b"),
                                    ("retained", "retained at exit", "#e15759"))),
                    "note": f"{spread}."})
        out.append({"id": chart_id(prefix, "time"), "title": "Time per configuration",
                    "kind": "bar",
                    "x": {"label": "configuration", "unit": "", "log": False, "categories": names},
                    "y": {"label": "time", "unit": "s", "log": False, "min": 0},
                    "series": bars((("wall_s", "wall", "#76b7b2"), ("cpu_s", "CPU", "#b07aa1"))),
                    "note": f"{spread}; the program's own time, up to heapsight's exit probe "
                            "(CPU includes the library's statistics thread)."})
    # each configuration's run with the median peak RSS (its repeats differ little; one line
    # each stays readable), drawn to its exit reading so no line stops in mid-air
    by_config = {}
    for rec in doc.get("runs") or []:
        if rec.get("timeline") and rec.get("config") is not None:
            by_config.setdefault(rec["config"], []).append(rec)
    series = []
    for name, recs in by_config.items():
        recs.sort(key=lambda r: (r.get("summary") or {}).get("peak_rss_bytes") or 0)
        rec = recs[(len(recs) - 1) // 2]
        cols = columns(rec, ("t", "rss"))
        ok = np.flatnonzero(~np.isnan(cols["rss"]) & ~np.isnan(cols["t"]))
        if not len(ok):
            continue
        k = ok[extreme_rows([cols["rss"][ok]], buckets)]
        x, y = _nums(cols["t"][k], 4), _nums(cols["rss"][k])
        fin = (rec.get("summary") or {}).get("final") or {}
        if isinstance(fin.get("at_s"), (int, float)) and fin["at_s"] > (x[-1] or 0):
            x, y = x + [round(float(fin["at_s"]), 4)], y + [fin.get("rss_bytes")]
        series.append({"name": name, "x": x, "y": y})
    if series:
        out.append({"id": chart_id(prefix, "rss"), "title": "RSS over time, the median run of each configuration",
                    "kind": "line",
                    "x": {"label": "time", "unit": "s", "log": False, "min": 0},
                    "y": {"label": "RSS", "unit": "bytes", "log": False, "min": 0},
                    "series": series,
                    "note": "RSS as sampled from /proc, up to the exit reading, in the run of each "
                            "configuration whose peak RSS was the median of its repeats."})
    return out


def diff_charts(a: dict, b: dict, prefix: str, buckets: int = BUCKETS) -> list:
    """Two runs on one time axis: RSS and live bytes of run A and run B (heapsight diff)."""
    series = []
    for label, doc, colors in (("A", a, ("#4e79a7", "#a0cbe8")), ("B", b, ("#f28e2b", "#ffbe7d"))):
        cols = columns(doc, ("t", "rss", "live_usable"))
        for key, name, color in (("rss", "RSS", colors[0]), ("live_usable", "live", colors[1])):
            ok = np.flatnonzero(~np.isnan(cols[key]) & ~np.isnan(cols["t"]))
            if not len(ok):
                continue
            k = ok[extreme_rows([cols[key][ok]], buckets)]
            series.append({"name": f"{label}: {name}", "x": _nums(cols["t"][k], 4),
                           "y": _nums(cols[key][k]), "color": color})
    if not series:
        return []
    return [{"id": chart_id(prefix, "ab"), "title": "Run A and run B on one time axis",
             "kind": "line",
             "x": {"label": "time", "unit": "s", "log": False, "min": 0},
             "y": {"label": "bytes", "unit": "bytes", "log": False, "min": 0},
             "series": series,
             "note": "RSS and live (usable) bytes of each run, from its start; A in blue, B in "
                     "orange."}]


# ---------------------------------------------------------------------------- lab

def lab_charts(experiment: dict, prefix: str) -> list:
    """An experiment's own charts, with ids made unique on the page; anything that is not a
    chart description is dropped here rather than breaking the page."""
    out = []
    name = str(experiment.get("name") or "")
    for i, ch in enumerate(experiment.get("charts") or []):
        if not isinstance(ch, dict) or not isinstance(ch.get("series"), list):
            continue
        c = clean(ch)
        own = str(ch.get("id") or f"chart{i + 1}")
        if name and own.startswith(name + "-"):
            own = own[len(name) + 1:]  # "release-glibc" in experiment release: prefix says it
        c["id"] = chart_id(prefix, own)
        out.append(c)
    return out


def unique_ids(charts: list) -> list:
    seen = {}
    for c in charts:
        base = c["id"]
        if base in seen:
            seen[base] += 1
            c["id"] = f"{base}-{seen[base]}"
        else:
            seen[base] = 1
    return charts
