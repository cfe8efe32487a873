/* snapshot.c: heapsight_snapshot(label), the program's way to ask for a snapshot (the
 * header is include/heapsight_snapshot.h). It writes the label into the segment, bumps
 * snapshot_seq and waits, bounded, until the CLI's sampler has taken the sample
 * (snapshot_ack), so the snapshot is of this moment. Only the owner process asks. The heap
 * map the CLI asks for meanwhile (before it answers) is taken here, on the asking thread
 * (it returns once the copy is made). */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "hs_internal.h"

#define HS_EXPORT __attribute__((visibility("default")))
#define HS_SNAPSHOT_WAIT_MS 2500

HS_EXPORT int heapsight_snapshot(const char *label) {
  hs_segment_t *seg = _hs_seg;
  if (!seg || !_hs_is_owner() || __atomic_load_n(&seg->state, __ATOMIC_ACQUIRE) != HS_STATE_RUNNING)
    return 0;
  _hs_flush_current();   /* the live figure is this thread's to the byte */
  size_t n = label ? strnlen(label, sizeof seg->snapshot_label - 1) : 0;
  memcpy(seg->snapshot_label, label ? label : "", n);
  seg->snapshot_label[n] = 0;
  uint64_t seq = __atomic_add_fetch(&seg->snapshot_seq, 1, __ATOMIC_RELEASE);
  struct timespec ms = {0, 1000000};
  /* the sampler ticks every 10 ms by default, and it answers once the last heap map's copy
   * has been walked (one at a time: live/measure.py waits for it up to MAP_WAIT_S, 2 s) */
  for (int i = 0; i < HS_SNAPSHOT_WAIT_MS; i++) {
    if (__atomic_load_n(&seg->snapshot_ack, __ATOMIC_ACQUIRE) >= seq) {
      _hs_answer_map_request(); /* the snapshot's map, asked for before the answer */
      return 1;
    }
    if (_hs_answer_map_request()) continue; /* this thread takes the map asked for */
    nanosleep(&ms, NULL);
  }
  return 0;
}
