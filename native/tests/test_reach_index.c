/* reach.c's find with its index against a plain scan of every block, on layouts of blocks
 * like the heaps' (dense runs of small blocks, big blocks, runs far apart, a block's last
 * word on glibc's chunk rule), and words inside, between, at the edges and outside. Prints
 * "reach-index: layouts=N words=M mismatches=K" and exits 1 on any mismatch. */
#define _GNU_SOURCE /* (reach.c's, before any header) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../src/reach.c"

uint64_t _hs_now_ns(void) { return 0; }

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static int64_t plain(const hs_chunk_t *c, size_t n, int glibc, uint64_t w) {
  for (size_t i = 0; i < n; i++) {
    if (w < c[i].lo || w >= c[i].hi) continue;
    if (glibc && (c[i].hi & 15) == 8 && w >= c[i].hi - 8) return -1;
    return (int64_t)i;
  }
  return -1;
}

int main(void) {
  long layouts = 0, words = 0, bad = 0;
  for (int round = 0; round < 120; round++) {
    size_t n = 64 + next() % 3000;
    hs_chunk_t *c = calloc(n, sizeof *c);
    uint64_t at = 0x555555554000ull + (next() % 4096) * 16;
    for (size_t i = 0; i < n; i++) {
      uint64_t r = next() % 100;
      if (r < 2) at += (next() % 4 + 1) * (HS_REACH_GAP_BYTES + 4096); /* another run */
      else if (r < 10) at += (next() % 64) * 16;                        /* a free gap */
      uint64_t size = r < 5 ? (next() % 4096 + 1) * 4096 : (next() % 64 + 1) * 16;
      c[i].lo = at + 16;
      c[i].hi = c[i].lo + size - 8; /* glibc: usable bytes end 8 past a multiple of 16 */
      if (round % 3 == 0) c[i].hi = c[i].lo + (next() % 8 + 1) * 8; /* other allocators */
      at = c[i].hi + 8 + (round % 3 == 0 ? next() % 3 * 8 : 0);
    }
    uint8_t *state = calloc(n + 1, 1);
    uint32_t *stack = calloc(2 * n + 1, sizeof *stack);
    hs_reach_t r;
    _hs_reach_init(&r, c, n, state, stack);
    r.glibc_chunks = round % 3 != 0;
    unsigned shift = 0;
    size_t bytes = _hs_reach_index_bytes(c, n, &shift);
    void *mem = malloc(bytes);
    _hs_reach_index(&r, mem, shift);
    layouts++;
    for (int k = 0; k < 5000; k++) {
      const hs_chunk_t *b = &c[next() % n];
      uint64_t w;
      switch (next() % 6) {
      case 0: w = b->lo; break;
      case 1: w = b->hi - 1; break;
      case 2: w = b->hi; break;
      case 3: w = b->lo - 1 - next() % 64; break;
      case 4: w = b->lo + next() % (b->hi - b->lo); break;
      default: w = c[0].lo - 4096 + next() % (c[n - 1].hi - c[0].lo + 8192); break;
      }
      words++;
      int64_t want = plain(c, n, r.glibc_chunks, w), got = find(&r, w);
      if (want != got && bad++ < 10)
        fprintf(stderr, "round %d word %#llx: find %lld, every block says %lld\n", round,
                (unsigned long long)w, (long long)got, (long long)want);
    }
    free(mem);
    free(stack);
    free(state);
    free(c);
  }
  printf("reach-index: layouts=%ld words=%ld mismatches=%ld\n", layouts, words, bad);
  return bad != 0;
}
