"""Reading /proc/PID/status and smaps_rollup. Files are opened once and re-read with
pread at offset 0 (the kernel regenerates them on every read)."""

from __future__ import annotations

import os
import re

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


def status(pid: int) -> ProcFile:
    return ProcFile(f"/proc/{pid}/status", STATUS_KEYS)


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
