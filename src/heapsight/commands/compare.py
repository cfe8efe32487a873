"""Run one program under several allocators and tunables and compare their memory and time.

Each configuration runs --repeat times (default 3) under `heapsight run`'s measurement;
the table gives medians with min-max: peak RSS, the RSS at the moment ranked by (by
default the moment glibc's run's verdict is about: held, end or exit; --rank-by), retained
at exit, what a release at exit gave back, wall and CPU time, minor faults, each relative
to glibc's default. The recommendation is the lowest at that moment among the
configurations costing at most 25% more time, and beside it the lowest of all with its
cost; a configuration that failed is listed with why. Each run checks that the allocator it asked for is the one that answered; a
mismatch (a static binary, a program that ignores LD_PRELOAD) is an error in its row.

examples:
  heapsight compare -- ./server --bench
  heapsight compare --configs glibc,glibc-arena2,jemalloc-eager -- ./app
  heapsight compare --config mine:jemalloc:MALLOC_CONF=narenas:2 -- ./app
  heapsight compare --list
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import textwrap

from heapsight import output, report
from heapsight.live import comparison, measure
from heapsight.allocators import (DEFAULT_CONFIGS, PRESETS, RUNTIME_DEFAULTS, library_for,
                                  parse_config, presets, runtime_of)
from heapsight.errors import HeapsightError
from heapsight.progress import Progress
from heapsight.reporters import csv, terminal

USAGE = "heapsight compare [options] [--] PROGRAM [ARGS...]"


def add_arguments(p) -> None:
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help=f"comma-separated configurations (default: {DEFAULT_CONFIGS}; the "
                        "mmap baseline, one mapping per block, is slow and large: add it by "
                        "name); see --list")
    p.add_argument("--config", action="append", default=[], metavar="NAME:ALLOC[:ENV=VAL,...]",
                   help="add your own: ALLOC is glibc, jemalloc, tcmalloc, mimalloc, mmap, or the "
                        "path of an allocator library; ENV=VAL pairs are set for the program")
    p.add_argument("--repeat", type=int, default=3, help="runs per configuration (default 3)")
    p.add_argument("--rank-by", choices=("peak", "held", "end", "exit"), default="",
                   help="the moment whose RSS ranks the configurations: peak (peak RSS), held "
                        "(the most RSS kept through a stretch of the run), end (as the exit "
                        "began), exit (after exit handlers and teardown); default: the moment "
                        "the verdict of glibc's run is about")
    p.add_argument("--follow", metavar="NAME", default="",
                   help="measure the process of the program named NAME among those the command "
                        "starts (as run --follow)")
    p.add_argument("--json", metavar="FILE", help="the comparison as JSON ('-' for stdout)")
    p.add_argument("--csv", metavar="FILE", help="the table as CSV, one row per configuration, "
                   "numbers in bytes and seconds ('-' for stdout)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="save every run (summaries and timelines) for reports "
                        "(default heapsight-compare-PROG.PID.json.gz)")
    p.add_argument("--no-save", action="store_true", help="do not save the runs")
    p.add_argument("--html", metavar="FILE",
                   help="also write the comparison as a self-contained HTML page")
    p.add_argument("--spread", action="store_true",
                   help="show each figure's min-max over the repeats under its median")
    p.add_argument("--show-output", action="store_true",
                   help="let the program's stdout through (default: discarded)")
    p.add_argument("--list", action="store_true", help="list the built-in configurations and exit")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND [ARGS...]",
                   help="the program and its arguments ('--' before it is optional)")


def select_configs(args, runtime: str | None = None) -> list:
    """The configurations asked for; with the default matrix, the presets made for the
    program's runtime are added (CPython: its objects through malloc), and a runtime's
    preset given for another program is refused."""
    out = presets(args.configs) + [parse_config(t) for t in args.config]
    if args.configs == DEFAULT_CONFIGS and runtime in RUNTIME_DEFAULTS:
        out += presets(",".join(RUNTIME_DEFAULTS[runtime]))
    wrong = [c.name for c in out if c.runtime and c.runtime != runtime]
    if wrong:
        raise HeapsightError(f"{', '.join(wrong)}: made for CPython programs, and this one is not "
                             "(leave it out, or run the program under python3)")
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise HeapsightError(f"configuration names repeat: {names}")
    if not out:
        raise HeapsightError("no configurations selected")
    return out


def list_configs(out) -> None:
    """Each preset: its name, what it is, the environment it sets and whether its library
    is missing, wrapped to the terminal (the environment on a line of its own when the
    line would not fit)."""
    width = shutil.get_terminal_size((80, 24)).columns
    col = max(len(c.name) for c in PRESETS) + 2
    for c in PRESETS:
        lib, err = library_for(c)
        env = " ".join(f"{k}={v}" for k, v in c.env.items())
        state = "" if err is None else "   [missing: " + err.split(": ", 1)[1] + "]"
        line = f"{c.name:{col}}{c.about}{'  (' + env + ')' if env else ''}{state}"
        if len(line) > width:
            line = textwrap.fill(f"{c.name:{col}}{c.about}{state}", max(width, col + 20),
                                 subsequent_indent=" " * col)
            for k, v in c.env.items():   # one setting a line, each whole
                line += f"\n{'':{col}}{k}={v}"
        out.write(line + "\n")


def execute(args) -> int:
    if args.list:
        list_configs(sys.stdout)
        return 0
    if not 1 <= args.repeat <= 100:
        raise HeapsightError(f"--repeat {args.repeat} is out of range: give 1 to 100")
    argv = measure.program_argv(args.command, "compare")
    path = measure.resolve_command(argv)  # fail before any work when the command does not exist
    # the runtime of the process measured: the program followed, else the command's
    runtime = runtime_of(shutil.which(args.follow) or args.follow) if args.follow else None
    configs = select_configs(args, runtime or runtime_of(path))
    output.check_all([("--json", args.json, True), ("--csv", args.csv, True),
                      ("--output", None if args.no_save else args.output, False),
                      ("--html", args.html, False)])
    progress = Progress(sys.stderr, "heapsight compare", in_place=not args.show_output)   # the program's output
                                                                     # would land on its line
    try:
        cmp = comparison.run_all(argv, configs, args.repeat, args.show_output, progress=progress,
                                 rank_by=args.rank_by, follow=args.follow)
    finally:
        progress.done()
    doc = cmp.doc(with_runs=False)
    terminal.render_compare(doc, sys.stderr, spread=args.spread)
    if cmp.interrupted:
        sys.stderr.write("heapsight compare: interrupted: the runs that finished are kept below; "
                         "the rest did not run\n")
    if args.json:
        output.write_json(args.json, doc)
    out = None
    if not args.no_save:
        out = args.output or f"heapsight-compare-{os.path.basename(argv[0])}.{os.getpid()}.json.gz"
        output.save_doc(out, cmp.doc())
        sys.stderr.write(f"runs saved to {out}\n")
    if args.html:
        report.write_html(args.html, [(out or "this comparison (not saved)", cmp.doc())])
        sys.stderr.write(f"page written to {args.html}\n")
    if args.csv:
        output.write(args.csv, csv.render_compare(doc), gzip=False)
    if cmp.interrupted:
        return 130
    failed = [r["name"] for r in cmp.rows if not r["ok"]]
    if failed:
        sys.stderr.write(f"heapsight compare: {len(failed)} configuration(s) failed: "
                         f"{', '.join(failed)} (exit 1)\n")
    return 1 if failed else 0
