"""Turn saved runs, comparisons and lab results into one HTML page with charts.

Each FILE gets a section: a run record (from `heapsight run`) shows its RSS split over
time, allocation rate, arenas, the breakdown at the peak and at exit, and the verdict; a
comparison (`heapsight compare`) shows memory and time per configuration with the spread
of the repeats; lab results (`heapsight lab`) show each experiment's charts, tables and
claims. The page is one self-contained file (no network); hover a chart for its values,
drag across a timeline to zoom, double-click to zoom out. --png also writes every chart
as a PNG image (needs Chromium: Debian package chromium).

examples:
  heapsight report heapsight-app.1234.hsrun.json.gz -o app.html
  heapsight report --terminal heapsight-app.1234.hsrun.json.gz
  heapsight report run.hsrun.json.gz compare.json.gz lab.json.gz -o all.html
  heapsight report lab.json.gz -o lab.html --png charts/ --title "this box"
"""

from __future__ import annotations

import os
import sys

from heapsight import capture, output, record, report
from heapsight.errors import HeapsightError
from heapsight.report import png


def add_arguments(p) -> None:
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="run records (.hsrun.json.gz), comparisons or lab results, in any mix")
    p.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="the HTML page to write (default heapsight-report.html; with --pprof "
                        "alone, no page)")
    p.add_argument("--pprof", metavar="FILE",
                   help="write the run record's sampled call sites as a pprof heap profile "
                        "(one run record: go tool pprof -top FILE)")
    p.add_argument("--pprof-at", metavar="MOMENT", default="peak",
                   help="the pprof profile's inuse moment: peak (default), exit, 'never "
                        "freed', or a snapshot's label")
    p.add_argument("--png", metavar="DIR",
                   help="also write each chart as DIR/CHART_ID.png (drawn by headless Chromium)")
    p.add_argument("--title", metavar="T", help="the page's title")
    p.add_argument("--terminal", action="store_true",
                   help="show each run record's summary in the terminal, as `heapsight run` "
                        "printed it (analysed again by this heapsight; as saved with "
                        "--as-recorded, or when the record has no capture); no page unless -o")
    p.add_argument("--as-recorded", action="store_true",
                   help="show each run's summary as it was saved; by default a run recorded "
                        "with its capture (what the analysis read) is analysed again by this "
                        "heapsight, so a better analysis applies to old runs too")


def show_in_terminal(docs: list, as_recorded: bool = False) -> None:
    """Each run record's summary as `run` prints it: analysed again from its capture, or as
    saved (as_recorded, or a record saved without a capture, which is said); comparisons,
    labs and attach's records are refused before anything is shown."""
    from heapsight.model import Summary
    from heapsight.reporters import terminal
    bad = [p for p, d in docs if d.get("kind") != record.KIND]
    if bad:
        raise HeapsightError(f"--terminal shows run records saved by `heapsight run`; "
                             f"{', '.join(bad)} is not one: write a page instead (-o FILE.html)")
    summaries = []
    for path, doc in docs:
        try:
            again = None if as_recorded else capture.rederive(doc)
        except capture.NewerCapture as e:
            raise HeapsightError(f"{path}: {e}; a page (-o FILE.html) shows it as recorded")
        if again is None and not as_recorded:
            print(f"heapsight report: {path}: shown as recorded (saved without a capture to "
                  "analyse again)", file=sys.stderr)
        try:
            summaries.append((path, again or Summary.from_dict(doc["summary"])))
        except ValueError as e:
            raise HeapsightError(f"{path}: its saved summary cannot be drawn in the terminal "
                                 f"({e}); a page (-o FILE.html) shows what it has")
    for path, summary in summaries:
        terminal.render_run(summary, sys.stdout, saved_to=path)


def execute(args) -> int:
    # Everything that can fail on the inputs fails before anything is written.
    docs = [(path, record.load(path)) for path in args.files]
    if args.terminal:
        show_in_terminal(docs, args.as_recorded)
        if args.output is None and not args.pprof:
            return 0
    if not args.as_recorded:
        docs = [(path, capture.reanalysed(path, doc, "heapsight report")) for path, doc in docs]
    if args.pprof:
        runs = [(p, d) for p, d in docs if d.get("kind") == record.KIND]
        if len(docs) != 1 or not runs:
            raise HeapsightError("--pprof takes one run record (.hsrun.json.gz): "
                                 f"{len(docs)} file(s) given, {len(runs)} of them run records")
        from heapsight.reporters import pprof
        data = pprof.encode(runs[0][1]["summary"], args.pprof_at)   # refusals before writing
        output.check_all([("--pprof", args.pprof, False)], inputs=args.files)
        output.write(args.pprof, data, gzip=False)
        print(f"heapsight report: wrote {args.pprof} (pprof, inuse at {args.pprof_at}; "
              f"go tool pprof -top {args.pprof})", file=sys.stderr)
        if args.output is None:
            return 0
    args.output = args.output or "heapsight-report.html"
    output.check_all([("--output", args.output, False)], inputs=args.files)
    if args.png:
        png.chromium()
        if os.path.exists(args.png) and not os.path.isdir(args.png):
            raise HeapsightError(f"--png {args.png} exists and is not a directory")
        try:   # before the page is written, not after
            os.makedirs(args.png, exist_ok=True)
            output.check(os.path.join(args.png, "chart.png"), "--png")
        except OSError as e:
            raise HeapsightError(f"--png {args.png}: cannot make the directory ({e.strerror})") from e
    page = report.write_html(args.output, docs, args.title)
    size = len(report.printable(page.html).encode("utf-8"))
    print(f"heapsight report: wrote {args.output} ({len(docs)} file(s), {len(page.charts)} "
          f"chart(s), {size / 1024:,.0f} KiB)", file=sys.stderr)
    if args.png and page.charts:
        paths = png.write_pngs(args.output, [c["id"] for c in page.charts], args.png)
        print(f"heapsight report: wrote {len(paths)} PNG image(s) to {args.png}", file=sys.stderr)
    return 0
