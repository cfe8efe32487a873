"""The sampler's fast tick in C (native/src/readloop.c, libhsread.so through ctypes): it reads
/proc/PID/statm and the segment's counters between the Python sampler's own, rarer ticks,
so a 1 kHz sampler costs a few microseconds a tick instead of ~60 (bench/sampler-cost)."""

from __future__ import annotations

import ctypes
import os

from heapsight import native

# native/src/readloop.h, mirrored (tests/test_readloop.py checks each against the header)
COLUMNS = ("t", "rss", "anon", "live_usable", "live_req", "n_alloc", "n_free",
           "alloc_in_use", "alloc_free", "alloc_mapped", "arenas")
WHY = ("UNTIL", "FULL", "SIGNAL", "GONE", "ASKED", "OWNER", "EXITING", "RSS", "EXEC", "FINALIZING")
UNTIL, FULL, SIGNAL, GONE, ASKED, OWNER, EXITING, RSS, EXEC, FINALIZING = range(len(WHY))
_u64, _int, _double, _ptr = ctypes.c_uint64, ctypes.c_int, ctypes.c_double, ctypes.c_void_p
SIGNATURES = {
    "hs_read_loop": (_int, [_int, _ptr, _u64, ctypes.POINTER(_u64), _u64, _u64, _u64, _u64,
                            _double, _ptr, _int, ctypes.POINTER(_int), _int,
                            ctypes.POINTER(_double), _u64, _int, _double, ctypes.c_char_p, _int,
                            _u64]),
    "hs_poke_slots": (None, [_ptr]),
    "hs_read_counters": (None, [_ptr, _ptr]),
    "hs_read_steady": (_int, [_int, _ptr, _double, ctypes.POINTER(_u64), ctypes.POINTER(_u64),
                              _ptr]),
    "hs_read_pools": (_int, [_int, _int, ctypes.POINTER(_u64), _int, _u64, ctypes.POINTER(_u64)]),
}
C_HEADER = "readloop.h"
# RSS that moved by more than this (and 1%) while the counters were read is read again with
# them, STEADY_TRIES times at most
STEADY_BYTES, STEADY_TRIES = 1 << 20, 3
# /proc/PID/exe is read when statm's code size changes (an exec), and every EXE_EVERY ticks
EXE_EVERY = 16
C_CONSTANTS = {"HS_READ_COLUMNS": len(COLUMNS), **{f"HS_READ_{w}": i for i, w in enumerate(WHY)},
               "HS_STEADY_BYTES": STEADY_BYTES, "HS_STEADY_TRIES": STEADY_TRIES,
               "HS_EXE_EVERY": EXE_EVERY}
ROWS = 512
_lib = None


def _load():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(native.lib_path("libhsread.so"))
        for name, (restype, argtypes) in SIGNATURES.items():
            getattr(lib, name).restype = restype
            getattr(lib, name).argtypes = argtypes
        _lib = lib
    return _lib


def available() -> bool:
    try:
        _load()
        return True
    except OSError:
        return False


class FastReader:
    """Ticks in C from next_ns on, every period_ns, until a deadline the caller gives."""

    def __init__(self, segment, start_ns: int, period_s: float, wake: set) -> None:
        self.lib = _load()
        self.seg_addr = segment.address() if segment is not None else None
        self.start_ns = start_ns
        self.period_ns = max(1, int(period_s * 1e9))
        self.next_ns = ctypes.c_uint64(0)
        self.mask = sum(1 << s for s in wake)
        self.buf = (ctypes.c_double * (ROWS * len(COLUMNS)))()
        self.why = ctypes.c_int(0)
        self.page = float(os.sysconf("SC_PAGE_SIZE"))
        self.own = (ctypes.c_double * 2)(0.0, 0.0)

    def loop(self, statm_fd: int, next_ns: int, until_ns: int, asked_seq: int,
             pagemap_fd: int | None = None, own_bytes: float = 0.0, pid: int = 0,
             watch_exit: bool = False, rss_above: float = 0.0, exe: str = "",
             finalizing: tuple | None = None):
        """(rows, each a list of len(COLUMNS) floats; why; the next tick due in ns). The
        allocator's columns stay NaN here (the Python tick reads them). Rows' RSS leaves out heapsight's own bytes resident
        in the program (the segment's pages), read through pagemap_fd each tick, else
        own_bytes as given; self.own holds them at the last tick and the most seen.
        finalizing: (an fd of /proc/PID/mem, the address of CPython's _PyRuntime._finalizing)
        to read each tick: the loop returns (FINALIZING) after the first that reads it set."""
        self.next_ns.value = next_ns
        self.own[0], self.own[1] = own_bytes, own_bytes
        n = self.lib.hs_read_loop(statm_fd, self.seg_addr, self.start_ns, ctypes.byref(self.next_ns),
                                  self.period_ns, until_ns, self.mask, asked_seq, self.page,
                                  self.buf, ROWS, ctypes.byref(self.why),
                                  -1 if pagemap_fd is None else pagemap_fd, self.own, pid,
                                  1 if watch_exit else 0, rss_above,
                                  os.fsencode(exe) if exe else None,
                                  *(finalizing if finalizing is not None else (-1, 0)))
        k = len(COLUMNS)
        flat = self.buf[:n * k]
        return [flat[i:i + k] for i in range(0, n * k, k)], self.why.value, self.next_ns.value


def counters(segment) -> tuple:
    """(live usable bytes, live requested bytes, allocations, frees) as a tick of the C loop
    reads them (Segment.counters' figures, without numpy)."""
    row = (ctypes.c_double * len(COLUMNS))()
    _load().hs_read_counters(segment.address(), row)
    i = COLUMNS.index("live_usable")
    return tuple(row[i:i + 4])


def steady_counters(segment, statm_fd: int, rss_bytes: int) -> tuple:
    """(the counters, as counters() gives them; (RSS, anonymous RSS) in bytes read from
    statm_fd right after them, or None when it could not be read): the counters and RSS of
    one moment, for a tick that read RSS (rss_bytes) before it read the counters. While RSS
    moved by more than STEADY_BYTES and 1% between the two readings (the reader was
    descheduled between them while the program grew), both are read again."""
    lib, page = _load(), os.sysconf("SC_PAGE_SIZE")
    row = (ctypes.c_double * len(COLUMNS))()
    rss, shared = ctypes.c_uint64(rss_bytes // page), ctypes.c_uint64(0)
    read = lib.hs_read_steady(statm_fd, segment.address(), float(page), ctypes.byref(rss),
                              ctypes.byref(shared), row) >= 0
    i = COLUMNS.index("live_usable")
    after = (rss.value * page, (rss.value - shared.value) * page) if read else None
    return tuple(row[i:i + 4]), after


def poke(segment) -> None:
    """Sends every thread of the program that has counters to the library's slow path at
    its next allocation and free, where it takes a heap map asked for (heapsight.h: the
    poke). Costs the program one slow call per thread."""
    _load().hs_poke_slots(segment.address())


def read_pools(pid: int, pagemap_fd: int, ranges: list) -> tuple | None:
    """CPython's pymalloc pools in the anonymous ranges [(start, end), ...] of process pid
    (native/src/pools.c): (the bytes of the objects in use, the pools' bytes, the pools),
    or None when the process could not be read. Only resident pages are read."""
    if not ranges:
        return (0, 0, 0)
    flat = (_u64 * (2 * len(ranges)))(*(x for r in ranges for x in r[:2]))
    out = (_u64 * 4)()
    if _load().hs_read_pools(pid, pagemap_fd, flat, len(ranges), os.sysconf("SC_PAGE_SIZE"),
                             out) < 0:
        return None
    return out[0], out[1], out[2]
