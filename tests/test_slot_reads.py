"""The live figure at every reading while threads churn: the hot path adds no usable bytes
(its countdowns count them) and each thread folds its countdowns into its slot's totals
every 64 KiB; a reader that caught a fold half-done would be off by up to 64 KiB. The
slot's seq makes the sampler read again, so every reading of a steady heap is within a
block or two of the others. And a signal handler that allocates in the middle of its
thread's fold leaves its counts pending instead of folding them twice."""

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


TICKING = r"""
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static void *volatile sink;
/* 40 bytes: from glibc's per-thread cache, which takes no lock (primed in main), so the
 * handler never waits on the arena the code it interrupts may hold */
static void on_tick(int sig) { (void)sig; void *p = malloc(40); sink = p; free(p); }

int main(void) {
  /* the cache's entry, through the volatile pointer: free(malloc(40)) is compiled away, and
   * the handler's first malloc then ran in the arena the loop was in (bare: aborted 10 runs
   * of 10; under heapsight only when its start-up left no such chunk in the cache) */
  sink = malloc(40);
  free(sink);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_tick;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval it = {{0, 50}, {0, 50}};
  setitimer(ITIMER_REAL, &it, NULL);
  enum { N = 1000 };
  static void *ring[N];
  unsigned seed = 1;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0;; i++) {
    int k = (int)(i % N);
    free(ring[k]);
    seed = seed * 1103515245u + 12345u;
    ring[k] = malloc(1100 + (seed >> 16) % 2000); /* past the cache: the arena's */
    if ((i & 4095) == 0) {
      clock_gettime(CLOCK_MONOTONIC, &t);
      if (t.tv_sec - t0.tv_sec + (t.tv_nsec - t0.tv_nsec) / 1e9 > 1.0) break;
    }
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  for (int k = 0; k < N; k++) free(ring[k]);
  return 0;
}
"""


def test_a_handler_that_allocates_inside_a_fold_leaves_the_totals_exact(tmp_path):
    src, exe = tmp_path / "ticking.c", tmp_path / "ticking"
    src.write_text(TICKING)
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], check=True)
    subprocess.run([str(exe)], check=True, timeout=60)   # (its handler is safe bare)
    # GIVEN a program that frees and mallocs for 1 s, folding its countdowns every ~25
    # allocations, interrupted every 50 us by a handler that mallocs and frees 40 bytes
    # (before the fold was guarded, live at exit read 48-259 KB in 3 runs of 3)
    for i in range(3):
        js = tmp_path / f"s{i}.json"
        p = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "--no-save",
                            "--json", str(js), "--", str(exe)],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert p.returncode == 0, p.stderr
        heap = json.loads(js.read_text())["heap"]
        # THEN everything it allocated it freed, to the byte
        assert heap["n_alloc"] == heap["n_free"] > 1_000_000, heap
        assert heap["live_usable_bytes"] == 0, heap
