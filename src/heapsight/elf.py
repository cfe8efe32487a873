"""Is a program dynamically linked? A preload library only reaches programs that the
dynamic loader starts: an ELF file with a PT_INTERP header, or a script whose interpreter is one."""

from __future__ import annotations

import shutil
import struct

PT_INTERP = 3


def _interpreter_of_script(path: str) -> str | None:
    with open(path, "rb") as f:
        first = f.readline(256)
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].strip().split()
    if not parts:
        return None
    interp = parts[0].decode(errors="replace")
    if interp.endswith("/env") and len(parts) > 1:
        found = shutil.which(parts[1].decode(errors="replace"))
        return found
    return interp


def linkage(path: str, depth: int = 0) -> str:
    """'dynamic', 'static', or 'unknown' (not ELF, unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:2] == b"#!" and depth < 4:
                interp = _interpreter_of_script(path)
                return linkage(interp, depth + 1) if interp else "unknown"
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only
                return "unknown"
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except (OSError, IndexError, struct.error, TypeError):
        return "unknown"
    for i in range(phnum):
        p_type, = struct.unpack_from("<I", table, i * phentsize)
        if p_type == PT_INTERP:
            return "dynamic"
    return "static"
