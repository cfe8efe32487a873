/* hs_internal.h: what the parts of libheapsight share, and the hot path itself (inline,
 * so each hook compiles to: call the real function, then a few thread-local adds). */
#ifndef HS_INTERNAL_H
#define HS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "heapsight.h"
#include "heapmap_file.h"

#define HS_LIKELY(x) __builtin_expect(!!(x), 1)
#define HS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HS_TLS __thread __attribute__((tls_model("initial-exec")))
/* Internals the hot path reads: hidden, so each is one PC-relative load (the definitions
 * are hidden by -fvisibility=hidden, but a declaration alone does not say so). */
#define HS_HIDDEN __attribute__((visibility("hidden")))
#define HS_GLIBC_MMAP_THRESHOLD_START (128 * 1024)

/* The functions underneath us (RTLD_NEXT), resolved once in _hs_resolve(). */
typedef struct hs_real_s {
  void *(*malloc)(size_t);
  void (*free)(void *);
  void *(*calloc)(size_t, size_t);
  void *(*realloc)(void *, size_t);
  void *(*reallocarray)(void *, size_t, size_t);
  int (*posix_memalign)(void **, size_t, size_t);
  void *(*aligned_alloc)(size_t, size_t);
  void *(*memalign)(size_t, size_t);
  void *(*valloc)(size_t);
  void *(*pvalloc)(size_t);
  size_t (*malloc_usable_size)(void *);
} hs_real_t;

extern HS_HIDDEN hs_real_t _hs_real;
/* 1 once the program installed a seccomp filter (preload.c): the library then makes no
 * system call of its own in the program's allocations and no copy at exit */
extern HS_HIDDEN int _hs_seccomp;
extern HS_HIDDEN hs_segment_t *_hs_seg;      /* never NULL once _hs_resolve() has run */
extern HS_HIDDEN int _hs_usable_by_header;   /* glibc: read the chunk header instead of calling */
extern HS_TLS hs_slot_t *_hs_tslot;
extern HS_TLS hs_slot_t *_hs_tslot_other; /* counters.c: the slot under another allocator */
void *_hs_counted_other(hs_slot_t *s, void *p, size_t req, const void *caller);
extern HS_HIDDEN int _hs_sizes_by_request; /* counters.c: usable size by the request's class */
void _hs_count_free_other(hs_slot_t *s, void *p);
extern HS_HIDDEN int64_t _hs_flush_limit;    /* pending bytes a thread may hold back (counters.c) */

void _hs_resolve(void);
hs_slot_t *_hs_slot_claim(void);               /* NULL: do not count this call */
void _hs_count_alloc_slow(void *p, size_t req, const void *caller);
void _hs_count_free_slow(void *p);
void *_hs_counted_slow(void *p, size_t req, const void *caller);          /* returns p */
void *_hs_counted_due(hs_slot_t *s, void *p, size_t chunk, size_t req,
                      const void *caller);                          /* returns p */
void _hs_count_shared(int is_alloc, size_t usable, size_t req, size_t hdr, void *p,
                      const void *caller);
void _hs_flush(hs_slot_t *s);
void _hs_own_begin(void);   /* heapsight's own calls that allocate follow: not counted */
void _hs_own_end(void);
int _hs_own_take(void *p);  /* 1: p was one of heapsight's own blocks (now forgotten) */
int _hs_own_slot(const hs_slot_t *s);
void _hs_own_free(void *p); /* in own mode, a free of the program's block */
void _hs_segment_attach(void);
void _hs_segment_after_fork_child(void);
int _hs_is_owner(void);
void _hs_allocator_detect(void);
void _hs_allocator_describe(hs_segment_t *seg, int full);
void _hs_flush_current(void);
void _hs_segment_remove_own(void); /* HEAPSIGHT_SEGMENT=auto: the segment made for attach */
extern HS_TLS int _hs_t_helper;
/* The object whose code is at pc: its load base and file name (the program's: argv[0]),
 * without a symbol search (mappings.c). */
int _hs_object_of(const void *pc, uint64_t *base, const char **name);
const char *_hs_exe_path(void); /* profile.c: /proc/self/exe, NULL before it is read */
int _hs_allocator_stats(hs_alloc_stats_t *out);
int _hs_allocator_release(void);
int _hs_allocator_release_on_caller(void);
void _hs_probe_start(void); /* probe.c: at start, before main */
/* heapsight's blocks live now; *whole 1 when they are every block heapsight's start-up left
 * in the heap (counters.c: each allocation kept), 0 when a block is named whose own records
 * are found by what it reaches (copylib.c: the copy library's link map) */
size_t _hs_own_blocks(uint64_t *out, size_t max, int *whole);
int _hs_glibc_publish_arena(void); /* arenas.c */
int _hs_glibc_locks_free(void);
int _hs_answer_map_request(void); /* probe.c: a map the CLI asked for, taken on this thread */
void _hs_map_poll(void);          /* probe.c: the same, if one was asked for (counters.c) */
void _hs_py_end_poll(void);       /* preload.c: CPython began finalizing: the end's reading */
int _hs_helper_running(void);
void _hs_exit_probe(void);
int _hs_read_status(uint64_t *rss_bytes, uint64_t *anon_bytes); /* less heapsight's own */
size_t _hs_proc_self_read(const char *path, char *buf, size_t size); /* procself.c */
int _hs_status_read(uint64_t *rss_bytes, uint64_t *anon_bytes);  /* procself.c: as read */
int _hs_statm_read(uint64_t *rss_bytes, uint64_t *anon_bytes);   /* procself.c: as read */
void _hs_exit_begun_read(hs_segment_t *seg); /* counters.c: the reading as the exit begins */
uint64_t _hs_now_ns(void);                                          /* procself.c */

/* heapsight attach --track (attach.c): the library loaded into a running process, the
 * hooks reached through its objects' patched GOT entries, under names of their own */
void *_hs_hook_malloc(size_t);
void _hs_hook_free(void *);
void *_hs_hook_calloc(size_t, size_t);
void *_hs_hook_realloc(void *, size_t);
int _hs_hook_posix_memalign(void **, size_t, size_t);
void *_hs_hook_aligned_alloc(size_t, size_t);
void *_hs_hook_memalign(size_t, size_t);
void *_hs_hook_valloc(size_t);
void *_hs_hook_pvalloc(size_t);
void _hs_attach_start(void);           /* preload.c: the constructor's work, when asked */
void _hs_attach_stop(void);            /* attach.c: at dlclose */
void _hs_segment_unmap(void);          /* segment.c: at dlclose */
void _hs_slots_forget(void);           /* counters.c: at dlclose, no thread-exit call */
extern HS_HIDDEN const char *_hs_attach_segment; /* the segment's path attach gave */

/* Sampled call sites (profile.c). The hot path's share: the slot's countdown of allocated
 * bytes (hs_slot_t.left, which runs out no later than sample_left), and one byte load on
 * free: a map of counts of live sampled blocks by (p >> 4) & mask, in .bss (pages never
 * written stay unbacked).
 * Only a nonzero byte leads to the lookup of the block. */
#define HS_SAMPLE_MAP_SIZE (1u << 18)
#define HS_SAMPLE_FRESH (INT64_MIN / 2) /* a claimed slot's countdown: not drawn yet */
extern HS_HIDDEN unsigned char _hs_sample_map[HS_SAMPLE_MAP_SIZE];
void _hs_sample_alloc(hs_slot_t *s, void *p, size_t usable, size_t req, const void *caller);
void _hs_sample_shared(void *p, size_t usable, size_t req, const void *caller);
void _hs_sample_free(void *p);
void _hs_profile_map(void *p, size_t len, const void *caller); /* mappings.c's mmap */
/* The heap map (heapmap.c), taken on a thread of the program's or the exit helper (probe.c) */
int _hs_heapmap_write(const char *path, int at_exit); /* waits for the copy, not its walk */
int _hs_heapmap_write_refusal(const char *path, const char *why);
__attribute__((noreturn)) void _hs_heapmap_in_copy(const char *path); /* copylib.c's */
int _hs_heapmap_forking(void);          /* 1 while the helper is inside fork() */
int _hs_glibc_arenas(uint64_t *arenas, uint64_t *system_mem); /* no lock, no walk */
int _hs_glibc_arenas_known(uint64_t *arenas, uint64_t *system_mem); /* and no search */
extern HS_HIDDEN uint64_t _hs_exit_sp; /* probe.c: the exiting thread's stack pointer, while
                                          the exit map's copy is made (0 otherwise) */
extern HS_HIDDEN uint64_t _hs_helper_self; /* probe.c: the helper thread's pthread_self() */

/* Reachability, in the heap map's copy (reach.c) */
typedef struct hs_chunk_s { uint64_t lo, hi; } hs_chunk_t; /* a block's usable bytes */
/* The first of n ranges in address order (disjoint) that ends past a; n when none. */
static inline size_t hs_first_past(const hs_chunk_t *v, size_t n, uint64_t a) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (v[mid].hi <= a) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
/* An index of the sorted blocks for find (reach.c): the blocks in runs no gap of
 * HS_REACH_GAP_BYTES splits (a heap, an arena's heaps, the mmapped chunks near each other),
 * each run cut into buckets of 1 << shift bytes, each bucket holding the first block that
 * ends past its start. */
typedef struct hs_run_s { uint64_t lo, hi; uint32_t first, end, bucket; } hs_run_t;
typedef struct hs_reach_s {
  hs_chunk_t *chunks;  /* sorted by address, disjoint */
  size_t n, top;
  hs_run_t *runs;      /* NULL: no index (a binary search over every block) */
  uint32_t *buckets;
  size_t n_runs;
  unsigned shift;
  int pagemap;         /* /proc/self/pagemap, or -1: a large block's untouched pages are
                          not read (they hold zeros) */
  uint64_t *pm_buf, page; /* HS_REACH_PM_ENTRIES entries, for the pagemap's reads */
  uint8_t *state;      /* HS_REACH_* per block */
  uint32_t *stack;     /* 2n entries */
  uint64_t lo, hi, root_bytes;
  uint64_t bytes[4], blocks[4]; /* by state, after _hs_reach_finish */
  uint64_t deadline_ns, words, checked; /* past the deadline (CLOCK_MONOTONIC): late */
  int late;
  int glibc_chunks;    /* the blocks are glibc's chunks (a word at a block's end is the
                          next chunk's header: reach.c's find) */
  int defer;           /* the roots push what they reach and leave it for _hs_reach_workers */
  int loader_root;     /* the root being scanned is the dynamic loader's data (reach.c:
                          kept_start) */
  /* the readable file mappings (sorted, disjoint), and of them the executable ones: where
   * memcheck's multipleinheritance heuristic looks for vtables (reach.c); n 0: none */
  const hs_chunk_t *rfile, *xfile;
  size_t n_rfile, n_xfile;
  struct hs_reach_pool_s *pool; /* while two processes mark: what they share (reach.c) */
} hs_reach_t;
void _hs_reach_sort(hs_chunk_t *chunks, size_t n);
void _hs_reach_init(hs_reach_t *r, hs_chunk_t *chunks, size_t n, uint8_t *state, uint32_t *stack);
size_t _hs_reach_index_bytes(const hs_chunk_t *chunks, size_t n, unsigned *shift);
void _hs_reach_index(hs_reach_t *r, void *mem, unsigned shift);
uint64_t _hs_resident_runs(int pm, uint64_t *buf, size_t entries, uint64_t page, uint64_t lo,
                           uint64_t hi, uint64_t (*fn)(void *ctx, uint64_t lo, uint64_t hi),
                           void *ctx);
#define HS_REACH_PM_ENTRIES 4096
#define HS_REACH_SPARSE_BYTES (64u << 10) /* blocks this large: their resident pages only */
void _hs_reach_root(hs_reach_t *r, uint64_t lo, uint64_t hi);
void _hs_reach_own(hs_reach_t *r, uint64_t addr);
void _hs_reach_own_roots(hs_reach_t *r, const uint64_t *addrs, size_t n);
size_t _hs_reach_pool_bytes(size_t n);
int _hs_reach_workers(hs_reach_t *r, struct hs_reach_pool_s *pool);
#define HS_REACH_WORKERS_MIN_BYTES (16ull << 20) /* fewer blocks' bytes: one process marks */
void _hs_reach_finish(hs_reach_t *r);
size_t _hs_profile_own(hs_chunk_t *out, size_t max); /* profile.c: its tables' mappings */
/* Where each live block starts and which mappings are the allocator's, for the marking
 * under an allocator other than glibc, whose heaps the copy cannot walk (blockmap.c) */
extern HS_HIDDEN int _hs_blockmap_on;
#define HS_BM_REGION_SHIFT 32                                     /* 4 GiB of addresses */
#define HS_BM_REGIONS (1u << 15)                                  /* 47-bit addresses */
#define HS_BM_REGION_BYTES (((1ull << HS_BM_REGION_SHIFT) >> 3) / 8) /* a bit per 8 bytes */
#define HS_BM_HEADER_BYTES 4096ull
extern HS_HIDDEN uint64_t *_hs_bm_regions[HS_BM_REGIONS];
void _hs_blockmap_set_slow(void *p, int word_was_empty);
/* The bitmap region of p's 4 GiB of addresses (NULL: none yet, or p past 47 bits): a page
 * of header (a bit per bitmap page written), then a bit per 8-byte granule. */
static inline uint64_t *_hs_blockmap_region(const void *p) {
  uint64_t i = (uint64_t)(uintptr_t)p >> HS_BM_REGION_SHIFT;
  return i < HS_BM_REGIONS ? __atomic_load_n(&_hs_bm_regions[i], __ATOMIC_ACQUIRE) : 0;
}
static inline uint64_t _hs_blockmap_granule(const void *p) { return (uint32_t)(uintptr_t)p >> 3; }
/* A block's start, set as its allocation is counted, cleared as its free is: loads and
 * one locked or/and on the common path. The first bit set on a bitmap page (the word and
 * the page's bit in the region's header both empty) takes the slow path, which counts the
 * page as heapsight's memory; so does a region not mapped yet. try_set is the common path
 * alone, for a caller that must make no call (no register saved): 0 when the slow path is
 * needed (nothing was set then); _hs_blockmap_set does both. */
static inline int _hs_blockmap_try_set(void *p) {
  uint64_t *region = _hs_blockmap_region(p), g = _hs_blockmap_granule(p);
  if (HS_UNLIKELY(region == NULL)) return 0;
  uint64_t *w = region + HS_BM_HEADER_BYTES / 8 + (g >> 6), page = g >> 15; /* 512 words a page */
  if (HS_UNLIKELY(__atomic_load_n(w, __ATOMIC_RELAXED) == 0) &&
      !((__atomic_load_n(&region[page >> 6], __ATOMIC_RELAXED) >> (page & 63)) & 1))
    return 0;
  __atomic_fetch_or(w, 1ull << (g & 63), __ATOMIC_RELAXED);
  return 1;
}
static inline void _hs_blockmap_set(void *p) {
  if (HS_LIKELY(_hs_blockmap_try_set(p))) return;
  uint64_t *region = _hs_blockmap_region(p), g = _hs_blockmap_granule(p);
  if (region == NULL) { _hs_blockmap_set_slow(p, 0); return; } /* (it sets the bit) */
  _hs_blockmap_set_slow(p, 1);
  __atomic_fetch_or(region + HS_BM_HEADER_BYTES / 8 + (g >> 6), 1ull << (g & 63),
                    __ATOMIC_RELAXED);
}
static inline void _hs_blockmap_clear(void *p) {
  uint64_t *region = _hs_blockmap_region(p), g = _hs_blockmap_granule(p);
  if (region) __atomic_fetch_and(region + HS_BM_HEADER_BYTES / 8 + (g >> 6), ~(1ull << (g & 63)),
                                 __ATOMIC_RELAXED);
}
int _hs_blockmap_incomplete(void);
size_t _hs_blockmap_blocks(hs_chunk_t *out, size_t max);
size_t _hs_blockmap_own(hs_chunk_t *out, size_t max);
void _hs_blockmap_allocator(uint64_t base, int on);
int _hs_blockmap_noting(void);
void _hs_blockmap_mapped(uint64_t lo, uint64_t hi, uint64_t base);
void _hs_blockmap_unmapped(uint64_t lo, uint64_t hi);
long _hs_blockmap_ranges(hs_chunk_t *out, size_t max);
#define HS_ALLOC_RANGES_MAX 8192 /* the allocator's mappings kept (blockmap.c) */
/* The stack from unwind rules cached per return address (unwind.c) */
void _hs_unwind_start(void *libgcc);
void _hs_unwind_forget(void);     /* after a dlclose: a new table (off after four) */
int _hs_unwind_ready(void);
int _hs_unwind_fast(uint64_t *out, int max, uintptr_t skip_lo, uintptr_t skip_hi); /* -1: libgcc's */
size_t _hs_unwind_own(hs_chunk_t *out, size_t max);
/* A free counted from what was read of the block before it was freed (its glibc chunk header,
 * 0 under another allocator, and its usable size): the block itself is not read. */
void _hs_count_free_read(size_t hdr, size_t usable);
uint64_t _hs_mmapped_chunk_bytes(void);  /* glibc chunks served by their own mmap, live now */
uint64_t _hs_live_blocks(void);          /* blocks live now, as the slots count them */
const char *_hs_segment_path(void);     /* segment.c: the owner's segment file, NULL if none */
int _hs_segment_is_own(void);           /* segment.c: HEAPSIGHT_SEGMENT=auto's, made by this process */
int _hs_profile_unmap(void *p, size_t len); /* 1: it was recorded */
void _hs_profile_setup(void);             /* at attach: the mean, the profile's header */
void _hs_profile_start(void);             /* from the constructor: the unwinder */
void _hs_profile_reset(hs_segment_t *seg); /* the owner re-attaches after execve */
void _hs_profile_dlclosed(void);          /* after a dlclose: modules may be gone */

/* The interpreter's frames at a sample (interp.c): what profile.c splices into the stack
 * in place of the interpreter's eval loop. A stored stack holds such a frame as a tagged
 * word, HS_IFRAME_TAG | the word offset of its record in the stack region (heapsight.h). */
#define HS_INTERP_DEPTH 64
typedef struct hs_iframe_s {
  uint64_t code, name, file; /* the code object and its two str objects (addresses) */
  int32_t line;
  uint8_t entry, skip;       /* entry: the outermost frame of its eval loop's call */
} hs_iframe_t;
void _hs_interp_start(int *kind, int *status, uint64_t *version);
uint64_t _hs_py_finalizing_addr(void); /* &_PyRuntime._finalizing, 0: no CPython known */
extern HS_HIDDEN void *_hs_real_exit;  /* preload.c: glibc's exit (its frame, for probe.c) */
void _hs_mappings_resolve(void); /* mappings.c: the real mmap, munmap... looked up now */
int _hs_interp_ready(void);
int _hs_interp_kind(void);
int _hs_interp_is_loop(uintptr_t ret);
int _hs_interp_frames(hs_iframe_t *out, int max);
size_t _hs_interp_names(const hs_iframe_t *f, char *dst, size_t max, uint32_t *nlen,
                        uint32_t *flen);

/* heapsight's own private memory in the program (hs_segment_t.own_private_bytes): the
 * sampled-block map's pages as they are first written, the tables as they are mapped
 * (profile.c, unwind.c; counters.c publishes the sum). */
void _hs_own_memory(int64_t bytes);
void _hs_map_written(uintptr_t index); /* a byte of _hs_sample_map was written */
void _hs_own_publish(void);            /* into the segment, once attached */
uint64_t _hs_own_private(void);        /* the bytes of it */

void *_hs_raw_mmap(size_t bytes); /* profile.c: anonymous memory of heapsight's own; NULL */

/* The hash of heapsight's own tables (profile.c, unwind.c): murmur3's finalizer. */
static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

static inline int hs_sample_maybe(const void *p) {
  return _hs_sample_map[((uintptr_t)p >> 4) & (HS_SAMPLE_MAP_SIZE - 1)] != 0;
}

/* Class of a usable size: exact 16-byte steps below 1 KiB, 8 per power of two above. */
static inline unsigned hs_class_of(size_t u) {
  if (u < 1024) return (unsigned)(u >> 4);
  unsigned e = 63u - (unsigned)__builtin_clzl(u);
  return HS_FINE_CLASSES + (e - 10) * HS_SUBCLASSES + (unsigned)((u >> (e - 3)) & 7);
}

/* glibc chunk header (malloc.c: chunksize, chunk_is_mmapped, musable): the size word sits
 * just before the user pointer; mmapped chunks carry a two-word header. Read only while
 * the chunk is allocated. */
static inline size_t hs_glibc_header(const void *p) { return ((const size_t *)p)[-1]; }
static inline size_t hs_glibc_usable(size_t hdr) {
  return (hdr & ~(size_t)7) - ((hdr & 2) ? 2 * sizeof(size_t) : sizeof(size_t));
}

/* The counting, once the slot and the block's chunk bytes (usable + HS_BLOCK_EXTRA: a
 * glibc heap chunk's size) are known: the count, the requested bytes, and one countdown of
 * allocated bytes that covers both the flush of the live figure and the next sample; no
 * usable bytes (the countdown counts them: hs_slot_usable). Nonzero when it ran out: the
 * caller then calls _hs_counted_due (a jump from preload.c's counted, so its common case
 * saves no register). Nothing here depends on the size's class: the size histogram comes
 * from the samples. */
__attribute__((always_inline)) static inline int hs_add_alloc(hs_slot_t *s, size_t chunk,
                                                             size_t req) {
  s->n_alloc++;
  s->req_alloc_bytes += req;
  return (s->left -= (int64_t)chunk) < 0;
}

/* Nonzero when the thread's frees went past its limit: the caller flushes (_hs_flush). */
__attribute__((always_inline)) static inline int hs_add_free(hs_slot_t *s, size_t chunk) {
  s->n_free++;
  return (s->free_left -= (int64_t)chunk) < 0;
}

/* The hot path is for glibc's heap chunks: _hs_tslot is set only when the usable size can
 * be read from the chunk header, so one test of the slot covers "no slot yet", "another
 * allocator" and "not started"; an mmapped chunk (bit 1 of the size word) goes the slow way
 * too (counters.c). */
__attribute__((always_inline)) static inline void hs_count_alloc_by(void *p, size_t req,
                                                                   const void *caller) {
  hs_slot_t *s = _hs_tslot;
  size_t hdr;
  if (HS_UNLIKELY(s == NULL) || HS_UNLIKELY((hdr = hs_glibc_header(p)) & 2)) {
    _hs_count_alloc_slow(p, req, caller);
    return;
  }
  size_t chunk = hdr & ~(size_t)7;
  if (HS_UNLIKELY(hs_add_alloc(s, chunk, req))) _hs_counted_due(s, p, chunk, req, caller);
}
#define hs_count_alloc(p, req) hs_count_alloc_by((p), (req), __builtin_return_address(0))

/* Called before the real free, so the chunk is still ours to read; the caller has checked
 * hs_sample_maybe (a sampled block's free is recorded first). */
__attribute__((always_inline)) static inline void hs_count_free_unsampled(void *p) {
  hs_slot_t *s = _hs_tslot;
  size_t hdr;
  if (HS_UNLIKELY(s == NULL) || HS_UNLIKELY((hdr = hs_glibc_header(p)) & 2)) {
    _hs_count_free_slow(p);
    return;
  }
  if (HS_UNLIKELY(hs_add_free(s, hdr & ~(size_t)7))) _hs_flush(s);
}

#endif
