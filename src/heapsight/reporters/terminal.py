"""What the commands print on the terminal: run's summary (one screen, read at a glance),
compare's table and lab's tables and claims.

Drawn with rich: tables fit the terminal's width (COLUMNS, else the terminal's, else 100),
prose wraps, and colour is used only on a terminal and never under NO_COLOR (rich reads
NO_COLOR and FORCE_COLOR itself)."""

from __future__ import annotations

import math
import os
import re
import textwrap

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from heapsight import allocators, analysis, fmt, heapmap, moments, remedies
from heapsight.sites import CALLED_VIA
from heapsight import ranking
from heapsight.ranking import METRICS, baseline
from heapsight.fmt import MiB, human, pct, printable
from heapsight.model import Breakdown, Summary

ROWS = (("live (requested, not freed)", "live"), ("waste (rounding)", "waste"),
        ("allocator metadata", "metadata"), ("retained (freed, kept)", "retained"),
        ("non-heap", "non-heap"))
VERDICT_STYLE = {"hold": "bold yellow", "never-freed": "bold red", "leak": "bold red", "child": "bold yellow",
                 "kept": "bold yellow", "retention": "bold yellow",
                 "fragmentation": "bold red", "waste": "bold yellow", "non-heap": "bold yellow"}
# compare's figures where less is better (given back is neither: it depends on what was kept)
LOWER_IS_BETTER = {"peak_rss", "held_rss", "end_rss", "final_rss", "retained", "wall_s", "cpu_s",
                   "minor_faults"}


def console(out) -> Console:
    """A console on out: the terminal's width (COLUMNS first), 100 when out is no terminal."""
    width = None
    if os.environ.get("COLUMNS", "").isdigit():
        width = int(os.environ["COLUMNS"])
    elif not (hasattr(out, "isatty") and out.isatty()):
        width = 100
    # NO_COLOR: no escape codes at all (rich alone would still print bold)
    plain = {"color_system": None} if os.environ.get("NO_COLOR") else {}
    return Console(file=out, width=width, highlight=False, soft_wrap=False, emoji=False, **plain)


def _cells(b: Breakdown | None, part: str, share: bool = True) -> tuple:
    """A column's two cells: a resident part (Breakdown.parts) and its share of RSS, or a
    Breakdown field without a share."""
    if b is None:
        return "-", ""
    v = b.parts()[part] if share else getattr(b, part)
    return human(v), (pct(v, b.rss_bytes) if share else "")


def render_run(s: Summary, out, saved_to: str | None = None) -> None:
    """A run's summary for a terminal: what ran, the verdict and the first thing to try,
    the split at the peak and at exit, the moments and mappings, the release, the heap and
    its call sites, then each finding with its commands."""
    c = console(out)
    _run_header(c, s)
    _run_verdict(c, s)
    _split_table(c, s)
    _snapshot_lines(c, s)
    _mapping_lines(c, s)
    _hold_lines(c, s)
    _release_lines(c, s)
    _heap_lines(c, s)
    _finding_lines(c, s)
    if saved_to:
        c.print()
        c.print(Text(f"  run saved to {printable(saved_to)}"), overflow="fold")
    c.print()


def _run_header(c: Console, s: Summary) -> None:
    """The command, how it ended, its time and CPU, and whose figures these are."""
    how = (f"killed by signal {s.exit_signal}" if s.exit_signal else f"exited with code {s.exit_code}")
    # the version without a build's suffix (jemalloc's "5.3.0-0-g54eaed1d...")
    alloc = (f"{s.heap.allocator} {s.heap.allocator_version.split('-')[0]}".strip() if s.heap
             else "heap not visible")
    probe = (f" (then {s.exit_probe_s * 1000:.0f} ms to end, of which heapsight held its "
             f"exit {s.exit_held_s * 1000:.0f} ms)" if s.exit_probe_s >= 0.0005 else "")
    if s.library_cpu_s >= 0.0005:
        share = (f", {s.library_cpu_s / s.program_cpu_s:.0%} of the program's"
                 if s.program_cpu_s >= 0.001 else "")
        probe += (f"; CPU: the program {s.program_cpu_s:.2f} s, heapsight's library in it "
                  f"{s.library_cpu_s * 1000:.0f} ms more{share}")
    c.print()
    # the command as it would be typed, on one line (the whole of it is in --json and the record)
    c.print(Text(fmt.clip(f"heapsight: {fmt.shell_join(s.command)}", c.width), style="bold"),
            soft_wrap=True)
    # (a process followed among the command's is not heapsight's child: its own exit status
    # is not known, the command's is)
    line = (f"pid {s.pid} {how} after {s.duration_s:.2f} s" if s.pid == s.started_pid else
            f"pid {s.pid} ended after {s.duration_s:.2f} s (the command {how})")
    _indent(c, f"{line}{probe}; {alloc}; {s.samples} samples at {s.sample_hz:g} Hz", 2)
    if (s.preload != "active" or s.forks or s.other_processes or s.pid != s.started_pid
            or s.children or len(s.images) > 1):
        _indent(c, f"note: {s.preload_note}", 2, style="dim")
    if s.heap is not None and s.heap.version_note:
        _indent(c, f"note: {s.heap.version_note}", 2, style="dim")


def _run_verdict(c: Console, s: Summary) -> None:
    # the answer first: the verdict, and the first thing to try; the figures follow
    c.print()
    _verdict(c, s)
    if s.findings and s.findings[0].suggestions:
        _command(c, s.findings[0].suggestions[0], 4)
    _verified_lines(c, s)


def _verified_lines(c: Console, s: Summary) -> None:
    """run --verify's measurements: each setting's RSS at the verdict's moment, against the
    run without a setting."""
    if not s.verified:
        return
    base = s.verified[0]
    title = moments.TITLE.get(base["moment"], base["moment"])
    head = (f"measured on this program (--verify, one run each, {title} RSS"
            + (f"; without a setting {human(base['rss_bytes'])} in {base['wall_s']:.2f} s):"
               if not base.get("error") else f"; the run without a setting: {base['error']}):"))
    c.print()
    _indent(c, head, 2)
    if not any(r.get("change", 0) <= -0.10 for r in s.verified[1:]):
        _indent(c, "no setting lowered it by a tenth here: no allocator setting is the "
                   "answer for this program; the other suggestions come first", 4, style="bold")
    for r in sorted(s.verified[1:], key=lambda r: r.get("change", math.inf)):
        c.print(Text("    " + printable(r["setting"])), soft_wrap=True)
        if r.get("error") or "change" not in r:
            _indent(c, f"not measured: {r.get('error') or 'the run without a setting failed'}", 8)
        else:
            _indent(c, remedies.effect(r, base["moment"]), 8,
                    style="green" if r["change"] <= -0.10 else "dim")


def _untouched_shown(b) -> bool:
    """Whether a column's live blocks never touched get their own row: when they are a
    material part of RSS (a MiB and 1%) or of the live bytes (a tenth: gcc's 85 KiB of its
    172 KiB live; without the row its live figure read half the peak's below). Below 64 KiB
    it may be the skew between a /proc read and a counters read."""
    if not b or b.untouched_bytes < 64 * 1024:
        return False
    return b.untouched_bytes >= min(max(MiB, b.rss_bytes / 100),
                                    0.1 * (b.live_bytes + b.untouched_bytes))


def _columns(s: Summary) -> list:
    """(header, Breakdown) for each named moment (moments.py), one column for moments read
    at the same sample; runs saved before moments had names: peak live and exit."""
    if not s.moments:
        peak_t = f"at peak {'live' if s.heap else 'RSS'}" + (f"\n{s.peak.at_s:.2f} s" if s.peak else "")
        return [(peak_t, s.peak), ("at exit", s.final)]
    cols = []
    for m in s.moments:
        name = moments.TITLE[m.name] + ("*" if m.name == s.moment else "")
        when = (f"{m.start_s:.2f}-{m.end_s:.2f} s" if m.name == "held" and m.end_s > m.start_s
                else f"{m.at_s:.2f} s")
        if cols and cols[-1][1] == m.breakdown:
            cols[-1] = (cols[-1][0].replace("\n", f", {name}\n", 1), m.breakdown)
        else:
            cols.append((f"{name}\n{when}", m.breakdown))
    return cols


def _split_table(c: Console, s: Summary) -> None:
    """RSS and its parts at each named moment (anonymous and file-backed alone without
    the library), each part's share of RSS where the width allows; then the peak of RSS
    and heapsight's own pages."""
    cols = _columns(s)
    g = _moment_grid(s, cols, shares=True)
    if g.width() + 2 > c.width:
        g = _moment_grid(s, cols, shares=False)
    c.print()
    _draw(c, g, 2)
    if s.moment and s.moments:
        _indent(c, f"* the moment the verdict is about ({_moment_about(s)})", 2, style="dim")
    if s.preload == "active" and any(_untouched_shown(b) for _, b in cols):
        c.print("  (blocks allocated but never written: counted live, not in RSS, so not above)",
                style="dim")
    if s.preload != "active":
        c.print("  (/proc figures only: no split into live, waste and retained)", style="dim")
    if s.heap is not None and s.heap.metadata_figure:
        _indent(c, f"allocator metadata at exit: {s.heap.metadata_figure}, which it gives "
                   "at exit only (at the other moments, \"-\", it is in retained)", 2, style="dim")
    elif (s.heap is not None and not allocators.metadata_known(s.heap.allocator)
          and getattr(allocators.ALLOCATORS.get(s.heap.allocator), "metadata", None) is None):
        # 0 B would read as none: mimalloc 2.0 (and an allocator heapsight does not know)
        # gives no figure of its metadata
        _indent(c, f"allocator metadata: {s.heap.allocator} gives no figure of its own (\"-\"); "
                   "its metadata is counted in retained", 2, style="dim")
    kept = [(words, v) for words, v in (s.heap.kept_parts if s.heap else ()) if v]
    if kept:
        _indent(c, f"retained at exit, in {s.heap.allocator}'s words: " + ", ".join(
            f"{words} {human(v)}" for words, v in kept), 2, style="dim")
    c.print(f"  peak RSS: {human(s.peak_rss_bytes)} at {s.peak_rss_at_s:.2f} s")
    if s.heapsight_rss_bytes:
        _indent(c, f"heapsight's memory in the program (its stats segment and tables): "
                   f"{human(s.heapsight_rss_bytes)} at most, left out of every figure here", 2,
                style="dim")


class _Grid:
    """A table as the reporter's tables are made (rich's Table, no box, one space of
    padding a side and none at the edges, nothing wrapped), kept as its cells, so that one
    that fits the width is drawn line by line (_draw): rich's layout of the moment table
    was 10 ms of the summary's 16 here, drawing its lines takes a tenth of that. A cell is
    a string or a Text, and may hold more than one line; so may a header."""

    def __init__(self, show_header: bool = True):
        self.show_header = show_header
        self.heads, self.justify, self.styles, self.rows = [], [], [], []
        self.min_widths, self.max_widths = [], []

    def add_column(self, head: str, justify: str = "left", style: str = "", min_width: int = 0,
                   max_width: int | None = None) -> None:
        self.heads.append(head)
        self.justify.append(justify)
        self.styles.append(style)
        self.min_widths.append(min_width)
        self.max_widths.append(max_width)

    def add_row(self, *cells, style: str = "") -> None:
        self.rows.append((cells, style))

    def widths(self) -> list:
        w = list(self.min_widths)
        if self.show_header:
            w = [max([a] + [cell_len(x) for x in h.split("\n")]) for a, h in zip(w, self.heads)]
        for cells, _ in self.rows:
            w = [max([a] + [cell_len(x) for x in _lines(cell)]) for a, cell in zip(w, cells)]
        return w

    def width(self, widths: list | None = None) -> int:
        """Its width (of these column widths, else its own): the widest cell of each
        column, and two spaces between columns."""
        widths = self.widths() if widths is None else widths
        return sum(widths) + 2 * (len(widths) - 1)

    def fits(self, width: int) -> bool:
        """Whether it is drawn at its natural width: no column past its max_width, the whole
        within width (else rich shrinks, wraps or cuts it)."""
        widths = self.widths()
        return self.width(widths) <= width and all(
            m is None or w <= m for w, m in zip(widths, self.max_widths))

    def table(self) -> Table:
        t = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False,
                  show_header=self.show_header)
        for head, justify, style, lo, hi in zip(self.heads, self.justify, self.styles,
                                                self.min_widths, self.max_widths):
            t.add_column(head, justify=justify, no_wrap=True, style=style or None,
                         min_width=lo or None, max_width=hi, overflow="ellipsis")
        for cells, style in self.rows:
            t.add_row(*cells, style=style or None)
        return t


def _lines(cell) -> list:
    """A cell's lines, as strings (for their widths)."""
    return (cell.plain if isinstance(cell, Text) else cell).split("\n")


def _draw(c: Console, g: _Grid, indent: int) -> None:
    """The grid indented, as rich draws it when it fits the width (headers bold and at the
    bottom of their row, a row's cells at its top, each padded and styled by its column,
    then its row), without the trailing spaces (_print); rich's table where it does not
    fit."""
    if not g.fits(c.width - indent):
        _print(c, Padding(g.table(), (0, 0, 0, indent), expand=False))
        return
    widths, last, lines = g.widths(), len(g.heads) - 1, []

    def row(cells, styles, bottom=False):
        split = [x.split("\n") if isinstance(x, Text) else [Text(y) for y in x.split("\n")]
                 for x in cells]
        height = max(len(x) for x in split)
        for k in range(height):
            t = Text(" " * indent)
            for i, (parts, w, style) in enumerate(zip(split, widths, styles)):
                at = k - (height - len(parts)) if bottom else k
                x = parts[at] if 0 <= at < len(parts) else Text("")
                pad = " " * (w - x.cell_len)
                piece = Text(" " if i else "", style=style or "")
                piece.append(pad if g.justify[i] != "left" else "")
                piece.append_text(x)
                piece.append((pad if g.justify[i] == "left" else "") + (" " if i < last else ""))
                t.append_text(piece)
            lines.append(t)

    if g.show_header:
        row(g.heads, ["table.header"] * len(g.heads), bottom=True)
    for cells, style in g.rows:
        row(cells, [" ".join(x for x in (col, style) if x) for col in g.styles])
    out = Text("\n").join(lines)
    out.no_wrap, out.overflow = True, "ignore"
    _print(c, out)


def _moment_grid(s: Summary, cols: list, shares: bool) -> "_Grid":
    t = _Grid()
    t.add_column("")
    for head, _ in cols:
        t.add_column(head, justify="right")
        if shares:
            t.add_column("", justify="right", style="dim")

    # another allocator's metadata where it gives no figure (mimalloc; jemalloc and
    # tcmalloc but at exit) is in retained: "-", not "0 B", which would read as none
    unknown_metadata = s.heap is not None and not allocators.metadata_known(s.heap.allocator)

    def row(part, share=True):
        out = []
        for _, b in cols:
            v, p = _cells(b, part, share)
            if part == "metadata" and unknown_metadata and b is not None and not b.parts()[part]:
                v, p = "-", ""
            out += [v, p] if shares else [v]
        return out
    t.add_row("RSS", *row("rss_bytes", False), style="bold")
    if s.preload == "active":
        for label, part in ROWS:
            t.add_row("  " + label, *row(part))
        if any(b is not None and b.objects_bytes for _, b in cols):
            # (where its pools were read before and after the moment: "-" elsewhere)
            cells = []
            for _, b in cols:
                v = "-" if b is None or b.objects_bytes is None else human(b.objects_bytes)
                cells += [v, ""] if shares else [v]
            t.add_row("      of it CPython objects, at least", *cells, style="dim")
        if any(_untouched_shown(b) for _, b in cols):
            t.add_row("  allocated, never touched", *row("untouched_bytes", False), style="dim")
    else:
        for label, attr in (("  anonymous", None), ("  file-backed", "file_bytes")):
            cells = []
            for _, b in cols:
                v = 0 if b is None else (b.rss_bytes - b.file_bytes if attr is None else getattr(b, attr))
                cells += [human(v), ""] if shares else [human(v)]
            t.add_row(label, *cells)
    return t


def _moment_about(s: Summary) -> str:
    """How the verdict's moment was found, in words."""
    m = next((m for m in s.moments if m.name == s.moment), None)
    return f"{moments.TITLE[m.name]}: {m.how}" if m else s.moment


def _snapshot_lines(c: Console, s: Summary) -> None:
    for snap in s.snapshots:
        b = snap.breakdown
        p = b.parts()
        line = (f"snapshot [{printable(snap.label)}] at {snap.at_s:.2f} s: RSS {human(b.rss_bytes)}, live "
                f"{human(p['live'])}, retained {human(p['retained'])}, non-heap {human(p['non-heap'])}")
        if snap.release and "gave_back_bytes" in snap.release:
            line += f"; {snap.release['call']} gave back {human(snap.release['gave_back_bytes'])}"
        elif snap.release:
            line += f"; release not measured: {snap.release.get('error')}"
        _indent(c, line, 2)


# The reading of the mappings called the peak's only when it saw at least this share of peak
# RSS resident.
PEAK_READING_SHARE = 0.9


def _mapping_lines(c: Console, s: Summary) -> None:
    """Resident memory by kind of mapping, and what was mapped outside malloc, by whom."""
    peak_k, last_k = s.resident_by_kind_peak, s.resident_by_kind
    same = bool(peak_k) and bool(last_k) and peak_k.get("at_s") == last_k.get("at_s")
    # an allocator that maps its heaps with mmap (jemalloc, tcmalloc, mimalloc): those are
    # where the live and retained bytes above are, not memory beside malloc's; in the
    # mappings they are its heaps, not "other anonymous" (nor glibc's thread arenas)
    own = f"{s.heap.allocator}'s own heaps" if s.heap else None
    own_heaps = next((o for o in s.mapped_by if o["owner"] == own), None)
    for k, when, key in ((peak_k, "near peak RSS, at" if not same else "near peak RSS and last, at",
                          "resident_peak"), (None if same else last_k, "at", "resident")):
        if k:
            k = dict(k)
            names = [("heap", "[heap]"), ("arena", "thread arenas"), ("stack", "stacks"),
                     ("file", "file-backed"), ("shared", "shared"), ("anon", "other anonymous")]
            resident = sum(k.get(kind, 0) for kind, _ in names)
            if key == "resident_peak" and resident < PEAK_READING_SHARE * s.peak_rss_bytes:
                # the mappings are read on the sampler's Python ticks and at new highs of RSS:
                # a program that reached its peak and ended within one tick has no reading near
                # it, and this one is not to be taken for the peak's
                which = "last reading" if same else "reading nearest peak RSS"
                when = (f"at {k['at_s']:.2f} s, the {which} ({human(resident)} resident then, "
                        "before peak RSS)")
            else:
                when = f"{when} {k['at_s']:.2f} s"
            if own_heaps is not None and own_heaps.get(f"{key}_at_s") == k["at_s"]:
                held = min(k.get("anon", 0), own_heaps.get(f"{key}_bytes", 0))
                k["anon"] = k.get("anon", 0) - held
                k["own"] = held
                names.insert(-1, ("own", f"{s.heap.allocator}'s heaps"))
            _indent(c, f"by mapping {when}: " + ", ".join(
                f"{name} {human(k[kind])}" for kind, name in names if k.get(kind)), 2)
    big = [o for o in s.mapped_by if o["peak_bytes"] >= MiB]
    heaps = [o for o in big if o["owner"] == own]
    big = [o for o in big if o["owner"] != own]
    for o in heaps:
        _indent(c, f"{s.heap.allocator}'s heaps (its own mappings, which hold the live, waste "
                   f"and retained bytes above): " + analysis.owner_words(o).split(": ", 1)[1], 2)
    if big:
        _indent(c, "mapped outside malloc: " + "; ".join(analysis.owner_words(o)
                                                         for o in big[:3]), 2)
        peak_mapped = next((m for m in (s.mapped_sites or {}).get("moments", ())
                            if m["name"] == "peak mapped"), None)
        if peak_mapped and peak_mapped["sites"]:
            top = peak_mapped["sites"][:3]
            _indent(c, f"mapped for (at {peak_mapped['t_s']:.2f} s, every mapping recorded): "
                       + "; ".join(f"{x['site']} {human(x['bytes'])}" for x in top), 4)


def _hold_lines(c: Console, s: Summary) -> None:
    for h in s.holds:
        if h.cause == "retained":
            _indent(c, f"held beyond live bytes: {human(h.held_bytes)} from {h.start_s:.2f} s to "
                       f"{h.end_s:.2f} s (freed, kept by the allocator; up to "
                       f"{human(h.max_held_bytes)})", 2)
        else:
            _indent(c, f"outside malloc: {human(h.held_bytes)} from {h.start_s:.2f} s to "
                       f"{h.end_s:.2f} s beyond the live malloc bytes (up to "
                       f"{human(h.max_held_bytes)}; live objects or free space inside: not "
                       "known from outside)", 2)


def _release_lines(c: Console, s: Summary) -> None:
    """What the release at exit gave back (or why it was not measured), and reachability."""
    r = s.release
    c.print()
    if r.measured:
        if r.where == "copy" and r.counted_fast_chunks:
            _indent(c, f"release at exit: {r.call} would give back {human(r.gave_back_bytes)} "
                       f"(RSS {human(r.rss_before_bytes)} -> {human(r.rss_after_bytes)}; "
                       f"{analysis.COUNTED_IN_THE_COPY}: running it would first merge the "
                       f"{r.counted_fast_chunks:,} chunks of its fastbins)", 2)
        elif r.where == "copy":
            _indent(c, f"release at exit: {r.call} would give back {human(r.gave_back_bytes)} "
                       f"in {r.seconds * 1000:.1f} ms (RSS {human(r.rss_before_bytes)} -> "
                       f"{human(r.rss_after_bytes)}; {analysis.IN_THE_COPY})", 2)
        else:
            _indent(c, f"release at exit: {r.call} gave back {human(r.gave_back_bytes)} in "
                       f"{r.seconds * 1000:.1f} ms (RSS {human(r.rss_before_bytes)} -> "
                       f"{human(r.rss_after_bytes)})", 2)
    else:
        _indent(c, f"release at exit: not measured: {r.why_not}", 2)
    snaps = [(x.label, x.at_s) for x in s.snapshots]
    for m in s.heapmaps:
        line = heapmap.reach_line(m.get("reach"))
        if line:
            _indent(c, f"reachable {heapmap.moment_words(m, snaps)}: {line}", 2)


def _heap_lines(c: Console, s: Summary) -> None:
    """The library's heap figures, the call sites and the pinners."""
    if s.heap:
        h = s.heap
        tail = f"; {h.arenas:,} arena(s); {h.threads_seen:,} thread(s)" if h.allocator == "glibc" \
            else f"; {h.threads_seen:,} thread(s)"
        _indent(c, f"heap: {h.n_alloc:,} allocations, {h.n_free:,} frees, {h.live_blocks:,} blocks "
                   f"live at exit; peak live {human(h.peak_live_requested_bytes)} requested "
                   f"({human(h.peak_live_usable_bytes)} usable) at {h.peak_at_s:.2f} s{tail}", 2)
    if s.sites:
        _sites(c, s.sites)
    for m in s.heapmaps:
        _pinners(c, m, sampled=s.sites is not None)


def _finding_lines(c: Console, s: Summary) -> None:
    if s.findings:
        c.print()
        c.print(Text("  why, and what to try:", style="bold"))
    for f in s.findings:
        c.print()
        # the title wrapped under its first word, as the detail below it (rich's own wrap
        # put a long title's last words at the margin)
        title = textwrap.wrap(f.title, max(20, c.width - 4), break_on_hyphens=False) or [""]
        c.print(Text("  * " + title[0], style="bold"), no_wrap=True, overflow="ignore")
        for more in title[1:]:
            c.print(Text("    " + more, style="bold"), no_wrap=True, overflow="ignore")
        _indent(c, f.detail, 4)
        for sug in f.suggestions:
            _command(c, sug, 6)


def _verdict(c: Console, s: Summary) -> None:
    style = VERDICT_STYLE.get(s.findings[0].kind, "bold") if s.findings else "bold green"
    _verdict_lines(c, s.verdict, style)


def _verdict_lines(c: Console, verdict: str, style: str) -> None:
    """VERDICT and its words, wrapped to the width under their first line's."""
    words = textwrap.wrap(verdict, max(20, c.width - 11)) or [""]
    c.print(Text.assemble("  VERDICT  ", (words[0], style)), no_wrap=True, overflow="ignore")
    for more in words[1:]:
        c.print(Text(" " * 11 + more, style=style), no_wrap=True, overflow="ignore")


TOP_SITES = 5


RUN_SITES = (("peak", "at peak live"), ("never freed", "of the bytes never freed"))
# attach --track: the blocks allocated since the attach and still live at its end
GREW_SITES = (("grew", "that grew: allocated since the attach, still live"),)


def _sites(c: Console, sites: dict, moments: tuple = RUN_SITES) -> None:
    """The top call sites at each of moments ((name, title)): estimated bytes with their
    95% interval, the share of the moment's estimate, the site; and what the estimate
    rests on."""
    low = sites.get("sample_bytes_min", sites["sample_bytes"])
    high = sites.get("sample_bytes_max", sites["sample_bytes"])
    mean = human(high).replace(".0 ", " ")
    if low < high:   # adaptive: it coarsens with the sampled blocks still live
        mean = f"{human(low).replace('.0 ', ' ')} at first, coarsening to {mean},"
    for name, title in moments:
        m = next((x for x in sites["moments"] if x["name"] == name), None)
        if m is None or not m["sites"]:
            continue
        c.print()
        _indent(c, f"call sites {title} ({human(m['live_bytes'])} usable at {m['t_s']:.2f} s; "
                   f"top {min(TOP_SITES, len(m['sites']))} of {len(m['sites'])}):"
                if name == "peak" else
                f"call sites {title} ({human(m['live_bytes'])} usable; top "
                f"{min(TOP_SITES, len(m['sites']))} of {len(m['sites'])}):", 2)
        t = _Grid(show_header=False)
        top = m["sites"][:TOP_SITES]
        # the figures whole, the site in what is left of the line
        widths = [max(len(f(x)) for x in top) for f in (
            lambda x: human(x["bytes"]), lambda x: f"\u00b1{human(x['error_bytes'])}",
            lambda x: fmt.share(x["share"]))]
        t.add_column("bytes", justify="right", min_width=widths[0])
        t.add_column("error", justify="right", style="dim", min_width=widths[1])
        t.add_column("share", justify="right", min_width=widths[2])
        t.add_column("site", max_width=max(20, c.width - 4 - sum(widths) - 10))
        for x in top:
            t.add_row(human(x["bytes"]), f"\u00b1{human(x['error_bytes'])}", fmt.share(x["share"]),
                      site_text(x["site"]))
        _draw(c, t, 4)
        _indent(c, f"estimated from {m['samples']:,} sampled blocks live then, "
                   f"{human(m['estimated_bytes'])} in all (usable bytes; one sample per {mean} "
                   "allocated on average; \u00b1 is a 95% interval)", 4, style="dim")
    if sites.get("note"):
        _indent(c, f"note: {printable(sites['note'])}", 4, style="dim")
    if sites.get("dropped"):
        _indent(c, f"note: {sites['dropped']:,} samples were not recorded (the profile was "
                   "full): the estimates miss them", 4, style="dim")


def site_text(name: str) -> Text:
    """A call site on one line, or two when it is in the runtime: the program's own frame,
    then the runtime's it called ("← std::basic_string::_M_construct (libstdc++.so.6)",
    dimmed). A name, not markup ([unknown], C++ templates)."""
    own, via, lib = name.partition(CALLED_VIA)
    out = Text(own)
    if via:
        out.append("\n" + via.strip() + " " + lib, style="dim")
    return out


TOP_PINNERS = 3


def _pinners(c: Console, m: dict, sampled: bool) -> None:
    """A heap map's pinners: the call sites whose live blocks keep the most otherwise-free
    pages resident, which a release cannot return."""
    pins = [p for p in m.get("pinners") or () if p["pinned_bytes"] >= 64 * 1024]
    pinned = sum(a.get("pinned_pages", 0) for a in m["arenas"]) * m.get("page_bytes", 4096)
    if not pins and pinned < MiB:
        return
    c.print()
    where = "at exit" if m["moment"] == "exit" else f"at {m['moment']}"
    text = (f"pinned {where}: {human(pinned)} of heap pages hold only a few live bytes each, "
            "which a release cannot return; ")
    if not pins:   # small blocks pin, and few of them were sampled
        _indent(c, text + ("too few of their blocks were sampled to name them (a smaller "
                           "--sample-bytes, e.g. 4K, would)" if sampled else
                           "sampling was off, which would name their blocks"), 2)
        return
    _indent(c, text + "the blocks that keep them:", 2)
    t = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False, show_header=False)
    t.add_column("bytes", justify="right", no_wrap=True)
    t.add_column("error", justify="right", no_wrap=True, style="dim")
    t.add_column("blocks", justify="right", no_wrap=True)
    t.add_column("site", overflow="fold")
    for p in pins[:TOP_PINNERS]:
        t.add_row(human(p["pinned_bytes"]), f"\u00b1{human(p['error_bytes'])}",
                  f"{p['blocks']:,} blocks of {human(p['block_bytes'])}", Text(p.get("site", "")))
    _print(c, Padding(t, (0, 0, 0, 4), expand=False))


_TRAILING = re.compile(r" +((?:\x1b\[[0-9;]*m)*)$")


def _print(c: Console, renderable) -> None:
    """A table without the spaces rich pads its last cells with."""
    with c.capture() as cap:
        c.print(renderable)
    c.file.write("".join(_TRAILING.sub(r"\1", line) + "\n" for line in cap.get().splitlines()))


def _indent(c: Console, text: str, n: int, style: str | None = None) -> None:
    """Prose wrapped to the width and indented by n."""
    for line in textwrap.wrap(text, max(20, c.width - n), break_on_hyphens=False) or [""]:
        c.print(Text(" " * n + line, style=style or ""), no_wrap=True, overflow="ignore")


def _command(c: Console, text: str, n: int, prefix: str = "try: ") -> None:
    """A command to copy: one line whatever its length (the terminal wraps it, not us); its
    note ("   # ...") beside it when both fit, else on the lines below, wrapped."""
    cmd, sep, note = text.partition("   # ")
    lead = Text(" " * n + prefix, style="dim") + Text(cmd, style="cyan")
    if not sep or n + len(prefix) + len(text) <= c.width:
        if sep:
            lead.append("   # " + note, style="dim")
        c.print(lead, soft_wrap=True)
        return
    c.print(lead, soft_wrap=True)
    indent = " " * (n + len(prefix))
    for line in textwrap.wrap(note, max(20, c.width - len(indent) - 2)):
        c.print(Text(f"{indent}# {line}", style="dim"), soft_wrap=True)




def _delta(key: str, st: dict, base: dict | None, stacked: bool = False) -> Text:
    """A median and its change against glibc's, coloured better (green) or worse (red)
    when the repeats' ranges do not overlap; a change inside the noise is shown as "~"
    (about the same); stacked: the change on a line of its own (for a narrow terminal)."""
    cell = Text(fmt.metric(key, st["median"], short=True))
    c = ranking.change(key, st, base)
    if c is None:
        return cell
    style = ""
    if c != "~" and key in LOWER_IS_BETTER and abs(c) >= 0.05:
        style = "green" if c < 0 else "red"
    cell.append(("\n" if stacked else " ") + ranking.change_text(c), style=style or "dim")
    return cell


def _compare_table(rows, base, metrics, repeat, spread, stacked) -> tuple:
    t = Table(box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False, show_edge=False)
    t.add_column("configuration", no_wrap=True, overflow="fold")
    for _, head in metrics:
        t.add_column(head, justify="right", no_wrap=True)
    errors = []
    for r in rows:
        if not r["ok"]:
            t.add_row(Text(r["name"], style="red"), Text("failed (below)", style="red"),
                      *[""] * (len(metrics) - 1))
            errors.append(r)
            continue
        cells = []
        for key, _ in metrics:
            st = r["stats"].get(key)
            if st is None:
                cells.append(Text("-"))
                continue
            b = base["stats"].get(key) if base is not None and r is not base else None
            cell = _delta(key, st, b, stacked)
            if spread and repeat > 1:   # half the min-max range, against the median
                half = (st["max"] - st["min"]) / 2
                cell.append(f"\n\u00b1{100 * half / st['median']:.0f}%" if st["median"] else
                            f"\n\u00b1{fmt.metric(key, half, True)}", style="dim")
            cells.append(cell)
        t.add_row(r["name"], *cells)
    return t, errors


def render_compare(doc: dict, out, spread: bool = False) -> None:
    """compare's table: one row per configuration, medians against glibc's defaults; with
    spread, each cell's min-max below it, dimmed."""
    c = console(out)
    rows, repeat = doc["configs"], doc["repeat"]
    base = baseline(rows)
    rank = doc.get("rank_by") or "exit"    # a comparison saved before moments: at exit
    dropped = []
    ranked = ranking.RANK_KEY[rank]
    # peak RSS, the moment ranked by, what stayed at exit and the cost; minor faults only
    # where there is room: the rest fits in 100 columns
    have = {k for r in rows if r["ok"] for k in r.get("stats", {})}
    metrics = [(k, h + ("*" if k == ranked else "")) for k, h in METRICS
               if k in have and (k == ranked or k not in ("held_rss", "end_rss", "final_rss"))
               and (k != "minor_faults" or c.width >= 120)]
    c.print()
    _indent(c, f"ranked by* {ranking.RANK_WORDS[rank]}: "
               f"{doc.get('rank_why') or 'a comparison saved before moments had names'}", 0)
    # the changes go under the figures when the rows would not fit on one line
    def width(t):
        return Measurement.get(c, c.options.update(max_width=10_000), t).maximum
    t, errors = _compare_table(rows, base, metrics, repeat, spread, stacked=False)
    if width(t) > c.width:
        t, errors = _compare_table(rows, base, metrics, repeat, spread, stacked=True)
    # still too wide (a long configuration name): what stayed at exit gives way first,
    # never the names, the moment ranked by or the time
    for drop in ("given_back", "retained", "cpu_s"):
        if width(t) <= c.width:
            break
        metrics = [m for m in metrics if m[0] != drop]
        t, errors = _compare_table(rows, base, metrics, repeat, spread, stacked=True)
        dropped.append(drop)
    _print(c, t)
    for r in errors:
        _indent(c, f"{r['name']}: {r['error']}", 2, style="red")
    what = f"medians of {repeat} run(s)" + (", \u00b1 half their min-max range below each"
                                            if spread and repeat > 1 else
                                            (" (--spread shows min-max)" if repeat > 1 else ""))
    _indent(c, f"{what}; changes against glibc's defaults, green better, red worse "
               "(5% or more), ~ within the spread of the repeats (their min-max ranges "
               "overlap: no difference shown)"
               + ("; 'given back' is what the release at exit returned"
                  if "given_back" not in dropped else "")
               + (f"; left out for the width (--json and --csv have them): "
                  f"{', '.join(dict(METRICS)[k] for k in dropped)}" if dropped else ""),
            0, style="dim")
    by = {m.get("held_by") for r in rows if r.get("ok") for m in r.get("runs", ())}
    if "held_rss" in dict(metrics) and by & {"stretch", "peak"}:
        stretch = ("held RSS: each run's median RSS over the stretch where glibc's first run "
                   "held memory, taken by share of the run")
        peak = ("held RSS of a run that held nothing (no held moment: its RSS stayed near its "
                "live bytes): its peak (glibc's runs held nothing either)")
        _indent(c, stretch if "stretch" in by else peak, 0, style="dim")
    c.print()
    text, _, how = doc["recommendation"].partition("; run it with: ")
    text, _, lowest = text.partition("; lowest memory: ")
    _indent(c, f"recommendation: {text}", 0, style="bold")
    if how:
        _command(c, how, 2)
    if lowest:
        low, _, low_how = lowest.rpartition(" (")
        _indent(c, f"lowest memory: {low}", 0, style="bold")
        _command(c, low_how.removesuffix(")"), 2)


# A lab table on the terminal: a grid of columns LAB_GAP apart, LAB_INDENT from the left;
# headers and the first column's labels wrap at spaces, figures never break.
LAB_INDENT, LAB_GAP = 2, 2
# Units a column's cells may share, moved into its header (into the title when every figure
# column has the same one): "0" under "glibc (KiB)", not "0 KiB" in every cell.
LAB_UNITS = ("KiB", "MiB", "GiB", "MB", "B", "s", "%")
_FIGURE = re.compile(r"[-+]?[0-9][0-9,]*(\.[0-9]+)?")
_NO_VALUE = {"", "-", "n/a", "error"}
# A table of at most this many rows may be transposed: its row labels become the headers.
LAB_TRANSPOSE_ROWS = 12


def _lab_unit(cells: list) -> str | None:
    """The unit every figure of a column ends with ("1,024 KiB", "12.5%"), or None."""
    unit = None
    for v in cells:
        if v in _NO_VALUE:
            continue
        for u in LAB_UNITS:
            num = v[:-len(u)].rstrip() if v.endswith(u) else None
            if num is not None and _FIGURE.fullmatch(num) and (u != "%" or num == v[:-1]):
                break
        else:
            return None
        if unit not in (None, u):
            return None
        unit = u
    return unit


def _lab_strip_units(title: str, cols: list, rows: list) -> tuple | None:
    """The table with each column's shared unit moved out of its cells: into the title when
    every figure column has the same one ("(KiB)"), else into the column's header."""
    units = {j: _lab_unit([r[j] for r in rows if j < len(r)]) for j in range(1, len(cols))}
    units = {j: u for j, u in units.items() if u}
    if not units:
        return None

    def bare(v: str, u: str) -> str:
        return v if v in _NO_VALUE else v[:-len(u)].rstrip()
    rows = [[bare(v, units[j]) if j in units else v for j, v in enumerate(r)] for r in rows]
    if len(set(units.values())) == 1 and len(units) == len(cols) - 1:
        return f"{title} ({next(iter(units.values()))})", cols, rows
    cols = [f"{h} ({units[j]})" if j in units else h for j, h in enumerate(cols)]
    return title, cols, rows


def _lab_transpose(cols: list, rows: list) -> tuple:
    """Columns as rows: the first column's labels become the headers."""
    return ([cols[0]] + [r[0] for r in rows],
            [[cols[j]] + [r[j] if j < len(r) else "" for r in rows] for j in range(1, len(cols))])


def _lab_wrap_cell(s: str, k: int) -> list:
    """A header, a label or a text cell wrapped to k: at spaces and after hyphens, never
    inside a word."""
    return textwrap.wrap(s, max(1, k), break_long_words=False) or [""]


def _lab_text(col: list) -> bool:
    """Whether a column holds words, which may wrap: a cell of two words or more that starts
    with a letter ("array of 32-byte strings", an error), not figures ("47.6 (gave back)")."""
    return any(v[:1].isalpha() and len(v.split()) > 1 for v in col if v not in _NO_VALUE)


def _lab_grid(cols: list, rows: list, width: int) -> list | None:
    """A table as plain lines (header lines, a rule, the rows) no wider than width, or None
    when it cannot be: headers, the first column's labels and prose columns wrap at spaces;
    figures never break."""
    n = len(cols)
    cells = [[str(v) for v in r] + [""] * (n - len(r)) for r in rows]
    text = [j == 0 or _lab_text([r[j] for r in cells]) for j in range(n)]

    def least_of(s: str) -> int:   # the widest piece s can be wrapped into
        return max(len(x) for x in _lab_wrap_cell(s, 1))
    natural, least = [], []
    for j in range(n):
        col = [r[j] for r in cells]
        natural.append(max([len(cols[j])] + [len(v) for v in col]))
        body = [least_of(v) for v in col] if text[j] else [len(v) for v in col]
        least.append(max([least_of(cols[j])] + body))
    room = width - LAB_INDENT - LAB_GAP * (n - 1)
    if sum(least) > room:
        return None
    wrapped = {}

    def lines_of(j: int, k: int) -> list:   # column j at width k: its header's lines, then
        if (j, k) not in wrapped:            # each cell's (1 for a figure)
            wrapped[j, k] = [len(_lab_wrap_cell(cols[j], k))] + [
                len(_lab_wrap_cell(r[j], k)) if text[j] else 1 for r in cells]
        return wrapped[j, k]

    def height(widths: list) -> int:   # the table's lines: its header's and its rows'
        per = [lines_of(j, k) for j, k in enumerate(widths)]
        return sum(max(col[i] for col in per) for i in range(len(cells) + 1))
    w = list(natural)
    if sum(w) > room:
        # for each height of the header: the figure columns as narrow as their headers then
        # allow, the room left to the columns of words, a character at a time where it
        # saves the most lines; the layout with the fewest lines in all
        best = None
        for h in range(1, max(len(_lab_wrap_cell(c, 1)) for c in cols) + 1):
            ws = [next((k for k in range(least[j], natural[j] + 1) if lines_of(j, k)[0] <= h),
                       natural[j]) if not text[j] else least[j] for j in range(n)]
            if sum(ws) > room:
                continue
            while sum(ws) < room:
                grow = [j for j in range(n) if text[j] and ws[j] < natural[j]]
                if not grow:
                    break
                j = min(grow, key=lambda i: (height(ws[:i] + [ws[i] + 1] + ws[i + 1:]), i == 0))
                ws[j] += 1
            if best is None or height(ws) < height(best):
                best = ws
        w = best or least
    pad, gap = " " * LAB_INDENT, " " * LAB_GAP

    def lines(parts: list, bottom: bool) -> list:
        """One row's cells, each a list of lines, side by side; bottom: short cells sit on
        the last line (headers over their figures), else on the first."""
        height = max(len(p) for p in parts)
        out = []
        for i in range(height):
            line = []
            for j, p in enumerate(parts):
                k = i - (height - len(p)) if bottom else i
                s = p[k] if 0 <= k < len(p) else ""
                line.append(s.ljust(w[j]) if text[j] else s.rjust(w[j]))
            out.append((pad + gap.join(line)).rstrip())
        return out
    out = lines([_lab_wrap_cell(h, w[j]) for j, h in enumerate(cols)], bottom=True)
    out.append(pad + "-" * (sum(w) + LAB_GAP * (n - 1)))   # ASCII: one byte a column
    for r in cells:
        out += lines([_lab_wrap_cell(v, w[j]) if text[j] else [v] for j, v in enumerate(r)],
                     bottom=False)
    return out


def _lab_split(cols: list, rows: list, width: int) -> list | None:
    """A table too wide as a whole as several grids one under the other, each the label
    column and some of the others (a row with no figure in a grid left out of it): as few
    grids as fit, their columns shared out evenly; None when one column alone does not fit."""
    def grid(j: int, k: int) -> list | None:   # the label column and columns j..k-1
        part = [[r[0]] + r[j:k] for r in rows]
        part = [r for r in part if any(v not in _NO_VALUE for v in r[1:])] or part
        return _lab_grid([cols[0]] + cols[j:k], part, width)
    bounds, j = [], 1
    while j < len(cols):   # as many columns in each as fit, in turn
        k = j + 1
        if grid(j, k) is None:
            return None
        while k < len(cols) and grid(j, k + 1) is not None:
            k += 1
        bounds.append((j, k))
        j = k
    m, p = len(cols) - 1, len(bounds)   # then the same number of grids, evened out
    even = [(1 + i * m // p, 1 + (i + 1) * m // p) for i in range(p)]
    grids = [grid(j, k) for j, k in even]
    if None in grids:
        grids = [grid(j, k) for j, k in bounds]
    return grids


def lab_table_lines(t: dict, width: int) -> tuple:
    """A lab table fitted to width: (title, [grid, ...], how). A unit every figure of a
    column shares moves out of its cells (into the title when the whole table shares it);
    then the first that fits: the table as it is; transposed, configurations as rows (a
    table of at most LAB_TRANSPOSE_ROWS rows); split into narrower grids that each repeat
    the label column. how names it. Only when not even one figure column fits beside the
    labels is it stacked (how "stacked", no grid)."""
    title = str(t["title"])
    cols = [str(x) for x in t["columns"]]
    rows = [[fmt.cell(v) for v in r] for r in t["rows"]]
    how = "as is"
    stripped = _lab_strip_units(title, cols, rows)
    if stripped:
        (title, cols, rows), how = stripped, "units"
    grid = _lab_grid(cols, rows, width)
    if grid is not None:
        return title, [grid], how
    few = len(rows) <= LAB_TRANSPOSE_ROWS
    tcols, trows = _lab_transpose(cols, rows)
    grid = _lab_grid(tcols, trows, width) if few else None
    if grid is not None:
        return title, [grid], "transposed"
    splits = [s for s in (_lab_split(cols, rows, width),
                          _lab_split(tcols, trows, width) if few else None) if s]
    if splits:
        return title, min(splits, key=lambda s: sum(len(g) for g in s)), "split"
    return title, [], "stacked"


def _first_sentence(text: str) -> str:
    """text's first sentence (up to its first '. ' or ': ' that ends a clause), whole when
    it has one only."""
    text = " ".join(text.split())
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


def lab_table(c: Console, t: dict, rows_note: str = "", brief: bool = False) -> None:
    """A lab table under its title, fitted to the terminal's width (lab_table_lines); its
    note is wrapped prose (brief: its first sentence only, the rest is in --verbose and
    the page)."""
    title, grids, how = lab_table_lines(t, c.width)
    for line in textwrap.wrap(title, c.width, break_on_hyphens=False):
        c.print(Text(line, style="bold"), no_wrap=True, overflow="ignore")
    for i, grid in enumerate(grids):
        if i:
            c.print()
        rule = next(k for k, line in enumerate(grid) if set(line.strip()) == {"-"})
        for k, line in enumerate(grid):   # the header lines bold
            c.print(Text(line, style="bold" if k < rule else ""), no_wrap=True, overflow="ignore")
    if how == "stacked":   # not one figure beside its label fits: "column: value" lines
        cols = [str(x) for x in t["columns"]]
        for row in t["rows"]:
            _indent(c, fmt.cell(row[0]) if row else "", 2, style="bold")
            for name, v in zip(cols[1:], row[1:]):
                _indent(c, f"{name}: {fmt.cell(v)}", 4)
    note = t.get("note") or ""
    note = " ".join(x for x in (_first_sentence(note) if brief else note, rows_note) if x)
    for part in note.split("\n"):
        if part.strip():
            _indent(c, part.strip(), 2, style="dim")


def render_table(t: dict, width: int = 100) -> str:
    """A lab table as plain text (for tests and logs)."""
    import io
    buf = io.StringIO()
    c = Console(file=buf, width=width, no_color=True, highlight=False)
    lab_table(c, t)
    return buf.getvalue().rstrip("\n")


VERDICT_WORD = {"holds": "green", "fails": "red", "depends": "yellow"}


def _lab_brief(t: dict) -> tuple:
    """What the terminal shows of a table without --verbose: (the table with the rows it
    keeps, a note saying how many were left out), or (None, "") for a detail table."""
    if t.get("detail"):
        return None, ""
    keep = t.get("brief_rows")
    if keep is None or len(keep) >= len(t["rows"]):
        return t, ""
    shown = dict(t, rows=[t["rows"][i] for i in keep if i < len(t["rows"])])
    return shown, f"({len(shown['rows'])} of {len(t['rows'])} rows)"


def _lab_wrap(c: Console, text: str, first: int, rest: int, style: str = "") -> None:
    """Prose wrapped to the width, the first line indented by first, the others by rest."""
    lines = textwrap.wrap(text, max(20, c.width), initial_indent=" " * first,
                          subsequent_indent=" " * rest, break_on_hyphens=False)
    for line in lines:
        c.print(Text(line, style=style), no_wrap=True, overflow="ignore")


# Without --verbose an experiment takes at most a screen: its claims, each with its verdict
# and the figure that decides it, and its key table when it fits beside them.
LAB_SCREEN_LINES = 39


def _lines_of(c: Console, draw) -> list:
    """What draw(console) prints at c's width, as plain lines (to measure it first)."""
    import io
    buf = io.StringIO()
    draw(Console(file=buf, width=c.width, no_color=True, highlight=False, soft_wrap=False,
                 emoji=False))
    return buf.getvalue().splitlines()


def _lab_claims(c: Console, result: dict, verbose: bool) -> None:
    c.print("claims:")
    for cl in result["claims"]:
        verdict = cl["verdict"].upper()
        if cl["verdict"] == "depends" and cl.get("depends_on"):
            verdict += f" on {cl['depends_on']}"
        head = textwrap.wrap(f"[{verdict}] \"{cl['text']}\"", max(20, c.width - 2),
                             subsequent_indent="  ", break_on_hyphens=False)
        for i, line in enumerate(head):
            text = Text("  ")
            if i == 0:   # the verdict in its colour, the rest plain
                end = line.index("]") + 1 if "]" in line else len(line)
                text.append(line[:end], style=VERDICT_WORD.get(cl["verdict"], ""))
                text.append(line[end:])
            else:
                text.append(line)
            c.print(text, no_wrap=True, overflow="ignore")
        brief = cl.get("figure") if not verbose else ""
        _lab_wrap(c, brief or cl["evidence"], 6, 6, style="dim")


def render_lab(result: dict, out, verbose: bool = False) -> None:
    """One experiment's tables and claims, as lab prints them after it ran: each claim with
    its verdict and the figure that decides it, and, within a screen (LAB_SCREEN_LINES),
    its key table (the first that is not a detail: its key rows, its note's first
    sentence); with verbose every table whole and each claim's whole evidence (the page
    always has both)."""
    c = console(out)
    c.print()
    _lab_wrap(c, f"== {result['name']}: {result['title']} ==", 0, 3, style="bold")
    _lab_wrap(c, f"after \"{result['source']}\" ({result['duration_s']:.1f} s)", 3, 4,
              style="dim")
    tables = [(t, *((t, "") if verbose else _lab_brief(t))) for t in result["tables"]]
    tables = [(t, shown, note) for t, shown, note in tables if shown is not None]
    named = []
    if not verbose and tables:
        # the screen: the heading (3 lines, with the blank before it), the claims and the
        # blank before them; the key table with its blank and the line naming the others
        room = LAB_SCREEN_LINES - 4 - len(_lines_of(c, lambda k: _lab_claims(k, result, False)))
        _, shown, note = tables[0]
        fits = len(_lines_of(c, lambda k: lab_table(k, shown, note, True))) <= room - 3
        named = [t for t, _, _ in tables[1 if fits else 0:]]
        tables = tables[:1] if fits else []
    for _, shown, note in tables:
        c.print()
        lab_table(c, shown, note, brief=not verbose)
    if named:
        c.print()
        _lab_wrap(c, "tables (--verbose, the page): " + "; ".join(str(t["title"]) for t in named),
                  2, 4, style="dim")
    c.print()
    _lab_claims(c, result, verbose)


def _render_track(c, k: dict) -> None:
    """attach --track: what was allocated while heapsight followed the process, the sites
    of what of it is still live, and what loading and unloading cost the process."""
    n = k["counters"]
    c.print()
    unload = ("the process ended or ran another program with it loaded" if k.get("ended") else
              f"{k['unload_pause_ms']:.1f} ms to unload it"
              + ("" if k["unloaded"] else "; it stays loaded, inert"))
    _indent(c, f"followed for {k['seconds']:.1f} s (heapsight's library loaded into the process: "
               f"one thread stopped {k['load_pause_ms']:.1f} ms to load it, {unload}):", 2)
    _indent(c, f"{n['allocations']:,} allocations ({human(n['allocated_bytes'])}), "
               f"{n['frees']:,} frees of them; still live: {human(n['live_bytes'])} in "
               f"{n['live_blocks']:,} blocks", 4)
    if k.get("sites"):
        _sites(c, k["sites"], GREW_SITES)
    else:
        _indent(c, "no allocation was sampled: nothing grew enough to name a site", 4, style="dim")
    if k.get("note"):
        _indent(c, f"note: {k['note']}", 4, style="dim")


def _render_leaks(c, k: dict) -> None:
    """attach --leaks: the reach classes marked in a copy, what the copy cost the process,
    the lost blocks by size and the largest with their first bytes."""
    r = k["reach"]
    c.print()
    _indent(c, f"reachable now (a copy of the process, marked as memcheck does; the process "
               f"stopped {k['pause_ms']:.1f} ms, {k['threads']} thread"
               f"{'s' * (k['threads'] != 1)}, and {k['reap_pause_ms']:.1f} ms to reap the copy):", 2)
    _indent(c, heapmap.reach_line(r).replace("of the program", "of the process"), 4)
    if k["lost_by_size"]:
        _indent(c, "definitely lost by size: " + ", ".join(
            f"{x['blocks']:,} x {human(x['bytes'])}" for x in k["lost_by_size"][:4])
            + (f", and {len(k['lost_by_size']) - 4} more sizes" if len(k["lost_by_size"]) > 4 else ""), 4)
    for x in ((k.get("lost_sites") or {}).get("sites") or [])[:3]:
        _indent(c, f"lost from {x['site']}: {human(x['bytes'])} ±{human(x['error_bytes'])} "
                   f"({fmt.share(x['share'])} of the lost blocks --track sampled)", 4)
    for b in k["largest_lost"][:3]:
        _indent(c, f"lost at {b['addr']}: {human(b['bytes'])}, starts {printable(b['starts'])}", 4,
                style="dim")
    _indent(c, f"a release (malloc_trim) would give back {human(k['release_measured_bytes'])}: "
               "measured in the copy", 4)


def render_attach(a, out) -> None:
    """attach's summary: the split of a running process's RSS, the allocator's arenas, the
    release estimate and, with --trim, the measured release."""
    c = console(out)
    c.print()
    c.print(Text(fmt.clip(f"heapsight attach: pid {a.pid}: {printable(a.command)}", c.width),
                 style="bold"), soft_wrap=True)
    _indent(c, f"allocator: {a.allocator}; RSS {human(a.rss_bytes)}", 2)
    for note in a.notes:
        _indent(c, f"note: {note}", 2, style="dim")
    t = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False)
    t.add_column("", no_wrap=True)
    t.add_column("now", justify="right", no_wrap=True)
    t.add_column("", justify="right", no_wrap=True, style="dim")
    t.add_row("RSS", human(a.rss_bytes), "", style="bold")
    if a.in_use_bytes is not None:
        t.add_row("  in use (live, rounding, headers, caches)", human(a.in_use_bytes),
                  pct(a.in_use_bytes, a.rss_bytes))
        if a.preloaded:
            t.add_row("    of which live (requested, not freed)", human(a.live_bytes),
                      pct(a.live_bytes, a.rss_bytes), style="dim")
            t.add_row("    of which waste (rounding)", human(a.waste_bytes),
                      pct(a.waste_bytes, a.rss_bytes), style="dim")
        t.add_row("  retained (freed, kept)", human(a.retained_bytes),
                  pct(a.retained_bytes, a.rss_bytes))
    for name, v in a.non_heap.items():
        t.add_row(Text(f"  {name}"), human(v), pct(v, a.rss_bytes))   # "[heap]" is no markup
        if name == "other anonymous" and a.py_objects_bytes is not None:
            objects = min(a.py_objects_bytes, v)
            t.add_row("    of it CPython objects (pymalloc's pools)", human(objects),
                      pct(objects, a.rss_bytes), style="dim")
    c.print()
    _print(c, Padding(t, (0, 0, 0, 2), expand=False))
    if a.arenas:
        busy = sorted(a.arenas, key=lambda x: -x["system_bytes"])
        _indent(c, f"{len(a.arenas)} arena(s): " + ", ".join(
            f"#{x['nr']} {human(x['system_bytes'])} ({human(x['free_bytes'])} free in "
            f"{x['free_chunks']:,} chunks)" for x in busy[:4])
            + (f", and {len(busy) - 4} more" if len(busy) > 4 else ""), 2)
        if a.allocator_figures.get("mmapped_chunks"):
            _indent(c, f"{a.allocator_figures['mmapped_chunks']:,} mmapped chunk(s) of "
                       f"{human(a.allocator_figures['mmapped_bytes'])} in all", 2)
    if a.release_estimate_bytes is not None and a.release_measured:
        _indent(c, f"a release now would give back {human(a.release_estimate_bytes)}: malloc_trim "
                   "measured in a copy of the process", 2)
    elif a.release_estimate_bytes is not None:
        _indent(c, f"a release now would give back about {human(a.release_estimate_bytes)} "
                   "(the whole pages inside free chunks)", 2)
    if a.trim:
        r = a.trim
        _indent(c, f"release: {r['call']} gave back {human(r['gave_back_bytes'])} (RSS "
                   f"{human(r['rss_before_bytes'])} -> {human(r['rss_after_bytes'])})", 2, style="bold")
        if "pause_ms" in r:
            _indent(c, f"made on one of its threads, stopped {r['pause_ms']:.1f} ms for it (all "
                       f"{r['threads']} stopped {r['all_stopped_ms']:.1f} ms while one was chosen)", 4,
                    style="dim")
    if a.track:
        _render_track(c, a.track)
    if a.leaks:
        _render_leaks(c, a.leaks)
    c.print()
    style = "bold green" if a.verdict.startswith("healthy") else "bold yellow"
    _verdict_lines(c, a.verdict, style)
    c.print()
