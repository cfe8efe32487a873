"""Heap maps, live: how the CLI asks the program for a map while it runs (request, then
wait_ack: the library's copy answers once it is made) or at exit (at_exit, set before the
program starts), and reads the files its copies write beside the segment,
"<segment path>.map.N" / ".map.exit" (collect reads the ones present and removes them).
The format is heapsight.heapmap's."""

from __future__ import annotations

import glob
import os
import stat
import time

from heapsight.layout import MAP_EXIT as EXIT, MAP_LIMIT_S

# A map holds 5 bytes a page of heap and a few hundred thousand blocks: far below this
MAP_MAX_BYTES = 1 << 30


def _read_own(path: str) -> bytes:
    """The bytes of a map file the program's copy wrote beside the segment in /dev/shm,
    where anyone can put a file at that name first: opened without following a link or
    waiting (a FIFO would hang heapsight), and read only as a regular file of this user's
    (or root's), no larger than MAP_MAX_BYTES (a link to /dev/zero would not end)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file")
        if st.st_uid not in (os.geteuid(), 0):
            raise ValueError(f"{path}: made by another user (uid {st.st_uid}), not read")
        if st.st_size > MAP_MAX_BYTES:
            raise ValueError(f"{path}: {st.st_size} bytes, more than a heap map can be")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAP_MAX_BYTES + 1)
    finally:
        os.close(fd)


def read(path: str):
    """A map file (heapmap.HeapMap); ValueError when it is not one or is cut short (a
    stopped child). (The reader, with numpy, is imported here: the run sets its map up
    before numpy is imported.)"""
    from heapsight.heapmap import parse
    return parse(_read_own(path), path)


def at_exit(segment, on: bool = True) -> None:
    """A map at exit, before the release probe (set before the program starts)."""
    segment.header["heapmap_at_exit"] = 1 if on else 0


def request(segment, n: int) -> None:
    """Asks the library for map n (n above every earlier request): the first thread of the
    program's in the library's slow path after it (the poke sends each there at its next
    allocator call) makes the copy and answers heapmap_ack = n once it is made."""
    segment.header["heapmap_seq"] = n


# What the CLI waits for a map: the library bounds its copy to MAP_LIMIT_S, and more.
MAP_TIMEOUT_S = MAP_LIMIT_S + 10


# How often a request not yet answered is repeated (again(): the poke)
AGAIN_S = 0.05


def wait_ack(segment, n: int, timeout_s: float = MAP_TIMEOUT_S, alive=None, again=None) -> bool:
    """Whether map n was answered within timeout_s: the library answers once its copy of
    the program is taken (forked), so the map is of that moment and the program may go on;
    the file is complete when the program has ended, or when wait_written says so. alive(),
    when given, is asked between polls (the program may end meanwhile); again(), every
    AGAIN_S while no answer came."""
    start = time.monotonic()
    deadline, next_again = start + timeout_s, start + AGAIN_S
    while time.monotonic() < deadline:
        if int(segment.header["heapmap_ack"]) >= n:
            return True
        if alive is not None and not alive():
            return int(segment.header["heapmap_ack"]) >= n
        if again is not None and time.monotonic() >= next_again:
            again()
            next_again += AGAIN_S
        time.sleep(0.005)
    return False


def wait_written(segment_path: str, name, timeout_s: float = MAP_TIMEOUT_S) -> bool:
    """Whether map name's file was written whole within timeout_s (the library bounds a
    map to MAP_LIMIT_S)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            read(path_of(segment_path, name))
            return True
        except (OSError, ValueError):
            time.sleep(0.01)
    return False


def path_of(segment_path: str, name) -> str:
    return f"{segment_path}.map.{name}"


def collect(segment_path: str) -> dict:
    """The maps written beside the segment, by name (EXIT, or the request's number), read
    and removed; a damaged or cut-short file is removed too, and left out."""
    out = {}
    for path in glob.glob(glob.escape(segment_path) + ".map.*"):
        suffix = path[len(segment_path) + len(".map."):]
        name = EXIT if suffix == EXIT else int(suffix) if suffix.isdigit() else None
        try:
            if name is not None:
                out[name] = read(path)
        except (OSError, ValueError):
            pass
        try:
            os.unlink(path)
        except OSError:
            pass
    return out


# The exit map's copy bounds itself to MAP_LIMIT_S (heapmap.c): a little more here.
EXIT_MAP_WAIT_S = MAP_LIMIT_S + 5.0


def wait_exit_map(segment) -> None:
    """The program did not wait for its exit map's copy (it waits for the copy to be made,
    not walked): the copy, left running, writes the map when it is done. Waits for that
    file, or for the copy to end without one (gone, or a zombie nobody reaped)."""
    pid = segment.get("heapmap_exit_pid")
    path = path_of(segment.path, EXIT)
    start = time.monotonic()
    deadline = start + EXIT_MAP_WAIT_S
    while pid and not os.path.exists(path) and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    break
        except (OSError, IndexError):
            break
        # a small program's copy is done in 2-3 ms: looked for each ms at first (every 5 ms,
        # it was found 5 ms after its start, a tenth of a 0.15 s program's end)
        time.sleep(0.001 if time.monotonic() - start < 0.05 else 0.005)
    reap_copies()


WALL = 0x40000000   # __WALL: a child whose exit signal is not SIGCHLD (the copies')


PF_EXITING = 0x4   # a task's flags (/proc/PID/stat's ninth field) once it began to end


def _state(rest: bytes) -> bytes:
    """A process's state from its stat line past the command: b"Z" once it has ended, b"E"
    while it ends (its page tables freed: a large program's copy took 37-48 ms, which
    nothing need wait for), else the kernel's letter."""
    fields = rest.split()
    if not fields:
        return b"?"
    if fields[0] not in (b"Z", b"X") and len(fields) > 6 and fields[6].isdigit() \
            and int(fields[6]) & PF_EXITING:
        return b"E"
    return fields[0]


def _copies() -> list:
    """(pid, state) of the program's copies that heapsight's library made children of this
    process (CLONE_PARENT: so that no wait of the program's meets them), named hs-heapmap;
    state b"Z" once one has ended, b"E" while it ends (_state)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    pids, out = set(), []
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/children") as f:
                pids.update(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        name, _, rest = stat.rpartition(b")")
        if name.endswith(b"(hs-heapmap"):
            out.append((pid, _state(rest)))
    return out


def request_pending(segment) -> bool:
    """Whether the last map asked for is not answered yet: its copy is still to be made (at
    the program's next allocator call), and will then be walked."""
    return int(segment.header["heapmap_seq"]) > int(segment.header["heapmap_ack"])


def copy_walking(segment) -> bool:
    """Whether a copy of the program is still being walked (its map not yet written): one
    of this process's children (the copies that ended are reaped; one that is ending has
    written its map, or never will), or the last one the library made, which is the
    program's own child where heapsight did not start it (--follow's program)."""
    copies = _copies()
    _reap(copies)   # the ones this listing saw ended: one that ends after it is seen next time
    if any(state not in (b"Z", b"E") for _, state in copies):
        return True
    pid = segment.get("heapmap_copy_pid")
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            name, _, rest = f.read().rpartition(b")")
    except OSError:
        return False
    return bool(pid) and name.endswith(b"(hs-heapmap") and _state(rest) not in (b"Z", b"X", b"E")


def wait_copies(segment, timeout_s: float) -> None:
    """Until no copy is being walked, or timeout_s."""
    deadline = time.monotonic() + timeout_s
    while copy_walking(segment) and time.monotonic() < deadline:
        time.sleep(0.005)


def reap_copies() -> int:
    """Reaps the copies that have ended. How many."""
    return _reap(_copies())


def reap_ending(timeout_s: float) -> None:
    """At heapsight's end: waits for the copies still ending (one whose map was read ends
    meanwhile, its page tables freed) and reaps them, so that none is left to init, nor
    running in the run's process group; at most timeout_s. One still walking (its map
    unread) is left to end by itself, as before."""
    deadline = time.monotonic() + timeout_s
    while True:
        copies = _copies()
        _reap(copies)
        if not any(state == b"E" for _, state in copies) or time.monotonic() >= deadline:
            return
        time.sleep(0.002)


def _reap(copies) -> int:
    reaped = 0
    for pid, state in copies:
        if state != b"Z":
            continue
        try:
            if os.waitpid(pid, os.WNOHANG | WALL)[0] == pid:
                reaped += 1
        except ChildProcessError:
            pass
    return reaped
