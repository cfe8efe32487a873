/* blockmap.c: where every live block starts, under an allocator other than glibc, and
 * which mappings are the allocator's own: what the heap map's copy needs to mark which
 * blocks the program can still reach (heapmap.c's reach) where it cannot walk the heaps.
 *
 * The starts: one bit per 8-byte granule of the address space (every allocator's blocks
 * are 8-aligned at least), set when the hooks count an allocation and cleared when they
 * count its free (counters.c's slow path, which every call takes under these allocators).
 * Two levels: a region of bits per 4 GiB of addresses (64 MiB reserved, backed only where
 * written: a bitmap page covers 256 KiB of blocks), made by the first block in that range;
 * the bitmap's pages are counted as heapsight's own memory as they are first written. A
 * region that cannot be made leaves the list incomplete, and the copy says so rather than
 * mark from it.
 *
 * The allocator's mappings: jemalloc, tcmalloc and mimalloc map their heaps and their
 * bookkeeping with mmap (and tcmalloc with sbrk), through mappings.c's hooks. Their
 * bookkeeping points at the blocks (a slab's address is its first block's), so none of it
 * may be a root. Every anonymous mapping is noted with the base of the object that called
 * mmap until the allocator is known (its first mappings come from its constructor, before
 * heapsight's); then only the allocator's are kept, and munmap takes any range out. */
#define _GNU_SOURCE
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "hs_internal.h"

#define BM_PAGE 4096ull
#define BM_REGION_PAGES (HS_BM_REGION_BYTES / BM_PAGE)            /* 16,384 */

/* A region: a page of header (which bitmap pages were written), then the bits
 * (HS_BM_HEADER_BYTES in: hs_internal.h's inline set and clear). */
typedef struct region_s {
  uint64_t written[BM_REGION_PAGES / 64];
} region_t;

HS_HIDDEN int _hs_blockmap_on; /* 1 under jemalloc, tcmalloc, mimalloc, mmap */
HS_HIDDEN uint64_t *_hs_bm_regions[HS_BM_REGIONS];
static int g_incomplete;       /* a region could not be made, or a block lies past 47 bits */

/* The system call itself, not mappings.c's hook (which would note heapsight's bitmap as a
 * mapping of the program's); none once a seccomp filter is in (it may forbid it), and none
 * under an address-space limit (ulimit -v), which 64 MiB reserved would take from the
 * program (the segment's profile is made small for it likewise: live/segment.py). */
static uint64_t *region_new(uint64_t i) {
  if (__atomic_load_n(&_hs_seccomp, __ATOMIC_RELAXED)) return NULL;
  static int limited = -1;
  if (limited < 0) {
    struct rlimit rl;
    limited = getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur != RLIM_INFINITY;
  }
  if (limited) return NULL;
  long p = syscall(SYS_mmap, NULL, HS_BM_HEADER_BYTES + HS_BM_REGION_BYTES, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p < 0 && p > -4096) return NULL;
  uint64_t *want = NULL;
  if (!__atomic_compare_exchange_n(&_hs_bm_regions[i], &want, (uint64_t *)p, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE)) {
    syscall(SYS_munmap, p, HS_BM_HEADER_BYTES + HS_BM_REGION_BYTES); /* another made it first */
    return want;
  }
  _hs_own_memory((int64_t)HS_BM_HEADER_BYTES);
  return (uint64_t *)p;
}

/* The inline set's slow way: a region to make, or a block past 47 bits (word_was_empty 0:
 * the bit is set here), or a word with no bit set on a bitmap page not yet marked written
 * (1: the caller sets the bit): the page is then heapsight's own memory. */
void _hs_blockmap_set_slow(void *p, int word_was_empty) {
  uint64_t i = (uint64_t)(uintptr_t)p >> HS_BM_REGION_SHIFT, g = _hs_blockmap_granule(p);
  if (i >= HS_BM_REGIONS) { g_incomplete = 1; return; }
  uint64_t *region = __atomic_load_n(&_hs_bm_regions[i], __ATOMIC_ACQUIRE);
  if (region == NULL) {
    if ((region = region_new(i)) == NULL) { g_incomplete = 1; return; }
    __atomic_fetch_or(region + HS_BM_HEADER_BYTES / 8 + (g >> 6), 1ull << (g & 63),
                      __ATOMIC_RELAXED);
    word_was_empty = 1;
  }
  if (!word_was_empty) return;
  region_t *r = (region_t *)region;
  uint64_t page = g >> 15, bit = 1ull << (page % 64), *w = &r->written[page / 64];
  if (!(__atomic_fetch_or(w, bit, __ATOMIC_RELAXED) & bit)) _hs_own_memory((int64_t)BM_PAGE);
}

int _hs_blockmap_incomplete(void) { return __atomic_load_n(&g_incomplete, __ATOMIC_RELAXED); }

/* In the copy: every block start, in address order, with its usable bytes (the
 * allocator's malloc_usable_size: a lookup in its page map, no lock), into out (at most
 * max); the count, or max + 1 when there are more. heapsight's own blocks are among them
 * (the marking sets them apart). */
size_t _hs_blockmap_blocks(hs_chunk_t *out, size_t max) {
  size_t n = 0;
  for (uint64_t i = 0; i < HS_BM_REGIONS; i++) {
    region_t *r = (region_t *)_hs_bm_regions[i];
    if (r == NULL) continue;
    for (uint64_t pw = 0; pw < BM_REGION_PAGES / 64; pw++) {
      for (uint64_t pages = r->written[pw]; pages; pages &= pages - 1) {
        uint64_t page = pw * 64 + (uint64_t)__builtin_ctzll(pages);
        const uint64_t *w = (const uint64_t *)((const char *)r + HS_BM_HEADER_BYTES) +
                            page * (BM_PAGE / 8);
        for (uint64_t k = 0; k < BM_PAGE / 8; k++) {
          for (uint64_t bits = w[k]; bits; bits &= bits - 1) {
            uint64_t g = (page * (BM_PAGE / 8) + k) * 64 + (uint64_t)__builtin_ctzll(bits);
            uint64_t a = (i << HS_BM_REGION_SHIFT) | (g << 3);
            if (n == max) return max + 1;
            size_t u = _hs_real.malloc_usable_size((void *)(uintptr_t)a);
            out[n++] = (hs_chunk_t){a, a + (u ? u : 1)};
          }
        }
      }
    }
  }
  return n;
}

/* The bitmap's own mappings (never roots). */
size_t _hs_blockmap_own(hs_chunk_t *out, size_t max) {
  size_t n = 0;
  for (uint64_t i = 0; i < HS_BM_REGIONS && n < max; i++) {
    uint64_t p = (uint64_t)(uintptr_t)_hs_bm_regions[i];
    if (p) out[n++] = (hs_chunk_t){p, p + HS_BM_HEADER_BYTES + HS_BM_REGION_BYTES};
  }
  return n;
}

/* ---- the allocator's own mappings ---- */
#define AR_MAX HS_ALLOC_RANGES_MAX
static hs_chunk_t g_ar[AR_MAX];
static uint64_t g_ar_base[AR_MAX]; /* the object that mapped it (until the allocator is known) */
static size_t g_n_ar;
static int g_ar_lock, g_ar_full;
static uint64_t g_alloc_base;      /* the allocator's object; 0: not known yet */
static int g_ar_known;             /* the allocator is known: only its mappings are kept */

static void ar_lock(void) { while (__atomic_exchange_n(&g_ar_lock, 1, __ATOMIC_ACQUIRE)) {} }
static void ar_unlock(void) { __atomic_store_n(&g_ar_lock, 0, __ATOMIC_RELEASE); }

/* The allocator is known (allocators.c): base, its object's load address; 0 for glibc,
 * whose heaps the copy walks (nothing is kept, nothing more noted). */
void _hs_blockmap_allocator(uint64_t base, int on) {
  ar_lock();
  g_alloc_base = base;
  size_t k = 0;
  for (size_t i = 0; i < g_n_ar; i++) {
    if (base && g_ar_base[i] == base) {
      g_ar[k] = g_ar[i];
      g_ar_base[k++] = base;
    }
  }
  g_n_ar = k;
  __atomic_store_n(&g_ar_known, 1, __ATOMIC_RELEASE);
  __atomic_store_n(&_hs_blockmap_on, on, __ATOMIC_RELEASE);
  ar_unlock();
}

/* Whether mappings are noted still (not under glibc, once it is known). */
int _hs_blockmap_noting(void) {
  return !__atomic_load_n(&g_ar_known, __ATOMIC_ACQUIRE) || g_alloc_base != 0;
}

/* An anonymous mapping made by the object at base (mappings.c). */
void _hs_blockmap_mapped(uint64_t lo, uint64_t hi, uint64_t base) {
  if (__atomic_load_n(&g_ar_known, __ATOMIC_ACQUIRE) && (!g_alloc_base || base != g_alloc_base))
    return;
  ar_lock();
  if (g_n_ar < AR_MAX) {
    g_ar[g_n_ar] = (hs_chunk_t){lo, hi};
    g_ar_base[g_n_ar++] = base;
  } else {
    g_ar_full = 1;
  }
  ar_unlock();
}

/* [lo, hi) unmapped, by anyone: out of every range kept. */
void _hs_blockmap_unmapped(uint64_t lo, uint64_t hi) {
  if (__atomic_load_n(&g_ar_known, __ATOMIC_ACQUIRE) && !g_alloc_base) return;
  ar_lock();
  for (size_t i = 0; i < g_n_ar;) {
    hs_chunk_t *c = &g_ar[i];
    if (c->hi <= lo || c->lo >= hi) { i++; continue; }
    if (c->lo < lo && c->hi > hi) { /* a hole in the middle: two ranges */
      if (g_n_ar < AR_MAX) {
        g_ar[g_n_ar] = (hs_chunk_t){hi, c->hi};
        g_ar_base[g_n_ar++] = g_ar_base[i];
      } else {
        g_ar_full = 1;
      }
      c->hi = lo;
      i++;
    } else if (c->lo < lo) {
      c->hi = lo;
      i++;
    } else if (c->hi > hi) {
      c->lo = hi;
      i++;
    } else { /* all of it */
      g_ar[i] = g_ar[--g_n_ar];
      g_ar_base[i] = g_ar_base[g_n_ar];
    }
  }
  ar_unlock();
}

/* In the copy: the allocator's mappings (a copy of the list: the copy's own lock state is
 * whatever it was at the clone, so the list is read without it); -1 when some were not
 * kept (the table filled). */
long _hs_blockmap_ranges(hs_chunk_t *out, size_t max) {
  size_t n = g_n_ar < max ? g_n_ar : max;
  memcpy(out, g_ar, n * sizeof *out);
  return g_ar_full || g_n_ar > max ? -1 : (long)n;
}
