"""What the commands print on the terminal: run's summary (one screen, read at a glance),
compare's table and lab's tables and claims."""

from __future__ import annotations

import textwrap

from heapsight import fmt
from heapsight.comparison import METRICS, baseline
from heapsight.fmt import human, pct
from heapsight.model import Breakdown, Summary

ROWS = (("live (requested, not freed)", "live"), ("waste (rounding)", "waste"),
        ("allocator metadata", "metadata"), ("retained (freed, kept)", "retained"),
        ("non-heap", "non-heap"))


MiB = 1 << 20
LABEL = 30
CELL = 20


def _cell(b: Breakdown | None, part: str, share: bool = True) -> str:
    """One column's cell: a resident part (Breakdown.parts) with its share of RSS, or a
    Breakdown field without a share."""
    if b is None:
        return f"{'-':>{CELL}}"
    v = b.parts()[part] if share else getattr(b, part)
    return f"{human(v):>12}{pct(v, b.rss_bytes) if share else '':>6}  "


def render_run(s: Summary, out, saved_to: str | None = None) -> None:
    w = out.write
    how = (f"killed by signal {s.exit_signal}" if s.exit_signal else f"exited with code {s.exit_code}")
    alloc = s.heap.allocator if s.heap else "heap not visible"
    w(f"\nheapsight: {' '.join(s.command)}\n")
    probe = f" (then {s.exit_probe_s * 1000:.0f} ms in heapsight's exit probe)" if s.exit_probe_s >= 0.0005 else ""
    w(f"  pid {s.pid} {how} after {s.duration_s:.2f} s{probe}; {alloc}; {s.samples} samples "
      f"at {s.sample_hz:g} Hz\n")
    if s.preload != "active" or s.forks or s.other_processes or s.pid != s.started_pid:
        w(f"  note: {s.preload_note}\n")
    peak_t = f"at peak live ({s.peak.at_s:.2f} s)" if s.peak else "at peak"
    w(f"\n  {'':{LABEL}}{peak_t:>{CELL - 2}}  {'at exit':>{CELL - 2}}\n")
    w(f"  {'RSS':{LABEL}}{_cell(s.peak, 'rss_bytes', False)}{_cell(s.final, 'rss_bytes', False)}\n")
    if s.preload == "active":
        for label, part in ROWS:
            w(f"    {label:{LABEL - 2}}{_cell(s.peak, part)}{_cell(s.final, part)}\n")
        # below a MiB this is the skew between a /proc read and a counters read
        if any(b and b.untouched_bytes >= max(MiB, b.rss_bytes / 100) for b in (s.peak, s.final)):
            w(f"    {'allocated, never touched':{LABEL - 2}}{_cell(s.peak, 'untouched_bytes', False)}"
              f"{_cell(s.final, 'untouched_bytes', False)}\n")
            w("    (blocks allocated but never written: counted live, not in RSS, so not above)\n")
    else:
        for label, attr in (("anonymous", None), ("file-backed", "file_bytes")):
            pv = (s.peak.rss_bytes - s.peak.file_bytes) if (s.peak and attr is None) else (getattr(s.peak, attr) if s.peak else 0)
            fv = (s.final.rss_bytes - s.final.file_bytes) if (s.final and attr is None) else (getattr(s.final, attr) if s.final else 0)
            w(f"    {label:{LABEL - 2}}{human(pv):>12}{'':8}{human(fv):>12}\n")
        w("    (/proc figures only: no split into live, waste and retained)\n")
    w(f"  peak RSS: {human(s.peak_rss_bytes)} at {s.peak_rss_at_s:.2f} s\n")
    for h in s.holds:
        whose = "freed, kept by the allocator" if h.cause == "retained" else "not from malloc"
        w(f"  held beyond live bytes: {human(h.held_bytes)} from {h.start_s:.2f} s to "
          f"{h.end_s:.2f} s ({whose}; up to {human(h.max_held_bytes)})\n")
    r = s.release
    if r.measured:
        w(f"\n  release at exit: {r.call} gave back {human(r.gave_back_bytes)} in "
          f"{r.seconds * 1000:.1f} ms (RSS {human(r.rss_before_bytes)} -> {human(r.rss_after_bytes)})\n")
    else:
        w(f"\n  release at exit: not measured: {r.why_not}\n")
    if s.heap:
        h = s.heap
        w(f"  heap: {h.n_alloc:,} allocations, {h.n_free:,} frees, {h.live_blocks:,} blocks live at "
          f"exit; peak live {human(h.peak_live_requested_bytes)} at {h.peak_at_s:.2f} s")
        w(f"; {h.arenas} arena(s); {h.threads_seen} thread(s)\n" if h.allocator == "glibc"
          else f"; {h.threads_seen} thread(s)\n")
    w(f"\n  VERDICT  {s.verdict}\n")
    for f in s.findings:
        w(f"\n  * {f.title}\n")
        for line in textwrap.wrap(f.detail, 86):
            w(f"    {line}\n")
        for sug in f.suggestions:
            w(f"      try: {sug}\n")
    if saved_to:
        w(f"\n  run saved to {saved_to}\n")
    w("\n")


def render_compare(doc: dict, out) -> None:
    """compare's table: medians with min-max below, each against glibc's defaults."""
    rows, repeat = doc["configs"], doc["repeat"]
    base = baseline(rows)
    w = out.write
    heads = ["configuration"] + [h for _, h in METRICS]
    w(f"\n{heads[0]:22}" + "".join(f"{h:>22}" for h in heads[1:]) + "\n")
    for r in rows:
        if not r["ok"]:
            w(f"{r['name']:22}  ERROR: {r['error']}\n")
            continue
        cells, spans = [], []
        for key, _ in METRICS:
            st = r["stats"][key]
            rel = ""
            if base is not None and r is not base and base["stats"][key]["median"]:
                rel = f" {100 * (st['median'] / base['stats'][key]['median'] - 1):+.0f}%"
            cells.append(f"{fmt.metric(key, st['median']) + rel:>22}")
            spans.append(f"{'(' + fmt.metric(key, st['min']) + '-' + fmt.metric(key, st['max']) + ')':>22}"
                         if repeat > 1 else f"{'':>22}")
        w(f"{r['name']:22}" + "".join(cells) + "\n")
        if repeat > 1:
            w(f"{'':22}" + "".join(spans) + "\n")
    w(f"\nmedians of {repeat} run(s), min-max below; percentages against glibc's defaults\n")
    w(f"recommendation: {doc['recommendation']}\n")


def render_table(t: dict) -> str:
    """A lab table (lab.common.Table as a dict): title, aligned columns, note."""
    cells = [[str(c) for c in t["columns"]]] + [[fmt.cell(c) for c in r] for r in t["rows"]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(t["columns"]))]
    lines = [t["title"]]
    for n, r in enumerate(cells):
        lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                      for i, (c, w) in enumerate(zip(r, widths))))
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    if t.get("note"):
        lines.append(f"  {t['note']}")
    return "\n".join(lines)


def render_lab(result: dict, out) -> None:
    """One experiment's tables and claims, as lab prints them after it ran."""
    w = out.write
    w(f"\n== {result['name']}: {result['title']} ==\n")
    w(f"   after \"{result['source']}\" ({result['duration_s']:.1f} s)\n\n")
    for t in result["tables"]:
        w(render_table(t) + "\n\n")
    w("claims:\n")
    for c in result["claims"]:
        verdict = c["verdict"].upper()
        if c["verdict"] == "depends" and c.get("depends_on"):
            verdict += f" on {c['depends_on']}"
        w(f"  [{verdict}] \"{c['text']}\"\n      {c['evidence']}\n")
