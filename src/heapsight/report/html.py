"""The report page: one self-contained HTML file (inline CSS and JS, no network, no
external fonts). Text from the records - command lines, program names, verdicts, lab
tables - goes through html.escape here, or textContent in the renderer; the charts travel
as JSON in a <script type="application/json"> element with every "<", ">" and "&" written
as a \\u escape, so nothing in the data can end that element or open another."""

from __future__ import annotations

import html
import json
import re
import shlex
import time
from pathlib import Path

from heapsight.dataclass import dataclass
from heapsight import __version__, allocators, analysis, heapmap, ranking
from heapsight.moments import words as moment_words
from heapsight.ranking import METRICS
from heapsight.diffing import amount, change_text, read_at_text, sites_moment_text
from heapsight.fmt import cell, human, metric, pct
from heapsight.output import OTHER_SURROGATES
from heapsight.report import charts as ch
from heapsight.report import holders

ASSETS = Path(__file__).resolve().parent / "assets"

# The page's first script: from here on every uncaught error and console.error is kept in a
# list, which the renderer writes into <body data-errors> and #hs-errors when it has drawn.
HEALTH_JS = """
window.__hs = {errors: [], onerror: null};
(function () {
  var E = window.__hs.errors;
  function note(s) {
    E.push(s);
    if (window.__hs.onerror) try { window.__hs.onerror(); } catch (_) {}
  }
  window.addEventListener('error', function (e) {
    var what = e.message || ('failed to load ' + ((e.target && (e.target.src || e.target.href)) || 'a resource'));
    note(String(what) + (e.filename ? ' (' + e.filename.split('/').pop() + ':' + e.lineno + ')' : ''));
  }, true);
  window.addEventListener('unhandledrejection', function (e) { note('unhandled rejection: ' + String(e.reason)); });
  var ce = console.error;
  console.error = function () {
    note(Array.prototype.map.call(arguments, String).join(' '));
    return ce.apply(console, arguments);
  };
})();
"""


def esc(v) -> str:
    return html.escape(str(v), quote=True)


SURROGATES = re.compile("[\ud800-\udfff]+")


def printable(text: str) -> str:
    """Text whose undecodable bytes (a program's arguments can be any bytes: Python holds
    them as surrogate escapes) are shown as \\xNN, and any other lone surrogate as
    \\uNNNN, so the page is valid UTF-8."""
    text = OTHER_SURROGATES.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def script_json(data) -> str:
    """JSON that is safe inside a <script> element whatever its strings hold; undecodable
    bytes read as in the rest of the page (printable), and stay valid JSON."""
    text = json.dumps(ch.clean(data), separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    text = SURROGATES.sub(lambda m: json.dumps(printable(m.group()))[1:-1], text)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def asset(name: str, closing: str) -> str:
    text = (ASSETS / name).read_text(encoding="utf-8")
    if closing in text.lower():
        raise ValueError(f"{name} contains {closing}")  # it would end its element early
    return text


@dataclass
class Page:
    html: str
    charts: list    # the chart descriptions, in page order (ids are unique)


def figure(c: dict) -> str:
    return f'<figure class="chart" id="fig-{esc(c["id"])}" data-chart="{esc(c["id"])}"></figure>'


def figures(cs: list) -> str:
    return '<div class="charts">' + "".join(figure(c) for c in cs) + "</div>"


def table(columns: list, rows: list, caption: str = "", cls: str = "data") -> str:
    out = [f'<div class="scroll"><table class="{cls}">']
    if caption:
        out.append(f"<caption>{esc(caption)}</caption>")
    out.append("<thead><tr>" + "".join(f"<th>{esc(c)}</th>" for c in columns) + "</tr></thead><tbody>")
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{esc(x)}</td>" for x in r) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


# ---------------------------------------------------------------------------- run

PARTS = (("live (requested, not freed)", "live_bytes"), ("waste (rounding)", "waste_bytes"),
         ("allocator metadata", "metadata_bytes"), ("retained (freed, kept)", "retained_bytes"),
         ("non-heap", "non_heap_bytes"))


def _cell(b, key, share=True) -> str:
    """A value and its share of that moment's RSS, as two cells."""
    if not b:
        return "<td>-</td><td></td>"
    v = b.get(key, 0)
    p = esc(pct(v, b.get("rss_bytes", 0))) if share else ""
    return f'<td>{esc(human(v))}</td><td class="share">{p}</td>'



def _moment_columns(s: dict) -> list:
    """(header, breakdown dict) per named moment (moments.py), the verdict's marked; a run
    saved before moments had names: peak live and exit."""
    named = [m for m in s.get("moments") or () if m.get("breakdown")]
    if not named:
        peak, fin = s.get("peak"), s.get("final")
        return [(f"peak (at {peak['at_s']:.2f} s)" if peak else "peak", peak),
                (f"at exit ({fin['at_s']:.2f} s)" if fin else "at exit", fin)]
    cols = []
    for m in named:
        head = moment_words(m) + (" *" if m["name"] == s.get("moment") else "")
        if cols and cols[-1][1] == m["breakdown"]:
            cols[-1] = (cols[-1][0] + ", " + head, m["breakdown"])
        else:
            cols.append((head, m["breakdown"]))
    return cols


def breakdown_table(s: dict) -> str:
    cols = _moment_columns(s)
    # another allocator's metadata where it gives no figure (mimalloc; jemalloc and tcmalloc
    # but at exit) is in retained: "-", as the terminal says it, not "0 B"
    unknown = not allocators.metadata_known((s.get("heap") or {}).get("allocator"))

    def cell(b, key, share):
        if key == "metadata_bytes" and unknown and b and not b.get(key):
            return "<td>-</td><td></td>"
        return _cell(b, key, share)

    def row(label, key, share=True, cls=""):
        return (f'<tr><td{cls}>{esc(label)}</td>'
                + "".join(cell(b, key, share) for _, b in cols) + "</tr>")
    rows = [row("RSS", "rss_bytes", False)]
    if s.get("preload") == "active":
        rows += [row(label, key, True, ' class="sub"') for label, key in PARTS]
        if any(b and b.get("untouched_bytes", 0) > 0 for _, b in cols):
            rows.append(row("never touched (not resident)", "untouched_bytes", False, ' class="sub"'))
    else:
        rows.append(row("file-backed", "file_bytes", True, ' class="sub"'))
    about = next((m for m in s.get("moments") or () if m["name"] == s.get("moment")), None)
    note = (f'<p class="note">* the moment the verdict is about: {esc(about.get("how", ""))}</p>'
            if about else "")
    return ("<div class=\"scroll\"><table class=\"data breakdown\"><caption>Where the RSS went, "
            'at each moment</caption><thead><tr><th></th>'
            + "".join(f'<th colspan="2">{esc(h)}</th>' for h, _ in cols)
            + f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>{note}")


def run_facts(s: dict) -> list:
    heap = s.get("heap") or {}
    how = (f"killed by signal {s.get('exit_signal')} (exit code {s.get('exit_code')})"
           if s.get("exit_signal") else f"{s.get('exit_code')}")
    attached = s.get("preload") == "attached"
    if attached:   # a process heapsight watched: its exit code is its parent's to read
        how = ("still running when the watch ended" if s.get("still_running")
               else "ended during the watch (its exit code went to its parent)")
    cpu = f"{s.get('cpu_user_s', 0) + s.get('cpu_sys_s', 0):.2f} s CPU"
    facts = [("command", f'<code class="cmd">{esc(shlex.join(s.get("command") or []))}</code>'),
             ("the process" if attached else "exit code" if s.get("pid") == s.get("started_pid")
              else "exit code (the command's)", esc(how)),
             ("duration", esc(f"{s.get('duration_s', 0):.2f} s wall, "
                              + (f"{cpu} (the process's, over the watch)" if attached else
                                 f"{cpu}, {s.get('minor_faults', 0):,} minor faults"))),
             ("allocator", esc(heap.get("allocator", "heap not visible"))),
             ("samples", esc(f"{s.get('samples', 0):,} at {s.get('sample_hz', 0):g} Hz")),
             ("process", esc(f"pid {s.get('pid')}: {s.get('preload_note', '')}")),
             ("peak RSS (VmHWM)", esc(human(s.get("peak_rss_bytes", 0))))]
    rel = s.get("release") or {}
    if rel.get("measured"):
        facts.append(("release at exit", esc(
            f"{rel.get('call')} {'would give' if rel.get('where') == 'copy' else 'gave'} back "
            f"{human(rel.get('gave_back_bytes', 0))}"
            + ("" if rel.get("counted_fast_chunks") else f" in {rel.get('seconds', 0) * 1000:.1f} ms")
            + f" (RSS {human(rel.get('rss_before_bytes', 0))} "
            f"\u2192 {human(rel.get('rss_after_bytes', 0))}"
            + (f"; {analysis.release_how(rel)}" if analysis.release_how(rel) else "") + ")")))
    else:
        facts.append(("release at exit", esc(f"not measured: {rel.get('why_not', '')}")))
    snaps = [(x.get("label"), x.get("at_s")) for x in s.get("snapshots") or ()]
    for m in s.get("heapmaps") or ():
        line = heapmap.reach_line(m.get("reach"))
        if line:
            facts.append((f"reachable {heapmap.moment_words(m, snaps)}", esc(line)))
    if heap:
        facts.append(("heap", esc(
            f"{heap.get('n_alloc', 0):,} allocations, {heap.get('n_free', 0):,} frees, "
            f"{heap.get('live_blocks', 0):,} blocks live at exit; peak live "
            f"{human(heap.get('peak_live_requested_bytes', 0))} at {heap.get('peak_at_s', 0):.2f} s; "
            f"{heap.get('arenas', 0)} arena(s); {heap.get('threads_seen', 0)} thread(s)")))
    return facts


def facts_html(facts: list) -> str:
    return '<dl class="facts">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"


def first_try(s: dict) -> str:
    """The first thing to try, under the verdict (the terminal's `try:` line), so it is in
    the first screen however wide the breakdown is."""
    first = next(iter((s.get("findings") or [{}])[0].get("suggestions") or ()), None)
    if not first:
        return ""
    return (f'<div class="findings first-try"><ul><li>try: <code>{esc(first)}</code></li>'
            "</ul></div>")


def findings_html(s: dict) -> str:
    out = []
    for f in s.get("findings") or []:
        sug = "".join(f"<li>try: <code>{esc(x)}</code></li>" for x in f.get("suggestions") or [])
        out.append(f'<div class="finding"><h4>{esc(f.get("title", ""))}</h4>'
                   f'<p>{esc(f.get("detail", ""))}</p>{"<ul>" + sug + "</ul>" if sug else ""}</div>')
    return f'<div class="findings">{"".join(out)}</div>' if out else ""


def holders_html(s: dict, sid: str) -> tuple:
    """Who holds the memory: the flame graph of the sampled call sites beside the top call
    sites, and the heap map beside the blocks that pin it; each side panel is filled by
    the renderer for the moment or map selected. Nothing for a run without them."""
    out, cs = [], []
    for title, chart in (("Who holds the memory: sampled call sites",
                          holders.flame_chart(s, f"{sid}-flame")),
                         ("The heap, page by page, and the blocks that pin it",
                          holders.heapmap_chart(s, f"{sid}-heapmap"))):
        if chart:
            cs.append(chart)
            out.append(f'<h3 class="holders">{esc(title)}</h3>'
                       f'<div class="holders-grid">{figure(chart)}'
                       f'<div class="side" id="side-{esc(chart["id"])}"></div></div>')
    return "".join(out), cs


def run_section(sid: str, source: str, doc: dict, label: str = "") -> tuple:
    s = doc.get("summary") or {}
    cs = ch.run_charts(doc, sid)
    who, who_charts = holders_html(s, sid)
    prog = (s.get("command") or ["?"])[0]
    kind = (s.get("findings") or [{}])[0].get("kind", "healthy" if s.get("heap") else "")
    body = [f'<section class="doc run" id="{sid}">',
            f'<h2><span class="kind">run</span>{esc(prog)}{esc(" " + label) if label else ""}</h2>',
            f'<div class="from">{esc(source)}</div>',
            f'<div class="verdict v-{esc(kind)}">{esc(s.get("verdict", ""))}</div>',
            first_try(s),
            # what a reader needs first, in the first screen: the verdict, what to try and
            # the breakdown; then the charts, who holds the memory, and the facts
            f'<div class="run-top">{breakdown_table(s)}{findings_html(s)}</div>',
            figures(cs), who, facts_html(run_facts(s)), "</section>"]
    return "".join(body), cs + who_charts


# ---------------------------------------------------------------------------- comparison



def compare_table(doc: dict) -> str:
    rows = doc.get("configs") or []
    base = next((r for r in rows if r.get("name") == ranking.BASELINE and r.get("ok")
                 and r.get("stats")), None)
    rep = doc.get("repeat", 1)
    head = "".join(f"<th>{esc(h)}</th>" for h in ["configuration"] + [h for _, h in METRICS])
    out = [f'<div class="scroll"><table class="data compare"><thead><tr>{head}</tr></thead><tbody>']
    for r in rows:
        name = f'{esc(r.get("name", "?"))}<span class="range">{esc(r.get("about", ""))}</span>'
        if not r.get("ok") or not r.get("stats"):
            out.append(f'<tr class="err"><td>{name}</td><td class="text" colspan="{len(METRICS)}">'
                       f'error: {esc(r.get("error") or "no figures")}</td></tr>')
            continue
        cells = []
        for key, _ in METRICS:
            st = r["stats"].get(key) or {}
            med = st.get("median")
            rel = ""
            if base is not None and r is not base and med is not None:
                # as the terminal says it: "~" inside the repeats' noise, nothing for the
                # bytes given back (a % of 0 B says nothing)
                bst = base["stats"].get(key)
                rel = " " + ranking.change_text(ranking.change(key, st, bst)) if bst else ""
                rel = rel.rstrip()
            span = (f'<span class="range">{esc(metric(key, st.get("min")))} \u2013 '
                    f'{esc(metric(key, st.get("max")))}</span>') if rep > 1 else ""
            cells.append(f"<td>{esc(metric(key, med) + rel)}{span}</td>")
        out.append(f"<tr><td>{name}</td>{''.join(cells)}</tr>")
    out.append("</tbody></table></div>")
    out.append(f'<p class="table-note">{esc(f"medians of {rep} run(s)" + (", lowest and highest below" if rep > 1 else ""))}'
               f'{esc("; changes against glibc defaults, ~ where the repeats overlap" if base else "")}'
               + (f"{esc('; ranked by ' + ranking.RANK_WORDS[doc['rank_by']] + ': ' + doc.get('rank_why', ''))}"
                  if doc.get("rank_by") in ranking.RANK_WORDS else "") + "</p>")
    return "".join(out)


def compare_section(sid: str, source: str, doc: dict) -> tuple:
    cs = ch.compare_charts(doc, sid)
    cmd = shlex.join(doc.get("command") or [])
    prog = (doc.get("command") or ["?"])[0]
    body = [f'<section class="doc compare" id="{sid}">',
            f'<h2><span class="kind">comparison</span>{esc(prog)}</h2>',
            f'<div class="from">{esc(source)}</div>',
            facts_html([("command", f'<code class="cmd">{esc(cmd)}</code>'),
                        ("repeats", esc(doc.get("repeat", 1))),
                        ("configurations", esc(len(doc.get("configs") or [])))]),
            f'<div class="recommend"><b>recommendation:</b> {esc(doc.get("recommendation", ""))}</div>',
            figures(cs), compare_table(doc), "</section>"]
    return "".join(body), cs


# ---------------------------------------------------------------------------- lab

def claim_html(c: dict) -> str:
    v = str(c.get("verdict", "")).lower()
    cls = v if v in ("holds", "fails", "depends") else "depends"
    on = (f' <span class="on">on {esc(c["depends_on"])}</span>' if v == "depends" and c.get("depends_on") else "")
    return (f'<div class="claim"><span class="badge {cls}">{esc(v or "?")}{on}</span>'
            f'<div class="text">\u201c{esc(c.get("text", ""))}\u201d</div>'
            f'<div class="evidence">{esc(c.get("evidence", ""))}</div></div>')


FOLD_ROWS = 12   # a longer table is folded: its title shows, its rows open on a click


def lab_table(t: dict) -> str:
    rows = [[cell(x) for x in r] for r in t.get("rows") or []]
    note = f'<p class="table-note">{esc(t["note"])}</p>' if t.get("note") else ""
    if len(rows) <= FOLD_ROWS:
        return table(t.get("columns") or [], rows, t.get("title", "")) + note
    return (f'<details class="table"><summary>{esc(t.get("title", "table"))} '
            f'<span class="rows">({len(rows)} rows)</span></summary>'
            + table(t.get("columns") or [], rows) + note + "</details>")


def lab_section(sid: str, source: str, doc: dict) -> tuple:
    m = doc.get("machine") or {}
    exps = doc.get("experiments") or []
    counts = {}
    for e in exps:
        for c in e.get("claims") or []:
            counts[c.get("verdict")] = counts.get(c.get("verdict"), 0) + 1
    links = ", ".join(f'<a href="#{esc(sid)}-{esc(ch.chart_id(e.get("name") or f"e{i}"))}">'
                      f'{esc(e.get("name", "?"))}</a>' for i, e in enumerate(exps, 1))
    facts = [("experiments", links),
             ("claims", esc(", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=str)) or "none")),
             ("mode", esc("quick (small sizes)" if doc.get("quick") else "full size")),
             ("machine", esc(f"{m.get('cores', '?')} cores, kernel {m.get('kernel', '?')}, "
                             f"{m.get('libc', '?')}")),
             ("started", esc(doc.get("started", "?")))]
    body = [f'<section class="doc lab" id="{sid}">', '<h2><span class="kind">lab</span>allocator experiments</h2>',
            f'<div class="from">{esc(source)}</div>', facts_html(facts)]
    all_charts = []
    for i, e in enumerate(exps, 1):
        eid = f"{sid}-{ch.chart_id(e.get('name') or f'e{i}')}"
        body.append(f'<h3 id="{esc(eid)}">{esc(e.get("name", "?"))}'
                    f'{": " + esc(e["title"]) if e.get("title") else ""}</h3>')
        if e.get("source"):
            took = e.get("duration_s")
            took = f" ({took:.1f} s)" if isinstance(took, (int, float)) else ""
            body.append(f'<div class="from">after \u201c{esc(e["source"])}\u201d{esc(took)}</div>')
        if e.get("about"):
            body.append(f'<p class="about">{esc(e["about"])}</p>')
        if e.get("error"):
            body.append(f'<p class="error">this experiment failed to run: {esc(e["error"])}</p>')
            continue
        cs = ch.lab_charts(e, eid)
        ch.unique_ids(all_charts + cs)  # renames in place: ids must be final before the figures
        all_charts += cs
        claims = "".join(claim_html(c) for c in e.get("claims") or [])
        body.append(f'<div class="lab-grid"><div class="charts">{"".join(figure(c) for c in cs)}</div>'
                    f'<div class="claims">{claims}</div></div>')
        body.append("".join(lab_table(t) for t in e.get("tables") or []))
    body.append("</section>")
    return "".join(body), all_charts


# ---------------------------------------------------------------------------- page

# ---------------------------------------------------------------------------- diff

def diff_section(sid: str, source: str, doc: dict) -> tuple:
    """heapsight diff's page head: both runs on one time axis, and what moved (a document
    {"kind": "heapsight-diff", "diff": diffing.diff(...), "a": run A, "b": run B})."""
    d = doc["diff"]
    cs = ch.diff_charts(doc["a"], doc["b"], sid)

    parts = [f'<section class="doc diff" id="{sid}">',
             f'<h2><span class="kind">diff</span>{esc(source)}</h2>',
             f'<div class="verdict">A: {esc(d["a"]["verdict"] or "")}<br>B: '
             f'{esc(d["b"]["verdict"] or "")}</div>']
    for at, title in (("peak", "at peak live"), ("exit", "at exit")):
        read = read_at_text(d, at)
        parts.append(table(["", "A", "B", "change"],
                           [[r["row"], human(r["a"]), human(r["b"]), change_text(r)]
                            for r in d["split"][at]], f"the split {title}{' ' + read if read else ''}"))
    parts.append(table(["", "A", "B", "change"],
                       [[r["figure"], amount(r["a"]), amount(r["b"]), change_text(r)]
                        for r in d["figures"]], "figures"))
    for moment, got in d["sites"].items():
        moved = [r for r in got["rows"] if r["how"] != "no change"]
        rows = [[r["how"], human(r["a"]), human(r["b"]),
                 change_text(r), r["site"]] for r in moved] or [["no call site changed", "", "", "", ""]]
        parts.append(table(["", "A", "B", "change", "site"], rows,
                           f"call sites {moment} ({sites_moment_text(got)}a change inside the two runs' sampling "
                           "error, their 99.9% interval, is no change)"))
    flame = holders.diff_flame_chart(doc["a"].get("summary") or {}, doc["b"].get("summary") or {},
                                     f"{sid}-flame")
    if flame:
        cs = cs + [flame]
        parts.append('<h3 class="holders">The call paths at the peak, B against A (red grew, '
                     'blue shrank, grey within the sampling error)</h3>'
                     f'<div class="holders-grid">{figure(flame)}'
                     f'<div class="side" id="side-{esc(flame["id"])}"></div></div>')
    parts += [figures([c for c in cs if c is not flame]), "</section>"]
    return "".join(parts), cs


def section_title(doc: dict) -> str:
    k = doc.get("kind")
    if k == "heapsight-diff":
        return "diff"
    if k == "heapsight-run":
        return "run: " + ((doc.get("summary") or {}).get("command") or ["?"])[0].rsplit("/", 1)[-1]
    if k == "heapsight-compare":
        return "comparison: " + (doc.get("command") or ["?"])[0].rsplit("/", 1)[-1]
    return "lab"


def build(items: list, title: str | None = None) -> Page:
    """items: (source name, document) pairs, each a run record, a comparison or a lab."""
    sections, all_charts, toc = [], [], []
    for n, (source, doc) in enumerate(items, 1):
        sid = f"s{n}"
        kind = doc.get("kind")
        if kind == "heapsight-run":
            part, cs = run_section(sid, source, doc)
        elif kind == "heapsight-compare":
            part, cs = compare_section(sid, source, doc)
        elif kind == "heapsight-lab":
            part, cs = lab_section(sid, source, doc)
        elif kind == "heapsight-diff":
            part, cs = diff_section(sid, source, doc)
        else:
            raise ValueError(f"{source}: not a heapsight document (kind {kind!r})")
        sections.append(part)
        all_charts += cs
        toc.append(f'<a href="#{sid}">{esc(section_title(doc))}</a>')
    title = title or ("heapsight report: " + ", ".join(section_title(d) for _, d in items))
    data = {"charts": all_charts, "generated": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "version": __version__}
    sub = (f"heapsight {__version__} \u00b7 {time.strftime('%Y-%m-%d %H:%M')} \u00b7 "
           f"{len(items)} file(s), {len(all_charts)} chart(s) \u00b7 hover a chart for values, drag "
           "across a timeline to zoom" + (", click a box of a flame graph to zoom into it"
                                          if any(c.get("kind") == "flame" for c in all_charts) else "")
           + ", double-click to zoom out")
    page = "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<script>{HEALTH_JS}</script>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title>",
        f"<style>{asset('report.css', '</style')}</style></head>",
        '<body data-charts="0 drawn" data-errors="0"><main>',
        f'<header class="page"><h1>{esc(title)}</h1><div class="sub">{esc(sub)}</div></header>',
        '<div id="hs-errors" role="alert"></div>',
        f'<nav class="toc">{"".join(toc)}</nav>' if len(toc) > 1 else "",
        "".join(sections), "</main>",
        f'<script type="application/json" id="hs-data">{script_json(data)}</script>',
        f"<script>{asset('report.js', '</script')}</script>",
        "</body></html>\n"])
    return Page(page, all_charts)
