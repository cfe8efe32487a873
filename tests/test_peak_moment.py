"""The peak column and the peak figures: taken where the program was at its most live
bytes with the highest RSS, and never below what was live at exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HS = [sys.executable, "-m", "heapsight"]

# mallocs 100 MiB, waits, then writes it 4 MiB at a time over about half a second
TOUCH = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(void) {
  size_t n = 100u << 20;
  char *p = malloc(n);
  usleep(150000);
  for (size_t off = 0; off < n; off += 4u << 20) { memset(p + off, 1, 4u << 20); usleep(10000); }
  usleep(150000);
  free(p);
  return 0;
}
"""

# 200,000 malloc(1) (24 usable bytes, 1 requested, each) freed, then 1,100 blocks of 4,088
# bytes (usable as requested) kept to the end: the most usable bytes are in the first
# phase, the most requested bytes at exit
MIX = r"""
#include <stdlib.h>
#include <unistd.h>
#define N 200000
static char *small[N];
int main(void) {
  for (int i = 0; i < N; i++) small[i] = malloc(1);
  usleep(60000);
  for (int i = 0; i < N; i++) free(small[i]);
  for (int i = 0; i < 1100; i++) { char *volatile p = malloc(4088); p[0] = 1; }
  usleep(30000);
  return 0;
}
"""


def run(tmp_path, name: str, source: str) -> tuple:
    src, exe, js = tmp_path / f"{name}.c", tmp_path / name, tmp_path / f"{name}.json"
    src.write_text(source)
    subprocess.run(["cc", "-O1", "-o", str(exe), str(src)], check=True)
    r = subprocess.run([*HS, "run", "--no-save", "--json", str(js), "--", str(exe)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(js.read_text()), r.stderr


def test_the_peak_column_is_where_the_peak_live_bytes_were_written(tmp_path):
    # GIVEN a program at its most live bytes from its malloc on, whose RSS grows as it writes
    s, err = run(tmp_path, "touch", TOUCH)
    # THEN the peak column is taken once the block is written (it was the first sample
    # at the peak: RSS 1.7 MiB, "99.9 MiB allocated, never touched")
    peak = s["peak"]
    assert peak["live_bytes"] >= 100 << 20
    assert peak["rss_bytes"] >= 95 << 20, peak
    assert peak["untouched_bytes"] < 8 << 20, peak
    assert peak["rss_bytes"] >= s["peak_rss_bytes"] - (8 << 20)
    # and the table's peak RSS column has no block never touched either
    at_peak = next(m for m in s["moments"] if m["name"] == "peak")["breakdown"]
    assert at_peak["untouched_bytes"] < 8 << 20, at_peak
    row = next((x for x in err.splitlines() if "never touched" in x and "B" in x), "")
    assert not row or row.split("never touched")[1].split()[:2] == ["0", "B"], row


def test_the_peak_live_bytes_are_never_below_those_at_exit(tmp_path):
    # GIVEN a program whose requested bytes are at their most at exit
    s, _ = run(tmp_path, "mix", MIX)
    h = s["heap"]
    # THEN both peaks are at least what was live at exit (the requested one was 200,664
    # against 4,497,464 at exit: the usable peak's ratio of requested to usable)
    assert h["peak_live_usable_bytes"] >= h["live_usable_bytes"] >= 1100 * 4088
    assert h["peak_live_requested_bytes"] >= h["live_requested_bytes"]
    assert h["peak_live_requested_bytes"] <= h["peak_live_usable_bytes"]
    # and the usable peak is the first phase's: 200,000 blocks of 24 bytes
    assert h["peak_live_usable_bytes"] >= 200000 * 24


# 8 MiB in fa(), then 32 MiB in fb(), which makes the peak
FAFB = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
__attribute__((noinline)) char *fa(void) { char *p = malloc(8u << 20); memset(p, 1, 8u << 20); return p; }
__attribute__((noinline)) char *fb(void) { char *p = malloc(32u << 20); memset(p, 1, 32u << 20); return p; }
int main(void) {
  char *volatile a = fa();
  usleep(50000);
  char *volatile b = fb();
  usleep(50000);
  free(b);
  free(a);
  return 0;
}
"""


def test_the_block_that_makes_the_peak_is_among_the_peaks_call_sites(tmp_path):
    src, exe, js = tmp_path / "fafb.c", tmp_path / "fafb", tmp_path / "s.json"
    src.write_text(FAFB)
    subprocess.run(["cc", "-O1", "-g", "-o", str(exe), str(src)], check=True)
    r = subprocess.run([*HS, "run", "--no-save", "--json", str(js), "--", str(exe)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s = json.loads(js.read_text())
    peak = next(m for m in s["sites"]["moments"] if m["name"] == "peak")
    frames = s["sites"]["frames"]
    got = {}
    for x in peak["sites"]:
        fn = frames[x["frame"]]["function"] if x["frame"] is not None else None
        got[fn] = got.get(fn, 0) + x["bytes"]
    # THEN fb's 32 MiB are there beside fa's 8 (the peak was timed before fb's sample was,
    # and its sites were fa's alone: "8.0 MiB 100% fa")
    assert got.get("fb", 0) > 30 << 20 and got.get("fa", 0) > 6 << 20, got


# 150 times: a 32 MiB block (glibc serves it by its own mmap) written, then freed
MUNMAPS = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(void) {
  for (int i = 0; i < 150; i++) {
    size_t n = (32u << 20) + i * 4096;
    char *p = malloc(n);
    memset(p, 1, n);
    __asm__ volatile("" :: "r"(p) : "memory");
    free(p);
    usleep(7000);
  }
  return 0;
}
"""


@pytest.mark.parametrize("how", ["munmap", "heap trim"])
def test_a_block_glibc_gives_back_is_never_read_as_retained(tmp_path, how):
    # (munmap: glibc serves 32 MiB by its own mmap; heap trim: with a fixed 64 MiB mmap
    # threshold it comes from the heap, and its free trims the heap's top)
    from heapsight import record
    src, exe, saved = tmp_path / "munmaps.c", tmp_path / "munmaps", tmp_path / "r.hsrun.json.gz"
    src.write_text(MUNMAPS)
    subprocess.run(["cc", "-O1", "-o", str(exe), str(src)], check=True)
    env = dict(os.environ)
    if how == "heap trim":
        env["GLIBC_TUNABLES"] = "glibc.malloc.mmap_threshold=67108864"
    r = subprocess.run([*HS, "run", "-q", "-o", str(saved), "--", str(exe)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    rec = record.load(str(saved))
    tl = rec["timeline"]
    # THEN no sample has the block's pages resident with the block counted freed (its free is
    # counted once glibc's free returned: counted before, 5-14 samples of ~400 caught the
    # munmap or the trim, and the peak column read "live 0 B, retained 32.5 MiB" in 2 runs
    # of 3, and 1 of 3 for the trim)
    caught = [(t, rss, live) for t, rss, live in zip(tl["t"], tl["rss"], tl["live_usable"])
              if rss is not None and live is not None and rss - live > 16 << 20 and live < 1 << 20]
    assert caught == [], caught[:5]
    peak = next(m for m in rec["summary"]["moments"] if m["name"] == "peak")["breakdown"]
    assert peak["retained_bytes"] < 4 << 20, peak
