"""The live figure at every reading while threads churn: the hot path adds no usable bytes
(its countdowns count them) and each thread folds its countdowns into its slot's totals
every 64 KiB; a reader that caught a fold half-done would be off by up to 64 KiB. The
slot's seq makes the sampler read again, so every reading of a steady heap is within a
block or two of the others."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

N, SIZE = 2000, 40  # each thread's ring: N blocks of SIZE bytes (usable 40: no waste)

STEADY = r"""
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define N %d
#define SIZE %d
static pthread_barrier_t bar;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *worker(void *arg) {
  void **ring = arg;
  for (int k = 0; k < N; k++) ring[k] = malloc(SIZE);
  pthread_barrier_wait(&bar);
  double end = now() + 1.5;
  for (long i = 0; ; i++) {
    int k = (int)(i %% N);
    free(ring[k]);
    ring[k] = malloc(SIZE);     /* the same live bytes, a block at a time */
    if ((i & 1023) == 0 && now() > end) break;
  }
  return NULL;
}

int main(void) {
  static void *rings[2][N];
  pthread_t t[2];
  pthread_barrier_init(&bar, NULL, 2);
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, rings[i]);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < N; k++) free(rings[i][k]);
  return 0;
}
""" % (N, SIZE)


def test_every_reading_of_a_steady_heap_is_within_a_block_or_two(tmp_path):
    src, exe = tmp_path / "steady.c", tmp_path / "steady"
    src.write_text(STEADY)
    subprocess.run(["cc", "-O2", "-pthread", "-o", str(exe), str(src)], check=True)
    rec = tmp_path / "steady.hsrun.json.gz"
    # GIVEN two threads that free and malloc a 40-byte block in turn for 1.5 s, each
    # folding its countdowns into its slot every 64 KiB (hundreds of times a second)
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "--hz", "1000",
                        "-o", str(rec), "--", str(exe)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    tl = json.loads(gzip.open(rec, "rt").read())["timeline"]
    n_alloc, live = tl["n_alloc"], tl["live_usable"]
    last = max(a for a in n_alloc if a is not None)
    # WHEN the readings taken while both rings churn are looked at (past the rings' fill,
    # before the last frees: those allocate nothing)
    during = [v for a, v in zip(n_alloc, live)
              if a is not None and 4 * N < a < last and v is not None]
    assert len(during) > 300, len(during)
    # THEN they all lie within a few blocks: the ring's 2 x 2000 x 40 bytes, less a
    # block in flight per thread (a half-done fold would be off by up to 64 KiB)
    assert max(during) - min(during) <= 4096, (min(during), max(during))
    assert abs(max(during) - 2 * N * SIZE) < 64 * 1024, max(during)
