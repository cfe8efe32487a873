/* readloop.h: libhsread.so's interface, which the CLI calls through ctypes
 * (src/heapsight/live/readloop.py mirrors it: its constants and argument types are checked
 * against this header by tests/test_readloop.py). */
#ifndef HS_READLOOP_H
#define HS_READLOOP_H

#include <stdint.h>

#include "heapsight.h"

/* A row's columns (doubles): the time, RSS, anonymous RSS, live usable and requested
 * bytes, allocations, frees, and the allocator's in use, free, mapped and arenas. */
#define HS_READ_COLUMNS 11

/* Why the loop returned. */
enum { HS_READ_UNTIL = 0, HS_READ_FULL = 1, HS_READ_SIGNAL = 2, HS_READ_GONE = 3,
       HS_READ_ASKED = 4, HS_READ_OWNER = 5, HS_READ_EXITING = 6, HS_READ_RSS = 7,
       HS_READ_EXEC = 8, HS_READ_FINALIZING = 9 };

/* Ticks every period_ns from *next_ns until until_ns, a row each in out (at most max_rows),
 * returning early for one of the reasons above (*why); readloop.c says each argument. */
int hs_read_loop(int statm_fd, const hs_segment_t *seg, uint64_t start_ns, uint64_t *next_ns,
                 uint64_t period_ns, uint64_t until_ns, uint64_t wake_mask, uint64_t asked_seq,
                 double page_bytes, double *out, int max_rows, int *why,
                 int pagemap_fd, double *own, uint64_t pid, int watch_exit,
                 double rss_above, const char *exe, int mem_fd, uint64_t fin_addr);

/* The poke (heapsight.h): every thread with counters takes its next allocation and free to
 * the library's slow path. */
void hs_poke_slots(hs_segment_t *seg);
/* /proc/PID/exe is read when statm's code size changes, and every this many ticks. */
#define HS_EXE_EVERY 16

/* RSS that moved by more than this (and 1%) while the counters were read is read again with
 * them, this many times at most (hs_read_steady). */
#define HS_STEADY_BYTES (1 << 20)
#define HS_STEADY_TRIES 3

/* The counters of the same moment as RSS (readloop.c): row[3..6]; *rss_pages and
 * *shared_pages the statm reading before on entry, the one after on return; -1 when statm
 * could not be read after them. */
int hs_read_steady(int statm_fd, const hs_segment_t *seg, double page_bytes,
                   uint64_t *rss_pages, uint64_t *shared_pages, double *row);
/* The counters alone, as a tick reads them: row[3..6] (live usable, live requested,
 * allocations, frees). */
void hs_read_counters(const hs_segment_t *seg, double *row);

/* CPython's pymalloc pools in the ranges [ranges[2i], ranges[2i+1]) of process pid
 * (pools.c): out[0] the bytes of the blocks in use, out[1] the pools' bytes, out[2] the
 * pools, out[3] the headers read. 0, or -1 when the process could not be read. */
int hs_read_pools(int pid, int pagemap_fd, const uint64_t *ranges, int n_ranges,
                  uint64_t page_bytes, uint64_t *out);

#endif
