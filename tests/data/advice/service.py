"""A Python service: builds 480k small objects, keeps every 200th in a cache, drops the rest
and idles; before it ends it prints its own RSS while idle (from /proc/self/statm)."""
import os
import sys
import time


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Row:
    __slots__ = ("a", "b", "c")

    def __init__(self, i):
        self.a, self.b, self.c = i, str(i) * 3, [i, i + 1]


data = [Row(i) for i in range(480_000)]
cache = data[::200]
del data
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0)
print(f"idle rss {rss()}", file=sys.stderr)
