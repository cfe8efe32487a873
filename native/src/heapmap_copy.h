/* heapmap_copy.h: what the heap map's copy is made of, shared by its files (private to
 * them): heapmap.c makes the copy and runs it; heapwalk.c (in the copy) finds glibc's heaps
 * and walks them chunk by chunk; heaproots.c (in the copy) lists the blocks and the roots
 * reach.c marks from; arenas.c (in the program) finds glibc's arenas and takes their locks
 * as fork() does. The glibc 2.36 layouts they read are described in heapmap.c. */
#ifndef HS_HEAPMAP_COPY_H
#define HS_HEAPMAP_COPY_H

#include <stddef.h>
#include <stdint.h>

#include "hs_internal.h"

#define HS_MAP_LIMIT_NS (HS_MAP_LIMIT_S * 1000000000ull)
#define HS_MAP_HEAP_MAX (64ull << 20)  /* glibc's HEAP_MAX_SIZE (src/heapsight/mappings.py) */
#define HS_PM_ENTRIES 8192             /* pagemap entries read at a time */
#define HS_LOCK_WAIT_NS 200000000ull   /* under probe.c's HS_PROBE_BLOCKED_NS */

/* glibc 2.36, x86-64 (see the top comment) */
#define G_MINSIZE 32u
#define G_CHUNK_STRUCT 48u          /* sizeof(struct malloc_chunk): mtrim keeps these */
#define G_TOP_KEEP 33u              /* systrim keeps MINSIZE + 1 bytes of the top */
#define G_TCACHE_MAX_CHUNK 1040u    /* chunk of tidx2usize(63) = 1032 usable bytes */
#define G_TCACHE_STRUCT_CHUNK 656u  /* request2size(sizeof(tcache_perthread_struct)) */
#define G_FAST_MAX_CHUNK 176u       /* the largest fastbin chunk (M_MXFAST at its most, 160) */
#define G_NFASTBINS 10u
#define G_MSTATE_FASTBINS 16u       /* fastbinsY[G_NFASTBINS]: chunk pointers, not protected */
#define G_MSTATE_BYTES 2200u
#define G_MSTATE_TOP 96u
#define G_MSTATE_NEXT 2160u
#define G_MSTATE_SYSTEM_MEM 2184u
#define G_MSTATE_FLAGS 4u
#define G_NONCONTIGUOUS 2u

/* The copy's view of the process: its mappings, glibc's heaps, the blocks found. */
typedef struct map_s {
  uint64_t lo, hi;
  int r, w, anon, heap; /* heap: the [heap] mapping */
  int dev;              /* a device's memory (/dev/..., but shm and zero): never read */
  int shared;           /* MAP_SHARED (a memfd, a shm_open file): its pages are the file's */
  int x, file;          /* executable; a file's (a path, not [heap], [stack], [anon:...]) */
} map_t;

typedef struct heap_s {
  uint64_t start, end;          /* the pages mapped here */
  uint64_t info_bytes;          /* thread heap: sizeof(heap_info); 0 for the main heap */
  uint64_t size;                /* thread heap: heap_info.size */
  uint64_t ar;                  /* thread heap: its arena (ar_ptr) */
  int kind, first, ok_layout;
  uint64_t bit0;                /* its first 16-byte slot's bit in the fastbin bitmaps */
  hs_map_heap_t out;
  uint32_t *live;
  uint8_t *flags;
} heap_t;

/* The release counted (heapwalk.c: _hs_walk_fastbins): a candidate's link, as bitmap
 * slots; a slot and the links to it past one (a fastbin's head: more 0); and how many of
 * the threads' tcaches and of the extra links it keeps at most */
typedef struct hs_link_s { uint32_t at, to; } hs_link_t;
typedef struct hs_fast_slot_s { uint32_t slot, more; } hs_fast_slot_t;
#define HS_TCACHES_MAX 4096
#define HS_TWICE_MAX 65536

typedef struct child_s {
  uint64_t page;
  map_t *maps;
  size_t n_maps;
  heap_t *heaps;
  size_t n_heaps;
  uint64_t *pm_buf;             /* pagemap entries read at a time: HS_PM_ENTRIES */
  int before_read;              /* the heaps' pages resident before the release: flagged */
  uint64_t key;                 /* the tcache key, when found */
  int key_found;
  int finding_key;              /* the first walk: looks for the key only */
  /* The release counted (heapwalk.c: _hs_walk_fastbins): two bits per 16-byte slot of the
   * heaps, set at each chunk in a fastbin and at each one a fastbin chunk links to (fast,
   * fast_bits slots); while counting, the walk merges free and fastbin chunks as malloc_trim's
   * consolidation would and clears HS_PAGE_AFTER where its madvise and sbrk would drop
   * the page (released: how many were resident) */
  uint64_t *fast;
  hs_link_t *links;             /* each candidate's link, as slots (the first walk's) */
  size_t n_links, cap_links;
  uint64_t *tcaches;            /* the threads' tcache_perthread_structs (user data) */
  size_t n_tcaches;
  hs_fast_slot_t *twice, *heads;   /* chunks linked to more than once; the fastbins' heads */
  size_t n_twice, n_heads;
  uint64_t fast_bits, released;
  int finding_fast, counting;
  int fast_unknown;             /* the first walk could not tell every chunk (a heap not
                                   walked, no room): nothing counted */
  /* The first walk's chunks, kept for the counted walk (the heap is as it was: nothing
   * ran in between): each chunk's size word, with bit 1 (IS_MMAPPED, never set on a chunk
   * the walk accepts) holding whether the chunk is in use (its successor's PREV_INUSE).
   * The counted walk reads them in order, not the heap's headers, one dependent load a
   * chunk. replay_ok 0: not kept (no room), the heap is read. */
  uint64_t *replay;
  size_t n_replay, cap_replay, replay_at;
  int replay_ok;
  hs_chunk_t *chunks;           /* the in-use blocks, for the reach (NULL: not collected) */
  size_t n_chunks, cap_chunks;
} child_t;

static inline uint64_t hs_rd(uint64_t addr) { return *(const volatile uint64_t *)(uintptr_t)addr; }

/* heapmap.c: memory of the copy's own (never a root of the reach) */
#define HS_OWN_MAX 64
extern HS_HIDDEN hs_chunk_t _hs_copy_own[HS_OWN_MAX];
extern HS_HIDDEN size_t _hs_copy_n_own;
void *_hs_copy_map(size_t bytes, int populate);
/* The hooks' counts at the moment the copy was made, read just before it by the thread
 * that made it: in the copy the segment is the program's, which goes on counting */
extern HS_HIDDEN uint64_t _hs_copy_live_blocks, _hs_copy_mmapped_bytes;
void _hs_copy_unmap(void *p, size_t bytes);

/* heapother.c: another allocator's pages, from the hooks' record */
#define HS_OTHER_PAGES_MAX (16ull << 20) /* 64 GiB of 4 KiB pages at most */
int _hs_other_heaps(child_t *c, const char **why);
void _hs_other_live(child_t *c);

/* heapwalk.c */
int _hs_walk_maps(child_t *c);                    /* /proc/self/maps; 0 on failure */
int _hs_walk_readable(const child_t *c, uint64_t lo, uint64_t hi);
int _hs_walk_find_heaps(child_t *c);              /* [heap] and the thread heaps */
uint64_t _hs_walk_number_arenas(child_t *c);      /* main_arena, or 0 */
uint64_t _hs_walk_presence(child_t *c, uint8_t f); /* resident pages: flag f */
void _hs_walk_heaps(child_t *c, uint64_t main_arena);
/* The chunks in glibc's fastbins, told from the pages: -1 when they cannot be (*why says
 * why; the bitmaps are gone), else how many (c->fast set; the key must have been looked for) */
int64_t _hs_walk_fastbins(child_t *c, uint64_t main_arena, const char **why);
void _hs_walk_fastbins_forget(child_t *c);
int _hs_walk_fastbins_hold(const child_t *c, uint64_t main_arena, uint64_t limit,
                           uint64_t budget_ns);
uint64_t _hs_start_brk(void);                     /* read once (arenas.c too) */

/* heaproots.c */
void _hs_roots_other_blocks(child_t *c, hs_map_reach_t *rec);
void _hs_roots_reach(child_t *c, int at_exit, hs_map_reach_t *rec, hs_map_block_t **list);

/* arenas.c: every glibc arena lock (NULL, or why not; then none is held) */
const char *_hs_arenas_lock(uint64_t *head, uint64_t deadline);
const char *_hs_arenas_lock_ring(uint64_t from, uint64_t upto, uint64_t deadline);
void _hs_arenas_unlock(void);
void _hs_arenas_forget(void);          /* none held (before a copy that takes none) */
void _hs_arenas_free_in_copy(void);    /* the copy's copies of the held locks, freed */
uint64_t _hs_arenas_ring_head(void);   /* main_arena's ->next now (one is held) */
int _hs_arenas_main_known(void);
uint64_t _hs_arenas_main(void);        /* main_arena as found (0: never was) */

#endif
