"""Run a program under heapsight and explain its memory.

Starts COMMAND with the preload library and samples it from this process; at the end
prints where the RSS went (live, waste, metadata, retained, non-heap) at the peak and at
exit, what a release at exit gave back, the call sites holding the most at the peak and
of what was never freed (estimated from allocations sampled with their stacks, with the
sampling error), and a verdict with commands to try. The summary goes to stderr so the
program's own output is untouched; the run is saved for reports. The exit code is the
program's; if it died from signal N, heapsight ends by the same signal once the run is
saved (its parent sees what it sees bare; a shell shows 128+N).

A gate turns a figure into a CI check: when the program succeeded but a figure is above
its limit, heapsight says which and exits with 90 (EXIT_GATE); a gate it cannot judge
(--fail-if-lost on a run without reachability) exits 2, never passes silently.

examples:
  heapsight run ./server --port 8080
  heapsight run --fail-if-retained 64M --fail-if-rss 1G -- ./batch_job   # in CI
  heapsight run --fail-if-lost 1M -- ./unit_tests    # leaks only, in CI
  heapsight run --json summary.json -- python3 job.py
  heapsight run --json - -- ./tool > summary.json    # its stdout goes to stderr
  MALLOC_ARENA_MAX=2 heapsight run -- ./threaded_app  # try a knob
  heapsight run --sample-bytes 64K -- ./tool          # finer call sites
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys

from heapsight import interrupts, output, phases
from heapsight.errors import EXIT_GATE, EXIT_UNJUDGED, HeapsightError
from heapsight.fmt import human, parse_size
from heapsight.live.measure import HEAP_MAP_EVERY_S, Options, measure, program_argv

USAGE = "heapsight run [options] [--] PROGRAM [ARGS...]"


def add_arguments(p) -> None:
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where to save the run record (default: heapsight-PROG.PID.hsrun.json.gz "
                        "in the current directory)")
    p.add_argument("--no-save", action="store_true", help="do not save the run record")
    p.add_argument("--json", metavar="FILE", help="write the summary as JSON to FILE ('-' for "
                   "stdout; the program's stdout then goes to stderr)")
    p.add_argument("--hz", type=float, default=100.0,
                   help="/proc/PID/status samples per second (default 100, at most 1000)")
    p.add_argument("--smaps-hz", type=float, default=4.0,
                   help="smaps_rollup samples per second (default 4), at most: a reading walks "
                        "the program's page tables under its mmap lock (8 ms at 400 MiB "
                        "resident), and with smaps' readings these walks hold it at most 1%% "
                        "of the run's time and 10 ms more")
    p.add_argument("--stats-hz", type=float, default=10.0,
                   help="readings per second of what the allocator holds from the OS, taken "
                        "from outside the program, with no call into it (glibc: each arena's "
                        "system_mem and the mmapped chunks; jemalloc, tcmalloc, mimalloc: the "
                        "mappings they made; their own statistics are read at exit; default 10)")
    p.add_argument("--no-release", action="store_true",
                   help="measure no release at exit (what the allocator's malloc_trim or "
                        "purge would give back)")
    p.add_argument("--release-in-program", action="store_true",
                   help="the program itself calls the allocator's release at exit (its RSS "
                        "drops and it waits for the release). By default the release is "
                        "measured in the exit map's copy of the program, at the same moment, "
                        "and the program keeps its memory; without a heap map "
                        "(--no-heap-map) it is made in the program")
    p.add_argument("--html", metavar="FILE",
                   help="also write the run as a self-contained HTML page (as `heapsight report`)")
    p.add_argument("--pprof", metavar="FILE",
                   help="also write the sampled call sites as a pprof heap profile (gzipped "
                        "profile.proto: go tool pprof -top FILE): alloc_objects/alloc_space "
                        "over the run, inuse_objects/inuse_space at --pprof-at")
    p.add_argument("--pprof-at", metavar="MOMENT", default="peak",
                   help="the moment of the pprof profile's inuse figures: peak (default), "
                        "exit, 'never freed', or a snapshot's label")
    p.add_argument("--verify", action="store_true",
                   help="after the run, measure each setting the findings suggest on this "
                        "program (one light run each, and one without a setting) at the "
                        "moment the verdict is about, and order the suggestions by what they "
                        "changed: '-93%% end RSS, +110%% time, measured'")
    p.add_argument("--follow", metavar="NAME",
                   help="measure the process of the program named NAME (its executable's "
                        "name, or the name it was started by: perl, python3, cc1) among those "
                        "the command starts: `heapsight run --follow perl -- sh -c 'perl x.pl; "
                        "true'` measures perl, not the shell: the first process of that name, "
                        "from its start to its end. 'NAME WORD' measures the first whose first "
                        "argument is WORD: a child with the command's own name, as git gc's "
                        "--follow 'git pack-objects'. By default the process started is "
                        "measured, and a child that held much more memory is named, with this "
                        "option to follow it")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="at the end, say where heapsight's time went: its start-up, the "
                        "program's run, the exit's copy, the capture, the summary (and the "
                        "symbolizer's share of it), the record and each output")
    p.add_argument("-q", "--quiet", action="store_true", help="no terminal summary (with --no-save and no other output "
                   "only the --fail-if gates read the run: the program is then neither sampled "
                   "nor copied at exit, nor trimmed; --fail-if-lost still copies it at exit; "
                   "with no gate either, only its exit status is passed on: no summary is "
                   "made)")
    p.add_argument("--no-heap-map", action="store_true",
                   help="do not map the heap page by page at exit and at snapshots (a copy "
                        "of the program walks it, measures what a release gives back and "
                        "marks which blocks the program can still reach: lost or kept; "
                        "the pinners are named from it)")
    p.add_argument("--sample-bytes", metavar="SIZE", type=size_arg, default=None,
                   help="call sites: sample allocations once per SIZE bytes allocated on "
                        "average, with their stacks (default: adaptive, from 16K, doubling as "
                        "the sampled blocks still live pass 2,048, up to 512K, coarser only "
                        "when the profile's room runs low; SIZE sets that 512K (it starts "
                        "32 times finer); "
                        "smaller is finer and costs more; 0: off; at least 64). The summary "
                        "names the top call sites at the peak and of the bytes never freed, "
                        "with their sampling error")
    snaps = p.add_argument_group("snapshots (the split at moments you choose; in the summary, "
                                 "JSON, page)",
                                 "Each snapshot's heap map is a copy of the program, made by the "
                                 "program's own thread at its next allocator call (a program "
                                 "that makes none until later still had that heap then); "
                                 "heapsight runs no thread in the program.")
    snaps.add_argument("--snapshot-on", metavar="SIGNAL", type=signal_arg,
                       help="take one each time heapsight gets SIGNAL (e.g. USR1: kill -USR1 "
                            "<heapsight's pid>); the program never sees it")
    snaps.add_argument("--at", metavar="T[,T...]", type=times_arg, default=(),
                       help="take one at these seconds from the start")
    snaps.add_argument("--every", metavar="T", type=every_arg, default=0.0,
                       help="take one every T seconds (heap maps at most every "
                            f"{HEAP_MAP_EVERY_S:g} s: each copies the program)")
    snaps.add_argument("--release-at-snapshot", action="store_true",
                       help="at each snapshot also call the allocator's release in the program "
                            "(through gdb) and measure it: this changes the program's state")
    p.add_argument("--openmetrics-port", type=port_arg, metavar="PORT",
                   help="serve the latest split to Prometheus on http://127.0.0.1:PORT/metrics "
                        "while the program runs (heapsight_memory_bytes{kind=...}); 0: any free "
                        "port, which heapsight prints")
    gates = p.add_argument_group("CI gates (exit 90 when a figure is above its limit; SIZE: "
                                 "512M, 2G)")
    gates.add_argument("--fail-if-retained", metavar="SIZE", type=size_arg,
                       help="memory freed but kept by the allocator at exit")
    gates.add_argument("--fail-if-rss", metavar="SIZE", type=size_arg, help="peak RSS")
    gates.add_argument("--fail-if-held", metavar="SIZE", type=size_arg,
                       help="held RSS: the RSS through the stretch the program held memory "
                            "beyond its live bytes, else the one it sat at longest (what a "
                            "service idles at)")
    gates.add_argument("--fail-if-never-freed", metavar="SIZE", type=size_arg,
                       help="bytes still allocated at exit (never freed): leaks and data kept "
                            "until exit alike")
    gates.add_argument("--fail-if-lost", metavar="SIZE", type=size_arg,
                       help="bytes definitely and indirectly lost at exit (no pointer reaches "
                            "them, as memcheck counts): leaks only. A run whose reachability "
                            "was not checked (--no-heap-map, HEAPSIGHT_REACH=0) exits 2")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND [ARGS...]",
                   help="the program and its arguments: everything from the program's name on "
                        "belongs to it ('--' before it is optional)")


# what the library accepts for HEAPSIGHT_SAMPLE_BYTES (native/src/options.c), 0 aside
SAMPLE_BYTES_MIN, SAMPLE_BYTES_MAX = 64, 1 << 40


def size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


RESERVED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGKILL,
            signal.SIGSTOP}
# signals that report a fault in heapsight itself (a blocked one would hide it), or stop and
# continue it: never a request for a snapshot
NOT_REQUESTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP,
                signal.SIGSYS, signal.SIGABRT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU,
                signal.SIGCONT, signal.SIGPIPE, signal.SIGXCPU, signal.SIGXFSZ}


def signal_arg(text: str) -> int:
    name = text.upper()
    try:
        sig = signal.Signals(int(name)) if name.isdigit() else signal.Signals[
            name if name.startswith("SIG") else "SIG" + name]
    except (KeyError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a signal: give a name such as USR1") from e
    if sig in RESERVED:
        raise argparse.ArgumentTypeError(f"{sig.name} is taken (heapsight passes it to the program "
                                         "or needs it): use USR1 or USR2")
    if sig in NOT_REQUESTS:
        raise argparse.ArgumentTypeError(f"{sig.name} reports a fault, or stops or continues a "
                                         "process: use USR1 or USR2")
    return int(sig)


def times_arg(text: str) -> tuple:
    try:
        out = tuple(sorted(float(x) for x in text.split(",") if x.strip()))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds, e.g. 0.5,2,10") from e
    if not out or not all(math.isfinite(t) and t >= 0 for t in out):
        raise argparse.ArgumentTypeError(f"{text!r}: give finite seconds of 0 or more, e.g. 0.5,2,10")
    return out


def every_arg(text: str) -> float:
    try:
        t = float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds, e.g. 0.5") from e
    if not (math.isfinite(t) and t > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number of seconds above 0, "
                                         "e.g. 0.5")
    return t


def port_arg(text: str) -> int:
    try:
        port = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number: give 1 to 65535, or 0 "
                                         "for any free port") from e
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is out of range: give 1 to 65535, or 0 for any "
                                         "free port")
    return port


def _held_rss(summary) -> int:
    from heapsight import moments   # (numpy's: imported while the program ran)
    return moments.rss_of(summary.moments, "held") or 0


GATES = ("fail_if_retained", "fail_if_rss", "fail_if_held", "fail_if_never_freed",
         "fail_if_lost")


def gate_failures(args, summary) -> list:
    """The gates the run failed: (what, figure, limit) for each figure above its limit."""
    figures = (("retained at exit", args.fail_if_retained,
                summary.final.retained_bytes if summary.final else 0),
               ("peak RSS", args.fail_if_rss, summary.peak_rss_bytes),
               ("held RSS", args.fail_if_held, _held_rss(summary)),
               ("never freed at exit", args.fail_if_never_freed,
                summary.final.live_bytes if summary.final else 0))
    failed = [(what, value, limit) for what, limit, value in figures
              if limit is not None and value > limit]
    if args.fail_if_lost is not None:
        lost = lost_at_exit(summary)
        if lost is not None and lost > args.fail_if_lost:
            failed.append(("lost at exit", lost, args.fail_if_lost))
    return failed


def lost_at_exit(summary) -> int | None:
    """Definitely and indirectly lost bytes at exit; None when reachability was not marked."""
    from heapsight import diffing
    return diffing.figure({"heapmaps": list(summary.heapmaps)}, "lost")


def unjudged_lost_gate(summary) -> str | None:
    """Why --fail-if-lost cannot be judged on this run, or None when it can."""
    if lost_at_exit(summary) is not None:
        return None
    exit_map = next((m for m in summary.heapmaps if m.get("moment") == "exit"), None)
    return ((exit_map or {}).get("reach") or {}).get("why") or (
        "no heap map at exit" if exit_map is None else "reachability not marked")


def save_somewhere(path: str, summary, timeline) -> str | None:
    """The record at path, or, when it cannot be written there (a full disk, a directory
    gone), in a new private directory under $TMPDIR, saying so: a measured run is never
    lost to its output. The path written, or None when nowhere would take it."""
    from heapsight import record   # (imported while the program ran)
    try:
        return record.save(path, summary, timeline)
    except HeapsightError as e:
        first = e.message
    import tempfile
    try:
        place = os.path.join(tempfile.mkdtemp(prefix="heapsight-"), os.path.basename(path))
        saved = record.save(place, summary, timeline)
    except (HeapsightError, OSError) as e:
        sys.stderr.write(f"heapsight: {first}; nor in $TMPDIR ({getattr(e, 'message', e)}): "
                         "the run was not saved\n")
        return None
    sys.stderr.write(f"heapsight: {first}; the run is saved to {saved} instead\n")
    return saved


def _verified(argv: list, summary, opts: Options):
    """The summary with its suggested settings measured on the program (live/verify.py)."""
    from heapsight.live import verify
    from heapsight.progress import Progress
    if not verify.candidates(summary):
        sys.stderr.write("heapsight: --verify: the findings suggest no setting to measure\n")
        return summary
    progress = Progress(sys.stderr, "heapsight run --verify")
    try:
        results = verify.measure_all(argv, summary, opts, progress)
    finally:
        progress.done()
    return verify.apply(summary, results)


def default_output(argv: list, pid: int) -> str:
    name = os.path.basename(argv[0]) or "program"
    return output.default_name(f"heapsight-{name}.{pid}")


def validate(args) -> None:
    if not (1 <= args.hz <= 1000):
        raise HeapsightError(f"--hz {args.hz:g} is out of range: give 1 to 1000 samples per second")
    if not (0 <= args.smaps_hz <= 100):
        raise HeapsightError(f"--smaps-hz {args.smaps_hz:g} is out of range: give 0 to 100")
    if args.release_at_snapshot and not (args.snapshot_on or args.at or args.every):
        raise HeapsightError("--release-at-snapshot: no snapshot asked for (add --snapshot-on, "
                             "--at or --every)")
    if args.sample_bytes is not None and args.sample_bytes and not (
            SAMPLE_BYTES_MIN <= args.sample_bytes <= SAMPLE_BYTES_MAX):
        raise HeapsightError(f"--sample-bytes {args.sample_bytes}: give 0 (off) or a size from "
                             f"{SAMPLE_BYTES_MIN} bytes to 1T (e.g. 64K; the default is 512K)")
    if args.no_release and args.release_in_program:
        raise HeapsightError("--no-release and --release-in-program ask for opposite things: "
                             "give one of them")
    if not (0 <= args.stats_hz <= 1000):
        raise HeapsightError(f"--stats-hz {args.stats_hz:g} is out of range: give 0 to 1000")
    check_outputs(args)


def check_outputs(args) -> None:
    """Every output path, before the program runs; no two of them the same file."""
    output.check_all([("--json", args.json, True),
                      ("--output", None if args.no_save else args.output, False),
                      ("--html", args.html, False), ("--pprof", args.pprof, False)])
    if args.pprof and args.sample_bytes == 0:
        raise HeapsightError("--pprof writes the sampled call sites, and --sample-bytes 0 "
                             "turns sampling off: drop one of them")


def execute(args) -> int:
    validate(args)
    argv = program_argv(args.command, "run")
    keep = not (args.quiet and args.no_save) or bool(args.json or args.html or args.pprof)
    # nothing shows or saves call sites, heap maps or a release (-q --no-save, no output, no
    # exporter: only the gates read the run): the program is not sampled, copied or trimmed,
    # so it pays nothing for them
    # (--fail-if-lost needs the exit's heap map: the program is then copied at exit)
    bare = not keep and args.openmetrics_port is None and args.fail_if_lost is None
    sample_bytes = 0 if args.sample_bytes is None and bare else args.sample_bytes
    opts = Options(hz=args.hz, smaps_hz=args.smaps_hz, stats_hz=args.stats_hz,
                   release=not (args.no_release or bare),
                   release_in_program=args.release_in_program, follow=args.follow or "",
                   keep=keep,
                   warn=not args.quiet,
                   snapshot_signal=args.snapshot_on, snapshot_at=args.at,
                   snapshot_every_s=args.every, release_at_snapshot=args.release_at_snapshot,
                   sample_bytes=sample_bytes, heap_maps=not (args.no_heap_map or bare),
                   stdout=sys.stderr if args.json == "-" else None,
                   warm=tuple(m for m, wanted in (("heapsight.reporters.terminal", not args.quiet),
                                                  ("heapsight.report", args.html),
                                                  ("heapsight.reporters.pprof", args.pprof))
                              if wanted))
    exporter = None
    if args.openmetrics_port is not None:
        from heapsight.reporters import openmetrics
        exporter = openmetrics.serve("127.0.0.1", args.openmetrics_port)
        if args.openmetrics_port == 0:
            sys.stderr.write(f"heapsight: serving metrics on http://127.0.0.1:{exporter.port}"
                             "/metrics\n")
        opts = opts.replace(exporter=exporter)
    # nothing reads the run but the program's exit status (as bare, and no gate, --verify or
    # --follow, which says when its program never ran): no summary is made, and neither the
    # analysis nor numpy is imported
    if bare and not (args.verify or args.follow) and all(getattr(args, g) is None for g in GATES):
        ended, _ = measure(argv, opts.replace(summarize=False))
        if args.verbose:
            sys.stderr.write(phases.render(phases.report()))
        if ended.exit_signal:
            interrupts.program_signal = ended.exit_signal
        return ended.exit_code
    # An interrupt after the program ended waits until the run is saved (then ends heapsight).
    with interrupts.deferred():
        summary, timeline = measure(argv, opts)
        if exporter is not None:
            exporter.close()
        if args.verify and not summary.interrupted:
            with phases.one("--verify's runs"):
                summary = _verified(argv, summary, opts)
        out = None
        if not args.no_save:
            out = save_somewhere(args.output or default_output(argv, summary.started_pid),
                                 summary, timeline)
            phases.mark("the record saved")
        if args.json:
            output.write_json(args.json, summary.to_dict())
        if args.html:
            from heapsight import record, report
            report.write_html(args.html, [(out or "this run", record.to_json_dict(summary, timeline))])
        if args.pprof:
            from heapsight.reporters import pprof
            try:
                output.write(args.pprof, pprof.encode(summary.to_dict(), args.pprof_at), gzip=False)
            except HeapsightError as e:   # the run is saved: say why there is no profile
                sys.stderr.write(f"heapsight: {e}\n")
        if args.json or args.html or args.pprof:
            phases.mark("--json, --html, --pprof written")
    if not args.quiet:
        from heapsight.reporters import terminal
        terminal.render_run(summary, sys.stderr, saved_to=out)
        if args.html:
            sys.stderr.write(f"heapsight: page written to {args.html}\n")
        phases.mark("the terminal summary")
    if args.verbose:
        sys.stderr.write(phases.render(phases.report()))
    # a --follow whose program never ran: what was asked was not measured (exit 2 where the
    # program succeeded, as a gate that cannot be judged)
    missed = bool(args.follow and summary.pid == summary.started_pid
                  and summary.preload != "active")
    if missed:
        seen = ", ".join(sorted({c["name"] for c in summary.children})) or "none seen"
        sys.stderr.write(f"heapsight: error: --follow {args.follow}: no process of that name ran "
                         f"(the processes the command started: {seen}); the figures are "
                         f"{os.path.basename(argv[0])}'s, from /proc alone\n")
    failed = gate_failures(args, summary)
    unjudged = unjudged_lost_gate(summary) if args.fail_if_lost is not None else None
    if unjudged and summary.exit_code == 0:
        sys.stderr.write(f"heapsight: gate not judged: --fail-if-lost needs which blocks are "
                         f"reachable at exit, and this run has none ({unjudged}); run with "
                         "the heap map on (the default), or gate on --fail-if-never-freed\n")
    for what, value, limit in failed:
        sys.stderr.write(f"heapsight: gate failed: {what} {human(value)} is above the limit "
                         f"{human(limit)}\n")
    if failed and summary.exit_code == 0:
        return EXIT_GATE
    if (unjudged or missed) and summary.exit_code == 0:
        return EXIT_UNJUDGED
    if summary.exit_signal:   # the program died of a signal: so does heapsight, once done
        interrupts.program_signal = summary.exit_signal
    return summary.exit_code


