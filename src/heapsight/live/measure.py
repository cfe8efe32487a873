"""One measured run: start the program under the preload library, sample it from this
process until it ends, collect the library's exit figures, take the capture (capture.py:
what the analysis reads, kept in the record) and summarize it (summary.py), so run,
compare and lab all measure the same way.
"""

from __future__ import annotations

import math
import os
import signal
import sys

# What the program's start needs, and the sampler: no numpy, nothing of the analysis. The
# program starts as soon as these are in; the modules the end needs (END_MODULES, with
# numpy: 100-200 ms) are imported meanwhile, on a thread of heapsight's (_Meanwhile).
from heapsight import elf, interrupts, native, phases
from heapsight.live import heapmaps, launch, procfs, readloop
from heapsight.fmt import printable
from heapsight.progress import say
from heapsight.errors import HeapsightError
from heapsight.live.sampler import Sampler, add_exit_begun_row
from heapsight.timeline import IDX
from heapsight.live.segment import Segment, segment_dir

END_MODULES = ("numpy", "heapsight.analysis", "heapsight.capture", "heapsight.heapmap",
               "heapsight.remedies", "heapsight.summary")

EXIT_NOT_FOUND = 127


def program_argv(words: list, command: str) -> list:
    """The program's argv from what follows the options ('--' before it is optional)."""
    argv = list(words[1:] if words[:1] == ["--"] else words)
    if not argv:
        raise HeapsightError(f"no program given: heapsight {command} [options] [--] PROGRAM [ARGS...]")
    return argv


def resolve_command(argv: list) -> str:
    prog = argv[0]
    import shutil
    path = prog if "/" in prog else shutil.which(prog)
    if path is None or not os.path.exists(path):
        hint = ("check the name, or give its path, e.g. ./" + printable(prog) if "/" not in prog
                else "check the path")
        raise HeapsightError(f"command not found: {printable(prog)} ({hint})", EXIT_NOT_FOUND)
    if os.path.isdir(path):
        raise HeapsightError(f"{printable(path)} is a directory: give the program to run, e.g. "
                             f"`heapsight run -- {printable(path.rstrip('/'))}/PROGRAM`",
                             EXIT_NOT_FOUND)
    if not os.access(path, os.X_OK):
        raise HeapsightError(f"not executable: {printable(path)} (chmod +x it, or run it through its "
                             "interpreter, e.g. `heapsight run -- python3 script.py`)",
                             EXIT_NOT_FOUND)
    return path


def child_env(segment: Segment | None, opts: "Options") -> dict:
    env = dict(os.environ)
    env.update(opts.extra_env)
    if segment is not None:
        libs = [str(native.preload_library()), *opts.extra_preload]
        if env.get("LD_PRELOAD"):
            libs.append(env["LD_PRELOAD"])
        env["LD_PRELOAD"] = ":".join(libs)
        env["HEAPSIGHT_SEGMENT"] = segment.path
        if interrupts.START_INTERNAL_DEFAULT:   # glibc's signals 32 and 33: see preload.c
            env["HEAPSIGHT_INTERNAL_SIGNALS"] = ",".join(map(str, interrupts.START_INTERNAL_DEFAULT))
        if opts.heap_maps and (opts.snapshot_signal or opts.snapshot_at or opts.snapshot_every_s):
            # maps while the program runs: its threads look for a request (probe.c)
            env["HEAPSIGHT_MAPS_WHILE_RUNNING"] = "1"
        if not (opts.heap_maps and opts.reach):
            # no copy will mark reachability: under another allocator than glibc the hooks
            # then keep no record of where each block starts (it costs each call)
            env["HEAPSIGHT_REACH"] = "0"
        if opts.follow:
            env["HEAPSIGHT_FOLLOW"] = opts.follow
        env["HEAPSIGHT_RELEASE_AT_EXIT"] = ("1" if release_in_program(opts) else
                                            "copy" if opts.release else "0")
        if opts.sample_bytes is not None:
            env["HEAPSIGHT_SAMPLE_BYTES"] = str(opts.sample_bytes)
    return env


# How to measure one run: each option and its default (Options)
OPTIONS = dict(
    hz=100.0,
    smaps_hz=4.0,
    stats_hz=10.0,
    release=True,             # measure what the allocator's release gives back at exit
    release_in_program=False,  # in the program itself (its RSS drops, it waits for it),
                              # not in the exit map's copy
    extra_env={},
    extra_preload=(),         # libraries to preload after heapsight's (an allocator)
    stdout=None,              # where the program's stdout goes (None: ours)
    stderr=None,
    warn=True,                # say on stderr when a static program limits the figures
    snapshot_signal=None,     # a signal to heapsight takes a snapshot
    snapshot_at=(),           # seconds from the start
    snapshot_every_s=0.0,
    release_at_snapshot=False,  # call the allocator's release there (through gdb)
    exporter=None,            # reporters.openmetrics.Exporter: the latest split
    sample_bytes=None,        # call sites: the sampling mean (0: off; None: the library's
                              # default, or HEAPSIGHT_SAMPLE_BYTES as set)
    heap_maps=True,           # map the heap at exit and at each snapshot
    reach=True,               # mark which blocks are reachable in those maps (compare:
                              # off, so that no configuration pays for a record of block
                              # starts it does not use)
    follow="",                # the program whose process is measured (its image name), ""
                              # for the first one started
    keep=True,                # something shows or saves the summary: names for the call
                              # sites, and the capture for the record (run -q --no-save
                              # with no other output: neither)
    warm=(),                  # modules the end will import (its reporters): imported
                              # while the program runs
    summarize=True,           # False: nothing reads the run but its exit status (run -q
                              # --no-save with no output, gate, --follow or --verify): no
                              # summary, and none of the analysis' modules imported
)


class Options:
    """How to measure one run (shared by run and compare): each of OPTIONS given by name or
    left at its default; opts.replace(name=value) makes another. (A plain class: a dataclass
    would have the program wait for the dataclasses module, 10-25 ms here, before it
    starts.)"""

    __slots__ = tuple(OPTIONS)

    def __init__(self, **given) -> None:
        unknown = set(given) - set(OPTIONS)
        if unknown:
            raise TypeError(f"Options has no {', '.join(sorted(unknown))}")
        for k, v in OPTIONS.items():
            object.__setattr__(self, k, given[k] if k in given else
                               (dict(v) if isinstance(v, dict) else v))

    def __setattr__(self, name, value):
        raise AttributeError("Options are not changed: opts.replace(name=value) makes another")

    def replace(self, **changes) -> "Options":
        return Options(**{**{k: getattr(self, k) for k in OPTIONS}, **changes})

    def __repr__(self) -> str:
        return "Options(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in OPTIONS) + ")"


def release_in_program(opts: Options) -> bool:
    """Whether the program itself calls the allocator's release at exit. By default the
    release is measured in the exit map's copy (a fork()ed copy of the program, at the same
    moment): the program keeps its RSS and does not wait for the release. In the program
    when asked, or when no copy is made (--no-heap-map); and for mimalloc, whose mi_collect
    acts on the calling thread's own heap, which the copy cannot reach (the library decides:
    HEAPSIGHT_RELEASE_AT_EXIT=copy)."""
    return opts.release and (opts.release_in_program or not opts.heap_maps)


def _samples(opts: Options) -> bool:
    """Whether the library will sample call sites (what it reads: native/src/options.c)."""
    if opts.sample_bytes is not None:
        return opts.sample_bytes != 0
    v = {**os.environ, **opts.extra_env}.get("HEAPSIGHT_SAMPLE_BYTES", "")
    return not (v.isdigit() and int(v) == 0)


def new_segment(prog: str, opts: Options) -> Segment | None:
    """The run's stats segment; None, said in one line, when /dev/shm has no room for it
    (the program then runs without the library: /proc figures only)."""
    try:
        seg = Segment(profile=_samples(opts))
        if seg.room_note and opts.warn:
            print(f"heapsight: {seg.room_note}", file=sys.stderr)
        return seg
    except OSError as e:
        if opts.warn:
            print(f"heapsight: no room for the stats segment in {segment_dir()} ({e.strerror}): "
                  f"running {prog} without heapsight's library, /proc figures only (free or "
                  "enlarge /dev/shm for the heap split)", file=sys.stderr)
        return None


class _Callbacks:
    """What the sampler calls while the program runs: a signal meant for the program, a
    snapshot (a heap map of the moment and, if asked, a release) and the latest split for
    Prometheus. proc is set once the program has started."""

    def __init__(self, argv: list, opts: "Options", segment) -> None:
        self.argv, self.opts, self.segment, self.proc = argv, opts, segment, None
        self.forwarded = []    # signals passed on to the program
        self.releases = {}     # (label, t) -> the release measured at that snapshot
        self.maps_asked = {}   # heap map number -> its snapshot's moment name
        self.maps_last, self.maps_said = -math.inf, False   # at most every HEAP_MAP_EVERY_S
        self.walking_said = False   # a snapshot came while a copy was being walked

    def on_signal(self, info) -> None:
        """A signal for the program came to heapsight while it ran (see interrupts.py)."""
        if info.si_signo not in interrupts.PASSED_ON:   # those do not interrupt the run
            self.forwarded.append(info.si_signo)
        if not interrupts.program_received(info, self.proc.pid):
            try:
                self.proc.send_signal(info.si_signo)
            except ProcessLookupError:
                pass

    def on_snapshot(self, label: str, t: float) -> None:
        """A heap map of the moment (taken by the library in a fork()ed copy; waited for
        a little, so that the copy is of this moment and is taken before a release); with
        --release-at-snapshot, the allocator's release, called in the program through gdb,
        with RSS before and after."""
        opts, segment, proc = self.opts, self.segment, self.proc
        wanted = opts.heap_maps and segment is not None and segment.attached()
        # --every's snapshots (the sampler's labels) get a map at most every HEAP_MAP_EVERY_S:
        # each copies the program; those asked for one by one (a signal, --at, the program's
        # call) always get theirs
        every = label.startswith("--every ")
        # (less a tenth: the snapshots of --every 0.1 land a tick early or late)
        if wanted and every and t - self.maps_last < 0.9 * HEAP_MAP_EVERY_S:
            if opts.warn and not self.maps_said:
                say(f"--every {opts.snapshot_every_s:g}: heap maps are taken at most every "
                    f"{HEAP_MAP_EVERY_S:g} s (each copies the program); the snapshots between "
                    "have none", sys.stderr)
            self.maps_said = True
        elif wanted and every and (heapmaps.request_pending(segment)
                                   or heapmaps.copy_walking(segment)):
            # one copy at a time: copies walked side by side would take the machine from
            # the program (each walks and marks its whole heap); a copy asked for and not
            # yet made is one (on a loaded machine the program's thread made the last one
            # 100 ms after it was asked, and the next 17 ms after that, while the first was
            # walked)
            if opts.warn and not self.walking_said:
                say(f"snapshot {printable(label)} at {t:.2f} s has no heap map: the last one's "
                    "copy was still being walked (one at a time; the snapshots of --every "
                    "meanwhile have none)", sys.stderr)
            self.walking_said = True
        elif wanted:
            # one asked for by itself waits for the copy being walked, if any (the program
            # that asked waits in heapsight_snapshot() meanwhile)
            heapmaps.wait_copies(segment, MAP_WAIT_S)
            self.maps_last = t if every else self.maps_last
            n = len(self.maps_asked) + 1
            self.maps_asked[n] = f"snapshot: {label}"
            heapmaps.request(segment, n)
            readloop.poke(segment)   # each thread's next allocator call looks for it
            if opts.release_at_snapshot:
                heapmaps.wait_ack(segment, n, timeout_s=MAP_WAIT_S, alive=lambda: proc.poll() is None,
                                 again=lambda: readloop.poke(segment))
        if opts.release_at_snapshot and segment is not None and segment.attached():
            try:
                from heapsight.live import attach   # gdb's caller: only for a release
                self.releases[(label, t)] = attach.trim(proc.pid, segment.allocator_name())
            except HeapsightError as e:
                self.releases[(label, t)] = {"error": e.message}

    def on_tick(self, row, mapped: float = math.nan) -> None:
        """The latest sample's split, for Prometheus (--openmetrics-port), bounded by what the
        allocator held at its latest reading (mapped), as the summary bounds each sample:
        without it a python3 service's 27 MiB of objects in pymalloc's arenas were exported
        as retained."""
        segment = self.segment
        if self.opts.exporter is None or segment is None or not segment.attached():
            return
        from heapsight import analysis
        from heapsight.summary import _num
        v = {c: row[i] for c, i in IDX.items()}
        if math.isnan(v["rss"]):
            return
        b = analysis.breakdown(v["t"], int(v["rss"]), int(_num(v["anon"], v["rss"])),
                               segment.get("start_anon_bytes"), int(_num(v["live_req"])),
                               int(_num(v["live_usable"])), int(_num(v["n_alloc"]) - _num(v["n_free"])),
                               segment.allocator_name(), mapped)
        self.opts.exporter.update_run(self.proc.pid, self.argv[0], segment.allocator_name(), b)


class _Meanwhile:
    """What heapsight prepares for the end while the program runs, on a thread of its own
    (the program is not touched): first the modules the end will import (the analysis and
    numpy, 100-200 ms, then the terminal's reporter), so that the program starts without
    waiting for them; then the sampled stacks' addresses sent to the symbolizer, read from
    the segment's file every PREFETCH_FIRST_S, then every quarter of the time run so far
    (at most PREFETCH_MAX_S), so that the names asked for at the end are mostly answered
    already (python3 building dicts: 0.26 s of waiting for them at the end, 0.01-0.1 s
    now). Only addresses not sent before are sent; a stack read torn while the library
    writes it at worst asks for an address no site uses. The main thread samples
    meanwhile (in C, or in Python ticks that need none of those modules: while this thread
    imports, a tick waits at most IMPORT_SWITCH_S for the interpreter's lock); it joins this
    one as the program ends, before the analysis."""

    def __init__(self, segment, modules: tuple, names: bool, program: str = "") -> None:
        import threading
        import time
        self.segment, self.modules, self.names, self.program = segment, modules, names, program
        self.done, self.t0 = threading.Event(), time.monotonic()
        self.thread = threading.Thread(target=self._run, name="heapsight-meanwhile", daemon=True)

    def start(self) -> None:
        """Starts it (after the sampler's first tick: the program's first moments first)."""
        if self.thread.ident is None:
            self.thread.start()

    def _run(self) -> None:
        import gc
        import importlib
        import time
        if self.names:   # the tool reads libc's debug information meanwhile
            from heapsight import symbolize
            # and the program's own file (its symbols, its debug information; a script's
            # interpreter), as its stacks name it: unless an earlier run kept their answers
            # (symbolize.warm_up)
            run = self.program and os.path.realpath(elf.script_interpreter(self.program)
                                                    or self.program)
            symbolize.warm_up(_libc_lookup() + ([(run, 0)] if run and elf.is_elf(run) else []))
        # The sampler's ticks take the interpreter's lock between their reads: while this
        # thread imports, it is handed over within IMPORT_SWITCH_S, not the default 5 ms
        # (a tick kept waiting would sample the program late: the peak's moment missed)
        switch = sys.getswitchinterval()
        sys.setswitchinterval(IMPORT_SWITCH_S)
        # The modules' objects (100k and more: numpy's, the analysis') live as long as
        # heapsight: no cycle collection while they are made (it examined each one as it
        # came, 15-17 ms of a run's CPU beside the program), and once made, none again
        # (frozen: every object then is left out of later collections; cycles among them
        # would go uncollected, and the process is young: its modules, its options, the
        # sampler's first state).
        paused = gc.isenabled() and any(m not in sys.modules for m in self.modules)
        if paused:   # (a second run in the process, compare's or lab's, imports nothing)
            gc.disable()
        try:
            for m in self.modules:   # the end imports whichever failed here (and says why)
                try:
                    importlib.import_module(m)
                except Exception:
                    pass
        finally:
            sys.setswitchinterval(switch)
            if paused:
                gc.freeze()
                gc.enable()
        if not self.names:
            return
        from heapsight import sites
        wait = PREFETCH_FIRST_S
        while not self.done.wait(wait):
            try:
                prof = self.segment.profile()
                if prof is not None and len(prof.allocs):
                    mapped = prof.mapped()
                    symbolize.prefetch(sites.lookups(prof) + (
                        sites.lookups(mapped) if mapped is not None else []))
            except Exception:   # it only saves time: the end does whatever is left
                pass
            run_s = time.monotonic() - self.t0
            wait = min(PREFETCH_MAX_S, max(PREFETCH_FIRST_S, run_s / 4))

    def stop(self) -> None:
        self.start()   # (a program gone before the first tick: the end needs the modules)
        self.done.set()
        self.thread.join()


PREFETCH_FIRST_S, PREFETCH_MAX_S = 0.1, 5.0
IMPORT_SWITCH_S = 0.0002


def _libc_lookup() -> list:
    """[(libc as this process's loader named it, the offset of malloc in it)]: asked first,
    it has the symbolizer read libc's debug information (libc6-dbg's: 80-100 ms) while the
    program runs; the program's loader names libc the same way (the same cache), and its
    sampled stacks all pass through libc. [] when it cannot be told."""
    import ctypes

    class _DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
    try:
        libc = ctypes.CDLL(None)
        at = ctypes.cast(libc.malloc, ctypes.c_void_p).value
        info = _DlInfo()
        if not libc.dladdr(ctypes.c_void_p(at), ctypes.byref(info)) or not info.fname:
            return []
        return [(os.fsdecode(info.fname), at - info.fbase)]
    except (OSError, AttributeError, TypeError):
        return []


class Ended:
    """How a run that nothing reads ended (Options.summarize off): what heapsight exits with."""

    __slots__ = ("exit_code", "exit_signal")

    def __init__(self, returncode: int) -> None:
        self.exit_code = 128 - returncode if returncode < 0 else returncode
        self.exit_signal = -returncode if returncode < 0 else 0


def measure(argv: list, opts: Options) -> tuple:
    """Run argv once under the library and the sampler: (Summary, Timeline), (Ended,
    Timeline) when opts.summarize is off. The steps:
    the segment, the program started with the signals it should have, sampled until it
    ends, then what it left (the sampled allocations, the heap maps, the segment's figures)
    captured and summarized."""
    path = resolve_command(argv)
    linkage = elf.linkage(path)
    if linkage == "static" and opts.warn:
        print(f"heapsight: {argv[0]} is statically linked: the preload library cannot reach its "
              "malloc. Going on with /proc figures only (RSS, anonymous, file-backed).",
              file=sys.stderr)
    segment = None if linkage == "static" else new_segment(argv[0], opts)
    if segment is not None and opts.heap_maps:
        heapmaps.at_exit(segment)
    cb = _Callbacks(argv, opts, segment)
    # Blocked here, taken by the sampler; the program starts with the signal state heapsight
    # was started with (launch.py). The snapshot signal is ignored as well as blocked: one
    # that comes after the program ended, while the run is saved, must not end heapsight.
    extra = {opts.snapshot_signal} if opts.snapshot_signal else set()
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, interrupts.WATCHED | interrupts.PASSED_ON |
                                      {signal.SIGCHLD} | extra)
    if opts.snapshot_signal:
        signal.signal(opts.snapshot_signal, signal.SIG_IGN)
    interrupts.drain(interrupts.PASSED_ON)   # sent before the program was there: not its
    try:
        phases.mark("start-up: Python, imports, options, the segment")
        try:
            cb.proc = proc = launch.start(path, argv, child_env(segment, opts), stdout=opts.stdout,
                                          stderr=opts.stderr)
        except OSError as e:
            raise HeapsightError(f"cannot start {argv[0]}: {e.strerror}", EXIT_NOT_FOUND) from e
        # names are asked only for sampled stacks
        names = opts.keep and _samples(opts) and segment is not None
        meanwhile = _Meanwhile(segment, END_MODULES + tuple(opts.warm) if opts.summarize else (),
                               names, path)
        try:
            sampler = Sampler(proc, segment, hz=opts.hz, smaps_hz=opts.smaps_hz,
                              on_signal=cb.on_signal, snapshot_signal=opts.snapshot_signal,
                              snapshot_at=tuple(opts.snapshot_at),
                              snapshot_every_s=opts.snapshot_every_s, on_snapshot=cb.on_snapshot,
                              on_tick=cb.on_tick if opts.exporter is not None else None,
                              stats_hz=opts.stats_hz, on_first_tick=meanwhile.start)
            timeline = sampler.run()
        finally:
            phases.mark("the program's run, sampled")
            meanwhile.stop()
            phases.mark("the end's imports, left when the program ended")
        if opts.summarize:
            add_exit_begun_row(timeline, segment, sampler.segment_resident)
        if opts.snapshot_signal:
            interrupts.drain({opts.snapshot_signal})
        interrupted = bool(cb.forwarded) or bool(interrupts.drain())
        if not opts.summarize:
            return Ended(proc.returncode), timeline
        summary = _after_the_run(argv, opts, segment, linkage, proc, timeline, cb)
        import dataclasses
        return dataclasses.replace(summary, interrupted=interrupted), timeline
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        if segment is not None:
            collect_maps(segment)   # none left beside a segment that is gone
            segment.close()


def _after_the_run(argv, opts, segment, linkage, proc, timeline, cb: _Callbacks):
    """What the ended program left, captured (for the record) and summarized: the sampled
    allocations, copied out before the segment file goes; the heap maps, snapshots' first;
    the segment's figures, read once."""
    from heapsight import capture, heapmap, remedies
    from heapsight.summary import summarize
    attached = segment is not None and segment.attached()
    prof = segment.profile() if attached else None
    if attached:
        heapmaps.wait_exit_map(segment)
        # a snapshot's, made at the program's last calls (not one that is ending: the exit's,
        # its map written, took 37-48 ms to free a large program's page tables)
        heapmaps.wait_copies(segment, heapmaps.EXIT_MAP_WAIT_S)
    collected = collect_maps(segment)
    if attached and (segment.get("forks") or segment.get("foreign_attaches")):
        # the descendants that loaded the library and run on without it (heapsight's copies,
        # its children too, are collected by now)
        timeline.outlived = [list(x) for x in procfs.outliving(segment.path)]
    phases.mark("the exit: the library's figures, the heap map's copy")
    maps = [(cb.maps_asked.get(name, heapmap.EXIT if name == heapmap.EXIT else None), hm)
            for name, hm in sorted(collected.items(),   # snapshots, then exit
                                   key=lambda kv: (kv[0] == heapmap.EXIT, str(kv[0]).zfill(9)))]
    named_maps = [(name, hm) for name, hm in maps if name]
    unanswered = [n for n in cb.maps_asked if n not in collected]
    if unanswered and opts.warn:
        # a request is answered at the program's next allocator call: one that came before
        # it is answered by the next request's map; none comes for a program killed first
        say(f"{len(unanswered)} snapshot{'s' * (len(unanswered) > 1)} got no heap map: the "
            "program made no allocator call between "
            f"{'them and the next one' if len(unanswered) > 1 else 'it and the next one'} "
            "(whose map then shows that heap), or ended without one", sys.stderr)
    # summarize reads the segment's figures as a saved run's are read again (capture.py),
    # and the record keeps them with the rest of what it reads, taken before summarize,
    # which cuts the timeline
    reading = segment.reading() if segment is not None else None
    # the allocator settings the program ran with (its findings do not suggest them again)
    env = child_env(None, opts)
    env["LD_PRELOAD"] = ":".join(x for x in (*opts.extra_preload, env.get("LD_PRELOAD")) if x)
    settings = remedies.settings_in(env)
    cap = capture.take(argv, proc.pid, proc.returncode, linkage, reading, timeline,
                       opts.hz, opts.stats_hz, opts.smaps_hz, cb.releases, prof, named_maps,
                       opts.release, opts.follow, settings) if opts.keep else None
    phases.mark("the capture")
    # names only for what is shown or saved: llvm-symbolizer takes 80 ms
    symbols = capture.Recording() if opts.keep else capture.Replay(capture.NO_SYMBOLS)
    summary = summarize(argv, proc.pid, proc.returncode, linkage, reading, timeline,
                        opts.hz, opts.stats_hz, opts.smaps_hz, cb.releases, prof,
                        named_maps, opts.release, opts.follow, symbolizer=symbols,
                        settings=settings)
    if cap is not None:
        cap["symbols"] = symbols.to_json()
    timeline.capture = cap
    phases.mark("the summary: call sites and their names, the verdict")
    return summary


# Heap maps at snapshots at most this often: each copies the program (a fork's worth of
# page tables, and the walk in the copy), 5 ms on a small heap, more on a large one.
HEAP_MAP_EVERY_S = 0.1

# A snapshot's heap map is not waited for: a thread of the program's makes its copy at its
# next allocator call after the request (the poke), within milliseconds in a program that
# allocates; one that makes no call meanwhile (asleep, or computing) makes it later, at its
# next call or at its exit, and its heap is then as it was at the snapshot (a poke lost to
# an owner's store in the same instant delays it by one flush: HS_FLUSH_BYTES allocated or
# freed by that thread). The map is collected at the end. Only a release at the snapshot
# (which changes the heap) waits for the copy, up to MAP_WAIT_S.
MAP_WAIT_S = 2.0


def collect_maps(segment) -> dict:
    """The heap maps the library wrote beside the segment, read and removed."""
    return heapmaps.collect(segment.path) if segment is not None else {}
