/* hs_pools.h: CPython's pymalloc pool header, as pools.c (the sampler's side, from outside)
 * and the heap map's copy (heapmap.c, inside a copy of the program) read it: pools.c says
 * the layout and how a header is told from other memory. */
#ifndef HS_POOLS_H
#define HS_POOLS_H

#include <stdint.h>

#define HS_POOL_SIZE (16u * 1024u)
#define HS_POOL_OVERHEAD 48u /* the header, rounded up to pymalloc's 16-byte alignment */
#define HS_POOL_CLASSES 32u  /* blocks of 16 to 512 bytes */

typedef struct {
  uint32_t count, count_pad; /* ref: a uint in a union with a pointer (little-endian) */
  uint64_t freeblock, nextpool, prevpool;
  uint32_t arenaindex, szidx, nextoffset, maxnextoffset;
} hs_pool_header_t;

/* The block size of a pool whose header this is, 0 when it is not a pool's header. */
static inline uint32_t hs_pool_block(const hs_pool_header_t *h) {
  if (h->szidx >= HS_POOL_CLASSES) return 0;
  uint32_t size = (h->szidx + 1) * 16u;
  if (h->maxnextoffset != HS_POOL_SIZE - size) return 0;
  if (h->nextoffset < HS_POOL_OVERHEAD + size || h->nextoffset > h->maxnextoffset + size ||
      (h->nextoffset - HS_POOL_OVERHEAD) % size != 0)
    return 0;
  if (h->count > (h->nextoffset - HS_POOL_OVERHEAD) / size) return 0;
  return size;
}

/* A header counted into out: [0] the bytes of the blocks in use, [1] the pools' bytes, [2]
 * the pools. */
static inline void hs_pool_count(const hs_pool_header_t *h, uint64_t *out) {
  uint32_t size = hs_pool_block(h);
  if (!size) return;
  out[0] += (uint64_t)h->count * size;
  out[1] += HS_POOL_SIZE;
  out[2] += 1;
}

#endif
