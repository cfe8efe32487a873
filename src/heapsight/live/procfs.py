"""Reading /proc/PID/status, smaps_rollup and statm (opened once and re-read with pread at
offset 0: the kernel regenerates them on every read), and smaps (each mapping, classified
by heapsight.mappings)."""

from __future__ import annotations

import os
import re

from heapsight import mappings

STATUS_KEYS = {b"VmRSS:": "rss", b"VmHWM:": "hwm", b"RssAnon:": "anon", b"RssFile:": "file",
               b"RssShmem:": "shmem", b"VmSize:": "vsize", b"Threads:": "threads"}
ROLLUP_KEYS = {b"Rss:": "rss", b"Pss:": "pss", b"Anonymous:": "anon", b"Swap:": "swap",
               b"Private_Dirty:": "private_dirty"}


_PATTERNS: dict = {}


def _parse(buf: bytes, keys: dict) -> dict:
    """One regular expression pass (the sampler calls this up to 1000 times a second)."""
    pattern = _PATTERNS.get(id(keys))
    if pattern is None:
        names = b"|".join(re.escape(k[:-1]) for k in keys)
        pattern = _PATTERNS[id(keys)] = re.compile(rb"^(" + names + rb"):\s+(\d+)", re.M)
    out = {}
    for head, value in pattern.findall(buf):
        name = keys[head + b":"]
        out[name] = int(value) if name == "threads" else int(value) * 1024
    return out


class ProcFile:
    """One /proc file kept open; read() returns parsed figures, or None once it is gone."""

    def __init__(self, path: str, keys: dict):
        self.path, self.keys = path, keys
        try:
            self.fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.fd = None

    def read(self) -> dict | None:
        if self.fd is None:
            return None
        try:
            buf = os.pread(self.fd, 8192, 0)
        except OSError:
            return None
        out = _parse(buf, self.keys)
        return out or None  # a zombie's status has no Vm lines

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def smaps(pid: int) -> list:
    """Every mapping of the process, classified (mappings.parse_smaps; its threads' stack
    pointers read when a guard page could be a thread stack's)."""
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as f:
        text = f.read()
    return mappings.parse_smaps(text, stack_pointers(pid) if " ---p " in text else None)


STACK_THREADS_MAX = 512   # more threads: their pointers are not read (one file each)


def stack_pointers(pid: int) -> tuple | None:
    """(the user stack pointers of the process's threads that sit in a system call or are
    stopped, how many threads gave none: running, or gone meanwhile), from
    /proc/PID/task/TID/syscall; None when they cannot be read (another user's process,
    ptrace refused; more than STACK_THREADS_MAX threads). Reading one does not stop or wait
    for the thread: a running one reads "running"."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    if len(tids) > STACK_THREADS_MAX:
        return None
    pointers, unread = [], 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall", "rb") as f:
                words = f.read().split()
        except PermissionError:
            return None
        except OSError:
            unread += 1
            continue
        # "NR ARG1..ARG6 SP PC", "-1 SP PC" (stopped outside a call), or "running"
        if len(words) >= 3 and words[0] != b"running":
            pointers.append(int(words[-2], 16))
        else:
            unread += 1
    return pointers, unread


def status(pid: int) -> ProcFile:
    return ProcFile(f"/proc/{pid}/status", STATUS_KEYS)


def status_field(pid: int, field: str) -> str:
    """A field of /proc/PID/status as written ("" when it has none, or is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith(field + ":")), "")
    except OSError:
        return ""


def rss_bytes(pid: int) -> int | None:
    """VmRSS, or None when the process is gone (or a zombie)."""
    v = status_field(pid, "VmRSS").split()
    return int(v[0]) * 1024 if v and v[0].isdigit() else None


def running(pid: int) -> bool:
    """Whether the process still runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def usage(pid: int) -> tuple | None:
    """(user, system) CPU seconds the process has used and its minor faults
    (/proc/PID/stat), or None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7])


def cpu_seconds(pid: int) -> tuple | None:
    """(user, system) CPU seconds the process has used (/proc/PID/stat), or None when gone."""
    got = usage(pid)
    return None if got is None else got[:2]


def smaps_rollup(pid: int) -> ProcFile:
    return ProcFile(f"/proc/{pid}/smaps_rollup", ROLLUP_KEYS)


class Statm(ProcFile):
    """/proc/PID/statm: the same kernel counters as status's VmRSS/RssAnon/RssFile+RssShmem,
    at a fifth of the cost; the sampler uses it between status reads above 100 Hz."""
    PAGE = os.sysconf("SC_PAGE_SIZE")

    def __init__(self, pid: int):
        super().__init__(f"/proc/{pid}/statm", {})

    def read(self) -> dict | None:
        if self.fd is None:
            return None
        try:
            fields = os.pread(self.fd, 256, 0).split()
        except OSError:
            return None
        if len(fields) < 3:
            return None
        rss, shared = int(fields[1]) * self.PAGE, int(fields[2]) * self.PAGE
        if rss == 0:
            return None  # a zombie
        return {"rss": rss, "anon": rss - shared}


class GlibcArenas:
    """glibc's own figures read from outside the program, so that heapsight runs no thread
    in it: the arenas on main_arena's ring and the sum of their system_mem (what each holds
    from the OS; mallinfo2's `arena`), each word read racily from /proc/PID/mem at the
    addresses the library put in the segment (glibc_main_arena and the two offsets). A
    thread arena is taken as one only when the heap_info at its heap's 64 MiB-aligned start
    names it, as the library checks it (native/src/heapmap.c, thread_arena_ok)."""

    HEAP_MAX = 64 << 20
    MAX_ARENAS = 4096

    def __init__(self, pid: int, main_arena: int, next_off: int, sysmem_off: int):
        self.key = (pid, main_arena)
        self.main, self.next_off, self.sysmem_off = main_arena, next_off, sysmem_off
        self.fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)

    def _words(self, addr: int, n: int = 1) -> list:
        buf = os.pread(self.fd, 8 * n, addr)
        if len(buf) != 8 * n:
            raise OSError("short read")
        return [int.from_bytes(buf[i:i + 8], "little") for i in range(0, 8 * n, 8)]

    def _thread_arena(self, a: int) -> bool:
        h = a & ~(self.HEAP_MAX - 1)
        if not a or a & 15 or not 32 <= a - h <= 128:
            return False
        ar_ptr, _prev, size, mprotect_size = self._words(h, 4)
        return ar_ptr == a and 0 < size <= self.HEAP_MAX and mprotect_size >= size

    def read(self) -> tuple | None:
        """(arenas, system_mem bytes), or None when the ring did not read as glibc's (a
        word caught mid-change, or the process gone)."""
        try:
            n, total = 1, self._words(self.main + self.sysmem_off)[0]
            a = self._words(self.main + self.next_off)[0]
            while a != self.main:
                if n >= self.MAX_ARENAS or not self._thread_arena(a):
                    return None
                total += self._words(a + self.sysmem_off)[0]
                a = self._words(a + self.next_off)[0]
                n += 1
        except OSError:
            return None
        return n, total

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Word:
    """One 8-byte word of the program's memory, read from /proc/PID/mem on an fd kept open
    (a pread; never a write, never ptrace): CPython's _PyRuntime._finalizing, at the address
    the library put in the segment (py_finalizing_addr)."""

    def __init__(self, pid: int, addr: int):
        self.addr = addr
        self.key = None
        self.fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)

    def read(self) -> int | None:
        """The word, or None when it cannot be read (the process gone)."""
        try:
            buf = os.pread(self.fd, 8, self.addr)
        except OSError:
            return None
        return int.from_bytes(buf, "little") if len(buf) == 8 else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def outliving(segment_path: str, limit: int = 20) -> list:
    """[(pid, name)] of the processes of ours whose environment names the run's segment
    (HEAPSIGHT_SEGMENT: the program's descendants, heapsight's library in them) still
    running once the program ended: a daemon that forked and left its parent, a job a
    shell put in the background. heapsight's copies of the program (hs-heapmap) are not
    among them. At most limit."""
    want = b"\0HEAPSIGHT_SEGMENT=" + os.fsencode(segment_path) + b"\0"
    uid, me, out = os.getuid(), os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = b"\0" + f.read()
            if want not in env + b"\0" or not running(int(name)):
                continue
            with open(f"/proc/{name}/comm", "rb") as f:
                comm = f.read().decode(errors="replace").strip()
        except OSError:
            continue
        if comm != "hs-heapmap":
            out.append((int(name), comm))
            if len(out) >= limit:
                break
    return sorted(out)
