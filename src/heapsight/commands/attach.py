"""Explain the memory of a running process, without restarting it.

Reads /proc/PID/smaps (every mapping classified: the allocator's heaps, stacks,
file-backed, shared, other anonymous), finds the allocator from the libraries the
process maps, and reads the allocator's own figures: glibc's from a copy of the process
(every thread stops for the copy, a few milliseconds; the copy's heaps are walked chunk
by chunk and malloc_trim is measured in it), jemalloc's and tcmalloc's by calling into the
process through gdb. It prints the same split as `heapsight run` (in use by the program,
freed but kept by the allocator, non-heap by owner) and how much a release would give
back.

The process stops only for the copy (or while gdb reads: a few tenths of a second) and is
otherwise left as it was (gdb places its string arguments in the process's memory, a few
dozen bytes). Nothing else changes unless you ask: --trim calls the
allocator's release (malloc_trim(0), jemalloc's purge, tcmalloc's ReleaseFreeMemory,
mi_collect) on one of its threads that waits in a system call (no gdb; that thread stops
for the call) and measures RSS before and after; --leaks copies the process (every thread
stops for the copy) and marks in the copy what no pointer reaches.

exit codes: 0 done; 3 cannot attach (the line says why and how to allow it); 4 the process
ended during --leaks, --trim or --track; 5 a copy or a call failed (the process is let go
unchanged); 130 --track or --watch ended by Ctrl-C; 2 bad input.

examples:
  heapsight attach 4242
  heapsight attach 4242 --trim                   # give memory back, measured
  heapsight attach 4242 --leaks                  # what no pointer reaches now
  heapsight attach 4242 --track 10               # who allocates and keeps
  heapsight attach 4242 --watch 60 -o svc.hsrun.json.gz   # a minute, for report
  heapsight attach 4242 --watch --openmetrics-port 9464   # for Prometheus
"""

from __future__ import annotations

import shutil
import sys
import textwrap

from heapsight import interrupts, output, report
from heapsight.live import attach
from heapsight.errors import HeapsightError
from heapsight.fmt import human
from heapsight.progress import Progress
from heapsight.reporters import terminal

USAGE = "heapsight attach [options] PID"


def add_arguments(p) -> None:
    p.add_argument("pid", type=int, metavar="PID", help="the process to explain")
    p.add_argument("--trim", action="store_true",
                   help="call the allocator's release in the process (on one of its threads, "
                        "no gdb) and measure what it gave back")
    p.add_argument("--leaks", action="store_true",
                   help="find the blocks the process can no longer reach (lost, as memcheck "
                        "counts them) in a copy of it: the process stops only while the copy is "
                        "made (about a millisecond, plus ~12 ms per GiB of heap), and nothing is "
                        "loaded into it (glibc only)")
    p.add_argument("--track", type=float, metavar="SECONDS",
                   help="load heapsight's library into the process for SECONDS and name the call "
                        "sites of what it allocates and keeps meanwhile (one thread stops about "
                        "a millisecond to load it and again to unload it; glibc only)")
    p.add_argument("--pprof", metavar="FILE",
                   help="with --track: also write its call sites as a pprof heap profile (gzipped "
                        "profile.proto: go tool pprof -top FILE): inuse = what grew")
    p.add_argument("--no-gdb", action="store_true",
                   help="the /proc figures only: no copy of the process and no gdb call for the "
                        "allocator's figures (--trim, --leaks and --track still make theirs)")
    p.add_argument("--json", metavar="FILE", help="the figures as JSON ('-' for stdout)")
    p.add_argument("--html", metavar="FILE",
                   help="also write a page (with --watch: the whole watch; else this moment)")
    p.add_argument("--watch", nargs="?", type=float, const=0.0, metavar="SECONDS",
                   help="sample the process over time (for SECONDS, or until Ctrl-C or its exit) "
                        "into a run record for `heapsight report`")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between /proc samples when watching (default 1)")
    p.add_argument("--stats-every", type=float, metavar="S",
                   help="seconds between the allocator's figures when watching (default: glibc's, "
                        "from a copy, as often as keeps the process stopped under 1%% of the "
                        "time, at least every --interval; through gdb, every 30)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where --watch saves its record (default heapsight-attach-PID.hsrun.json.gz; in a directory anyone can write, a random part is added to the name)")
    p.add_argument("--openmetrics-port", type=int, metavar="PORT",
                   help="with --watch: serve the figures to Prometheus on http://127.0.0.1:PORT/metrics")
    p.add_argument("--openmetrics-addr", default="127.0.0.1", metavar="ADDR",
                   help="the address to serve /metrics on (default 127.0.0.1)")


def execute(args) -> int:
    if args.pprof and args.track is None:
        raise HeapsightError("--pprof writes --track's call sites: add --track SECONDS")
    output.check_all([("--json", args.json, True), ("--html", args.html, False),
                      ("--pprof", args.pprof, False),
                      ("--output", args.output if args.watch is not None else None, False)])
    if args.interval <= 0 or (args.stats_every is not None and args.stats_every <= 0):
        raise HeapsightError("--interval and --stats-every must be positive")
    if (args.leaks or args.track is not None) and args.watch is not None:
        raise HeapsightError("--leaks and --track look once; run them and --watch separately")
    if args.track is not None and not 0 < args.track <= 86400:
        raise HeapsightError("--track takes the seconds to follow the process: more than 0, at "
                             "most 86400")
    if args.openmetrics_port is not None and args.watch is None:
        raise HeapsightError("--openmetrics-port serves figures while watching: add --watch")
    # an interrupt from here on ends the watch, keeping its record, or the --track, unloading
    # the library; --leaks's copy and --trim's call finish first
    if args.watch is not None or args.track is not None or args.leaks or args.trim:
        with interrupts.deferred():
            return _execute(args)
    return _execute(args)


def _execute(args) -> int:
    a = attach.inspect(args.pid, use_gdb=not args.no_gdb)
    if args.trim:
        a.trim = attach.trim(args.pid, a.allocator)
    tracked = None
    if args.track is not None:
        from heapsight.live import inject
        live = Progress(sys.stderr, "heapsight attach", elsewhere=False)
        try:
            tracked = inject.track(args.pid, a.allocator, args.track, live)
        finally:
            live.done()
        a.track = tracked.to_dict()
    if args.leaks and not (tracked is not None and tracked.interrupted):
        from heapsight.live import inject
        leaks = inject.copy_and_mark(args.pid, a.allocator)
        if tracked is not None:   # the lost blocks' sites, from the blocks --track sampled
            leaks.lost_sites = inject.lost_sites(tracked, leaks)
        a.leaks = leaks.to_dict()
    a.verdict = attach.verdict(a)
    terminal.render_attach(a, sys.stderr)
    if args.pprof:
        from heapsight.reporters import pprof
        try:
            output.write(args.pprof, pprof.encode({"sites": (a.track or {}).get("sites"),
                                                   "duration_s": (a.track or {}).get("seconds", 0)},
                                                  at="grew"), gzip=False)
            print(f"heapsight attach: pprof profile written to {args.pprof}", file=sys.stderr)
        except HeapsightError as e:   # nothing was sampled: say why there is no profile
            sys.stderr.write(f"heapsight: {e}\n")
    if args.json:
        output.write_json(args.json, a.to_dict())
    if args.watch is not None:
        return watch(args, a)
    if args.html:   # this moment: one sample of /proc with the allocator's figures
        from heapsight.live import watching
        w = watching.Watch(args.pid, a, use_gdb=False)
        w.run(0)
        report.write_html(args.html, [(f"attach {args.pid}", w.record())])
        print(f"heapsight attach: page written to {args.html}", file=sys.stderr)
    return 130 if tracked is not None and tracked.interrupted else 0


def watch(args, first: attach.Attached) -> int:
    from heapsight.live import watching
    exporter = None
    if args.openmetrics_port is not None:
        from heapsight.reporters import openmetrics
        exporter = openmetrics.serve(args.openmetrics_addr, args.openmetrics_port)
    out = args.output or output.default_name(f"heapsight-attach-{args.pid}")
    live = Progress(sys.stderr, "heapsight attach", elsewhere=False)   # a terminal only
    peak = {"rss": 0}

    def on_sample(a, rss=None):
        if exporter:
            exporter.update(a, rss)
        if rss is not None:
            peak["rss"] = max(peak["rss"], rss)
            left = f", {max(0.0, args.watch - w.elapsed()):.0f} s left" if args.watch else ""
            age = w.elapsed() - w.in_use_at
            in_use = (f", in use {human(a.in_use_bytes)}" + (f" ({age:.0f} s ago)" if age >= 1.5 else "")
                      if a.in_use_bytes is not None else "")
            live(f"{w.elapsed():.0f} s, RSS {human(rss)} (peak {human(peak['rss'])}){in_use}{left}")

    w = watching.Watch(args.pid, first, interval_s=args.interval, stats_every_s=args.stats_every,
                       use_gdb=not args.no_gdb, on_sample=on_sample)
    print(f"heapsight attach: watching {args.pid} every {args.interval:g} s"
          + (f" for {args.watch:g} s" if args.watch else " until Ctrl-C or its exit")
          + (f"; /metrics on {args.openmetrics_addr}:{args.openmetrics_port}" if exporter else ""),
          file=sys.stderr)
    try:
        w.run(args.watch or None)
    finally:
        live.done()
    with interrupts.deferred():
        doc = w.record()
        output.save_doc(out, doc)
        if args.html:
            report.write_html(args.html, [(out, doc)])
    _watch_summary(w, sys.stderr)
    said = (f"heapsight attach: {len(w.timeline)} samples over {w.timeline.duration_s:.1f} s"
            + (" (stopped by Ctrl-C)" if w.interrupted else "")
            + (" (the process ended)" if w.ended else "") + ", saved to")
    # the path whole (to copy), on a line of its own when the two do not fit on one
    width = shutil.get_terminal_size((80, 24)).columns
    print(f"{said} {out}" if len(said) + 1 + len(out) <= width else f"{said}\n  {out}",
          file=sys.stderr)
    if exporter:
        exporter.close()
    return 130 if w.interrupted else 0


def _watch_summary(w, out) -> None:
    """What the watch saw, in a few lines: RSS at its start, its end and its peak, the
    process's CPU over it, whether it still runs, and the last verdict."""
    cols = w.timeline.columns
    points = [(t, r) for t, r in zip(cols["t"], cols["rss"]) if r == r]
    if not points:
        return
    t_peak, peak = max(points, key=lambda x: x[1])
    state = "the process ended during the watch" if w.ended else "the process still runs"
    lines = [f"watched {w.timeline.duration_s:.1f} s: RSS {human(points[0][1])} -> "
             f"{human(points[-1][1])}, peak {human(peak)} at {t_peak:.0f} s; "
             f"{sum(w.cpu):.2f} s CPU; {state}",
             f"last verdict: {w.last.verdict}"]
    width = shutil.get_terminal_size((80, 24)).columns
    for line in lines:
        print(textwrap.fill(line, width, initial_indent="  ", subsequent_indent="    ",
                            break_long_words=False, break_on_hyphens=False), file=out)
