"""Reading /proc/PID/status and smaps_rollup. Files are opened once and re-read with
pread at offset 0 (the kernel regenerates them on every read)."""

from __future__ import annotations

import os

STATUS_KEYS = {b"VmRSS:": "rss", b"VmHWM:": "hwm", b"RssAnon:": "anon", b"RssFile:": "file",
               b"RssShmem:": "shmem", b"VmSize:": "vsize", b"Threads:": "threads"}
ROLLUP_KEYS = {b"Rss:": "rss", b"Pss:": "pss", b"Anonymous:": "anon", b"Swap:": "swap",
               b"Private_Dirty:": "private_dirty"}


def _parse(buf: bytes, keys: dict) -> dict:
    out = {}
    for line in buf.split(b"\n"):
        head, _, rest = line.partition(b"\t") if b"\t" in line else line.partition(b" ")
        name = keys.get(head)
        if name is not None:
            fields = rest.split()
            if fields:
                value = int(fields[0])
                out[name] = value if name == "threads" else value * 1024
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
