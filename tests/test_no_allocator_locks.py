"""While the program runs, no reading of heapsight's takes an allocator lock or walks its
free lists: glibc's mallinfo2, malloc_info and malloc_stats are never called (they lock
every arena and walk its bins), at the samples or at exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import scenario

HS = [sys.executable, "-m", "heapsight"]

# counts the calls of glibc's walking statistics, forwards them, and writes the counts at exit
SPY = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
static int calls[3];
struct mallinfo2 mallinfo2(void) {
  __atomic_fetch_add(&calls[0], 1, __ATOMIC_RELAXED);
  return ((struct mallinfo2 (*)(void))dlsym(RTLD_NEXT, "mallinfo2"))();
}
int malloc_info(int options, FILE *fp) {
  __atomic_fetch_add(&calls[1], 1, __ATOMIC_RELAXED);
  return ((int (*)(int, FILE *))dlsym(RTLD_NEXT, "malloc_info"))(options, fp);
}
void malloc_stats(void) {
  __atomic_fetch_add(&calls[2], 1, __ATOMIC_RELAXED);
  ((void (*)(void))dlsym(RTLD_NEXT, "malloc_stats"))();
}
__attribute__((destructor(101))) static void report(void) {
  const char *out = getenv("SPY_OUT");
  FILE *f = out ? fopen(out, "a") : NULL;
  if (f) { fprintf(f, "%d %d %d\n", calls[0], calls[1], calls[2]); fclose(f); }
}
"""


def test_no_walking_statistics_are_called_during_the_run_or_at_exit(tmp_path):
    (tmp_path / "spy.c").write_text(SPY)
    spy = tmp_path / "spy.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(spy), str(tmp_path / "spy.c"),
                    "-ldl"], check=True)
    out, js = tmp_path / "calls", tmp_path / "s.json"
    # GIVEN a run of 8 threads holding 256 MiB of freed memory, sampled at a high
    # statistics rate, with the spy behind heapsight's library
    env = {**os.environ, "LD_PRELOAD": str(spy), "SPY_OUT": str(out)}
    r = subprocess.run([*HS, "run", "--no-save", "--stats-hz", "200", "--json", str(js), "--",
                        scenario("hs-retention"), "--hold-ms", "300"],
                       capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    # THEN none of them was called, in the run or at exit (the release, malloc_trim, is
    # the one call heapsight makes), in the program or anywhere the spy was loaded
    lines = out.read_text().splitlines()
    assert lines and set(lines) == {"0 0 0"}, lines
    s = json.loads(js.read_text())
    # and the split still sees what glibc keeps: retained at exit, bounded by what it
    # holds from the OS (each arena's system_mem and the mmapped chunks, read unlocked)
    assert s["final"]["retained_bytes"] > 200 << 20, s["final"]
    assert s["heap"]["arenas"] >= 2


def test_the_exit_waits_for_the_copy_to_be_made_not_walked(tmp_path):
    # GIVEN perl with 250,000 freed hash entries (a heap of many free chunks), run with
    # heapsight's defaults, then with the release made in the program itself
    prog = 'my %h; $h{$_} = "y" x 150 for 1..250000; undef %h;'

    def run(name, *opts):
        js = tmp_path / f"{name}.json"
        r = subprocess.run([*HS, "run", "--no-save", *opts, "--json", str(js), "--",
                            "perl", "-e", prog], capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        return json.loads(js.read_text())

    s, inside = run("defaults"), run("inside", "--release-in-program")
    (exit_map,) = [m for m in s["heapmaps"] if m["moment"] == "exit"]
    # THEN the map of the exit is there, walked by the copy after the program had gone on,
    # and the program's exit waited for the copy to be made only (300 ms before: the two
    # statistics walks, the release, and the copy's walk)
    assert exit_map["status"] == "mapped", exit_map["status"]
    assert exit_map["map_ms"] > s["exit_held_s"] * 1000
    assert 0 < s["exit_held_s"] <= s["exit_probe_s"]
    assert s["exit_held_s"] < 0.05, s["exit_held_s"]
    # the release was measured in the copy: the program kept its memory to the end ...
    rel = s["release"]
    assert rel["measured"] and rel["where"] == "copy", rel
    assert rel["gave_back_bytes"] == exit_map["release_measured_bytes"] > 20 << 20
    # ... and it gives back what the same release in the program gives back
    rin = inside["release"]
    assert rin["measured"] and rin["where"] == "program", rin
    assert abs(rel["gave_back_bytes"] - rin["gave_back_bytes"]) <= 0.05 * rin["gave_back_bytes"]
    # which the program waited for: its exit was held longer
    assert inside["exit_held_s"] >= rin["seconds"] > 0
