"""Two saved runs side by side: what moved from run A to run B.

A and B are run records (`heapsight run` saves one per run), or a saved comparison's run
of one configuration (FILE#CONFIG: its repeat with the median peak RSS): the same program
before and after a change (MALLOC_ARENA_MAX, a malloc_trim, a pool, a new release). The diff gives
the RSS split at the peak and at exit (each row's change in bytes and percent), peak RSS,
what the release gave back, the largest hold, the pinned pages, reachability at exit
(where both runs have it), the verdicts, and the call sites at the peak and of the bytes
never freed: what grew, shrank, is new or gone, matched by function and file:line. A
site's change inside the two runs' sampling error (its 99.9% interval) is "no change".

examples:
  heapsight diff before.hsrun.json.gz after.hsrun.json.gz
  heapsight diff a.hsrun.json.gz b.hsrun.json.gz --json diff.json
  heapsight diff base.hsrun.json.gz new.hsrun.json.gz --fail-if-grew retained=8M
  heapsight diff cmp.json.gz#glibc cmp.json.gz#jemalloc-eager
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap

from heapsight import diffing, output, record
from heapsight.errors import EXIT_GATE, HeapsightError
from heapsight.fmt import clip, clip_left, human, parse_size, printable

USAGE = "heapsight diff [options] A B"


def add_arguments(p) -> None:
    p.add_argument("a", metavar="A", help="the first run record (.hsrun.json.gz), or "
                   "COMPARISON#CONFIG: before")
    p.add_argument("b", metavar="B", help="the second run record: after")
    p.add_argument("--json", metavar="FILE|-", help="the differences as JSON ('-': stdout)")
    p.add_argument("--html", metavar="FILE",
                   help="also write both runs as one page (each run's timeline and call sites)")
    p.add_argument("--force", action="store_true",
                   help="compare records of two different programs")
    p.add_argument("--fail-if-grew", metavar="FIGURE=SIZE", action="append", default=[],
                   help="CI gate: exit 90 when FIGURE grew by more than SIZE from A to B; "
                        "figures: " + ", ".join(diffing.GATE_FIGURES) + " (e.g. retained=8M)")
    p.add_argument("-q", "--quiet", action="store_true", help="no terminal output")
    p.add_argument("--as-recorded", action="store_true",
                   help="compare the summaries as they were saved; by default each run is "
                        "analysed again from its capture by this heapsight, as `report` "
                        "shows it, so both sides get the same analysis")


def gates(specs: list) -> list:
    out = []
    for spec in specs:
        name, _, size = spec.partition("=")
        if name not in diffing.GATE_FIGURES or not size:
            raise HeapsightError(f"--fail-if-grew {spec}: give FIGURE=SIZE with FIGURE one of "
                                 + ", ".join(diffing.GATE_FIGURES) + " (e.g. retained=8M)")
        try:
            out.append((name, parse_size(size)))
        except ValueError as e:
            raise HeapsightError(f"--fail-if-grew {spec}: {e}") from e
    return out


def load_run(path: str) -> dict:
    """A run record, or FILE#CONFIG: a saved comparison's run of that configuration (its
    repeat with the median peak RSS)."""
    config = None
    if not os.path.exists(path) and "#" in path:
        path, config = path.rsplit("#", 1)
    doc = record.load(path)
    if config is not None:
        if doc.get("kind") != "heapsight-compare":
            raise HeapsightError(f"{path}#{config}: {path} is not a saved comparison: #CONFIG "
                                 "names a configuration of one (heapsight compare -o FILE)", 2)
        runs = [r for r in doc.get("runs") or () if r.get("config") == config]
        if not runs:
            names = sorted({r.get("config") for r in doc.get("runs") or ()} - {None})
            raise HeapsightError(f"{path}#{config}: no run of {config} in it (it has: "
                                 + (", ".join(names) or "none saved") + ")", 2)
        runs.sort(key=lambda r: r["summary"].get("peak_rss_bytes") or 0)
        doc = runs[(len(runs) - 1) // 2]
        doc = {**doc, "kind": record.KIND}
    if doc.get("kind") != record.KIND:
        raise HeapsightError(f"{path}: {record.KINDS.get(doc.get('kind'), 'not a run record')}, "
                             "not a run record: diff compares two runs (.hsrun.json.gz, or "
                             "a saved comparison's run as FILE#CONFIG)", 2)
    return doc


def execute(args) -> int:
    limits = gates(args.fail_if_grew)
    da, db = load_run(args.a), load_run(args.b)
    if not args.as_recorded:   # today's analysis of both, as report shows them
        from heapsight import capture
        da = capture.reanalysed(args.a, da, "heapsight diff")
        db = capture.reanalysed(args.b, db, "heapsight diff")
    a, b = da["summary"], db["summary"]
    if diffing.program(a) != diffing.program(b) and not args.force:
        raise HeapsightError(f"{args.a} is a run of {diffing.program(a)} and {args.b} of "
                             f"{diffing.program(b)}: add --force to compare them anyway")
    output.check_all([("--json", args.json, True), ("--html", args.html, False)],
                     inputs=[p.split("#", 1)[0] for p in (args.a, args.b)])
    for name, _ in limits:
        for path, s in ((args.a, a), (args.b, b)):
            if diffing.figure(s, name) is None:
                raise HeapsightError(f"--fail-if-grew {name}: {path} has no "
                                     f"{diffing.GATE_FIGURES[name]} figure")
    d = diffing.diff(a, b, db.get("timeline"))
    failed = []
    for name, limit in limits:
        after = (diffing.held_in_b(a, b, db.get("timeline")) if name == "held_rss"
                 else diffing.figure(b, name))
        grew = (after or 0) - diffing.figure(a, name)
        d.setdefault("gates", []).append({"figure": name, "grew": grew, "limit": limit,
                                          "failed": grew > limit})
        if grew > limit:
            failed.append((name, grew, limit))
    if args.json:
        output.write_json(args.json, d)
    if args.html:
        from heapsight import report
        head = {"kind": "heapsight-diff", "diff": d, "a": da, "b": db}
        report.write_html(args.html, [(f"A: {args.a}, B: {args.b}", head), (f"A: {args.a}", da),
                               (f"B: {args.b}", db)], f"heapsight diff: {diffing.program(a)}")
    if not args.quiet:
        render(d, args.a, args.b, sys.stdout if args.json != "-" else sys.stderr)
    for name, grew, limit in failed:
        sys.stderr.write(f"heapsight diff: gate failed: {diffing.GATE_FIGURES[name]} grew by "
                         f"{human(grew)}, above the limit {human(limit)}\n")
    return EXIT_GATE if failed else 0


def _site_row(how: str, r: dict, width: int) -> str:
    """One call site's move: its figures, then its name on the same line when it fits,
    else on the next (cut to the width: --json has it whole)."""
    figures = f"    {how:<7}{human(r['a']):>11} -> {human(r['b']):<11} {diffing.change_text(r)}"
    name = printable(r["site"])
    if len(figures) + 2 + len(name) <= width:
        return f"{figures}  {name}\n"
    return f"{figures}\n{' ' * 11}{clip(name, width - 11)}\n"


def render(d: dict, path_a: str, path_b: str, out) -> None:
    """The diff for a terminal, its prose wrapped to the terminal's width."""
    w = out.write
    width = shutil.get_terminal_size((80, 24)).columns
    w("heapsight diff\n")
    for name, path in (("a", path_a), ("b", path_b)):
        pid = f" (pid {d[name]['pid']})"
        w(f"  {name.upper()}: {clip_left(printable(path), width - 5 - len(pid))}{pid}\n")
    w("\n")
    for at, title in (("peak", "at peak live"), ("exit", "at exit")):
        read = diffing.read_at_text(d, at)
        head = f"  {title:<24}{'A':>12}{'B':>12}  change"
        # when each column was read: beside the heading when it fits, under it when not
        w(f"{head}  {read}\n" if read and len(head) + 2 + len(read) <= width
          else f"{head}\n" + (f"  {clip(read, width - 2)}\n" if read else ""))
        for r in d["split"][at]:
            w(f"    {r['row']:<22}{human(r['a']):>12}{human(r['b']):>12}  {diffing.change_text(r)}\n")
        w("\n")
    for r in d["figures"]:
        line = (f"  {r['figure']:<26}{diffing.amount(r['a']):>12}{diffing.amount(r['b']):>12}"
                f"  {diffing.change_text(r)}")
        w(line.rstrip() + "\n")
    for moment, title in (("peak", "call sites at peak live"),
                          ("never freed", "call sites of the bytes never freed")):
        got = d["sites"].get(moment)
        if got is None:
            continue
        moved = [r for r in got["rows"] if r["how"] != "no change"]
        same = len(got["rows"]) - len(moved)
        head = (f"{title} ({diffing.sites_moment_text(got)}estimated from {got['a_samples']:,} and {got['b_samples']:,} "
                "sampled blocks; a change inside the two runs' sampling error is no change):")
        w("\n" + textwrap.fill(head, width, initial_indent="  ", subsequent_indent="  ") + "\n")
        for r in moved[:12]:
            w(_site_row(r["how"], r, width))
        if len(moved) > 12:
            w(f"    and {len(moved) - 12} more changed (--json lists them all)\n")
        # the largest moves inside the noise too, marked so: a real change smaller than the
        # two runs' sampling error is one a user may still want to see
        noise = [r for r in got["rows"] if r["how"] == "no change" and r["change"]][:3]
        for r in noise:
            w(_site_row("~", r, width))
        others = same - len(noise)
        tail = "; ".join(x for x in (
            "" if moved else "no call site changed beyond its sampling error",
            "~: moved within it" if noise else "",
            f"{others} other site(s): no change" if others else "") if x)
        w(textwrap.fill(tail, width, initial_indent="    ", subsequent_indent="    ") + "\n"
          if tail else "")
    w("\n")
    for name in ("a", "b"):
        w(textwrap.fill(f"verdict {name.upper()}: {printable(d[name]['verdict'] or '')}", width,
                        initial_indent="  ", subsequent_indent="             ") + "\n")
