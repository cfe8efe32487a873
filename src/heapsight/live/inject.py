"""heapsight attach's ways into a running process without gdb, through native/src/inject.c
(hs-inject, ptrace):

- copy_map / copy_and_mark (attach's glibc figures, --leaks): every thread of the process
  is stopped while one makes a copy of the process (a clone with no exit signal); its
  registers are put back and the process goes on: its pause is the copy's (measured).
  Nothing is loaded into the process or written to its memory. heapsight's copy library
  (libheapsight_copy.so) is loaded into the copy alone, which walks glibc's heaps, measures
  what malloc_trim gives back, marks what the process can still reach from its roots (as
  `run` does at exit) and writes a heap map file; the ended copy is then reaped by the
  process (one more short stop).
- release (--trim): the allocator's release called on one of its threads waiting in a
  system call, its registers and extended state put back.
- track (--track): heapsight's library loaded into the process for a while
  (native/src/attach.c), then unloaded.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import field

import numpy as np

from heapsight.dataclass import dataclass
from heapsight import allocators, elf, heapmap, interrupts, native
from heapsight.arrays import isin
from heapsight.errors import HeapsightError
from heapsight.live import gdbcall, procfs

# hs-inject's exit codes (inject.c)
REFUSED, ENDED, FAILED, BUSY = 3, 4, 5, 7
TRIES = 4              # a copy that met a held lock is made again, this many times in all
COPY_LIMIT_S = 60.0    # the copy bounds its own walk (30 s); this bounds hs-inject
LARGEST = 5            # the largest lost blocks shown, with their first bytes
PEEK_BYTES = 48


@dataclass
class Leaks:
    """The copy's answer: the reach classes (heapmap.Reach.to_json), what a release would
    give back (measured in the copy), the largest lost blocks, and what the process paid."""
    reach: dict
    release_bytes: int
    pause_ms: float            # the process stopped, all threads, for the copy
    reap_pause_ms: float       # stopped again, to reap the ended copy
    threads: int
    copy_ms: int
    tries: int
    lost_by_size: list = field(default_factory=list)   # [(usable bytes, blocks)], largest total first
    largest: list = field(default_factory=list)        # [{"addr", "bytes", "class", "starts"}]
    reaped: bool = True
    rss_bytes: int = 0                                 # the process's RSS right after the copy
    marks: heapmap.Reach | None = None                 # the marking itself (not saved)
    lost_sites: dict | None = None                     # with --track: sites.by_site of the lost

    def to_dict(self) -> dict:
        return {"reach": self.reach, "release_measured_bytes": self.release_bytes,
                "pause_ms": self.pause_ms, "reap_pause_ms": self.reap_pause_ms,
                "threads": self.threads, "copy_ms": self.copy_ms, "tries": self.tries,
                "lost_by_size": [{"bytes": b, "blocks": n} for b, n in self.lost_by_size],
                "largest_lost": self.largest, "reaped": self.reaped, "rss_bytes": self.rss_bytes,
                **({"lost_sites": self.lost_sites} if self.lost_sites else {})}


def _mapped(pid: int, prefix: str) -> tuple | None:
    """(path as the process sees it, path to read it from here, load address) of the first
    object the process maps whose file name starts with prefix, or None."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise HeapsightError(f"process {pid} ended", ENDED) from None
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[2] == "00000000" and os.path.basename(parts[5]).startswith(prefix):
            path = parts[5]
            return path, f"/proc/{pid}/root{path}", int(parts[0].split("-")[0], 16)
    return None


def _libc(pid: int) -> tuple:
    """The process's libc (_mapped), or a refusal."""
    found = _mapped(pid, "libc.so")
    if found is None:
        raise HeapsightError(f"process {pid} has no glibc loaded (a static binary, a Go program, "
                             "or another C library): heapsight has no way into it", REFUSED)
    return found


def _symbols(pid: int, found: tuple, names: set, why: str) -> dict:
    """The addresses in the process of names, defined by the object found (_mapped's), or a
    refusal naming why they are needed."""
    path, readable, base = found
    try:
        values = elf.symbol_values(readable, names)
    except (OSError, ValueError) as e:
        raise HeapsightError(f"process {pid}'s {path} could not be read: {e}", REFUSED) from None
    missing = sorted(names - set(values))
    if missing:
        raise HeapsightError(f"process {pid}'s {path} has no {', '.join(missing)} ({why})", REFUSED)
    return {k: base + v for k, v in values.items()}


def _loader(pid: int, *extra: str) -> dict:
    """dlopen's and dlsym's addresses (and extra's) in the process's libc."""
    return _symbols(pid, _libc(pid), {"dlopen", "dlsym", *extra},
                    "glibc 2.34 or later has dlopen in libc: heapsight needs it")


def _inject(*args) -> tuple:
    """hs-inject once: (exit code, its figures by name, its stdout, its stderr). In a session
    of its own and without a time limit: an interrupt meant for heapsight must not stop it
    halfway (it lets the process go in every case, a copy bounds itself, and a call it makes
    must be let finish: a tracer gone in the middle of one would leave the thread returning
    to address 0)."""
    p = subprocess.run([native.program("hs-inject"), *map(str, args)], capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    said: dict = {}
    for line in p.stdout.splitlines():
        k, _, v = line.partition(" ")
        if v.lstrip("-").isdigit():
            said[k] = said.get(k, 0) + int(v) if k.endswith("pause_us") else int(v)
    return p.returncode, said, p.stdout, p.stderr.strip()


def _refused_or_ended(pid: int, rc: int, doing: str) -> None:
    """The HeapsightError for hs-inject's refusal or the process's end."""
    if rc == REFUSED:
        raise HeapsightError(gdbcall.refusal(pid, "Operation not permitted"), REFUSED)
    if rc == ENDED:
        raise HeapsightError(f"process {pid} ended while heapsight was {doing}: nothing was "
                             "changed", ENDED)


def refusal(pid: int, loads: bool) -> str:
    """Why heapsight will not make a system call or a call in the process, or "": a seccomp
    filter (a call it forbids could kill the process), and, when a library of heapsight's is
    to be loaded into it or its copy (loads), another mount namespace (a container: the
    library's path is not there)."""
    if procfs.status_field(pid, "Seccomp") not in ("", "0"):
        return (f"process {pid} runs under a seccomp filter: a system call heapsight would make in "
                "it (clone, mmap, wait4) could be forbidden, and a forbidden call may kill it; "
                "heapsight makes none (`heapsight run` measures such a program from its start)")
    if loads:
        try:
            other = os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        except OSError:
            other = False
        if other:
            return (f"process {pid} runs in another mount namespace (a container): heapsight's "
                    "library is not at the same path there; run heapsight inside it")
    return ""


def _check(pid: int, loads: bool) -> None:
    why = refusal(pid, loads)
    if why:
        raise HeapsightError(why, REFUSED)
    tracer = procfs.status_field(pid, "TracerPid")
    if tracer not in ("", "0"):
        raise HeapsightError(f"process {pid} is already traced by process {tracer}: a process has "
                             "one tracer at a time; detach that one first", REFUSED)


def _private_dir(pid: int) -> str:
    """A new directory only heapsight and the process's user can write, for the map."""
    d = tempfile.mkdtemp(prefix="heapsight-attach-")
    st = os.stat(f"/proc/{pid}")
    if st.st_uid != os.geteuid():
        os.chown(d, st.st_uid, st.st_gid)   # root only: another user's process is refused before
    return d


def _peek(pid: int, addr: int, n: int) -> bytes:
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as f:
            f.seek(addr)
            return f.read(n)
    except (OSError, ValueError, OverflowError):
        return b""


def starts_words(data: bytes) -> str:
    """A block's first bytes as a person reads them: its text when they are text, else hex."""
    text = data.split(b"\0", 1)[0]
    if len(text) >= 4 and all(32 <= b < 127 for b in text):
        return '"' + text.decode("ascii") + '"'
    return " ".join(data[i:i + 8].hex() for i in range(0, min(len(data), 32), 8))


def _lost_blocks(pid: int, reach: heapmap.Reach) -> tuple:
    """The definitely lost blocks grouped by size, and the largest of them with their
    first bytes, read from the process (a lost block cannot change: nothing points to it)."""
    lost = reach.unreached[reach.unreached["state"] == heapmap.REACH_CLASSES.index("definitely_lost")]
    if not len(lost):
        return [], []
    sizes, counts = np.unique(lost["usable"], return_counts=True)
    by_size = sorted(((int(s), int(c)) for s, c in zip(sizes, counts)), key=lambda x: -x[0] * x[1])
    largest = []
    for b in lost[np.argsort(-lost["usable"].astype(np.int64), kind="stable")][:LARGEST]:
        addr, size = int(b["addr"]), int(b["usable"])
        largest.append({"addr": hex(addr), "bytes": size,
                        "starts": starts_words(_peek(pid, addr, min(size, PEEK_BYTES)))})
    return by_size, largest


def _under_run(allocator: str, what: str) -> str:
    """What `heapsight run` does instead under allocator, in a few words."""
    if allocator.startswith(allocators.OWN_MALLOC):   # an allocator built into the executable
        return ("nor can `heapsight run`: the program's calls reach its own malloc before any "
                "preloaded library; its /proc figures are all there is")
    return f"under {allocator}, {what}"


def copy_map(pid: int, allocator: str, reach: bool = True) -> tuple:
    """A heap map of a copy of the running process (see the top): (heapmap.HeapMap, what
    hs-inject said, tries, the process's RSS right after the copy). Refusals and failures
    as HeapsightError."""
    at = _loader(pid)
    if allocator != "glibc":
        raise HeapsightError(f"--leaks: the process's allocator is {allocator}; marking a running "
                             "process's blocks is done for glibc's heaps only so far "
                             f"({_under_run(allocator, '`heapsight run` marks them at exit')})",
                             REFUSED)
    _check(pid, loads=True)
    d = _private_dir(pid)
    try:
        for tries in range(1, TRIES + 1):
            path = os.path.join(d, f"attach-{pid}-{tries}.map.leaks")
            rc, said, _, err = _inject("copy", pid, native.lib_path("libheapsight_copy.so"),
                                       f"{at['dlopen']:x}", f"{at['dlsym']:x}", path,
                                       f"{COPY_LIMIT_S:g}", int(reach))
            rss = procfs.rss_bytes(pid) or 0
            if rc != BUSY:
                break
            time.sleep(0.05 * tries)
        _refused_or_ended(pid, rc, "copying it")
        if rc == BUSY:
            raise HeapsightError(f"process {pid}: each of {TRIES} copies met a lock held by one of "
                                 "its threads (inside malloc, or loading a library); try again",
                                 FAILED)
        if rc != 0 or not os.path.exists(path):
            raise HeapsightError(f"process {pid}: the copy failed ({err or f'exit code {rc}'}); "
                                 "the process was let go unchanged", FAILED)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)   # the directory may be the process's user's
        with os.fdopen(fd, "rb") as f:
            hm = heapmap.parse(f.read(64 << 20), path)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return hm, said, tries, rss


def copy_and_mark(pid: int, allocator: str) -> Leaks:
    """The reach of a running process's blocks, marked in a copy of it (see the top)."""
    hm, said, tries, rss = copy_map(pid, allocator, reach=True)
    if hm.reach is None or not hm.reach.marked:
        why = hm.reach.why if hm.reach is not None else hm.status
        raise HeapsightError(f"process {pid}: its blocks were not marked: {why}", FAILED)
    by_size, largest = _lost_blocks(pid, hm.reach)
    return Leaks(hm.reach.to_json(), hm.release_measured_bytes, said.get("pause_us", 0) / 1000,
                 said.get("reap_pause_us", 0) / 1000, said.get("threads", 0),
                 said.get("copy_ms", 0), tries, by_size, largest, bool(said.get("reaped")), rss,
                 hm.reach)


def release(pid: int, allocator: str) -> dict:
    """The allocator's release-now call (allocators.trim_call) made on one of the process's
    threads (native/src/inject.c's call): {"result", "threads", "pause_ms" (that thread's
    stop, the call included), "all_stopped_ms" (every thread's, while one was chosen)}."""
    call = allocators.trim_call(allocator)
    if call is None:
        raise HeapsightError(f"--trim: no release call is known for {allocator}", REFUSED)
    _check(pid, loads=False)
    prefix = allocators.ALLOCATORS[allocator].object_prefix or "libc.so"
    found = _mapped(pid, prefix) if allocator != "glibc" else _libc(pid)
    if found is None:
        raise HeapsightError(f"--trim: process {pid} maps no {prefix} library", REFUSED)
    fn = _symbols(pid, found, {call[0]}, "the release --trim makes")[call[0]]
    rc, said, _, err = _inject("call", pid, f"{fn:x}", *call[1:])
    _refused_or_ended(pid, rc, "making the release")
    if rc != 0 or "result" not in said:
        raise HeapsightError(f"--trim: process {pid}: {err or f'exit code {rc}'}; the process "
                             "was let go unchanged", FAILED)
    return {"result": said["result"], "threads": said.get("threads", 0),
            "pause_ms": said.get("pause_us", 0) / 1000,
            "all_stopped_ms": said.get("all_stopped_us", 0) / 1000}


def _lib_range(pid: int, path: str) -> tuple:
    """The lowest and highest address of the process's mappings of path."""
    lo = hi = 0
    real = os.path.realpath(path)
    with open(f"/proc/{pid}/maps") as f:
        for line in f.read().splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and os.path.realpath(parts[5]) == real:
                a, b = (int(x, 16) for x in parts[0].split("-"))
                lo, hi = (a if not lo else min(lo, a)), max(hi, b)
    return lo, hi


@dataclass
class Tracked:
    """What --track saw: the counters since the attach, the sampled call sites of the blocks
    allocated since then and still live (sites.build's shape, one moment "grew"), and what
    the process paid."""
    seconds: float
    patched: int
    counters: dict
    sites: dict | None
    load_pause_ms: float
    unload_pause_ms: float
    unloaded: bool
    note: str = ""
    blocks: np.ndarray | None = None   # the sampled blocks live at the end (sites.live_blocks)
    ended: bool = False                # the process ended while followed (nothing to unload)
    interrupted: bool = False          # Ctrl-C (SIGTERM, SIGHUP) ended the following early

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "patched": self.patched, "counters": self.counters,
                "sites": self.sites, "load_pause_ms": self.load_pause_ms,
                "unload_pause_ms": self.unload_pause_ms, "unloaded": self.unloaded,
                "ended": self.ended, "interrupted": self.interrupted, "note": self.note}


def track(pid: int, allocator: str, seconds: float, progress=None) -> Tracked:
    """heapsight's library loaded into the process for `seconds`: every allocation counted
    and sampled from then on (native/src/attach.c), then unloaded."""
    from heapsight import profile, sites
    from heapsight.live import segment
    _libc(pid)
    if allocator != "glibc":
        raise HeapsightError(f"--track: the process's allocator is {allocator}; following a "
                             "running process's allocations is done under glibc only so far "
                             f"({_under_run(allocator, '`heapsight run` follows them from the start')})",
                             REFUSED)
    _check(pid, loads=True)
    at = {k: f"{v:x}" for k, v in _loader(pid, "dlclose").items()}
    lib = native.preload_library()
    with open(f"/proc/{pid}/maps") as f:
        if "/libheapsight.so" in f.read():
            raise HeapsightError(f"process {pid} already runs with heapsight's library (started "
                                 "with `heapsight env`'s settings, or by heapsight run): attach "
                                 "reads its own counters without --track", REFUSED)
    seg = segment.Segment(profile=True)
    try:
        st = os.stat(f"/proc/{pid}")
        if st.st_uid != os.geteuid():
            os.chown(seg.path, st.st_uid, st.st_gid)
        rc, said, out, err = _inject("load", pid, at["dlopen"], at["dlsym"], at["dlclose"], lib,
                                     seg.path)
        _refused_or_ended(pid, rc, "loading its library")
        handle = next((line.split()[1] for line in out.splitlines() if line.startswith("handle ")), "")
        if rc != 0 or not handle:
            raise HeapsightError(f"--track: process {pid}: {err or f'exit code {rc}'}; the "
                                 "process was let go unchanged", FAILED)
        t0 = time.monotonic()
        interrupted = False
        while (left := seconds - (time.monotonic() - t0)) > 0:
            if progress:
                progress(f"following {pid}'s allocations: {left:.0f} s left (Ctrl-C ends it)")
            # an interrupt ends the following early; the library is unloaded all the same
            if signal.sigtimedwait(interrupts.WATCHED, min(0.25, left)) is not None:
                interrupted = True
                break
            if not procfs.running(pid):
                break
        followed = time.monotonic() - t0
        lo, hi = _lib_range(pid, lib) if procfs.running(pid) else (0, 0)
        note, unloaded = "", {}
        if not procfs.running(pid):   # nothing to undo: what it allocated is still told
            note = f"the process ended {followed:.1f} s into the {seconds:g} s"
        elif not lo:                  # execve: the library went with the old image
            note = ("the process ran another program (execve) while followed: heapsight's "
                    "library went with its old image")
        else:
            rc, unloaded, _, note = _inject("unload", pid, at["dlsym"], at["dlclose"], handle,
                                            f"{lo:x}", f"{hi:x}")
            if rc != 0 and not procfs.running(pid):
                note, unloaded = f"the process ended {followed:.1f} s into the {seconds:g} s", {}
            elif rc != 0:
                raise HeapsightError(f"--track: process {pid}: {note or f'exit code {rc}'}", FAILED)
        if interrupted:
            note = (note + "; " if note else "") + f"ended by an interrupt {followed:.1f} s in"
        c = seg.counters()   # (the library's last counts: it counts until it is unloaded)
        prof = seg.profile()
        grew, blocks = None, None
        if prof is not None and len(prof.allocs):
            m = [sites.Moment("grew", None, seconds, c.live_usable_bytes),
                 sites.Moment(sites.ALLOCATED, sites.ALL, seconds, c.requested_total_bytes)]
            grew = sites.build(prof, m, profile.unwinder(prof))
            blocks = sites.live_blocks(prof, None)
        ended = not unloaded
        return Tracked(round(followed, 3), said.get("patched", 0),
                       {"allocations": c.n_alloc, "frees": c.n_free,
                        "live_bytes": c.live_requested_bytes, "live_blocks": c.live_blocks,
                        "allocated_bytes": c.requested_total_bytes},
                       grew, said.get("pause_us", 0) / 1000,
                       (unloaded.get("pause_us", 0) + unloaded.get("checks_pause_us", 0)) / 1000,
                       ended or bool(unloaded.get("closed")), note, blocks, ended, interrupted)
    finally:
        seg.close()


def lost_sites(t: Tracked, k: Leaks) -> dict | None:
    """The call sites of the lost blocks (definitely and indirectly) among those --track
    sampled (sites.by_site's shape), or None when it sampled none of them."""
    if t.blocks is None or not len(t.blocks) or k.marks is None:
        return None
    cls = k.marks.classes_of(t.blocks["addr"])
    lost = isin(cls, [heapmap.REACH_CLASSES.index("definitely_lost"),
                      heapmap.REACH_CLASSES.index("indirectly_lost")])
    if not lost.any():
        return None
    from heapsight import sites
    return sites.by_site(t.sites, t.blocks[lost])
