/* hs_options.h: settings read once from HEAPSIGHT_* variables (options.c). */
#ifndef HS_OPTIONS_H
#define HS_OPTIONS_H
#include <stdint.h>
#define HS_RELEASE_IN_COPY 2
enum { HS_MAP_RELEASE_AUTO = 0, HS_MAP_RELEASE_RUN, HS_MAP_RELEASE_COUNT, HS_MAP_RELEASE_CHECK };
typedef struct hs_options_s {
  int release_at_exit;  /* HEAPSIGHT_RELEASE_AT_EXIT: 1: the program calls the allocator's
                           release at exit; "copy" (HS_RELEASE_IN_COPY): the exit map's copy
                           does, but for a release that acts on the calling thread's own heap
                           (mimalloc's), which the copy's one thread cannot reach; 0: none;
                           not given (-1): 1, but none in a process with a segment of its own
                           (HEAPSIGHT_SEGMENT=auto, `heapsight env`: the segment goes as the
                           process ends, and no one reads what a release would give back;
                           perl emptying a 1.5M-entry hash spent 0.5-0.8 s of its exit in it) */
  int reach;            /* HEAPSIGHT_REACH: the heap map's copy marks what the program can
                           still reach (reach.c; default 1) */
  int reach_index;      /* HEAPSIGHT_REACH_INDEX: the marking finds each word's block
                           through an index of the blocks (default 1; 0: a search over
                           them all, for bench/reach's comparison) */
  int reach_workers;    /* HEAPSIGHT_REACH_WORKERS: the processes that mark at exit: 0 (the
                           default): two past HS_REACH_WORKERS_MIN_BYTES of blocks, where the
                           program is the command the CLI started, else one;
                           1: one; 2: two whatever the count (reach.c; for the tests and
                           bench/reach's comparison) */
  int maps_while_running; /* HEAPSIGHT_MAPS_WHILE_RUNNING: the CLI will ask for heap maps
                            while the program runs (snapshots): the program's threads look
                            for a request in the counters' slow path (probe.c; default 0) */
  int map_release;      /* HEAPSIGHT_MAP_RELEASE: how a glibc heap map's copy finds what a
                           release would give back: "auto" (0, the default): counted from the
                           pages where malloc_trim would first merge HS_COUNT_FROM_CHUNKS or
                           more fastbin chunks, and a quarter of the blocks in use or more
                           (slow: ~0.2 us a chunk; heapmap.c), else run; "run" (1);
                           "count" (2) wherever the fastbins can be told; "check" (3): both,
                           the run's figures kept and the note saying where they differ */
  int huge_pages;       /* GLIBC_TUNABLES sets glibc.malloc.hugetlb: the release is run */
  uint64_t sample_bytes; /* HEAPSIGHT_SAMPLE_BYTES: mean usable bytes between sampled
                            allocations (0: off) */
} hs_options_t;
extern hs_options_t _hs_opt;
void _hs_options_read(void);
void _hs_options_read_sampling(void); /* at attach, before the other options are read */
int _hs_options_read_reach(void);     /* when the allocator is known: HEAPSIGHT_REACH */
#endif
