/* heapmap_file.h: the heap map's file, written by heapmap.c in the program's copy and read by
 * src/heapsight/heapmap.py (which mirrors it; the compiler checks every field and constant it
 * mirrors: tests/test_native.py).
 *
 * The file (little-endian; "<segment path>.map.N", ".map.exit"; 0600, O_EXCL):
 *   header, 384 bytes: u64 magic "HSHMAP01", version (HS_MAP_VERSION), header_bytes, file_bytes (the
 *     whole file: a shorter file is a child that was stopped), status (0 mapped, 1 not
 *     mapped), allocator (HS_ALLOC_*), page_bytes, time_ns (CLOCK_MONOTONIC just before the
 *     copy: the moment mapped), rss_before, rss_after, anon_before, anon_after (the child's
 *     VmRSS and RssAnon around the release), release_ns (the release's, or the count's
 *     up to the walk), walk_ns, fork_ns (from before
 *     the locks were taken to the child's first instruction: about the time the program's
 *     threads could not allocate),
 *     child_ns (the child's whole run), n_heaps, tcache_key_found, released_pages
 *     (pagemap: resident before the release, not after, in the heaps), child_minflt (pages
 *     the child faulted: its copies, its buffers), child_cpu_ns (its CPU time, as it saw
 *     it before writing), reach_bytes (the reach section's size after the heaps, 0: none),
 *     py_objects_bytes, py_pool_bytes, py_pools (CPython's pymalloc, heapmap.c),
 *     release_counted (1: the release was counted, see below; 0: run), fast_chunks (the
 *     chunks in glibc's fastbins, when counted), reserved[1];
 *     char why[160] (the reason when not mapped, else a note or empty).
 *   per heap (its pages: [heap] as mapped before the release; a thread heap's read-write
 *     part, mprotect_size; under another allocator, each of its mappings the hooks
 *     recorded, arena 0): u64 start, pages, arena (0 main, 1.. thread arenas in malloc_info's order),
 *     kind (HS_HEAP_*: 0 main heap, 1 thread heap, 2 another allocator's mapping), walked, top_bytes, live_bytes, inuse_chunks,
 *     free_chunks, tcache_chunks, reserved[2]; u32 live[pages]; u8 flags[pages]; zero
 *     padding to 8 bytes.
 *   trailer: u64 "HSHMAPEN".
 * Per page: live = user (usable) bytes of in-use chunks on the page; flags: 1 resident
 * before the release, 2 resident after it, 4 holds part of the top chunk, 8 holds
 * allocator bytes a release keeps (a chunk header, a free chunk's first 48 bytes, the top's
 * first 33, heap_info and malloc_state, fenceposts), 16 holds (part of) a free chunk kept
 * in a thread's tcache. malloc_trim(0) drops exactly the pages with none of live, 8, 16
 * inside free chunks; glibc 2.36 trims thread arenas' top chunks only on free(), never in
 * malloc_trim, so their top pages stay resident (bit 4, arena > 0). The main heap's pages
 * past the break the release lowered are past the walk: no live byte, no flag but 1.
 * A counted release (release_counted 1) writes what running it would have: flag 2 is
 * flag 1 but on the pages that rule drops, rss_after and anon_after are the figures before
 * less those pages, and the chunks malloc_trim would merge first are walked merged. */

#ifndef HS_HEAPMAP_FILE_H
#define HS_HEAPMAP_FILE_H

#include <stdint.h>

#define HS_MAP_MAGIC 0x313050414d485348ull   /* "HSHMAP01" */
#define HS_MAP_END 0x4e4550414d485348ull     /* "HSHMAPEN" */
#define HS_MAP_VERSION 3

/* A heap's kind (see above). */
enum { HS_HEAP_MAIN = 0, HS_HEAP_THREAD = 1, HS_HEAP_ALLOCATOR = 2 };

/* A page's flags (see above). */
enum { HS_PAGE_BEFORE = 1, HS_PAGE_AFTER = 2, HS_PAGE_TOP = 4, HS_PAGE_ALLOC = 8, HS_PAGE_TCACHE = 16 };

typedef struct hs_map_header_s {
  uint64_t magic, version, header_bytes, file_bytes, status, allocator, page_bytes, time_ns;
  uint64_t rss_before, rss_after, anon_before, anon_after;
  uint64_t release_ns, walk_ns, fork_ns, child_ns, n_heaps, tcache_key_found;
  uint64_t released_pages, child_minflt, child_cpu_ns;
  uint64_t reach_bytes;         /* the reach section's size, after the heaps (0: none) */
  /* CPython's pymalloc in the copy (heapmap.c: copy_pools): the bytes of its objects in
   * use, its pools' bytes and its pools (0 pools: not CPython, or none found) */
  uint64_t py_objects_bytes, py_pool_bytes, py_pools;
  /* glibc: 1 when the release was counted from the pages (heapmap.c: count_release), not
   * run, and the chunks then in its fastbins */
  uint64_t release_counted, fast_chunks;
  uint64_t reserved[1];
  char why[160];
} hs_map_header_t;

typedef struct hs_map_heap_s {
  uint64_t start, pages, arena, kind, walked, top_bytes, live_bytes;
  uint64_t inuse_chunks, free_chunks, tcache_chunks;
  uint64_t reserved[2];
} hs_map_heap_t;

/* The reach section (reach.c's classes): the figures, then the blocks not reachable,
 * by address (at most HS_REACH_LISTED of them). */
typedef struct hs_map_reach_s {
  uint64_t status;              /* 0 marked, 1 not (why says why) */
  uint64_t reach_ns, root_bytes, n_blocks;
  uint64_t bytes[4], blocks[4]; /* HS_REACH_LOST, _POSSIBLE, _REACHABLE, _INDIRECT */
  uint64_t n_listed, n_unlisted;
  uint64_t mmapped_missing_bytes; /* mmapped chunks the hooks counted live, not found */
  uint64_t workers;             /* the processes that marked: 1, or 2 (at exit, reach.c) */
  uint64_t reserved[2];
  char why[128];
} hs_map_reach_t;
/* A block's state (a listed block's, and the index of bytes[] and blocks[]); OWN, a block of
 * heapsight's own, is never written. */
enum { HS_REACH_UNREACHED = 0, HS_REACH_LOST = 0, HS_REACH_POSSIBLE = 1,
       HS_REACH_REACHABLE = 2, HS_REACH_INDIRECT = 3, HS_REACH_OWN = 4 };
typedef struct hs_map_block_s { uint64_t addr, usable, state; } hs_map_block_t;
#define HS_REACH_LISTED (1u << 20)

_Static_assert(sizeof(hs_map_reach_t) == 272, "the reach record is 272 bytes");
_Static_assert(sizeof(hs_map_header_t) == 384, "the file header is 384 bytes");
_Static_assert(sizeof(hs_map_heap_t) == 96, "a heap's record is 96 bytes");

#endif
