"""Where a command's time went: its phases, each timed from the end of the one before, the
first from heapsight's own start (the process's, as the kernel counts it). `heapsight run
--verbose` prints them; bench/phases sets them beside the bare program.

A phase is named as it ends (mark()); time inside a phase that another part spends waiting
for a helper (the symbolizer) is added with waited() and shown beside it."""

from __future__ import annotations

import contextlib
import os
import time

_marks: list = []     # (phase name, perf_counter at its end)
_waits: dict = {}     # what was waited for -> seconds
_inside = 0           # within one phase made of others (--verify's runs): theirs not kept


def process_start() -> float:
    """This process's start on the perf_counter clock (both are CLOCK_MONOTONIC-based on
    Linux: the kernel's start time in clock ticks since boot, against the boot clock)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])   # field 22: starttime
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.perf_counter() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter()


def mark(name: str) -> None:
    """The phase called name ends now."""
    if not _inside:
        _marks.append((name, time.perf_counter()))


def waited(what: str, seconds: float) -> None:
    """seconds of the current phase spent waiting for what."""
    if not _inside:
        _waits[what] = _waits.get(what, 0.0) + seconds


@contextlib.contextmanager
def one(name: str):
    """A phase made of parts that mark phases of their own (more measured runs): it is
    shown as one, named name."""
    global _inside
    _inside += 1
    try:
        yield
    finally:
        _inside -= 1
        mark(name)


def report() -> list:
    """(phase, seconds) in order, the first from the process's start, then what was waited
    for, as (\"  of which: WHAT\", seconds)."""
    out, last = [], process_start()
    for name, t in _marks:
        out.append((name, max(0.0, t - last)))
        last = t
    out += [(f"of which waiting for {what}", s) for what, s in _waits.items()]
    return out


def render(rows: list) -> str:
    total = sum(s for name, s in rows if not name.startswith("of which"))
    lines = [f"heapsight: where the time went ({total:.3f} s in all):"]
    for name, s in rows:
        lines.append(f"  {s * 1000:8.1f} ms  {name}")
    return "\n".join(lines) + "\n"
