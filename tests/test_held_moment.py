"""The held column's split: read at a sample where the allocator's mapped memory was read,
near the stretch's middle, so memory malloc did not give is not read as retained after a
big free (moments.level)."""

from __future__ import annotations

MiB = 1 << 20
PYTHON = "/usr/bin/python3"   # Debian's CPython 3.11 (pymalloc)
# 200k dicts kept (pymalloc's arenas: anonymous memory malloc did not give), a 64 MiB
# block written and kept 0.15 s (glibc serves it by its own mmap, read with it at a
# reading of glibc's figures), freed, then 1 s idle: the held stretch
FREE_THEN_IDLE = ("import time\n"
                  "keep = [{'a': i, 'b': str(i)} for i in range(200000)]\n"
                  "a = b'x' * (64 << 20)\n"
                  "time.sleep(0.15)\n"
                  "del a\n"
                  "time.sleep(1.0)\n")


def test_the_held_column_after_a_big_free_is_not_read_as_retained(hs):
    r = hs(PYTHON, "-c", FREE_THEN_IDLE, opts=["-q", "--no-save"])
    assert r.rc == 0, r.stderr
    s = r.summary
    by = {m["name"]: m["breakdown"] for m in s["moments"]}
    held, end = by["held"], by["end"]
    assert held["rss_bytes"] < 100 * MiB < s["peak_rss_bytes"], (held, s["peak_rss_bytes"])
    # THEN glibc kept little (as the end's own reading says) and pymalloc's arenas are
    # non-heap; the first samples of the idle stretch, between a reading with the 64 MiB
    # block and one without, read 57.2 MiB retained and 6.0 MiB non-heap
    assert held["retained_bytes"] < 4 * MiB, held
    assert held["non_heap_bytes"] > 40 * MiB, held
    assert abs(held["retained_bytes"] - end["retained_bytes"]) < 2 * MiB, (held, end)
