"""Two run records side by side: what moved between a run A and a run B (`heapsight diff`).

Pure: it takes two saved summaries (the "summary" of run records) and returns the
differences as plain data, for the terminal, the JSON and the gates.

  split     the RSS split at the peak and at exit, row by row: A, B, the change in bytes
            and in percent of A
  figures   peak RSS, the exact peak of the live bytes (the library's, not a sample), the
            release at exit, the holds, the pinned pages at exit, and, where
            both runs have it, reachability at exit (definitely/indirectly/possibly lost,
            still reachable)
  sites     the call sites at the peak and of the bytes never freed, matched by name
            (function and file:line): a site changed when the difference of the two
            estimates is outside its 99.9% interval (the two runs' sampling errors combined:
            sqrt(eA^2 + eB^2), widened from 95% to 99.9%, so that a table of a dozen sites
            names a change by chance about once in a hundred diffs); inside it, "no change"
  verdicts  each run's verdict
"""

from __future__ import annotations

import math
import os

from heapsight.fmt import human
from heapsight.moments import held_share, rss_of, rss_over

Z95, Z999 = 1.96, 3.29
SPLIT_ROWS = (("rss_bytes", "RSS"), ("live_bytes", "live"), ("waste_bytes", "waste"),
              ("metadata_bytes", "allocator metadata"), ("retained_bytes", "retained"),
              ("non_heap_bytes", "non-heap"))
REACH = ("definitely_lost", "indirectly_lost", "possibly_lost", "still_reachable")
# the figures a gate can name (--fail-if-grew FIGURE=SIZE): where each is in a summary
GATE_FIGURES = {
    "peak_rss": "peak RSS", "retained": "retained at exit", "live": "live at exit",
    "rss": "RSS at exit", "non_heap": "non-heap at exit",
    "peak_live": "live at the peak (the library's exact peak)",
    "lost": "definitely and indirectly lost at exit",
    "held_rss": "held RSS (A's, through its largest hold, else its longest steady stretch; "
                "B's over the same stretch)",
    "end_rss": "RSS as the exit began",
}


def program(summary: dict) -> str:
    cmd = summary.get("command") or ["?"]
    return os.path.basename(str(cmd[0]))


def _row(a, b) -> dict:
    a, b = int(a or 0), int(b or 0)
    return {"a": a, "b": b, "change": b - a, "percent": round(100.0 * (b - a) / a, 1) if a else None}


def _figure_row(a, b) -> dict:
    """A figure of both runs; None on the side of a run that has no such figure (no held
    moment, no release measured: "0 B" would read as a measured nothing), and then no
    change."""
    if a is None or b is None:
        return {"a": a, "b": b, "change": None, "percent": None}
    return _row(a, b)


def split(a: dict, b: dict, at: str) -> list:
    pa, pb = a.get(at) or {}, b.get(at) or {}
    return [{"row": name, **_row(pa.get(key), pb.get(key))} for key, name in SPLIT_ROWS]


def _exit_map(s: dict) -> dict:
    return next((m for m in s.get("heapmaps") or () if m.get("moment") == "exit"), {})


def reach(s: dict) -> dict | None:
    r = _exit_map(s).get("reach")
    return r if r and r.get("marked") else None


def pinned(s: dict) -> int:
    m = _exit_map(s)
    return sum(a.get("pinned_pages", 0) for a in m.get("arenas") or ()) * m.get("page_bytes", 4096)


def exact_peak_live(s: dict) -> int | None:
    """The live requested bytes at the library's exact peak (summary heap), or, for a run
    without the library's figures, the peak column's (a sample)."""
    heap = s.get("heap") or {}
    if heap.get("peak_live_requested_bytes") is not None:
        return heap["peak_live_requested_bytes"]
    return (s.get("peak") or {}).get("live_bytes")


def figure(s: dict, name: str) -> int | None:
    """A gate's figure of one summary (GATE_FIGURES), None where the run has none. Exact
    figures only: "peak_live" is the library's exact peak, not the peak column (a sample
    every 10 ms, which can miss the peak and read growth where it fell)."""
    fin = s.get("final") or {}
    if name == "peak_live":
        return exact_peak_live(s)
    if name in ("held_rss", "end_rss"):
        return rss_of(s.get("moments") or (), name.removesuffix("_rss"))
    if name == "lost":
        r = reach(s)
        return None if r is None else r["definitely_lost_bytes"] + r["indirectly_lost_bytes"]
    return {"peak_rss": s.get("peak_rss_bytes"), "retained": fin.get("retained_bytes"),
            "live": fin.get("live_bytes"), "rss": fin.get("rss_bytes"),
            "non_heap": fin.get("non_heap_bytes")}.get(name)


def held_in_b(a: dict, b: dict, timeline_b: dict | None) -> int | None:
    """B's held RSS, read where A held: B's median RSS over A's held stretch, by share of
    each run (moments.rss_over), as compare and run --verify read a setting. B's own held
    moment may be another part of its run (A held through its work and B, under another
    allocator, did not: B's own is its idle end, and "held RSS -80%" would be a drop B did
    not make). B's own held moment when A has none or B's timeline is not there."""
    share = held_share(a.get("moments") or (), a.get("duration_s") or 0.0)
    tl = timeline_b or {}
    if share is not None and tl.get("t"):
        got = rss_over(tl["t"], tl.get("rss", ()), b.get("duration_s") or 0.0, share)
        if got is not None:
            return got
    return rss_of(b.get("moments") or (), "held")


def figures(a: dict, b: dict, timeline_b: dict | None = None) -> list:
    rows = [("peak RSS", a.get("peak_rss_bytes"), b.get("peak_rss_bytes")),
            *(((f"{name} RSS", rss_of(a.get("moments") or (), name),
                rss_of(b.get("moments") or (), name)) if name == "end" else
               ("held RSS (A's stretch)", rss_of(a.get("moments") or (), name),
                held_in_b(a, b, timeline_b))) for name in ("held", "end")
              if a.get("moments") and b.get("moments")),
            ("peak live (exact)", exact_peak_live(a), exact_peak_live(b)),
            ("release at exit gave back", (a.get("release") or {}).get("gave_back_bytes"),
             (b.get("release") or {}).get("gave_back_bytes")),
            ("largest hold", max((h.get("max_held_bytes", 0) for h in a.get("holds") or ()), default=0),
             max((h.get("max_held_bytes", 0) for h in b.get("holds") or ()), default=0)),
            ("pinned at exit", pinned(a), pinned(b))]
    ra, rb = reach(a), reach(b)
    if ra and rb:
        rows += [(c.replace("_", " ") + " at exit", ra[c + "_bytes"], rb[c + "_bytes"]) for c in REACH]
    return [{"figure": name, **_figure_row(x, y)} for name, x, y in rows]


def _moment(s: dict, name: str) -> dict | None:
    return next((m for m in (s.get("sites") or {}).get("moments", ()) if m["name"] == name), None)


def sites(a: dict, b: dict, moment: str) -> dict | None:
    """The call sites of one moment in both runs, matched by name; None when either run
    did not sample."""
    ma, mb = _moment(a, moment), _moment(b, moment)
    if ma is None or mb is None:
        return None
    sa = {x["site"]: x for x in ma["sites"]}
    sb = {x["site"]: x for x in mb["sites"]}
    rows = []
    for name in sorted(set(sa) | set(sb)):
        x, y = sa.get(name), sb.get(name)
        ba, bb = (x or {}).get("bytes", 0), (y or {}).get("bytes", 0)
        ea, eb = (x or {}).get("error_bytes", 0), (y or {}).get("error_bytes", 0)
        # the difference's 99.9% interval: the two 95% errors combined, widened
        interval = math.hypot(ea, eb) * Z999 / Z95
        d = bb - ba
        if abs(d) <= interval:
            how = "no change"
        elif x is None:
            how = "new"
        elif y is None:
            how = "gone"
        else:
            how = "grew" if d > 0 else "shrank"
        rows.append({"site": name, "a": ba, "b": bb, "change": d, "interval": int(round(interval)),
                     "how": how})
    rows.sort(key=lambda r: (r["how"] == "no change", -abs(r["change"])))
    return {"moment": moment, "a_samples": ma["samples"], "b_samples": mb["samples"],
            # the moment in each run, and its live bytes (exact): the sites add up to these
            "a_at_s": ma.get("t_s"), "b_at_s": mb.get("t_s"),
            "a_bytes": ma.get("live_bytes"), "b_bytes": mb.get("live_bytes"), "rows": rows}


def diff(a: dict, b: dict, timeline_b: dict | None = None) -> dict:
    """Everything that moved from run A to run B (summaries of run records; B's timeline,
    where there is one, for its RSS where A held: held_in_b)."""
    out = {"a": {"command": a.get("command"), "pid": a.get("pid"), "verdict": a.get("verdict")},
           "b": {"command": b.get("command"), "pid": b.get("pid"), "verdict": b.get("verdict")},
           "split": {"peak": split(a, b, "peak"), "exit": split(a, b, "final")},
           # when each column was read (the peak column is a sample: the call sites' peak,
           # the library's exact moment, may fall between two)
           "at_s": {at: [(s.get(key) or {}).get("at_s") for s in (a, b)]
                    for at, key in (("peak", "peak"), ("exit", "final"))},
           "figures": figures(a, b, timeline_b), "sites": {}}
    for moment in ("peak", "never freed"):
        got = sites(a, b, moment)
        if got is not None:
            out["sites"][moment] = got
    return out


def _at(t) -> str:
    return f" at {t:.2f} s" if isinstance(t, (int, float)) else ""


def read_at_text(d: dict, at: str) -> str:
    """When each run's column of the split was read: "(A at 0.08 s, B at 0.05 s)", or "";
    the peak's says it is a sample (the exact peak is a figure below)."""
    pair = (d.get("at_s") or {}).get(at)
    if not pair or not all(isinstance(t, (int, float)) for t in pair):
        return ""
    sample = "samples: " if at == "peak" else ""
    return f"({sample}A{_at(pair[0])}, B{_at(pair[1])})"


def sites_moment_text(got: dict) -> str:
    """Each run's moment of a call-site table with its exact live bytes (the sites add up
    to these): "A 36.3 MiB usable at 0.10 s, B 4.0 MiB at 0.09 s; ", or ""."""
    if got.get("a_bytes") is None or got.get("b_bytes") is None:
        return ""
    return (f"A {human(got['a_bytes'])} usable{_at(got.get('a_at_s'))}, "
            f"B {human(got['b_bytes'])}{_at(got.get('b_at_s'))}; ")


def change_text(r: dict) -> str:
    """A row's change as people read it: "+1.2 MiB (+3.4%)", "-8.0 KiB", or "=" for none;
    a call site's with its interval: "+20.0 MiB (±1.5 MiB)"; "" where a run has no such
    figure. No percentage past tenfold: jemalloc's 3.0 MiB of metadata against glibc's 368 B
    read "+858682.6%" (the JSON keeps it)."""
    if r["change"] is None:
        return ""
    if not r["change"]:
        return "="
    text = f"{'+' if r['change'] > 0 else '-'}{human(abs(r['change']))}"
    if "interval" in r:
        return f"{text} (\u00b1{human(r['interval'])})"
    pct = r.get("percent")
    return text + (f" ({pct:+.1f}%)" if pct is not None and abs(pct) < 1000 else "")


def changed_sites(d: dict, moment: str) -> list:
    return [r for r in (d["sites"].get(moment) or {}).get("rows", ()) if r["how"] != "no change"]


def amount(v) -> str:
    """A figure's cell: its bytes, or "-" where the run has none."""
    return "-" if v is None else human(v)
