/* copylib.c: libheapsight_copy.so, the heap map's walk for a process heapsight did not
 * start (`heapsight attach PID --leaks`).
 *
 * The injector (inject.c) stops the process, makes a copy of it with a clone made by one
 * of its threads (the process's pause is the fork's), lets the process go on, and loads
 * this library into the copy alone: never into the process. heapsight_copy_main() then
 * does in the copy what the preload library's copy does (heapmap.c): it closes the
 * copy's fds, measures what the allocator's release gives back, walks glibc's heaps, marks
 * what the process can still reach from its roots and writes the map file; the copy ends.
 *
 * What the preload library would have recorded about the process (its hooks' counts, its
 * thread, its own memory) does not exist here: the definitions below are those of a
 * process with no hooks. The copy's own blocks (what its dlopen of this library allocated:
 * the loader's record of it, reachable from the loader's data) are marked heapsight's, out
 * of every class, with what only they reach. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <malloc.h>
#include <stdint.h>
#include <unistd.h>

#include "hs_internal.h"
#include "hs_options.h"

#define HS_COPY_EXPORT __attribute__((visibility("default")))

/* The copy's exit codes the injector reads (src/heapsight/live/inject.py) */
#define HS_COPY_BUSY 7 /* a thread of the process held an arena's lock at the copy */

static hs_segment_t g_seg; /* no segment is shared: this one only names the allocator */
HS_HIDDEN hs_segment_t *_hs_seg = &g_seg;
HS_HIDDEN hs_options_t _hs_opt = {.reach = 1, .reach_index = 1};
HS_HIDDEN int _hs_blockmap_on;
HS_HIDDEN uint64_t _hs_exit_sp, _hs_helper_self;

int _hs_helper_running(void) { return 0; }
uint64_t _hs_live_blocks(void) { return 0; }
uint64_t _hs_mmapped_chunk_bytes(void) { return 0; }
void _hs_segment_after_fork_child(void) {}
size_t _hs_profile_own(hs_chunk_t *out, size_t max) { (void)out, (void)max; return 0; }
int _hs_read_status(uint64_t *rss_bytes, uint64_t *anon_bytes) {
  return _hs_status_read(rss_bytes, anon_bytes);
}
int _hs_allocator_release(void) { return malloc_trim(0); }
int _hs_blockmap_incomplete(void) { return 1; }
size_t _hs_blockmap_blocks(hs_chunk_t *out, size_t max) { (void)out, (void)max; return 0; }
size_t _hs_blockmap_own(hs_chunk_t *out, size_t max) { (void)out, (void)max; return 0; }
long _hs_blockmap_ranges(hs_chunk_t *out, size_t max) { (void)out, (void)max; return 0; }

/* The loader's record of this library (a block of the copy's heap, allocated by its
 * dlopen), from which the marking reaches what else the dlopen allocated. */
size_t _hs_own_blocks(uint64_t *out, size_t max, int *whole) {
  *whole = 0;
  Dl_info info;
  struct link_map *lm = NULL;
  if (max == 0 || !dladdr1((void *)&_hs_own_blocks, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
    return 0;
  out[0] = (uint64_t)(uintptr_t)lm;
  return 1;
}

/* Runs in the copy (never in the process) and never returns: the copy ends here, with
 * exit code 0 once the map is written, HS_COPY_BUSY when a thread held an arena lock at
 * the moment of the copy (its heap may be half-changed: the injector makes another). */
HS_COPY_EXPORT __attribute__((noreturn)) void heapsight_copy_main(const char *path, long reach) {
  g_seg.allocator_id = HS_ALLOC_GLIBC;
  _hs_opt.reach = reach != 0; /* 0: the heaps' figures alone (attach without --leaks) */
  if (!_hs_glibc_locks_free()) {
    _hs_heapmap_write_refusal(path, "a thread of the process held an arena's lock at the copy");
    _exit(HS_COPY_BUSY);
  }
  _hs_heapmap_in_copy(path);
}
