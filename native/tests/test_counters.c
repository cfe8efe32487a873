/* test_counters.c: the counters linked directly (no preload) and hammered from many threads
 * at once, more threads than there are slots, with frees crossing threads. Every total must
 * come out exact. Exit 0 and "N passed, 0 failed" when all checks hold. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hs_internal.h"

#define THREADS 300   /* > HS_MAX_SLOTS: some threads must fall back to the shared slot */
#define ROUNDS 4
#define PER_THREAD 2000

static void *volatile g_handoff[THREADS][PER_THREAD];
static pthread_barrier_t g_bar;

static size_t size_for(int t, int i) { return (size_t)(1 + (t * 7919 + i * 31) % 3000); }

static void *worker(void *arg) {
  int t = (int)(long)arg;
  /* One allocation each before the barrier: all THREADS hold a slot (or need one) at once. */
  void *first = malloc(8);
  __asm__ volatile("" ::"r"(first) : "memory");
  pthread_barrier_wait(&g_bar);
  free(first);
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < PER_THREAD; i++) {
      void *p = malloc(size_for(t, i));
      __asm__ volatile("" ::"r"(p) : "memory");
      free(p);
    }
  }
  for (int i = 0; i < PER_THREAD; i++) g_handoff[t][i] = malloc(size_for(t, i));
  return NULL;
}

static void *freer(void *arg) { /* frees another thread's blocks: cross-thread frees */
  int t = (int)(long)arg;
  for (int i = 0; i < PER_THREAD; i += 2) free(g_handoff[t][i]);
  return NULL;
}

typedef struct { uint64_t n_alloc, n_free, req, ua, uf; } totals_t;

static totals_t sum(void) {
  totals_t s = {0};
  for (unsigned i = 0; i < HS_MAX_SLOTS; i++) {
    hs_slot_t *sl = &_hs_seg->slots[i];
    s.req += sl->req_alloc_bytes;
    s.n_alloc += sl->n_alloc;
    s.n_free += sl->n_free;
    uint64_t a, f;
    (void)hs_slot_usable(sl, 1000, &a, &f); /* after the threads are joined */
    s.ua += a; s.uf += f;
  }
  return s;
}

static int passed, failed;
static void check(int ok, const char *what, unsigned long long got, unsigned long long want) {
  if (ok) passed++;
  else { failed++; printf("FAIL %s: got %llu want %llu\n", what, got, want); }
}

int main(void) {
  totals_t before = sum();
  pthread_t th[THREADS];
  pthread_barrier_init(&g_bar, NULL, THREADS);
  for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)t);
  for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, freer, (void *)t);
  for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  totals_t after = sum();

  uint64_t want_alloc = (uint64_t)THREADS * (PER_THREAD * (ROUNDS + 1) + 1);
  uint64_t want_free = (uint64_t)THREADS * (PER_THREAD * ROUNDS + 1) + (uint64_t)THREADS * PER_THREAD / 2;
  uint64_t want_req = 0, want_live_usable = 0;
  for (int t = 0; t < THREADS; t++)
    for (int i = 0; i < PER_THREAD; i++) {
      want_req += size_for(t, i) * (ROUNDS + 1) + (i == 0 ? 8 : 0);
      if (i % 2) want_live_usable += malloc_usable_size(g_handoff[t][i]);
    }
  /* pthread_create and friends allocate too; allow for them but no more than 1%. */
  uint64_t got_alloc = after.n_alloc - before.n_alloc, got_free = after.n_free - before.n_free;
  check(got_alloc >= want_alloc && got_alloc <= want_alloc + want_alloc / 100, "allocations", got_alloc, want_alloc);
  check(got_free >= want_free && got_free <= want_free + want_free / 100, "frees", got_free, want_free);
  uint64_t got_req = after.req - before.req;
  check(got_req >= want_req && got_req <= want_req + want_req / 100, "requested bytes", got_req, want_req);
  uint64_t live = (after.ua - after.uf) - (before.ua - before.uf);
  check(live >= want_live_usable && live <= want_live_usable + 64 * 1024, "live usable bytes", live, want_live_usable);
  check(_hs_seg->slot_overflows > 0, "threads beyond the slots used the shared slot", _hs_seg->slot_overflows, 1);
  check(_hs_seg->slots_used <= HS_MAX_SLOTS, "slots in range", _hs_seg->slots_used, HS_MAX_SLOTS);
  check(_hs_seg->peak_usable_bytes >= want_live_usable, "peak at least the final live", _hs_seg->peak_usable_bytes, want_live_usable);
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
