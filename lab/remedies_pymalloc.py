#!/usr/bin/env python3
"""heapsight lab remedies, the CPython pattern: pymalloc arenas pinned by a few survivors.

    python3 hs-lab-remedies-pymalloc.py [--objects 480000] [--keep-every 200] [--trim 0|1]

Builds --objects small objects (a class with __slots__ holding an int, a short str and a
2-item list), keeps every --keep-every'th in a list, drops the rest, and reads its RSS
("the RSS kept after the drop"); with --trim 1 it then calls glibc's malloc_trim(0)
through ctypes and reads the RSS again. RSS is read from /proc/self/statm (resident pages
x page size). Prints one JSON object on stdout:
    {"event": "result", "allocator": ..., "rss_start": bytes, "rss_after": bytes,
     "rss_trim": bytes (= rss_after without --trim), "work_s": s, "trim_s": s, ...}
Standard library only. Exit 0 on success, 2 on bad arguments."""

import argparse
import ctypes
import json
import os
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


class Item:
    __slots__ = ("n", "name", "pair")

    def __init__(self, n, name, pair):
        self.n = n
        self.name = name
        self.pair = pair


def rss() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE


def allocator() -> str:
    """Which allocator answers malloc here: each exports a function glibc lacks."""
    me = ctypes.CDLL(None)
    for name, symbol in (("jemalloc", "mallctl"),
                         ("tcmalloc", "MallocExtension_GetNumericProperty"),
                         ("mimalloc", "mi_version")):
        if hasattr(me, symbol):
            return name
    return "glibc"


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", type=int, default=480_000)
    p.add_argument("--keep-every", type=int, default=200)
    p.add_argument("--trim", type=int, choices=(0, 1), default=0)
    args = p.parse_args(argv)
    if args.objects < 1 or args.keep_every < 1:
        p.error("--objects and --keep-every must be at least 1")
    libc = ctypes.CDLL("libc.so.6")   # loaded in every run, so that every run's RSS has it
    rss_start = rss()
    t0 = time.perf_counter()
    items = [Item(i, f"item-{i}", [i, -i]) for i in range(args.objects)]
    kept = items[::args.keep_every]
    del items
    t1 = time.perf_counter()
    rss_after = rss_trim = rss()
    t2 = t1
    if args.trim:
        libc.malloc_trim(0)
        t2 = time.perf_counter()
        rss_trim = rss()
    print(json.dumps({"event": "result", "allocator": allocator(),
                      "python": sys.version.split()[0],
                      "pythonmalloc": os.environ.get("PYTHONMALLOC", ""),
                      "objects": args.objects, "keep_every": args.keep_every,
                      "trim": args.trim, "kept_objects": len(kept),
                      "rss_start": rss_start, "rss_after": rss_after, "rss_trim": rss_trim,
                      "work_s": round(t1 - t0, 6), "trim_s": round(t2 - t1, 6)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
