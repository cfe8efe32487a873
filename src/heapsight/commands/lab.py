"""Re-run the classic allocator experiments here and check what their write-ups claimed.

Five experiments from published write-ups, and one that checks heapsight's own
remedy rules (`heapsight lab --list` names them), each run across allocators:
  release     2 KB .. 2 GB: which freed blocks go back to the OS, in which order
  waste       the rounding table: requested vs allocated for tiny blocks
  arenas      threads that allocate and free: arenas, malloc_trim, arena_max
  containers  C++ vector/list/deque of strings, std::allocator vs __pool_alloc
  perl        Perl scalars, arrays, hashes: when memory goes back
  remedies    threads and CPython objects that pin freed memory: which settings
              lower the RSS kept (jemalloc, malloc_trim...), and which do not

Each prints the key rows of the table its write-up printed, then every claim with a
verdict (holds, fails, or depends on ...) computed from this run's numbers, and the
figure that decides it; --verbose prints every table whole and the evidence behind each
claim. The results are saved for `heapsight report`, whose page shows them all.

examples:
  heapsight lab --quick          # all six, small: about 1 minute on 2 cores
  heapsight lab                  # full size, as published: about 17 minutes
  heapsight lab release waste    # two experiments, full size
  heapsight lab arenas --configs glibc,glibc-arena2,jemalloc
  heapsight lab --quick --json - > lab.json
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import sys
import textwrap
import time

from heapsight import lab, output, report
from heapsight.allocators import presets
from heapsight.errors import HeapsightError
from heapsight.fmt import middle_cut
from heapsight.lab.common import Context
from heapsight.model import SCHEMA_VERSION
from heapsight.progress import Progress
from heapsight.reporters import csv, terminal


def add_arguments(p) -> None:
    p.add_argument("experiments", nargs="*", metavar="EXPERIMENT",
                   help=f"which to run: {', '.join(lab.NAMES)} (default: all)")
    p.add_argument("--quick", action="store_true",
                   help="smaller sizes and fewer cases: all six in about 1 minute on 2 cores")
    p.add_argument("--configs", metavar="A,B,...",
                   help="run every experiment under these configurations instead of each "
                        "experiment's own set (names from `heapsight compare --list`)")
    p.add_argument("--json", metavar="FILE", help="the results as JSON ('-' for stdout)")
    p.add_argument("--csv", metavar="FILE", help="every table as CSV rows ('-' for stdout)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where to save the results for reports (default heapsight-lab.PID.json.gz)")
    p.add_argument("--no-save", action="store_true", help="do not save the results")
    p.add_argument("--html", metavar="FILE",
                   help="also write the results as a self-contained HTML page with the charts")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print every table whole and each claim's whole evidence (by default "
                        "the tables' key rows and the figure that decides each claim), and a "
                        "line per step when stderr is no terminal")


def machine() -> dict:
    return {"cores": os.cpu_count(), "kernel": platform.release(),
            "libc": " ".join(platform.libc_ver()), "python": platform.python_version()}


def select(args) -> tuple:
    names = args.experiments or list(lab.NAMES)
    bad = [n for n in names if n not in lab.NAMES]
    if bad:
        raise HeapsightError(f"unknown experiment {bad[0]!r}; known: {', '.join(lab.NAMES)}")
    configs = None
    if args.configs is not None:
        configs = presets(args.configs)
        if not configs:
            raise HeapsightError("--configs is empty: give configuration names, e.g. glibc,jemalloc")
    return list(dict.fromkeys(names)), configs


def estimate(names: list, quick: bool) -> str:
    """The lab's time on a 2-core machine like the one QUICK_SECONDS and FULL_SECONDS were
    measured on: "about 60 s", "about 17 min"."""
    s = sum(getattr(lab.experiment(n), "QUICK_SECONDS" if quick else "FULL_SECONDS", 0)
            for n in names)
    return f"about {s / 60:.0f} min" if s >= 90 else f"about {s:.0f} s"


def failed_all(doc: dict) -> bool:
    return all(e.get("error") for e in doc["experiments"])


def run_one(name: str, ctx: Context) -> dict:
    mod = lab.experiment(name)
    t0 = time.monotonic()
    data = mod.collect(ctx)
    return {"name": name, "title": mod.TITLE, "source": mod.SOURCE, "about": mod.ABOUT,
            "quick": ctx.quick, "duration_s": round(time.monotonic() - t0, 2), "data": data,
            "tables": [t.to_dict() for t in mod.tables(data)],
            "claims": [c.to_dict() for c in mod.claims(data)],
            "charts": mod.charts(data)}


def execute(args) -> int:
    if args.list:
        width = max(40, shutil.get_terminal_size((80, 24)).columns)
        for n in lab.NAMES:   # each with the write-up it re-runs, wrapped to the terminal
            mod = lab.experiment(n)
            print(textwrap.fill(f"{n:12}{mod.TITLE}", width, subsequent_indent=" " * 12))
            print(textwrap.fill(f'after "{mod.SOURCE}"', width, initial_indent=" " * 12,
                                subsequent_indent=" " * 13))
        return 0
    names, configs = select(args)
    output.check_all([("--json", args.json, True), ("--csv", args.csv, True),
                      ("--output", None if args.no_save else args.output, False),
                      ("--html", args.html, False)])
    width = terminal.console(sys.stderr).width   # the tables' width: COLUMNS, the terminal's
    # the step running now: in place on a terminal, a line per step in a log with --verbose
    steps = Progress(sys.stderr, "heapsight lab", elsewhere=args.verbose)

    def say(msg: str) -> None:   # lines that stay, wrapped: the step line cleared first
        steps.done()
        lines = textwrap.wrap(f"heapsight lab: {msg}", max(40, width), subsequent_indent="  ",
                              break_on_hyphens=False)
        sys.stderr.write("".join(line + "\n" for line in lines))
        sys.stderr.flush()
    ctx = Context(quick=args.quick, configs=configs, warning=say,
                  progress=lambda msg: steps(middle_cut(msg, width - len("heapsight lab: ") - 1)))
    doc = {"kind": "heapsight-lab", "schema_version": SCHEMA_VERSION, "quick": args.quick,
           "machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "experiments": []}
    failed, interrupted = [], False
    started = time.monotonic()
    weight = [getattr(lab.experiment(n), "QUICK_SECONDS" if args.quick else "FULL_SECONDS", 1)
              for n in names]
    try:
        for i, name in enumerate(names, 1):
            # the time: at the start what the experiments take on a 2-core machine (not with
            # --configs, which changes it); then the experiments to come, each by its share of
            # the lab's time (they differ tenfold), at the pace of those done so far
            eta = ""
            if i == 1 and configs is None:
                eta = f", {estimate(names, args.quick)} in all"
            elif i > 1:
                left = (time.monotonic() - started) / sum(weight[:i - 1]) * sum(weight[i - 1:])
                eta = f", about {left / 60:.0f} min left" if left >= 90 else f", about {left:.0f} s left"
            say(f"[{i}/{len(names)}] {name}{' (quick)' if args.quick else ''}{eta}")
            try:
                result = run_one(name, ctx)
            except HeapsightError as e:
                say(f"{name} failed: {e.message}")
                failed.append(name)
                doc["experiments"].append({"name": name, "error": e.message})
                continue
            steps.done()
            doc["experiments"].append(result)
            terminal.render_lab(result, sys.stderr, verbose=args.verbose)
    except KeyboardInterrupt:
        interrupted = doc["interrupted"] = True
        say(f"interrupted: {len(doc['experiments'])} experiment(s) finished and are kept; "
            "the one in progress and the rest did not run")
    totals = {}
    for r in doc["experiments"]:
        for c in r.get("claims", []):
            totals[c["verdict"]] = totals.get(c["verdict"], 0) + 1
    sys.stderr.write("\nclaims: " + ", ".join(f"{n} {v}" for v, n in sorted(totals.items()))
                     + (f"; experiments that failed to run: {', '.join(failed)}" if failed else "")
                     + "\n")
    if args.json:
        output.write_json(args.json, doc, indent=1)
    if args.csv:
        output.write(args.csv, csv.render_lab(doc), gzip=False)
    out = None
    if not args.no_save:
        out = args.output or f"heapsight-lab.{os.getpid()}.json.gz"
        output.save_doc(out, doc)
        sys.stderr.write(f"results saved to {out}\n")
    if args.html:
        report.write_html(args.html, [(out or "these lab results (not saved)", doc)])
        sys.stderr.write(f"page written to {args.html}\n")
    if not args.verbose and doc["experiments"] and not failed_all(doc):
        # the terminal showed each table's key rows and each claim's deciding figure
        where = f"the page ({args.html})" if args.html else "the page:" if out else "--html FILE"
        sys.stderr.write("\n".join(textwrap.wrap(
            f"every table whole and the evidence behind each claim: --verbose, or {where}",
            max(40, width), break_on_hyphens=False, break_long_words=False)) + "\n")
        if out and not args.html:   # a command to copy, on a line of its own
            sys.stderr.write(f"  heapsight report {shlex.quote(out)} -o lab.html\n")
    if interrupted:
        return 130
    return 1 if failed else 0
