"""Freed memory at the top of a thread's heap, which glibc's malloc_trim never shrinks (it
trims only the main heap's top; a thread heap's top shrinks on a free, past the trim
threshold that glibc raises with the dynamic mmap threshold): the finding says so, is not
called fragmentation, and what it suggests gives the memory back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

MiB = 1 << 20

TOPS = r"""
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void *work(void *arg) {
  (void)arg;
  /* a 16 MiB block, mmapped, then freed: the mmap threshold rises to 16 MiB and the trim
   * threshold to 32 MiB */
  char *big = malloc(16 << 20);
  memset(big, 1, 16 << 20);
  free(big);
  /* 24 blocks of 1 MiB now come from this thread's heap; freed, they coalesce into its top */
  char *blocks[24];
  for (int i = 0; i < 24; i++) { blocks[i] = malloc(1 << 20); memset(blocks[i], 2, 1 << 20); }
  for (int i = 23; i >= 0; i--) free(blocks[i]);
  return NULL;
}

int main(void) {
  pthread_t t;
  pthread_create(&t, NULL, work, NULL);
  pthread_join(t, NULL);
  /* the program goes on after the frees: what glibc keeps is the program's, not its last
   * moments' (analysis.RETENTION_MIN_AGE_S) */
  struct timespec ts = {0, 300000000};
  nanosleep(&ts, NULL);
  return 0;
}
"""


def run(tmp_path, exe, env=None):
    js = tmp_path / f"s{len(list(tmp_path.iterdir()))}.json"
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "--no-save", "--json",
                        str(js), "--", str(exe)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120, env={**os.environ, **(env or {})})
    assert p.returncode == 0, p.stderr
    return json.loads(js.read_text())


def test_a_thread_heaps_free_top_is_named_and_the_tunable_returns_it(tmp_path):
    src, exe = tmp_path / "tops.c", tmp_path / "tops"
    src.write_text(TOPS)
    # (-fno-builtin: the compiler would drop a malloc and free whose block is never read)
    subprocess.run(["cc", "-O1", "-fno-builtin", "-pthread", "-o", str(exe), str(src)], check=True)
    # GIVEN a thread that freed 24 MiB into its heap's top after the thresholds rose
    s = run(tmp_path, exe)
    assert s["final"]["retained_bytes"] >= 20 * MiB, s["final"]
    (f,) = [f for f in s["findings"] if f["kind"] in ("retention", "fragmentation")]
    # THEN the finding puts it on the top of the thread's heap, not on fragmentation, and
    # the release at exit (malloc_trim) gave back little of it
    assert f["kind"] == "retention", f
    assert "top of the threads' heaps" in f["detail"], f["detail"]
    assert s["release"]["gave_back_bytes"] < 4 * MiB, s["release"]
    tunable = next(x for x in f["suggestions"] if "trim_threshold" in x)
    # WHEN the suggestion is followed (its environment)
    env = dict(w.split("=", 1) for w in tunable.split(" heapsight run")[0].split())
    s2 = run(tmp_path, exe, env)
    # THEN the memory goes back: nothing retained at exit
    assert s2["final"]["retained_bytes"] < 2 * MiB, s2["final"]
