/* pools.c: how much of CPython's object allocator (pymalloc) is objects in use, read from
 * the sampler's side (libhsread.so): no thread of heapsight's in the program, no call into
 * it, none of its locks.
 *
 * pymalloc carves its arenas (1 MiB, mapped with mmap) into pools of POOL_SIZE bytes, each
 * aligned to POOL_SIZE, each of one size class, each starting with a header
 * (Objects/obmalloc.c, struct pool_header, the same in CPython 3.10-3.13 built with the
 * radix tree, the default: 16 KiB pools):
 *
 *   offset  0  ref.count      blocks in use (a union with a pointer: 8 bytes)
 *           8  freeblock      the pool's free list
 *          16  nextpool, 24 prevpool
 *          32  arenaindex     (uint)
 *          36  szidx          the size class: blocks of (szidx + 1) * 16 bytes
 *          40  nextoffset     the next block never used yet
 *          44  maxnextoffset  POOL_SIZE - the block size, set once when the pool is made
 *
 * A pool's objects in use are count x the block size. The header is read at every
 * POOL_SIZE-aligned address of the anonymous mappings the caller gives, on the pages that
 * are resident (pagemap: a page never touched or swapped out is not read, so reading faults
 * nothing in), and counted only where it is one: a size class, maxnextoffset exactly the
 * pool's size less the block's, nextoffset a whole number of blocks past the header and no
 * further than one past maxnextoffset, count no more than the blocks handed out. A pool
 * that emptied keeps its header with count 0 (in its arena's free list) and counts as
 * pooled, none of it in use. The headers are read while the program runs: a pool that
 * changes during the read is off by its few blocks. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include "hs_pools.h"
#include "readloop.h"

#define BATCH 512         /* headers a system call reads */
#define PAGEMAP_BATCH 4096 /* pagemap entries a read takes */


/* Reads the k headers queued; what came before a mapping that went meanwhile counts (the
 * read stops there). -1 when nothing could be read. */
static int flush_batch(int pid, hs_pool_header_t *got, struct iovec *local, struct iovec *remote,
                       int k, uint64_t *out) {
  if (!k) return 0;
  ssize_t n = process_vm_readv(pid, local, (unsigned long)k, remote, (unsigned long)k, 0);
  if (n < 0) return -1;
  int whole = (int)(n / (ssize_t)sizeof got[0]);
  for (int i = 0; i < whole; i++) hs_pool_count(&got[i], out);
  out[3] += (uint64_t)whole;
  return 0;
}

/* Reads the pool headers at the resident HS_POOL_SIZE-aligned pages of each range
 * [ranges[2i], ranges[2i+1]) of process pid: out[0] the bytes of the blocks in use, out[1]
 * the bytes of the pools found, out[2] their number, out[3] the headers read. Returns 0,
 * or -1 when the process could not be read (gone, or not ours to read). Its buffers are
 * static (72 KiB, not on the sampler's stack): one caller at a time, the sampler's thread. */
int hs_read_pools(int pid, int pagemap_fd, const uint64_t *ranges, int n_ranges,
                  uint64_t page_bytes, uint64_t *out) {
  static hs_pool_header_t got[BATCH];
  static struct iovec local[BATCH], remote[BATCH];
  static uint64_t present[PAGEMAP_BATCH];
  memset(out, 0, 4 * sizeof *out);
  if (pagemap_fd < 0 || page_bytes == 0 || HS_POOL_SIZE % page_bytes) return -1;
  uint64_t step = HS_POOL_SIZE / page_bytes; /* pages a pool spans */
  int k = 0;
  for (int r = 0; r < n_ranges; r++) {
    uint64_t lo = (ranges[2 * r] + HS_POOL_SIZE - 1) & ~(uint64_t)(HS_POOL_SIZE - 1);
    uint64_t hi = ranges[2 * r + 1];
    while (lo + HS_POOL_OVERHEAD <= hi) {
      /* the pagemap entries of the next pools: each pool's first page, resident or not */
      uint64_t pages = (hi - lo + page_bytes - 1) / page_bytes;
      if (pages > PAGEMAP_BATCH) pages = PAGEMAP_BATCH - PAGEMAP_BATCH % step;
      ssize_t n = pread(pagemap_fd, present, pages * 8, (off_t)(lo / page_bytes * 8));
      if (n <= 0) break; /* the mapping went: the next range */
      uint64_t have = (uint64_t)n / 8;
      for (uint64_t i = 0; i < have; i += step) {
        uint64_t at = lo + i * page_bytes;
        if (at + HS_POOL_OVERHEAD > hi) break;
        if (!(present[i] >> 63)) continue; /* not resident: nothing RSS counts is there */
        local[k] = (struct iovec){&got[k], sizeof got[k]};
        remote[k] = (struct iovec){(void *)(uintptr_t)at, sizeof got[k]};
        if (++k == BATCH) {
          if (flush_batch(pid, got, local, remote, k, out) < 0) return -1;
          k = 0;
        }
      }
      lo += (have + step - 1) / step * step * page_bytes;
    }
  }
  return flush_batch(pid, got, local, remote, k, out);
}
