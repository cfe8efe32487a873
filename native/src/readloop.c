/* readloop.c: the sampler's fast tick, in C (libhsread.so, loaded by the CLI with ctypes,
 * never by the program). At 1 kHz a Python tick costs ~60 us (numpy sums over the slots,
 * the parsing, the interpreter), 6% of a core; this loop reads /proc/PID/statm and the
 * segment's counters in a few microseconds and sleeps between ticks, and hands control back
 * to Python (heapsight/live/sampler.py) only for the work that is rare: smaps, the program's
 * children, allocator statistics, snapshots, signals, the program's exit.
 *
 * One row per tick, HS_READ_COLUMNS doubles: seconds since start_ns, RSS, anonymous RSS, live
 * usable bytes, live requested bytes (estimated per usable-size class, exactly as
 * heapsight.live.segment.Segment.counters does), allocations, frees, and the allocator's own
 * figures (in use, free, mapped, arenas) in the row that first sees a new reading, NaN in
 * the others. ctypes releases the GIL for
 * the call, so the CLI's other threads (the OpenMetrics exporter) keep running. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "heapsight.h"
#include "readloop.h"


static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* statm's second, third and fourth fields (resident, shared, the executable's code) in
 * pages (text_pages may be NULL); 0 when unreadable or a zombie (its RSS reads 0). */
static int read_statm(int fd, uint64_t *rss_pages, uint64_t *shared_pages,
                      uint64_t *text_pages) {
  char buf[256];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = 0;
  uint64_t v[4] = {0, 0, 0, 0};
  const char *p = buf;
  for (int i = 0; i < 4; i++) {
    while (*p == ' ') p++;
    if (*p < '0' || *p > '9') return 0;
    while (*p >= '0' && *p <= '9') v[i] = v[i] * 10 + (uint64_t)(*p++ - '0');
  }
  *rss_pages = v[1];
  *shared_pages = v[2];
  if (text_pages) *text_pages = v[3];
  return v[1] != 0;
}

/* The program exec'd another image than exe (the one the caller saw last), by
 * /proc/PID/exe (exe_link: its path). */
static int exec_elsewhere(const char *exe_link, const char *exe) {
  char now_exe[4096];
  ssize_t n = readlink(exe_link, now_exe, sizeof now_exe - 1);
  if (n <= 0) return 0;
  now_exe[n] = 0;
  return strcmp(now_exe, exe) != 0;
}

/* Each slot's usable bytes at the last reading that caught it between folds: a thread
 * descheduled (or stopped) in the middle of one keeps those until it finishes it. Per
 * reading thread, for one segment at a time (its address and its attach time: another
 * run's segment may be mapped at the same address). */
static __thread const hs_segment_t *t_seen_seg;
static __thread uint64_t t_seen_start;
static __thread uint64_t t_seen[HS_MAX_SLOTS][2];
static __thread unsigned char t_have[HS_MAX_SLOTS];

static void slot_usable(const hs_segment_t *seg, uint64_t i, uint64_t *a, uint64_t *f) {
  const hs_slot_t *s = &seg->slots[i];
  uint64_t start = __atomic_load_n(&seg->start_ns, __ATOMIC_RELAXED);
  if (t_seen_seg != seg || t_seen_start != start) {
    memset(t_have, 0, sizeof t_have);
    t_seen_seg = seg;
    t_seen_start = start;
  }
  /* the fold takes some 30 instructions: spin a little, then yield the CPU to its owner a
   * few times (2 ms at most), then keep what the slot had (never caught between folds
   * yet: what was read, off by at most one fold) */
  int ok = hs_slot_usable(s, 100, a, f);
  for (int w = 0; !ok && w < 40; w++) {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
    ok = hs_slot_usable(s, 100, a, f);
  }
  if (ok) {
    t_seen[i][0] = *a;
    t_seen[i][1] = *f;
    t_have[i] = 1;
  } else if (t_have[i]) {
    *a = t_seen[i][0];
    *f = t_seen[i][1];
  }
}

/* Live usable and requested bytes, allocations and frees, summed over the used slots. The
 * requested bytes of live blocks are estimated from the sampled size histogram (the live
 * blocks' mean waste by class, over their usable bytes), or from all allocations' waste
 * while no sampled block is live: as heapsight.live.segment.Segment.counters does. */
static void read_counters(const hs_segment_t *seg, double *row) {
  uint64_t used = __atomic_load_n(&seg->slots_used, __ATOMIC_RELAXED);
  if (used < 1) used = 1;
  if (used > HS_MAX_SLOTS) used = HS_MAX_SLOTS;
  uint64_t ua = 0, uf = 0, req = 0, na = 0, nf = 0;
  for (uint64_t i = 0; i < used; i++) {
    const hs_slot_t *s = &seg->slots[i];
    uint64_t a, f;
    slot_usable(seg, i, &a, &f);
    ua += a;
    uf += f;
    req += s->req_alloc_bytes;
    na += s->n_alloc;
    nf += s->n_free;
  }
  double live_usable = ua > uf ? (double)(ua - uf) : 0;
  double ratio = ua > 0 && ua > req ? (double)(ua - req) / (double)ua : 0;
  const hs_hist_t *h = &seg->hist;
  double waste = 0, live_u = 0;
  if (h->live_samples > 0) {
    for (int c = 0; c < HS_CLASSES; c++) {
      double a = h->alloc_w[c], n = h->live_w[c], u = h->live_u_w[c];
      if (!(a > 0)) continue;
      if (n > 0) waste += n * (h->waste_w[c] / a);
      if (u > 0) live_u += u;
    }
    if (live_u > 0) ratio = waste / live_u < 1 ? waste / live_u : 1;
  }
  double live_req = live_usable - floor(live_usable * ratio + 0.5);
  row[3] = live_usable;
  row[4] = live_req > 0 ? live_req : 0;
  row[5] = (double)na;
  row[6] = (double)nf;
}

/* The counters alone, into row's columns 3 to 6 (the Python tick's reading: the same
 * figures as the loop's ticks, without numpy on that side). */
void hs_read_counters(const hs_segment_t *seg, double *row) { read_counters(seg, row); }

/* The counters into row's columns 3 to 6, of the same moment as RSS: statm is read again
 * after them, and while RSS moved by more than HS_STEADY_BYTES and 1% since the reading
 * before (the reader was descheduled between the two, or waited on a slot while the program
 * grew), both are read again, HS_STEADY_TRIES times at most (a program that grows that fast
 * keeps the last pair). *rss_pages and *shared_pages: the reading before on entry, the one
 * after the counters on return. Returns the reads again, or -1 when statm could not be read
 * after the counters (the process gone: both left as they were). */
int hs_read_steady(int statm_fd, const hs_segment_t *seg, double page_bytes,
                   uint64_t *rss_pages, uint64_t *shared_pages, double *row) {
  int again = 0;
  for (;;) {
    read_counters(seg, row);
    uint64_t rss, shared;
    if (statm_fd < 0 || !read_statm(statm_fd, &rss, &shared, NULL)) return -1;
    double moved = fabs(((double)rss - (double)*rss_pages) * page_bytes);
    *rss_pages = rss;
    *shared_pages = shared;
    if (moved <= HS_STEADY_BYTES + 0.01 * (double)rss * page_bytes || again >= HS_STEADY_TRIES)
      return again;
    again++;
  }
}

static int g_sfd = -1;
static uint64_t g_sfd_mask;

/* A signalfd over the signals the CLI waits for (blocked in its threads): poll on it says a
 * signal is pending without taking it, so Python's sigtimedwait still gets its siginfo. */
static int signal_fd(uint64_t mask) {
  if (g_sfd >= 0 && mask == g_sfd_mask) return g_sfd;
  sigset_t set;
  sigemptyset(&set);
  for (int s = 1; s < 64; s++)
    if (mask & (1ull << s)) sigaddset(&set, s);
  g_sfd = signalfd(g_sfd, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  g_sfd_mask = mask;
  return g_sfd;
}

/* Sleeps until *next_ns (CLOCK_MONOTONIC), samples, and repeats every period_ns; returns
 * at until_ns, when a watched signal is pending, when the program is gone, when it asked for
 * a snapshot (snapshot_seq past asked_seq), or after max_rows rows. Returns the rows
 * written into out and sets *why; *next_ns is left at the next tick due. seg may be NULL
 * (no counters: NaN). */
/* The segment's pages resident in the program (its owner): present in its page tables,
 * from /proc/PID/pagemap (bit 63) over the range the library mapped it at. -1 if unknown. */
static double own_resident(int pagemap_fd, const hs_segment_t *seg, double page_bytes) {
  uint64_t entries[512];
  uint64_t at = __atomic_load_n(&seg->mapped_at, __ATOMIC_ACQUIRE);
  uint64_t page = (uint64_t)page_bytes, n = seg->size_bytes / page;
  if (pagemap_fd < 0 || !at || !page) return -1;
  uint64_t present = 0;
  for (uint64_t done = 0; done < n;) { /* a page of entries at a time */
    uint64_t want = n - done < 512 ? n - done : 512;
    ssize_t got = pread(pagemap_fd, entries, want * 8, (off_t)((at / page + done) * 8));
    if (got != (ssize_t)(want * 8)) return -1;
    for (uint64_t i = 0; i < want; i++) /* present (bit 63), a shared page (61) */
      present += (entries[i] >> 61 & 5) == 5;
    done += want;
  }
  return (double)present * page_bytes;
}

/* own[0]: heapsight's segment's bytes resident in the program, taken out of every row's
 * RSS: read each tick through pagemap_fd, or kept as given when it cannot be; own[1]: the
 * most seen of all heapsight's bytes in it (with its private memory, own_private_bytes,
 * which is taken out of RSS and anonymous RSS). mem_fd (/proc/PID/mem, or -1) and
 * fin_addr: CPython's _PyRuntime._finalizing in the program (py_finalizing_addr), read each
 * tick; the loop returns after the first tick that reads it non-zero. */
int hs_read_loop(int statm_fd, const hs_segment_t *seg, uint64_t start_ns, uint64_t *next_ns,
                 uint64_t period_ns, uint64_t until_ns, uint64_t wake_mask, uint64_t asked_seq,
                 double page_bytes, double *out, int max_rows, int *why,
                 int pagemap_fd, double *own, uint64_t pid, int watch_exit,
                 double rss_above, const char *exe, int mem_fd, uint64_t fin_addr) {
  int rows = 0, sfd = signal_fd(wake_mask);
  /* an exec: statm's code size changes with the image, and /proc/PID/exe is read then (and
   * every HS_EXE_EVERY ticks, for an image of the same code size): reading that link each
   * tick was a fifth of the loop's CPU */
  char exe_link[64] = "";
  if (exe && exe[0] && pid)
    snprintf(exe_link, sizeof exe_link, "/proc/%llu/exe", (unsigned long long)pid);
  uint64_t text_seen = UINT64_MAX;
  unsigned ticks = 0;
  for (;;) {
    uint64_t now = now_ns(), due = *next_ns < until_ns ? *next_ns : until_ns;
    if (due > now) {
      uint64_t wait = due - now;
      struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
      struct pollfd pfd = {.fd = sfd, .events = POLLIN};
      if (sfd >= 0 ? ppoll(&pfd, 1, &ts, NULL) > 0 : nanosleep(&ts, NULL) != 0) {
        *why = HS_READ_SIGNAL;
        return rows;
      }
      now = now_ns();
    } else if (sfd >= 0) {
      struct pollfd pfd = {.fd = sfd, .events = POLLIN};
      if (poll(&pfd, 1, 0) > 0) { *why = HS_READ_SIGNAL; return rows; }
    }
    if (now >= until_ns) { *why = HS_READ_UNTIL; return rows; }
    if (rows >= max_rows) { *why = HS_READ_FULL; return rows; }
    /* the counters are another process's than statm_fd's (a wrapper's program attached):
     * the caller reads that process from now on */
    uint64_t owner = seg ? __atomic_load_n(&seg->owner_pid, __ATOMIC_ACQUIRE) : 0;
    if (owner && pid && owner != pid) { *why = HS_READ_OWNER; return rows; }
    /* the program entered its exit handlers: the caller reads what it wants of that moment */
    if (watch_exit && seg && __atomic_load_n(&seg->state, __ATOMIC_ACQUIRE) >= HS_STATE_EXITING) {
      *why = HS_READ_EXITING;
      return rows;
    }
    double *row = out + (size_t)rows * HS_READ_COLUMNS;
    uint64_t rss, shared, text;
    if (!read_statm(statm_fd, &rss, &shared, &text)) { *why = HS_READ_GONE; return rows; }
    /* the program exec'd another image: the caller notes it (a program that runs less than
     * a Python tick would be missed) */
    if (exe_link[0] && (text != text_seen || ticks++ % HS_EXE_EVERY == 0)) {
      text_seen = text;
      if (exec_elsewhere(exe_link, exe)) { *why = HS_READ_EXEC; return rows; }
    }
    row[0] = (double)(now - start_ns) / 1e9;
    for (int i = 3; i < HS_READ_COLUMNS; i++) row[i] = NAN;
    int counted = seg && __atomic_load_n(&seg->magic, __ATOMIC_ACQUIRE) == HS_SEGMENT_MAGIC;
    double priv = 0;
    if (counted) {
      double mine = own_resident(pagemap_fd, seg, page_bytes);
      if (mine >= 0) own[0] = mine;
      /* and its private memory (tables, the sampled-block map): anonymous */
      priv = (double)__atomic_load_n(&seg->own_private_bytes, __ATOMIC_RELAXED);
      if (own[0] + priv > own[1]) own[1] = own[0] + priv;
      hs_read_steady(statm_fd, seg, page_bytes, &rss, &shared, row);
    }
    row[1] = (double)rss * page_bytes;
    row[2] = (double)(rss - shared) * page_bytes;
    if (counted) {
      row[1] = row[1] > own[0] + priv ? row[1] - own[0] - priv : 0; /* shared pages: never in row[2] */
      row[2] = row[2] > priv ? row[2] - priv : 0;
      /* attached meanwhile (the check above): its counters are not statm_fd's process's */
      owner = __atomic_load_n(&seg->owner_pid, __ATOMIC_ACQUIRE);
      if (owner && pid && owner != pid) { *why = HS_READ_OWNER; return rows; }
    }
    /* CPython began finalizing: the caller notes this row's time */
    uint64_t fin = 0;
    int finalizing = mem_fd >= 0 && fin_addr &&
                     pread(mem_fd, &fin, sizeof fin, (off_t)fin_addr) == (ssize_t)sizeof fin && fin;
    rows++;
    *next_ns += period_ns;
    if (finalizing) {
      if (*next_ns < now) *next_ns = now;
      *why = HS_READ_FINALIZING;
      return rows;
    }
    /* a new high of RSS: the caller reads the mappings of that moment */
    if (rss_above > 0 && row[1] > rss_above) {
      if (*next_ns < now) *next_ns = now;
      *why = HS_READ_RSS;
      return rows;
    }
    if (*next_ns < now) *next_ns = now; /* fell behind: no burst to catch up */
    if (seg && __atomic_load_n(&seg->snapshot_seq, __ATOMIC_ACQUIRE) > asked_seq) {
      *why = HS_READ_ASKED;
      return rows;
    }
  }
}

/* A countdown poked once (heapsight.h), unless it is poked already: pokes never pile up
 * (sixteen would wrap the 64 bits round to none). A compare-and-swap: an owner's count is
 * never lost, at worst the poke is (the CLI pokes again while no answer came). */
static void poke(int64_t *countdown) {
  int64_t v = __atomic_load_n(countdown, __ATOMIC_RELAXED);
  while (v > -HS_POKE / 2 &&
         !__atomic_compare_exchange_n(countdown, &v, v - HS_POKE, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

/* The poke: every slot in use takes its next allocation and free to the slow path, where
 * a heap map the CLI asked for is taken. */
void hs_poke_slots(hs_segment_t *seg) {
  uint64_t used = __atomic_load_n(&seg->slots_used, __ATOMIC_ACQUIRE); /* past the last */
  if (used > HS_MAX_SLOTS) used = HS_MAX_SLOTS;
  for (uint64_t i = 1; i < used; i++) {
    poke(&seg->slots[i].left);
    poke(&seg->slots[i].free_left);
  }
}
