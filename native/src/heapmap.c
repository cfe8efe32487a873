/* heapmap.c: the heap map, and a measured "what would a release give back right now".
 *
 * _hs_heapmap_write(path) runs on a thread of the program's that is inside the library
 * and holds no lock of the allocator's (probe.c: at exit, or at its next allocator call
 * after the CLI asked), or on the library's exit-time helper. It makes a copy of the
 * process with a raw clone() whose exit signal is 0 (make_copy): the program's wait()
 * never sees it and its end sends no SIGCHLD. For glibc,
 * every arena lock is held around the copy, taken as glibc's own fork() takes them, so the
 * copy sees a consistent heap; the copy frees its copies of those locks and detaches from
 * the shared segment first. The child, single-threaded and on its own copy:
 *   1. lists the heaps from /proc/self/maps: glibc's main heap ([heap]) and its thread
 *      arenas' heaps (64 MiB-aligned read-write mappings that start with a heap_info);
 *   2. reads its RSS and the heaps' page presence (/proc/self/pagemap);
 *   3. calls the allocator's release (_hs_allocator_release: malloc_trim(0) for glibc, the
 *      others' purge) on the copy, and reads RSS and pagemap again: the difference is what
 *      a release would give back now, measured, the program untouched;
 *   4. (glibc) walks every heap's chunks from their headers, after the release (malloc_trim
 *      consolidates the fastbins first, so a chunk is in use iff the next chunk's PREV_INUSE
 *      bit is set, but for chunks parked in a thread's tcache: those carry the tcache key in
 *      their second word, read from the entries of a thread's tcache_perthread_struct, found
 *      by a first walk: the child allocates nothing from the heap, which it would disturb);
 *   5. writes the file and _exit(0)s.
 * The thread that made the copy waits for it to be made (and to close its fds), never for
 * the walk: the child bounds itself (copy_bound). It is named "hs-heapmap" (the CLI leaves
 * it out of the program's descendants, and makes one at a time), runs none of the
 * program's signal handlers, and is the first the OOM killer takes. No map is taken (a
 * "not mapped" file says why) when glibc's main_arena cannot be found and checked, or when
 * a thread keeps an arena's lock 0.2 s.
 *
 * The glibc layouts read (2.36, x86-64; malloc/malloc.c and malloc/arena.c):
 *   chunk: prev_size, size (bits PREV_INUSE 1, IS_MMAPPED 2, NON_MAIN_ARENA 4); user data at
 *     chunk + 16; usable bytes of an in-use chunk: size - 8 (they end in the next chunk's
 *     prev_size). A tcache entry keeps its key in the user data's second word.
 *   heap_info (at each thread heap's 64 MiB-aligned start): ar_ptr, prev, size,
 *     mprotect_size, pagesize, padding: 48 bytes (read from the first heap: ar_ptr - heap).
 *   malloc_state (after the heap_info of an arena's first heap): top at +96, next at +2160,
 *     system_mem at +2184, 2200 bytes; the arena's first chunk is the next 16-aligned byte.
 *     system_mem must equal the sum of the arena's heap sizes: the check that the layout is
 *     the one expected; an arena that fails it is listed but not walked.
 *   A thread heap that is not its arena's current one ends in fenceposts: a 16-byte chunk
 *     and a header of size 0|PREV_INUSE within 2 * MINSIZE of the heap's end.
 *   The main arena starts at start_brk (/proc/self/stat) rounded up to 16 and ends at the
 *     break; its last chunk is the top.
 * Every read stays inside the mappings listed; a walk whose chunk sizes leave the heap, or
 * that does not end exactly at the heap's end (the top chunk, or the fenceposts), marks
 * that heap "not walked" (its live bytes and bits 4, 8, 16 are then empty), never a crash.
 *
 * The file it writes: heapmap_file.h.
 *
 * What a map costs the program (1 GiB heap, this machine): the copy takes ~21 ms, while
 * the allocator's locks are held (no thread of the program can allocate) and the address
 * space is locked; then every page the program writes for the first time after the fork takes a
 * minor fault, even once the child has ended (~1.2 us a page: ~0.3 s to rewrite 1 GiB).
 * At exit that is nothing; at a snapshot it is the price of the map. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <sched.h>
#include <setjmp.h>
#include <stdio.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "heapmap_copy.h"
#include "hs_pools.h"
#include "hs_fd.h"
#include "hs_options.h"


/* ---- the parent's side: state probe.c reads ---- */
static volatile int g_forking;   /* 1 while the copy may wait for the allocator's locks */

int _hs_heapmap_forking(void) { return __atomic_load_n(&g_forking, __ATOMIC_ACQUIRE); }

/* ---- small helpers usable in the child (no malloc, no stdio, no locks) ---- */
/* The copy's own mappings: never roots of the reach (heapsight's memory, not the program's) */
hs_chunk_t _hs_copy_own[HS_OWN_MAX];
size_t _hs_copy_n_own;
uint64_t _hs_copy_live_blocks, _hs_copy_mmapped_bytes;
static int g_in_copy;

static void *copy_map_flags(size_t bytes, int flags) {
  void *p = (void *)syscall(SYS_mmap, NULL, bytes, PROT_READ | PROT_WRITE,
                            flags | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if ((long)p < 0 && (long)p > -4096) return NULL;
  if (g_in_copy && _hs_copy_n_own < HS_OWN_MAX)
    _hs_copy_own[_hs_copy_n_own++] = (hs_chunk_t){(uint64_t)(uintptr_t)p, (uint64_t)(uintptr_t)p + bytes};
  return p;
}

void *_hs_copy_map(size_t bytes, int populate) {
  return copy_map_flags(bytes, MAP_PRIVATE | (populate ? MAP_POPULATE : 0));
}

void _hs_copy_unmap(void *p, size_t bytes) {
  if (!p) return;
  syscall(SYS_munmap, p, bytes);
  for (size_t i = 0; i < _hs_copy_n_own; i++) { /* its place in the list, for another */
    if (_hs_copy_own[i].lo == (uint64_t)(uintptr_t)p) {
      _hs_copy_own[i] = _hs_copy_own[--_hs_copy_n_own];
      break;
    }
  }
}

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return 0;
    p += w;
    n -= (size_t)w;
  }
  return 1;
}

static void set_why(hs_map_header_t *h, const char *why) {
  size_t n = strnlen(why, sizeof h->why - 1);
  memcpy(h->why, why, n);
  h->why[n] = 0;
}

static void header_init(hs_map_header_t *h, uint64_t time_ns) {
  memset(h, 0, sizeof *h);
  h->magic = HS_MAP_MAGIC;
  h->version = HS_MAP_VERSION;
  h->header_bytes = sizeof *h;
  h->allocator = _hs_seg ? _hs_seg->allocator_id : HS_ALLOC_UNKNOWN;
  h->page_bytes = (uint64_t)sysconf(_SC_PAGESIZE);
  h->time_ns = time_ns;
}

static int open_new(const char *path) {
  return hs_open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
}

/* A "not mapped" file with only the header: why no map was taken. */
int _hs_heapmap_write_refusal(const char *path, const char *why) {
  hs_map_header_t h;
  header_init(&h, _hs_now_ns());
  h.status = 1;
  set_why(&h, why);
  h.file_bytes = sizeof h + 8;
  unlink(path); /* a stopped child's partial file */
  int fd = open_new(path);
  if (fd < 0) return 0;
  uint64_t end = HS_MAP_END;
  int ok = write_all(fd, &h, sizeof h) && write_all(fd, &end, sizeof end);
  close(fd);
  return ok;
}

/* Why another allocator's pages are not mapped: their record is off (HEAPSIGHT_REACH=0,
 * compare's runs), or the allocator is not one heapsight knows. */
static const char *not_mapped_why(uint64_t id) {
  switch (id) {
  case HS_ALLOC_JEMALLOC:
    return "jemalloc's pages are mapped from the hooks' record of its blocks, off in this run "
           "(HEAPSIGHT_REACH=0); the release figure is arena.<all>.purge run in a copy";
  case HS_ALLOC_TCMALLOC:
    return "tcmalloc's pages are mapped from the hooks' record of its blocks, off in this run "
           "(HEAPSIGHT_REACH=0); the release figure is ReleaseFreeMemory run in a copy";
  case HS_ALLOC_MIMALLOC:
    return "mimalloc's pages are mapped from the hooks' record of its blocks, off in this run "
           "(HEAPSIGHT_REACH=0); its release (mi_collect) acts on the calling thread's heap, "
           "in the copy heapsight's own: the figure is a lower bound";
  case HS_ALLOC_MMAP:
    return "one mapping per block: a free returns its pages at once, nothing is held";
  default:
    return "the allocator is not known to heapsight";
  }
}

static int write_map(const char *path, hs_map_header_t *h, child_t *c,
                     const hs_map_reach_t *rec, const hs_map_block_t *blocks) {
  uint64_t bytes = sizeof *h + 8 + h->reach_bytes;
  for (size_t i = 0; i < c->n_heaps; i++) {
    uint64_t pages = c->heaps[i].out.pages;
    bytes += sizeof(hs_map_heap_t) + ((pages * 5 + 7) & ~(uint64_t)7);
  }
  h->file_bytes = bytes;
  h->n_heaps = c->n_heaps;
  int fd = open_new(path);
  if (fd < 0) return 0;
  int ok = write_all(fd, h, sizeof *h);
  static const char zeros[8];
  for (size_t i = 0; ok && i < c->n_heaps; i++) {
    heap_t *hp = &c->heaps[i];
    uint64_t pages = hp->out.pages;
    ok = write_all(fd, &hp->out, sizeof hp->out) && write_all(fd, hp->live, pages * 4) &&
         write_all(fd, hp->flags, pages) && write_all(fd, zeros, (8 - (pages * 5) % 8) % 8);
  }
  if (ok && h->reach_bytes)
    ok = write_all(fd, rec, sizeof *rec) &&
         (!rec->n_listed || write_all(fd, blocks, rec->n_listed * sizeof *blocks));
  uint64_t end = HS_MAP_END;
  ok = ok && write_all(fd, &end, sizeof end);
  close(fd);
  return ok;
}


static uint64_t cpu_of(const struct rusage *ru) {
  return (uint64_t)ru->ru_utime.tv_sec * 1000000000ull + (uint64_t)ru->ru_utime.tv_usec * 1000ull +
         (uint64_t)ru->ru_stime.tv_sec * 1000000000ull + (uint64_t)ru->ru_stime.tv_usec * 1000ull;
}

/* The copy bounds itself: no one waits for it (the program went on once it was made, and
 * may have ended). A timer ticks every HS_TICK_MS: past HS_MAP_LIMIT_NS in all, or once the
 * allocator's release has slept HS_RELEASE_ASLEEP_TICKS ticks in a row (under an allocator
 * other than glibc, a lock a thread of the program held when the copy was made stays taken
 * in the copy, and the release waits for it for ever; glibc's locks are taken around the
 * copy and freed in it), it writes why no map and ends. The handler makes only system
 * calls. */
#define HS_TICK_MS 250
#define HS_RELEASE_ASLEEP_TICKS 8 /* 2 s */
static const char *g_copy_path;
static uint64_t g_copy_t0, g_tick_cpu_ns;
static volatile int g_releasing, g_asleep_ticks;

static uint64_t process_cpu_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void copy_tick(int sig) {
  (void)sig;
  uint64_t cpu = process_cpu_ns();
  int asleep = cpu - g_tick_cpu_ns < 1000000ull; /* under 1 ms of CPU in a tick */
  g_tick_cpu_ns = cpu;
  g_asleep_ticks = g_releasing && asleep ? g_asleep_ticks + 1 : 0;
  const char *why = NULL;
  if (g_asleep_ticks >= HS_RELEASE_ASLEEP_TICKS)
    why = "the copy waited 2 s for a lock of the allocator's that a thread of the program "
          "held when it was made";
  else if (_hs_now_ns() - g_copy_t0 > HS_MAP_LIMIT_NS)
    why = "the map took longer than 30 s and was stopped";
  if (!why) return;
  _hs_heapmap_write_refusal(g_copy_path, why);
  _exit(7);
}

static void copy_bound(const char *path, uint64_t t0) {
  g_copy_path = path;
  g_copy_t0 = t0;
  g_tick_cpu_ns = process_cpu_ns();
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = copy_tick;
  sa.sa_flags = SA_RESTART;
  sigfillset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, NULL);
  sigset_t alrm;
  sigemptyset(&alrm);
  sigaddset(&alrm, SIGALRM);
  sigprocmask(SIG_UNBLOCK, &alrm, NULL); /* the thread that made it may block it */
  struct itimerval every = {{0, HS_TICK_MS * 1000}, {0, HS_TICK_MS * 1000}};
  setitimer(ITIMER_REAL, &every, NULL);
}

/* The heaps' per-page arrays and the pagemap buffer, in memory before RSS is read (they
 * are not in the release's difference). 0 when there is no room. */
static int page_arrays(child_t *c) {
  uint64_t pages = 0;
  for (size_t i = 0; i < c->n_heaps; i++) {
    c->heaps[i].out.start = c->heaps[i].start;
    c->heaps[i].out.kind = (uint64_t)c->heaps[i].kind;
    c->heaps[i].out.pages = (c->heaps[i].end - c->heaps[i].start) / c->page;
    pages += c->heaps[i].out.pages;
  }
  size_t arr_bytes = ((size_t)pages * 5 + 64 + 7) & ~(size_t)7;
  char *arr = _hs_copy_map(arr_bytes + HS_PM_ENTRIES * 8, 1);
  if (!arr) return 0;
  c->pm_buf = (uint64_t *)(arr + arr_bytes);
  for (size_t i = 0, at = 0; i < c->n_heaps; i++) {
    c->heaps[i].live = (uint32_t *)(arr + at * 4);
    at += c->heaps[i].out.pages;
  }
  for (size_t i = 0, at = 0; i < c->n_heaps; i++) {
    c->heaps[i].flags = (uint8_t *)(arr + pages * 4 + at);
    at += c->heaps[i].out.pages;
  }
  return 1;
}

/* The allocator's release in the copy: RSS, anonymous RSS and the heaps' resident pages
 * before and after it (those before read once: count_release may have). */
static void measure_release(child_t *c, hs_map_header_t *h) {
  _hs_read_status(&h->rss_before, &h->anon_before);
  if (!c->before_read) _hs_walk_presence(c, HS_PAGE_BEFORE);
  uint64_t r0 = _hs_now_ns();
  g_releasing = 1;
  _hs_allocator_release();
  g_releasing = 0;
  h->release_ns = _hs_now_ns() - r0;
  _hs_read_status(&h->rss_after, &h->anon_after);
  _hs_walk_presence(c, HS_PAGE_AFTER);
  uint64_t dropped = 0;
  for (size_t i = 0; i < c->n_heaps; i++) {
    for (uint64_t k = 0; k < c->heaps[i].out.pages; k++)
      dropped += (c->heaps[i].flags[k] & (HS_PAGE_BEFORE | HS_PAGE_AFTER)) == HS_PAGE_BEFORE;
  }
  h->released_pages = dropped;
}

static char *put_u64(char *at, const char *end, uint64_t v) {
  char t[24];
  int n = 0;
  do t[n++] = (char)('0' + v % 10); while ((v /= 10) && n < 24);
  while (n && at < end) *at++ = t[--n];
  return at;
}

static char *put_str(char *at, const char *end, const char *s) {
  while (*s && at < end) *at++ = *s++;
  return at;
}

/* glibc's release counted instead of run. malloc_trim first merges every fastbin chunk
 * with its free neighbours (malloc_consolidate), reading them in the order they were
 * freed: ~0.2 us a chunk here, 0.65 s of the copy of a perl that had just emptied a
 * 1.5M-entry hash. From HS_COUNT_FROM_CHUNKS such chunks on, and a quarter of the blocks
 * in use (HEAPSIGHT_MAP_RELEASE: hs_options.h), what it would give back is counted from the pages by its own rule (the
 * walk, heapwalk.c): the chunks it would merge are walked merged, and a page is given back
 * when it was resident and lies whole inside a free chunk past its first 48 bytes (mtrim's
 * madvise), or past the main heap's top's first 33 bytes (systrim's sbrk). 1 when counting
 * (the walk in map_glibc then counts), 0 when the release is to be run; the fastbins,
 * when they cannot be told from the pages (_hs_walk_fastbins), are run as always. */
#define HS_COUNT_FROM_CHUNKS 65536

/* What counting adds to the copy, roughly: one walk more of every chunk, ~40 ns a chunk
 * once the first walk has touched the pages (perl's emptied hash: 1.45M chunks in 55 ms),
 * taken as 50 ns for the blocks in use (the hooks' count) and as many free ones, and no
 * less than for HS_COUNT_FROM_CHUNKS chunks. Following the fastbins longer than that, the
 * release (which follows them again, and merges) would cost more than counting. */
#define HS_COUNT_NS_A_CHUNK 50
static uint64_t count_cost_ns(void) {
  return (2 * _hs_copy_live_blocks + HS_COUNT_FROM_CHUNKS) * HS_COUNT_NS_A_CHUNK;
}

static int count_release(child_t *c, hs_map_header_t *h) {
  int mode = _hs_opt.map_release;
  if (mode == HS_MAP_RELEASE_RUN) return 0;
  if (_hs_opt.huge_pages) { /* systrim then gives back whole huge pages: not its rule here */
    if (mode == HS_MAP_RELEASE_CHECK) set_why(h, "release check: run only: glibc.malloc.hugetlb is set");
    return 0;
  }
  uint64_t t0 = _hs_now_ns();
  _hs_read_status(&h->rss_before, &h->anon_before); /* before the copy's own bitmaps */
  _hs_walk_presence(c, HS_PAGE_BEFORE);
  c->before_read = 1;
  uint64_t main_arena = _hs_walk_number_arenas(c);
  if (!main_arena) main_arena = _hs_arenas_main(); /* one arena: not found from a thread's */
  /* counting walks every chunk once more (~40 ns each, in address order), running merges
   * the fastbin chunks (~0.2 us each): with many blocks in use and fewer fastbin chunks
   * than a quarter of them, running costs less */
  uint64_t from = _hs_copy_live_blocks / 4 > HS_COUNT_FROM_CHUNKS ? _hs_copy_live_blocks / 4
                                                                  : HS_COUNT_FROM_CHUNKS;
  if (mode == HS_MAP_RELEASE_AUTO &&
      !_hs_walk_fastbins_hold(c, main_arena, from, count_cost_ns()))
    return 0;
  c->finding_key = 1;
  _hs_walk_heaps(c, main_arena);
  c->finding_key = 0;
  const char *why = "";
  int64_t n = _hs_walk_fastbins(c, main_arena, &why);
  if (n < 0) {
    if (mode == HS_MAP_RELEASE_CHECK) {
      char note[sizeof h->why], *at = note, *end = note + sizeof note - 1;
      at = put_str(at, end, "release check: run only: ");
      at = put_str(at, end, why);
      *at = 0;
      set_why(h, note);
    }
    return 0;
  }
  if (mode == HS_MAP_RELEASE_AUTO && (uint64_t)n < from) {
    _hs_walk_fastbins_forget(c);
    return 0;
  }
  for (size_t i = 0; i < c->n_heaps; i++) {
    heap_t *hp = &c->heaps[i];
    for (uint64_t k = 0; k < hp->out.pages; k++)
      if (hp->flags[k] & HS_PAGE_BEFORE) hp->flags[k] |= HS_PAGE_AFTER;
  }
  c->counting = 1;
  c->released = 0;
  h->release_counted = 1;
  h->fast_chunks = (uint64_t)n;
  h->release_ns = _hs_now_ns() - t0;
  return 1;
}

/* After the counted walk: the figures running the release would have given. */
static void counted_figures(child_t *c, hs_map_header_t *h) {
  uint64_t gave = c->released * c->page;
  h->released_pages = c->released;
  h->rss_after = h->rss_before > gave ? h->rss_before - gave : 0;
  h->anon_after = h->anon_before > gave ? h->anon_before - gave : 0;
  c->counting = 0;
  _hs_walk_fastbins_forget(c);
}

/* HEAPSIGHT_MAP_RELEASE=check: the heaps walked counted, their pages kept; then the
 * release run (by the caller) and the heaps walked as always; compare_release says in the
 * note whether the two agree, page by page. */
typedef struct counted_s {
  uint8_t *flags;
  uint32_t *live;
  hs_map_heap_t *out;
  uint64_t released, fast_chunks;
} counted_t;

static int keep_counted(child_t *c, hs_map_header_t *h, counted_t *k) {
  uint64_t pages = 0;
  for (size_t i = 0; i < c->n_heaps; i++) pages += c->heaps[i].out.pages;
  char *mem = _hs_copy_map(pages * 5 + c->n_heaps * sizeof(hs_map_heap_t) + 64, 0);
  if (!mem) return 0;
  k->out = (hs_map_heap_t *)mem;
  k->live = (uint32_t *)(mem + c->n_heaps * sizeof(hs_map_heap_t));
  k->flags = (uint8_t *)(k->live + pages);
  _hs_walk_heaps(c, _hs_walk_number_arenas(c));
  counted_figures(c, h);
  k->released = h->released_pages;
  k->fast_chunks = h->fast_chunks;
  for (size_t i = 0, at = 0; i < c->n_heaps; i++) {
    heap_t *hp = &c->heaps[i];
    k->out[i] = hp->out;
    memcpy(k->live + at, hp->live, hp->out.pages * 4);
    memcpy(k->flags + at, hp->flags, hp->out.pages);
    at += hp->out.pages;
    memset(hp->live, 0, hp->out.pages * 4); /* as before the walk */
    for (uint64_t p = 0; p < hp->out.pages; p++) hp->flags[p] &= HS_PAGE_BEFORE;
    hp->out.walked = hp->out.top_bytes = hp->out.live_bytes = 0;
    hp->out.inuse_chunks = hp->out.free_chunks = hp->out.tcache_chunks = 0;
  }
  h->release_counted = h->fast_chunks = h->released_pages = 0;
  return 1;
}

static void compare_release(child_t *c, hs_map_header_t *h, const counted_t *k) {
  uint64_t flags = 0, live = 0, heaps = 0;
  for (size_t i = 0, at = 0; i < c->n_heaps; i++) {
    const heap_t *hp = &c->heaps[i];
    const hs_map_heap_t *o = &k->out[i];
    heaps += o->walked != hp->out.walked || o->top_bytes != hp->out.top_bytes ||
             o->live_bytes != hp->out.live_bytes || o->inuse_chunks != hp->out.inuse_chunks ||
             o->free_chunks != hp->out.free_chunks || o->tcache_chunks != hp->out.tcache_chunks;
    for (uint64_t p = 0; p < hp->out.pages; p++) {
      flags += k->flags[at + p] != hp->flags[p];
      live += k->live[at + p] != hp->live[p];
    }
    at += hp->out.pages;
  }
  char note[sizeof h->why], *at = note, *end = note + sizeof note - 1;
  at = put_str(at, end, flags || live || heaps || k->released != h->released_pages
                            ? "release check: counted and run differ:" : "release check: counted and run agree:");
  at = put_str(at, end, " pages given back ");
  at = put_u64(at, end, k->released);
  at = put_str(at, end, " and ");
  at = put_u64(at, end, h->released_pages);
  at = put_str(at, end, ", pages whose flags differ ");
  at = put_u64(at, end, flags);
  at = put_str(at, end, ", live bytes ");
  at = put_u64(at, end, live);
  at = put_str(at, end, ", heaps' counts ");
  at = put_u64(at, end, heaps);
  at = put_str(at, end, "; fastbin chunks ");
  at = put_u64(at, end, k->fast_chunks);
  *at = 0;
  if (!h->why[0]) set_why(h, note);
}

/* CPython's pymalloc in the copy (the program's CPython: the library found its
 * _PyRuntime): the pool headers (hs_pools.h) at every pool-aligned resident page of its
 * private anonymous mappings, read in place. mincore says which pages are resident (the
 * copy's pages are the program's), so no page is faulted in; a mapping it cannot tell is
 * left out. */
static void copy_pools(child_t *c, hs_map_header_t *h) {
  if (!_hs_seg || !_hs_seg->py_finalizing_addr || !c->pm_buf || c->page > HS_POOL_SIZE ||
      HS_POOL_SIZE % c->page)
    return;
  unsigned char *vec = (unsigned char *)c->pm_buf; /* a page's residency in each byte */
  uint64_t vec_pages = HS_PM_ENTRIES * 8, step = HS_POOL_SIZE / c->page, out[3] = {0, 0, 0};
  for (size_t i = 0; i < c->n_maps; i++) {
    const map_t *m = &c->maps[i];
    if (!m->r || !m->w || !m->anon || m->heap || m->dev || m->shared) continue;
    uint64_t lo = (m->lo + HS_POOL_SIZE - 1) & ~(uint64_t)(HS_POOL_SIZE - 1);
    while (lo + HS_POOL_OVERHEAD <= m->hi) {
      uint64_t pages = (m->hi - lo + c->page - 1) / c->page;
      if (pages > vec_pages) pages = vec_pages - vec_pages % step;
      if (mincore((void *)(uintptr_t)lo, pages * c->page, vec) != 0) break;
      for (uint64_t k = 0; k < pages; k += step) {
        uint64_t at = lo + k * c->page;
        if ((vec[k] & 1) && at + HS_POOL_OVERHEAD <= m->hi)
          hs_pool_count((const hs_pool_header_t *)(uintptr_t)at, out);
      }
      lo += (pages + step - 1) / step * step * c->page;
    }
  }
  h->py_objects_bytes = out[0];
  h->py_pool_bytes = out[1];
  h->py_pools = out[2];
}

/* glibc: the heaps walked after the release (a first walk finds the tcache key), and the
 * reach marked from their blocks. */
static void map_glibc(child_t *c, int at_exit, hs_map_header_t *h, hs_map_reach_t *rec,
                      hs_map_block_t **blocks) {
  uint64_t w0 = _hs_now_ns();
  /* the release may have shrunk [heap]: only what is mapped now is read (the first
   * listing's memory is left: the child ends soon) */
  if (!_hs_walk_maps(c)) _exit(5);
  uint64_t main_arena = _hs_walk_number_arenas(c);
  c->finding_key = 1; /* no tcache key in any tcache struct: no block is in a tcache */
  _hs_walk_heaps(c, main_arena);
  c->finding_key = 0;
  h->tcache_key_found = (uint64_t)c->key_found;
  if (_hs_opt.reach) { /* room for every block: reserved, backed only where written */
    uint64_t cap = 16;
    for (size_t i = 0; i < c->n_heaps; i++) cap += (c->heaps[i].end - c->heaps[i].start) / G_MINSIZE;
    for (size_t i = 0; i < c->n_maps; i++)
      if (c->maps[i].anon && c->maps[i].w) cap += (c->maps[i].hi - c->maps[i].lo) / c->page;
    c->chunks = _hs_copy_map(cap * sizeof(hs_chunk_t), 0);
    c->cap_chunks = c->chunks ? cap : 0;
  }
  _hs_walk_heaps(c, main_arena);
  h->walk_ns = _hs_now_ns() - w0;
  if (_hs_opt.reach) {
    _hs_roots_reach(c, at_exit, rec, blocks);
    h->reach_bytes = sizeof *rec + rec->n_listed * sizeof(hs_map_block_t);
  }
  if (c->n_heaps == 0) {
    h->status = 1;
    set_why(h, "no glibc heap found ([heap] or a thread arena's heap)");
    return;
  }
  size_t unwalked = 0;
  for (size_t i = 0; i < c->n_heaps; i++) unwalked += !c->heaps[i].out.walked;
  if (unwalked) set_why(h, "some heaps were not walked (their chunk headers did not "
                           "form a valid chain, or the arena layout was not glibc 2.36's)");
}

/* Another allocator: its structures are not walked; the hooks' record of its mappings
 * (the heaps, found before the release: heapother.c) and of the blocks' starts give each
 * page its live bytes, and the reach is marked from the blocks as glibc's. Without that
 * record (HEAPSIGHT_REACH=0) or its mappings, the release figure alone (why says why). */
static void map_other(child_t *c, int at_exit, hs_map_header_t *h, hs_map_reach_t *rec,
                      hs_map_block_t **blocks, const char *no_heaps) {
  if (!c->n_heaps) {
    h->status = 1;
    set_why(h, no_heaps ? no_heaps : not_mapped_why(h->allocator));
  }
  if (!_hs_opt.reach || !_hs_blockmap_on) return;
  uint64_t w0 = _hs_now_ns();
  if (!_hs_walk_maps(c)) _exit(5);
  _hs_roots_other_blocks(c, rec);
  if (c->chunks && c->n_heaps) _hs_other_live(c);
  else if (c->n_heaps) { /* no list of the blocks: the pages' residency alone */
    h->status = 1;
    set_why(h, "the live blocks were not listed (see the reach), so the pages' live bytes are "
               "not known");
  }
  h->walk_ns = _hs_now_ns() - w0;
  if (c->chunks) _hs_roots_reach(c, at_exit, rec, blocks);
  h->reach_bytes = sizeof *rec + rec->n_listed * sizeof(hs_map_block_t);
}

/* Written beside, then renamed: the CLI never reads half a map (and its clean-up of
 * "<segment>.map.*" never takes the one being written). */
static __attribute__((noreturn)) void write_and_end(const char *path, hs_map_header_t *h, child_t *c,
                                                    const hs_map_reach_t *rec,
                                                    const hs_map_block_t *blocks) {
  char part[4200];
  size_t n = strnlen(path, sizeof part - 16), dot = n;
  while (dot > 0 && path[dot - 1] != '.') dot--;   /* "<segment>.map.<name>" */
  if (dot < 5 || n + 8 >= sizeof part) _exit(6);
  memcpy(part, path, dot - 4);                      /* "<segment>." */
  memcpy(part + dot - 4, "part-map.", 9);
  memcpy(part + dot + 5, path + dot, n - dot + 1);  /* "<segment>.part-map.<name>" */
  if (!write_map(part, h, c, rec, blocks)) { unlink(part); _exit(6); }
  _exit(rename(part, path) == 0 ? 0 : 6);
}

static __attribute__((noreturn)) void child_main(const char *path, uint64_t t0, int at_exit) {
  uint64_t started = _hs_now_ns();
  g_in_copy = 1;
  prctl(PR_SET_NAME, "hs-heapmap", 0, 0, 0);
  copy_bound(path, t0);
  int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (fd >= 0) { (void)!write(fd, "1000", 4); close(fd); }

  hs_map_header_t h;
  header_init(&h, t0);
  h.fork_ns = started - t0;
  hs_map_reach_t rec;
  memset(&rec, 0, sizeof rec);
  hs_map_block_t *blocks = NULL;
  child_t c;
  memset(&c, 0, sizeof c);
  c.page = h.page_bytes;
  int glibc = h.allocator == HS_ALLOC_GLIBC;
  const char *no_heaps = NULL;
  if (!_hs_walk_maps(&c)) _exit(3);
  if (glibc && !_hs_walk_find_heaps(&c)) _exit(3);
  /* the others: their mappings as the hooks recorded them, when they record the blocks */
  if (!glibc && _hs_opt.reach && _hs_blockmap_on && !_hs_other_heaps(&c, &no_heaps))
    c.n_heaps = 0;
  if (!glibc && c.n_heaps && !page_arrays(&c)) { /* the release and the reach, without pages */
    c.n_heaps = 0;
    no_heaps = "no room in the copy for the allocator's pages";
  }
  if (!page_arrays(&c)) _exit(4);
  int counted = glibc && count_release(&c, &h);
  counted_t check = {0};
  if (counted && _hs_opt.map_release == HS_MAP_RELEASE_CHECK && keep_counted(&c, &h, &check))
    counted = 0;
  if (!counted) measure_release(&c, &h);
  copy_pools(&c, &h);
  if (glibc) map_glibc(&c, at_exit, &h, &rec, &blocks);
  else map_other(&c, at_exit, &h, &rec, &blocks, no_heaps);
  if (counted) counted_figures(&c, &h);
  if (check.out) compare_release(&c, &h, &check);
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0) {
    h.child_minflt = (uint64_t)ru.ru_minflt;
    h.child_cpu_ns = cpu_of(&ru);
  }
  h.child_ns = _hs_now_ns() - started;
  write_and_end(path, &h, &c, &rec, blocks);
}

/* Every fd of the copy closed: it shares the program's open files, and a copy holding
 * one keeps a flock the program released held, or a pipe the program closed open for its
 * reader (EOF only once the copy ends). The library keeps no fd open between calls, so the
 * copy needs none of them. */
static void close_every_fd(void) {
  if (syscall(SYS_close_range, 0U, ~0U, 0U) == 0) return;
  struct rlimit rl;
  rlim_t n = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 65536;
  for (rlim_t fd = 0; fd < n && fd < (1u << 20); fd++) close((int)fd);
}

/* The copy's first steps: its copies of the locks taken for it are free (their holder is
 * not in it), it closes the program's fds, it stops writing to the shared segment, and no
 * handler of the program runs in it (a crash reporter must not write for it). */
static void copy_starts(void) {
  _hs_arenas_free_in_copy();
  close_every_fd();
  _hs_segment_after_fork_child();
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; sig++) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, NULL);
  }
}

/* A copy of the process that is no child of the program's: see above. The allocator's
 * locks are held across it for glibc; the others are copied as they stand (a lock a
 * thread held at that moment stays taken in the copy: its release then sleeps, and the
 * parent stops it). Returns the pid, -1 with *why. */
/* 1 when the last copy was made a child of the program's parent (CLONE_PARENT): the
 * heapsight process that started the program, which reaps it. A reaper thread of the
 * program's (waitpid(-1, ..., __WALL)) then never meets it. Otherwise (a program heapsight
 * did not start, or one in a PID namespace of its own) it is the program's clone child
 * with exit signal 0, as before. */
static int g_parented;
static pid_t g_unparented; /* the last copy that is the program's own child, not yet reaped */

static pid_t clone_copy(void) {
  pid_t cli = (pid_t)__atomic_load_n(&_hs_seg->creator_pid, __ATOMIC_RELAXED);
  g_parented = cli > 0 && getppid() == cli;
  pid_t pid = (pid_t)syscall(SYS_clone, g_parented ? (unsigned long)CLONE_PARENT : 0UL, NULL,
                             NULL, NULL, 0UL); /* exit signal 0: no SIGCHLD */
  if (pid < 0 && g_parented) { /* EINVAL for a PID namespace's init */
    g_parented = 0;
    pid = (pid_t)syscall(SYS_clone, 0UL, NULL, NULL, NULL, 0UL);
  }
  return pid;
}

/* The copy closes its copies of the program's fds first thing; until it has run that far,
 * a pipe the program closed stays open for its reader, a lock it released stays held (a
 * copy not yet scheduled, on a busy machine: 0.2 s). So the parent waits for it: a pipe
 * whose only write ends are its own and the copy's reads EOF once the copy closed every fd.
 * Bounded (the copy may be slow to run, or a fork of the program's may hold the write end
 * until it execs); the pipe's two fds live only that long. */
#define HS_COPY_FDS_WAIT_MS 1000

static void wait_fds_closed(int fds[2], pid_t pid) {
  if (fds[1] >= 0) close(fds[1]);
  if (pid > 0 && fds[0] >= 0) {
    struct pollfd p = {fds[0], POLLIN, 0};
    uint64_t until = _hs_now_ns() + HS_COPY_FDS_WAIT_MS * 1000000ull;
    for (;;) {
      uint64_t now = _hs_now_ns();
      if (now >= until) break;
      int n = poll(&p, 1, (int)((until - now) / 1000000ull) + 1);
      if (n >= 0 || errno != EINTR) break;
    }
  }
  if (fds[0] >= 0) close(fds[0]);
}

static pid_t make_copy(const char *path, uint64_t t0, int at_exit, const char **why) {
  int glibc = _hs_seg->allocator_id == HS_ALLOC_GLIBC;
  uint64_t head = 0, deadline = t0 + HS_LOCK_WAIT_NS;
  _hs_arenas_forget();
  int fds[2] = {-1, -1};
  if (pipe2(fds, O_CLOEXEC) != 0) fds[0] = fds[1] = -1;
  if (glibc && (*why = _hs_arenas_lock(&head, deadline)) != NULL) {
    wait_fds_closed(fds, -1);
    return -1;
  }
  pid_t pid = -1;
  for (int tries = 0; tries < 4; tries++) {
    _hs_copy_live_blocks = _hs_live_blocks();
    _hs_copy_mmapped_bytes = _hs_mmapped_chunk_bytes();
    pid = clone_copy();
    if (pid == 0) {
      copy_starts();
      child_main(path, t0, at_exit);
    }
    if (pid < 0 || !glibc) break;
    uint64_t now = _hs_arenas_ring_head();
    if (now == head) break;
    /* an arena was linked in just before the copy, maybe in use in it: lock it, again */
    kill(pid, SIGKILL);
    while (!g_parented && waitpid(pid, NULL, __WALL) < 0 && errno == EINTR) {}
    pid = -1;
    *why = _hs_arenas_lock_ring(now, head, deadline);
    if (*why) { _hs_arenas_unlock(); wait_fds_closed(fds, -1); return -1; }
    head = now;
  }
  _hs_arenas_unlock();
  wait_fds_closed(fds, pid);
  if (pid < 0 && !*why)
    *why = glibc && _hs_arenas_main_known() ? "clone failed, or new arenas kept being made during the copy"
                                 : "clone failed (no memory for a copy?)";
  return pid;
}

/* For a process that is already the copy (copylib.c: made from outside, by `heapsight
 * attach --leaks`, and this library loaded into it alone): the copy's steps, here. */
void _hs_heapmap_in_copy(const char *path) {
  uint64_t t0 = _hs_now_ns();
  /* attach says "measured in a copy of the process": the release is run (the process no
   * longer waits for this copy) */
  _hs_opt.map_release = HS_MAP_RELEASE_RUN;
  copy_starts();
  child_main(path, t0, 0);
}

/* Writes map `path` from a copy of the process taken now, on the calling thread (a thread
 * of the program's: at its exit, or at its next allocator call after the CLI asked, see
 * probe.c). The caller waits for the copy to be made, never for it to be walked: the copy
 * bounds itself (child_main) and the CLI waits for its file. at_exit: the exit's map (its
 * copy is the one the CLI waits for, heapmap_exit_pid; it scans the exiting thread's
 * stack from exit()'s caller). */
int _hs_heapmap_write(const char *path, int at_exit) {
  hs_segment_t *seg = _hs_seg;
  if (!seg || !path) return 0;
  if (seg->allocator_id == HS_ALLOC_UNKNOWN)
    return _hs_heapmap_write_refusal(path, not_mapped_why(HS_ALLOC_UNKNOWN));
  unlink(path); /* a stale file would make the child's O_EXCL fail */
  uint64_t t0 = _hs_now_ns();
  const char *why = NULL;
  __atomic_store_n(&g_forking, 1, __ATOMIC_RELEASE);
  /* a copy that is the program's own child (not the CLI's: a program heapsight did not
   * start, --follow's) is reaped here once it ended, at most one left as a zombie */
  if (g_unparented > 0 && waitpid(g_unparented, NULL, WNOHANG | __WALL) != 0) g_unparented = 0;
  pid_t pid = make_copy(path, t0, at_exit, &why);
  __atomic_store_n(&g_forking, 0, __ATOMIC_RELEASE);
  if (pid < 0) return _hs_heapmap_write_refusal(path, why);
  if (!g_parented) g_unparented = pid;
  __atomic_store_n(&seg->heapmap_copy_pid, (uint64_t)pid, __ATOMIC_RELEASE);
  if (at_exit) __atomic_store_n(&seg->heapmap_exit_pid, (uint64_t)pid, __ATOMIC_RELEASE);
  return 1;
}
