/* probe.c: the library's own measurements: RSS from /proc/self/status (open/read into a
 * stack buffer: fopen would allocate), the stats thread that samples the allocator's
 * figures, and the release probe at exit. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hs_internal.h"
#include "hs_options.h"

static uint64_t field_kb(const char *buf, const char *key) {
  const char *p = strstr(buf, key);
  if (!p) return 0;
  p += strlen(key);
  while (*p == ' ' || *p == '\t') p++;
  uint64_t v = 0;
  while (*p >= '0' && *p <= '9') v = v * 10 + (uint64_t)(*p++ - '0');
  return v;
}

static int read_status(char *buf, size_t size) {
  int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  return 1;
}

int _hs_read_status(uint64_t *rss_bytes, uint64_t *anon_bytes) {
  char buf[4096];
  if (!read_status(buf, sizeof buf)) return 0;
  *rss_bytes = field_kb(buf, "\nVmRSS:") * 1024;
  *anon_bytes = field_kb(buf, "\nRssAnon:") * 1024;
  return 1;
}

uint64_t _hs_read_threads(void) {
  char buf[4096];
  return read_status(buf, sizeof buf) ? field_kb(buf, "\nThreads:") : 0;
}

static void publish_stats(const hs_alloc_stats_t *st) {
  hs_segment_t *seg = _hs_seg;
  __atomic_fetch_add(&seg->stats_seq, 1, __ATOMIC_ACQ_REL); /* odd: writing */
  seg->stats = *st;
  __atomic_fetch_add(&seg->stats_seq, 1, __ATOMIC_ACQ_REL); /* even: consistent */
}

static volatile int g_stop;
static pthread_t g_stats_thread;
static int g_stats_started;

static void sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* mallinfo2 and malloc_info walk the free lists under the arena locks: on a heap with
 * millions of free chunks a call can take milliseconds, so the period stretches to keep
 * the thread under 1% of the time. */
static void *stats_main(void *arg) {
  (void)arg;
  _hs_t_helper = 1;
  uint64_t period = (uint64_t)(1e9 / _hs_opt.stats_hz);
  while (!g_stop) {
    hs_alloc_stats_t st;
    memset(&st, 0, sizeof st);
    uint64_t t0 = _hs_now_ns();
    if (_hs_allocator_stats(&st) && !g_stop) publish_stats(&st);
    uint64_t spent = _hs_now_ns() - t0, wait = period;
    if (spent * 100 > wait) wait = spent * 100;
    __atomic_store_n(&_hs_seg->stats_hz_milli, (uint64_t)(1e12 / (double)wait), __ATOMIC_RELAXED);
    for (uint64_t slept = 0; slept < wait && !g_stop; slept += 10000000ull) sleep_ns(10000000ull);
  }
  return NULL;
}

void _hs_stats_thread_start(void) {
  _hs_options_read();
  _hs_allocator_prepare();
  if (!_hs_is_owner() || _hs_opt.stats_hz <= 0) return;
  hs_alloc_stats_t st;
  memset(&st, 0, sizeof st);
  if (!_hs_allocator_stats(&st)) return; /* nothing to sample for this allocator */
  publish_stats(&st);
  /* Start with every signal blocked so the program's handlers never run on our thread. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024); /* joinable: the exit probe waits for it */
  g_stats_started = pthread_create(&g_stats_thread, &attr, stats_main, NULL) == 0;
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* At exit, in the owner only: RSS and allocator figures, the allocator's release-now call,
 * and the same figures again. What the release gave back is the difference. */
void _hs_exit_probe(void) {
  hs_segment_t *seg = _hs_seg;
  if (!seg || !_hs_is_owner()) return;
  g_stop = 1;
  /* Let the statistics thread finish before measuring: a thread that ends runs the
   * allocator's thread cleanup (jemalloc flushes its tcache and may start purging its
   * arena; a purge already under way makes arena.<i>.purge return at once, so the release
   * below would look smaller than it is). Bounded, in case it is stuck behind a lock. */
  if (g_stats_started) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 200000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_timedjoin_np(g_stats_thread, NULL, &until);
    g_stats_started = 0;
  }
  _hs_flush_current();
  __atomic_store_n(&seg->state, HS_STATE_EXITING, __ATOMIC_RELEASE);
  seg->exit_ns = _hs_now_ns();
  _hs_read_status(&seg->exit_rss_before, &seg->exit_anon_before);
  _hs_allocator_stats(&seg->exit_stats_before);
  if (_hs_opt.release_at_exit) {
    uint64_t t0 = _hs_now_ns();
    _hs_allocator_release();
    seg->release_ns = _hs_now_ns() - t0;
    seg->exit_release_kind = seg->allocator_id;
  }
  _hs_read_status(&seg->exit_rss_after, &seg->exit_anon_after);
  _hs_allocator_stats(&seg->exit_stats_after);
  __atomic_store_n(&seg->state, HS_STATE_DONE, __ATOMIC_RELEASE);
}
