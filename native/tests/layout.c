/* layout.c: prints the stats segment's layout as JSON (name: [offset, size]) so the test
 * suite can check src/heapsight/segment.py against what the compiler laid out. */
#include <stddef.h>
#include <stdio.h>

#include "heapsight.h"

#define SEG(f) printf("%s\"%s\": [%zu, %zu]", first++ ? ", " : "", #f, \
                      offsetof(hs_segment_t, f), sizeof(((hs_segment_t *)0)->f))
#define SLOT(f) printf("%s\"%s\": [%zu, %zu]", first++ ? ", " : "", #f, \
                       offsetof(hs_slot_t, f), sizeof(((hs_slot_t *)0)->f))
#define STATS(f) printf("%s\"%s\": [%zu, %zu]", first++ ? ", " : "", #f, \
                        offsetof(hs_alloc_stats_t, f), sizeof(((hs_alloc_stats_t *)0)->f))

#define HIST(f) printf("%s\"%s\": [%zu, %zu]", first++ ? ", " : "", #f, \
                       offsetof(hs_hist_t, f), sizeof(((hs_hist_t *)0)->f))

#define PROF(f) printf("%s\"%s\": [%zu, %zu]", first++ ? ", " : "", #f, \
                       offsetof(hs_profile_t, f), sizeof(((hs_profile_t *)0)->f))

int main(void) {
  int first = 0;
  printf("{\"segment_bytes\": %zu, \"slot_bytes\": %zu, \"stats_bytes\": %zu, \"classes\": %d, ",
         sizeof(hs_segment_t), sizeof(hs_slot_t), sizeof(hs_alloc_stats_t), HS_CLASSES);
  printf("\"block_extra\": %d, \"flush_total_bytes\": %d, ", HS_BLOCK_EXTRA, HS_FLUSH_TOTAL_BYTES);
  printf("\"map_limit_s\": %d, \"probe_limit_s\": %d, ", HS_MAP_LIMIT_S, HS_PROBE_LIMIT_S);
  printf("\"segment\": {");
  SEG(magic); SEG(version); SEG(size_bytes); SEG(slot_bytes); SEG(max_slots); SEG(n_classes);
  SEG(owner_pid); SEG(state); SEG(execs); SEG(forks); SEG(foreign_attaches); SEG(slots_used);
  SEG(slot_overflows); SEG(start_ns); SEG(start_rss_bytes); SEG(start_anon_bytes);
  SEG(live_usable_bytes); SEG(peak_usable_bytes); SEG(peak_ns); SEG(allocator_id);
  SEG(allocator_name); SEG(usable_by_header); SEG(helper_mallocs);
  SEG(exit_ns); SEG(release_ns); SEG(exit_rss_before);
  SEG(exit_rss_after); SEG(exit_anon_before); SEG(exit_anon_after); SEG(exit_release_kind);
  SEG(exit_stats_before); SEG(exit_stats_after); SEG(slots_offset); SEG(creator_pid); SEG(image);
  SEG(exit_probe_status); SEG(library_threads); SEG(library_cpu_ns); SEG(snapshot_seq); SEG(snapshot_ack); SEG(snapshot_label);
  SEG(heapmap_seq); SEG(heapmap_ack); SEG(heapmap_at_exit); SEG(mapped_at); SEG(heapmap_exit_pid); SEG(heapmap_copy_pid); SEG(exit_done_ns); SEG(slot_claims); SEG(own_private_bytes); SEG(glibc_main_arena); SEG(glibc_arena_next_off); SEG(glibc_arena_sysmem_off); SEG(threads_seen); SEG(seccomp_at_ns); SEG(exit_begun_ns); SEG(exit_begun_how); SEG(py_finalizing_addr); SEG(owners); SEG(hist); SEG(slots); SEG(profile);
  first = 0;
  printf("}, \"slot\": {");
  SLOT(left); SLOT(free_left); SLOT(alloc_chunk_bytes); SLOT(free_chunk_bytes);
  SLOT(n_alloc); SLOT(n_free); SLOT(req_alloc_bytes); SLOT(n_realloc); SLOT(claimed);
  SLOT(tid); SLOT(left_base); SLOT(sample_left); SLOT(flushed_net); SLOT(n_large);
  SLOT(n_mmapped); SLOT(mmapped_alloc_bytes); SLOT(mmapped_free_bytes);
  SLOT(free_base); SLOT(n_alloc_base); SLOT(seq);
  first = 0;
  printf("}, \"hist\": {");
  HIST(alloc_w); HIST(live_w); HIST(waste_w); HIST(live_u_w); HIST(live_var); HIST(live_var_u);
  HIST(live_var_uu);
  HIST(live_samples);
  first = 0;
  printf("}, \"profile\": {");
  PROF(magic); PROF(mean_bytes); PROF(events_used); PROF(stack_words_used); PROF(modules_used);
  PROF(dropped_samples); PROF(unwind_ns); PROF(unwinds); PROF(unwind_frames);
  PROF(interp_kind); PROF(interp_status); PROF(interp_version); PROF(interp_ns);
  PROF(interp_walks); PROF(interp_frames); PROF(unwind_cached); PROF(unwind_checked);
  PROF(unwind_mismatches);
  first = 0;
  printf("}, \"event_bytes\": %zu, \"module_bytes\": %zu", sizeof(hs_event_t), sizeof(hs_module_t));
  printf(", \"profile_tables\": %u, \"profile_unit_bytes\": %llu, \"room_default\": %u, "
         "\"segment_bytes_by_room\": [", HS_PROFILE_TABLES,
         (unsigned long long)HS_PROFILE_UNIT_BYTES, HS_PROFILE_ROOM_DEFAULT);
  for (unsigned k = 0; k <= HS_PROFILE_ROOM_MAX; k++)
    printf("%s%llu", k ? ", " : "", (unsigned long long)hs_segment_bytes(k));
  printf("], \"unit\": [%u, %u, %u]", HS_PROFILE_EVENTS_UNIT, HS_PROFILE_WORDS_UNIT,
         HS_PROFILE_MODULES_UNIT);
  printf(", \"stats\": {");
  STATS(time_ns); STATS(in_use_bytes); STATS(free_bytes); STATS(mapped_bytes);
  STATS(resident_bytes); STATS(mmapped_bytes); STATS(arenas); STATS(top_pad_bytes); STATS(raw);
  printf("}}\n");
  return 0;
}
