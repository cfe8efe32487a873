"""Run heapsight on its built-in example and write the run and its page: no program needed.

The example (hs-retention, shipped with heapsight) starts 8 threads that allocate 256 MiB
in 1 KiB blocks and free 63 of every 64: RSS stays near its peak while 4 MiB is live, the
classic glibc retention that heapsight explains. The summary, a run record and an HTML
page with the timeline follow, as `heapsight run` writes them.

examples:
  heapsight demo        # heapsight-demo.hsrun.json.gz and .html
  heapsight demo --mb 64 -o demo.hsrun.json.gz --html demo.html
"""

from __future__ import annotations

from heapsight import native
from heapsight.errors import HeapsightError

USAGE = "heapsight demo [--mb N] [-o FILE] [--html FILE]"


def add_arguments(p) -> None:
    p.add_argument("--mb", type=int, default=256,
                   help="MiB the example allocates in all (default 256; at least 8)")
    p.add_argument("-o", "--output", default="heapsight-demo.hsrun.json.gz",
                   help="the run record (default heapsight-demo.hsrun.json.gz)")
    p.add_argument("--html", default="heapsight-demo.html",
                   help="the page (default heapsight-demo.html)")


def execute(args) -> int:
    if args.mb < 8:
        raise HeapsightError(f"--mb {args.mb} is too small: give 8 or more")
    example = native.program("hs-retention")
    from heapsight import cli
    return cli.main(["run", "-o", args.output, "--html", args.html, "--", example,
                     "--mb", str(args.mb)])
