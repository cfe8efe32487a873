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

#include "hs_fd.h"
#include "hs_internal.h"
#include "hs_options.h"

#define HS_MAP_LIMIT_NS (HS_MAP_LIMIT_S * 1000000000ull)
#define HS_MAP_HEAP_MAX (64ull << 20)

/* glibc 2.36, x86-64 (see the top comment) */
#define G_MINSIZE 32u
#define G_CHUNK_STRUCT 48u          /* sizeof(struct malloc_chunk): mtrim keeps these */
#define G_TOP_KEEP 33u              /* systrim keeps MINSIZE + 1 bytes of the top */
#define G_TCACHE_MAX_CHUNK 1040u    /* chunk of tidx2usize(63) = 1032 usable bytes */
#define G_TCACHE_STRUCT_CHUNK 656u  /* request2size(sizeof(tcache_perthread_struct)) */
#define G_MSTATE_BYTES 2200u
#define G_MSTATE_TOP 96u
#define G_MSTATE_NEXT 2160u
#define G_MSTATE_SYSTEM_MEM 2184u


/* ---- the parent's side: state probe.c reads ---- */
static volatile int g_forking;   /* 1 while the copy may wait for the allocator's locks */

int _hs_heapmap_forking(void) { return __atomic_load_n(&g_forking, __ATOMIC_ACQUIRE); }

/* ---- small helpers usable in the child (no malloc, no stdio, no locks) ---- */
/* The copy's own mappings: never roots of the reach (heapsight's memory, not the program's) */
#define HS_OWN_MAX 64
static hs_chunk_t g_own[HS_OWN_MAX];
static size_t g_n_own;
static int g_in_copy;

static void *raw_map(size_t bytes, int populate) {
  void *p = (void *)syscall(SYS_mmap, NULL, bytes, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE |
                                (populate ? MAP_POPULATE : 0), -1, 0);
  if ((long)p < 0 && (long)p > -4096) return NULL;
  if (g_in_copy && g_n_own < HS_OWN_MAX)
    g_own[g_n_own++] = (hs_chunk_t){(uint64_t)(uintptr_t)p, (uint64_t)(uintptr_t)p + bytes};
  return p;
}

static void raw_unmap(void *p, size_t bytes) {
  if (p) syscall(SYS_munmap, p, bytes);
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

/* ---- the child: mappings ---- */
typedef struct map_s {
  uint64_t lo, hi;
  int r, w, anon, heap; /* heap: the [heap] mapping */
  int dev;              /* a device's memory (/dev/..., but shm and zero): never read */
  int shared;           /* MAP_SHARED (a memfd, a shm_open file): its pages are the file's */
} map_t;

typedef struct heap_s {
  uint64_t start, end;          /* the pages mapped here */
  uint64_t info_bytes;          /* thread heap: sizeof(heap_info); 0 for the main heap */
  uint64_t size;                /* thread heap: heap_info.size */
  uint64_t ar;                  /* thread heap: its arena (ar_ptr) */
  int kind, first, ok_layout;
  hs_map_heap_t out;
  uint32_t *live;
  uint8_t *flags;
} heap_t;

typedef struct child_s {
  uint64_t page;
  map_t *maps;
  size_t n_maps;
  heap_t *heaps;
  size_t n_heaps;
  uint64_t *pm_buf;             /* pagemap entries read at a time: HS_PM_ENTRIES */
  uint64_t key;                 /* the tcache key, when found */
  int key_found;
  int finding_key;              /* the first walk: looks for the key only */
  hs_chunk_t *chunks;           /* the in-use blocks, for the reach (NULL: not collected) */
  size_t n_chunks, cap_chunks;
} child_t;

static char *read_file(const char *path, size_t *len, size_t *cap) {
  size_t size = 1 << 20;
  for (int tries = 0; tries < 8; tries++, size *= 4) {
    char *buf = raw_map(size, 0);
    if (!buf) return NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { raw_unmap(buf, size); return NULL; }
    size_t got = 0;
    for (;;) {
      ssize_t n = read(fd, buf + got, size - 1 - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += (size_t)n;
      if (got == size - 1) break;
    }
    close(fd);
    if (got < size - 1) {
      buf[got] = 0;
      *len = got;
      *cap = size;
      return buf;
    }
    raw_unmap(buf, size); /* did not fit: again, larger */
  }
  return NULL;
}

static uint64_t parse_hex(const char **s) {
  uint64_t v = 0;
  for (;; (*s)++) {
    char c = **s;
    if (c >= '0' && c <= '9') v = v * 16 + (uint64_t)(c - '0');
    else if (c >= 'a' && c <= 'f') v = v * 16 + (uint64_t)(c - 'a' + 10);
    else break;
  }
  return v;
}

/* /proc/self/maps into c->maps (a mapping of its own); 0 on failure. */
static int list_maps(child_t *c) {
  size_t len, cap;
  char *text = read_file("/proc/self/maps", &len, &cap);
  if (!text) return 0;
  size_t lines = 0;
  for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
  size_t bytes = (lines + 1) * sizeof(map_t);
  c->maps = raw_map(bytes, 0);
  if (!c->maps) return 0;
  size_t n = 0;
  const char *s = text, *end = text + len;
  while (s < end && n <= lines) {
    const char *eol = memchr(s, '\n', (size_t)(end - s));
    if (!eol) eol = end;
    map_t m;
    memset(&m, 0, sizeof m);
    m.lo = parse_hex(&s);
    if (*s == '-') s++;
    m.hi = parse_hex(&s);
    if (*s == ' ') s++;
    if (eol - s >= 4) {
      m.r = s[0] == 'r';
      m.w = s[1] == 'w';
      int priv = s[3] == 'p';
      /* the path: after the fifth field */
      const char *p = s;
      for (int field = 0; field < 4 && p < eol; field++) {
        while (p < eol && *p != ' ') p++;
        while (p < eol && *p == ' ') p++;
      }
      size_t plen = (size_t)(eol - p);
      m.heap = plen == 6 && memcmp(p, "[heap]", 6) == 0;
      m.dev = plen > 5 && memcmp(p, "/dev/", 5) == 0 &&
              !(plen > 9 && memcmp(p, "/dev/shm/", 9) == 0) &&
              !(plen >= 9 && memcmp(p, "/dev/zero", 9) == 0);
      m.anon = priv && (plen == 0 || (plen > 6 && memcmp(p, "[anon:", 6) == 0));
      m.shared = !priv;
      c->maps[n++] = m;
    }
    s = eol + 1;
  }
  c->n_maps = n;
  /* the text's own mapping stays: it is in the listing, and a listed mapping must stay
   * readable (the child ends soon) */
  (void)cap;
  return 1;
}

/* Whether [lo, hi) lies in readable mappings (contiguous ones may be spanned). */
static int readable(const child_t *c, uint64_t lo, uint64_t hi) {
  if (hi < lo) return 0;
  size_t a = 0, b = c->n_maps;
  while (a < b) { /* first mapping with hi > lo */
    size_t mid = (a + b) / 2;
    if (c->maps[mid].hi <= lo) a = mid + 1;
    else b = mid;
  }
  uint64_t at = lo;
  for (size_t i = a; i < c->n_maps; i++) {
    const map_t *m = &c->maps[i];
    if (m->lo > at || !m->r) return 0;
    if (m->hi >= hi) return 1;
    at = m->hi;
  }
  return 0;
}

static uint64_t rd(uint64_t addr) { return *(const volatile uint64_t *)(uintptr_t)addr; }

/* start_brk, field 47 of /proc/self/stat (after the command's closing parenthesis). */
static uint64_t stat_start_brk(void);

/* Read once: it is set at the image's exec and never moves. The statistics ask for it at
 * every reading, and a descriptor opened on the library's thread each time would show in
 * the program's /proc/self/fd. */
static uint64_t read_start_brk(void) {
  static uint64_t cached;
  uint64_t v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (!v) {
    v = stat_start_brk();
    __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
  }
  return v;
}

static uint64_t stat_start_brk(void) {
  char buf[2048];
  int fd = hs_open("/proc/self/stat", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char *p = NULL;
  for (ssize_t i = n - 1; i >= 0; i--) {
    if (buf[i] == ')') { p = buf + i + 1; break; }
  }
  if (!p) return 0;
  for (int field = 3; field <= 47; field++) { /* fields from 3 (state) on */
    while (*p == ' ') p++;
    if (!*p) return 0;
    if (field == 47) {
      uint64_t v = 0;
      while (*p >= '0' && *p <= '9') v = v * 10 + (uint64_t)(*p++ - '0');
      return v;
    }
    while (*p && *p != ' ') p++;
  }
  return 0;
}

/* A thread heap's heap_info at a 64 MiB-aligned address inside a read-write mapping. */
static int heap_info_ok(const child_t *c, uint64_t h, uint64_t map_hi) {
  if (h + 64 > map_hi) return 0;
  uint64_t ar = rd(h), size = rd(h + 16), mprot = rd(h + 24), pagesize = rd(h + 32);
  if (!ar || (ar & 15) || !mprot || mprot > HS_MAP_HEAP_MAX || (mprot % c->page)) return 0;
  if (size < 64 || size > mprot || (size % c->page) || h + mprot > map_hi) return 0;
  return pagesize == c->page || pagesize == (2u << 20) || pagesize == (1u << 30);
}

/* The heaps to map: [heap], and every 64 MiB-aligned heap_info found in anonymous
 * read-write mappings (adjacent heaps may share one mapping). Thread heaps whose arena is
 * not the first heap of some heap found are dropped (not glibc's). */
static int find_heaps(child_t *c) {
  size_t cap = 16;
  for (size_t i = 0; i < c->n_maps; i++) {
    const map_t *m = &c->maps[i];
    if (m->w && m->anon) cap += (m->hi - m->lo + HS_MAP_HEAP_MAX - 1) / HS_MAP_HEAP_MAX;
  }
  c->heaps = raw_map(cap * sizeof(heap_t), 0);
  if (!c->heaps) return 0;
  size_t n = 0;
  for (size_t i = 0; i < c->n_maps && n < cap; i++) {
    const map_t *m = &c->maps[i];
    if (m->heap && m->r && m->w) {
      heap_t *hp = &c->heaps[n++];
      memset(hp, 0, sizeof *hp);
      hp->start = m->lo;
      hp->end = m->hi;
      hp->kind = 0;
    }
  }
  for (size_t i = 0; i < c->n_maps; i++) {
    const map_t *m = &c->maps[i];
    if (!(m->r && m->w && m->anon)) continue;
    uint64_t h = (m->lo + HS_MAP_HEAP_MAX - 1) & ~(HS_MAP_HEAP_MAX - 1);
    for (; h < m->hi && n < cap; h += HS_MAP_HEAP_MAX) {
      if (!heap_info_ok(c, h, m->hi)) continue;
      heap_t *hp = &c->heaps[n++];
      memset(hp, 0, sizeof *hp);
      hp->start = h;
      hp->end = h + rd(h + 24);
      hp->size = rd(h + 16);
      hp->ar = rd(h);
      hp->kind = 1;
      hp->first = hp->ar > h && hp->ar - h <= 128 && hp->ar + G_MSTATE_BYTES <= hp->start + hp->size;
      if (hp->first) hp->info_bytes = hp->ar - h;
    }
  }
  /* keep thread heaps whose arena heads a heap found; take heap_info's size from it */
  size_t kept = 0;
  for (size_t i = 0; i < n; i++) {
    heap_t *hp = &c->heaps[i];
    if (hp->kind == 1 && !hp->first) {
      for (size_t j = 0; j < n; j++) {
        if (c->heaps[j].first && c->heaps[j].ar == hp->ar) { hp->info_bytes = c->heaps[j].info_bytes; break; }
      }
      if (!hp->info_bytes) continue;
    }
    c->heaps[kept++] = *hp;
  }
  c->n_heaps = kept;
  return 1;
}

/* Arena numbers as malloc_info gives them (main 0, then main_arena.next and on), and the
 * layout check (system_mem = the sum of the arena's heap sizes). main_arena itself is found
 * from a thread arena's next chain: the one arena not inside a heap. */
static int is_arena(const child_t *c, uint64_t a) {
  for (size_t j = 0; j < c->n_heaps; j++) {
    if (c->heaps[j].first && c->heaps[j].ar == a) return 1;
  }
  return 0;
}

static uint64_t number_arenas(child_t *c) {
  /* main_arena: on a thread arena's chain, outside every heap, its top inside [heap] */
  uint64_t main_arena = 0, heap_lo = 0, heap_hi = 0;
  for (size_t i = 0; i < c->n_heaps; i++) {
    if (c->heaps[i].kind == 0) { heap_lo = c->heaps[i].start; heap_hi = c->heaps[i].end; }
  }
  for (size_t i = 0; i < c->n_heaps && !main_arena; i++) {
    heap_t *hp = &c->heaps[i];
    if (!hp->first) continue;
    uint64_t a = hp->ar;
    for (int steps = 0; steps < 4096; steps++) {
      if (!readable(c, a + G_MSTATE_NEXT, a + G_MSTATE_NEXT + 8)) break;
      a = rd(a + G_MSTATE_NEXT);
      if (!a || (a & 7) || a == hp->ar) break;
      if (is_arena(c, a) || !readable(c, a, a + G_MSTATE_BYTES)) continue;
      uint64_t top = rd(a + G_MSTATE_TOP);
      if (top >= heap_lo && top < heap_hi) { main_arena = a; break; }
    }
  }
  uint64_t next_nr = 1;
  if (main_arena) {
    uint64_t a = main_arena;
    for (int steps = 0; steps < 4096; steps++) {
      a = rd(a + G_MSTATE_NEXT);
      if (a == main_arena || !a || (a & 7)) break;
      int found = 0;
      for (size_t j = 0; j < c->n_heaps; j++) {
        if (c->heaps[j].kind == 1 && c->heaps[j].ar == a) { c->heaps[j].out.arena = next_nr; found = 1; }
      }
      if (!found || !readable(c, a + G_MSTATE_NEXT, a + G_MSTATE_NEXT + 8)) break;
      next_nr++;
    }
  }
  for (size_t i = 0; i < c->n_heaps; i++) { /* arenas off the chain: numbered after */
    heap_t *hp = &c->heaps[i];
    if (hp->kind != 1 || hp->out.arena) continue;
    for (size_t j = i; j < c->n_heaps; j++) {
      if (c->heaps[j].kind == 1 && c->heaps[j].ar == hp->ar) c->heaps[j].out.arena = next_nr;
    }
    next_nr++;
  }
  for (size_t i = 0; i < c->n_heaps; i++) {
    heap_t *hp = &c->heaps[i];
    if (hp->kind != 1) continue;
    uint64_t sum = 0;
    for (size_t j = 0; j < c->n_heaps; j++) {
      if (c->heaps[j].kind == 1 && c->heaps[j].ar == hp->ar) sum += c->heaps[j].size;
    }
    uint64_t first_hi = 0;
    for (size_t j = 0; j < c->n_heaps; j++) {
      if (c->heaps[j].first && c->heaps[j].ar == hp->ar) first_hi = c->heaps[j].start + c->heaps[j].size;
    }
    hp->ok_layout = first_hi && hp->ar + G_MSTATE_BYTES <= first_hi &&
                    readable(c, hp->ar, hp->ar + G_MSTATE_BYTES) &&
                    rd(hp->ar + G_MSTATE_SYSTEM_MEM) == sum;
  }
  return main_arena;
}

/* ---- the child: pages ---- */
static uint64_t page_of(const heap_t *hp, uint64_t addr, uint64_t page) { return (addr - hp->start) / page; }

static void add_live(heap_t *hp, uint64_t lo, uint64_t hi, uint64_t page) {
  if (lo < hp->start) lo = hp->start;
  if (hi > hp->end) hi = hp->end;
  if (hi <= lo) return;
  hp->out.live_bytes += hi - lo;
  for (uint64_t pg = page_of(hp, lo, page); lo < hi; pg++) {
    uint64_t pend = hp->start + (pg + 1) * page, upto = hi < pend ? hi : pend;
    hp->live[pg] += (uint32_t)(upto - lo);
    lo = upto;
  }
}

static void set_flag(heap_t *hp, uint64_t lo, uint64_t hi, uint8_t f, uint64_t page) {
  if (lo < hp->start) lo = hp->start;
  if (hi > hp->end) hi = hp->end;
  if (hi <= lo) return;
  for (uint64_t pg = page_of(hp, lo, page), last = page_of(hp, hi - 1, page); pg <= last; pg++)
    hp->flags[pg] |= f;
}

/* Pages of every heap present in memory now: flag f. Returns how many. */
#define HS_PM_ENTRIES 8192
static uint64_t read_presence(child_t *c, uint8_t f) {
  uint64_t *buf = c->pm_buf;
  int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  uint64_t present = 0;
  for (size_t i = 0; i < c->n_heaps; i++) {
    heap_t *hp = &c->heaps[i];
    uint64_t pages = hp->out.pages;
    for (uint64_t at = 0; at < pages;) {
      uint64_t n = pages - at < HS_PM_ENTRIES ? pages - at : HS_PM_ENTRIES;
      ssize_t got = pread(fd, buf, n * 8, (off_t)((hp->start / c->page + at) * 8));
      if (got <= 0) break;
      n = (uint64_t)got / 8;
      for (uint64_t k = 0; k < n; k++) {
        if (buf[k] >> 63) { hp->flags[at + k] |= f; present++; }
      }
      at += n;
    }
  }
  close(fd);
  return present;
}

/* ---- the child: the chunk walk ---- */

/* The tcache key from a thread's tcache_perthread_struct (u16 counts[64], then 64 entry
 * pointers to user data): every entry's chunk has its bin's size and the key in its
 * second word. An in-use chunk of the struct's size that is not one is left alone. */
static void try_key(child_t *c, uint64_t u) {
  uint64_t key = 0;
  int n = 0;
  for (uint64_t i = 0; i < 64; i++) {
    uint64_t e = rd(u + 128 + 8 * i);
    uint16_t count = *(const volatile uint16_t *)(uintptr_t)(u + 2 * i);
    if (!e) continue;
    if (!count || (e & 15) || !readable(c, e - 16, e + 16)) return;
    if ((rd(e - 8) & ~(uint64_t)7) != 32 + 16 * i) return;
    uint64_t k = rd(e + 8);
    if (!k || (n && k != key)) return;
    key = k;
    n++;
  }
  if (n) {
    c->key = key;
    c->key_found = 1;
  }
}

/* Whether the user data at u is a tcache_perthread_struct: every one of the 64 bins'
 * counts matches its list (empty iff 0; each entry a chunk of the bin's size carrying the
 * key, when it is known). An all-zero block of that size is taken for one. */
static int is_tcache(const child_t *c, uint64_t u) {
  for (uint64_t i = 0; i < 64; i++) {
    uint64_t e = rd(u + 128 + 8 * i);
    uint16_t count = *(const volatile uint16_t *)(uintptr_t)(u + 2 * i);
    if (!e != !count) return 0;
    if (!e) continue;
    if ((e & 15) || !readable(c, e - 16, e + 16)) return 0;
    if ((rd(e - 8) & ~(uint64_t)7) != 32 + 16 * i) return 0;
    if (c->key_found && rd(e + 8) != c->key) return 0;
  }
  return 1;
}

static void classify(child_t *c, heap_t *hp, uint64_t ch, uint64_t sz, int inuse) {
  uint64_t page = c->page;
  if (c->finding_key) {
    if (inuse && sz == G_TCACHE_STRUCT_CHUNK && !c->key_found) try_key(c, ch + 16);
    return;
  }
  if (sz < G_MINSIZE) { /* a fencepost */
    set_flag(hp, ch + 8, ch + sz, HS_PAGE_ALLOC, page);
    return;
  }
  if (inuse) {
    int cached = 0;
    if (c->key_found && sz <= G_TCACHE_MAX_CHUNK && rd(ch + 24) == c->key) cached = 1;
    if (cached) {
      set_flag(hp, ch + 8, ch + sz, HS_PAGE_TCACHE, page);
      hp->out.tcache_chunks++;
      return;
    }
    set_flag(hp, ch + 8, ch + 16, HS_PAGE_ALLOC, page);
    add_live(hp, ch + 16, ch + sz + 8, page);
    hp->out.inuse_chunks++;
    /* a block of the program's (a thread's tcache_perthread_struct is glibc's own) */
    if (c->chunks && c->n_chunks < c->cap_chunks && !(sz == G_TCACHE_STRUCT_CHUNK && is_tcache(c, ch + 16)))
      c->chunks[c->n_chunks++] = (hs_chunk_t){ch + 16, ch + sz + 8};
  } else {
    set_flag(hp, ch + 8, ch + (sz < G_CHUNK_STRUCT ? sz : G_CHUNK_STRUCT), HS_PAGE_ALLOC, page);
    hp->out.free_chunks++;
  }
}

/* Walks [c0, cend): 1 when every chunk was read and the walk ended exactly at the end (on
 * the top chunk, which must be `top` when that is known, or on the fenceposts). */
static int walk(child_t *c, heap_t *hp, uint64_t c0, uint64_t cend, uint64_t top, int main_heap) {
  uint64_t page = c->page;
  if ((c0 & 15) || c0 >= cend || !readable(c, c0, cend)) return 0;
  if (c->finding_key) top = 0;
  else set_flag(hp, hp->start, c0, HS_PAGE_ALLOC, page);   /* heap_info, malloc_state */
  uint64_t ch = c0;
  while (ch < cend) {
    if (ch + 16 > cend) return 0;
    uint64_t word = rd(ch + 8), sz = word & ~(uint64_t)7;
    if (sz == 0) { /* the fenceposts that close a thread heap that is not the current one */
      if (main_heap || word != 1 || cend - ch > 2 * G_MINSIZE) return 0;
      if (!c->finding_key) set_flag(hp, ch, cend, HS_PAGE_ALLOC, page);
      return 1;
    }
    if ((sz & 15) || (word & 2) || sz > cend - ch) return 0;
    uint64_t next = ch + sz;
    if (next == cend) { /* the top chunk */
      if (c->finding_key) return 1;
      if (top && ch != top) return 0;
      hp->out.top_bytes += sz;
      set_flag(hp, ch, next, HS_PAGE_TOP, page);
      set_flag(hp, ch + 8, ch + G_TOP_KEEP, HS_PAGE_ALLOC, page);
      return 1;
    }
    if (next + 16 > cend) return 0;
    classify(c, hp, ch, sz, (int)(rd(next + 8) & 1));
    ch = next;
  }
  return 0;
}

static void walk_heaps(child_t *c, uint64_t main_arena) {
  for (size_t i = 0; i < c->n_heaps && !(c->finding_key && c->key_found); i++) {
    heap_t *hp = &c->heaps[i];
    int ok = 0;
    if (hp->kind == 0) {
      /* from start_brk (an unaligned one starts in the page before [heap], the end of the
       * executable's bss) to the break now (the release may have lowered it) */
      uint64_t start_brk = read_start_brk(), brk = (uint64_t)syscall(SYS_brk, 0);
      uint64_t c0 = (start_brk + 15) & ~(uint64_t)15;
      uint64_t top = main_arena ? rd(main_arena + G_MSTATE_TOP) : 0;
      if (start_brk && c0 + c->page >= hp->start && c0 < hp->end)
        ok = walk(c, hp, c0, brk, top, 1);
      if (c->finding_key) continue;
    } else if (hp->ok_layout && readable(c, hp->start, hp->start + 64)) {
      uint64_t c0 = hp->first ? (hp->ar + G_MSTATE_BYTES + 15) & ~(uint64_t)15
                              : hp->start + hp->info_bytes;
      uint64_t top = rd(hp->ar + G_MSTATE_TOP), end = hp->start + hp->size;
      ok = walk(c, hp, c0, end, top >= hp->start && top < end ? top : 0, 0);
      /* the top chunk ends only the heap that holds it */
      if (ok && hp->out.top_bytes && !(top >= hp->start && top < end)) ok = 0;
    }
    if (c->finding_key) continue;
    hp->out.walked = (uint64_t)ok;
    if (!ok) { /* nothing half-read is kept */
      hp->out.top_bytes = hp->out.live_bytes = 0;
      hp->out.inuse_chunks = hp->out.free_chunks = hp->out.tcache_chunks = 0;
      memset(hp->live, 0, hp->out.pages * sizeof *hp->live);
      for (uint64_t k = 0; k < hp->out.pages; k++) hp->flags[k] &= HS_PAGE_BEFORE | HS_PAGE_AFTER;
    }
  }
}

static const char *not_mapped_why(uint64_t id) {
  switch (id) {
  case HS_ALLOC_JEMALLOC:
    return "jemalloc's extents and slabs are not walked; the release figure is "
           "arena.<all>.purge run in a copy of the process";
  case HS_ALLOC_TCMALLOC:
    return "tcmalloc's spans are not walked; the release figure is ReleaseFreeMemory run "
           "in a copy of the process";
  case HS_ALLOC_MIMALLOC:
    return "mimalloc's pages are not walked; its release (mi_collect) acts on the calling "
           "thread's heap, in the copy heapsight's own: the figure is a lower bound";
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

/* ---- the child: what the program can still reach (reach.c marks) ---- */
extern const ElfW(Ehdr) __ehdr_start __attribute__((visibility("hidden"))); /* this library's */

static sigjmp_buf g_fault;
static void on_fault(int sig) {
  (void)sig;
  siglongjmp(g_fault, 1);
}

/* One root range; 0 when reading it faulted (a file mapping past its file's end). */
static int scan_root(hs_reach_t *r, uint64_t lo, uint64_t hi) {
  if (sigsetjmp(g_fault, 1)) return 0;
  _hs_reach_root(r, lo, hi);
  return 1;
}

/* A root range, its resident (or swapped) pages only: a page never touched holds zeros
 * (anonymous) or the file's bytes, no pointer of this run's; a large reservation costs
 * nothing. Returns the bytes that faulted. */
#define HS_REACH_LIMIT_NS 20000000000ull
static int pm = -1;
static uint64_t scan_resident(child_t *c, hs_reach_t *r, uint64_t lo, uint64_t hi) {
  uint64_t faulted = 0;
  if (pm < 0) pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (pm < 0) return scan_root(r, lo, hi) ? 0 : hi - lo;
  uint64_t page = c->page, run_lo = 0;
  int in_run = 0;
  for (uint64_t pg = lo & ~(page - 1); pg < hi;) {
    uint64_t n = (hi - pg + page - 1) / page;
    if (n > HS_PM_ENTRIES) n = HS_PM_ENTRIES;
    ssize_t got = pread(pm, c->pm_buf, n * 8, (off_t)(pg / page * 8));
    if (got <= 0) return faulted + (scan_root(r, pg > lo ? pg : lo, hi) ? 0 : hi - pg);
    n = (uint64_t)got / 8;
    for (uint64_t k = 0; k < n; k++, pg += page) {
      int here = (c->pm_buf[k] >> 62) != 0; /* present (63) or swapped (62) */
      if (here && !in_run) { run_lo = pg > lo ? pg : lo; in_run = 1; }
      if (!here && in_run) {
        if (!scan_root(r, run_lo, pg)) faulted += pg - run_lo;
        in_run = 0;
      }
    }
  }
  if (in_run && !scan_root(r, run_lo, hi)) faulted += hi - run_lo;
  return faulted;
}

/* A shared mapping's resident pages, as roots. A copy's page tables have none of a shared
 * mapping's pages (the kernel fills them on first touch), so its pagemap says nothing of
 * them; mincore() says which are in the file's memory. Only those are read: touching a
 * page the file does not have would make one, in the program's own file. */
static uint64_t scan_shared(child_t *c, hs_reach_t *r, uint64_t lo, uint64_t hi) {
  uint64_t page = c->page, skipped = 0, run_lo = 0;
  unsigned char *vec = (unsigned char *)c->pm_buf;
  int in_run = 0;
  for (uint64_t pg = lo & ~(page - 1); pg < hi;) {
    uint64_t n = (hi - pg + page - 1) / page;
    if (n > HS_PM_ENTRIES * 8) n = HS_PM_ENTRIES * 8;
    if (mincore((void *)(uintptr_t)pg, n * page, vec) != 0) return skipped + (hi - pg);
    for (uint64_t k = 0; k < n; k++, pg += page) {
      int here = vec[k] & 1;
      if (here && !in_run) { run_lo = pg > lo ? pg : lo; in_run = 1; }
      if (!here && in_run) {
        if (!scan_root(r, run_lo, pg)) skipped += pg - run_lo;
        in_run = 0;
      }
    }
  }
  if (in_run && !scan_root(r, run_lo, hi)) skipped += hi - run_lo;
  return skipped;
}

static uint64_t scan_mapping(child_t *c, const map_t *m, hs_reach_t *r, uint64_t lo, uint64_t hi) {
  return m->shared ? scan_shared(c, r, lo, hi) : scan_resident(c, r, lo, hi);
}

static const map_t *map_at(const child_t *c, uint64_t addr) {
  for (size_t i = 0; i < c->n_maps; i++) {
    if (addr >= c->maps[i].lo && addr < c->maps[i].hi) return &c->maps[i];
  }
  return NULL;
}

static int in_heaps(const child_t *c, uint64_t lo, uint64_t hi) {
  for (size_t i = 0; i < c->n_heaps; i++) {
    if (lo < c->heaps[i].end && hi > c->heaps[i].start) return 1;
  }
  return 0;
}

typedef struct excl_s { hs_chunk_t *r; size_t n, cap; } excl_t;
static void exclude(excl_t *e, uint64_t lo, uint64_t hi) {
  if (hi > lo && e->n < e->cap) e->r[e->n++] = (hs_chunk_t){lo, hi};
}

/* glibc's mmapped chunks at the start of an anonymous mapping outside the heaps: prev_size
 * 0, a size of whole pages with IS_MMAPPED alone, inside the mapping; one after the other
 * when the kernel merged their mappings. Appended to the blocks and excluded from the roots. */
static uint64_t mmapped_chunks(child_t *c, const map_t *m, excl_t *ex) {
  uint64_t a = m->lo, found = 0;
  while (a + 4096 <= m->hi && c->n_chunks < c->cap_chunks) {
    uint64_t word = rd(a + 8), sz = word & ~(uint64_t)7;
    if (rd(a) != 0 || (word & 7) != 2 || sz < c->page || sz % c->page || sz > m->hi - a) break;
    c->chunks[c->n_chunks++] = (hs_chunk_t){a + 16, a + sz};
    exclude(ex, a, a + sz);
    found += sz;
    a += sz;
  }
  return found;
}

/* Whether a lies in one of the mmapped chunks found so far (c->chunks[from..]: a few). */
static int in_chunks(const child_t *c, size_t from, uint64_t a) {
  for (size_t i = from; i < c->n_chunks; i++)
    if (a >= c->chunks[i].lo - 16 && a < c->chunks[i].hi) return 1;
  return 0;
}

/* The mmapped chunks that do not start their mapping: the kernel merges a chunk's mapping
 * with an adjacent one of the same flags (the program's own mmap, say), so a chunk may sit
 * anywhere in it, page-aligned. Any page may look like a chunk's header by chance, so the
 * pages that do are taken only when, with the chunks found at mappings' starts
 * (c->chunks[from..]), they add up to the mmapped bytes the hooks counted live, to the
 * byte; otherwise none is, and the bytes not found are said (rec->mmapped_missing_bytes).
 * Only resident pages are read (mincore): glibc wrote each chunk's header, and a large
 * reservation of the program's is not faulted in, page by page, in the copy. */
static uint64_t mmapped_chunks_inside(child_t *c, excl_t *ex, size_t from, uint64_t missing) {
  size_t first = c->n_chunks;
  uint64_t got = 0, page = c->page, batch = HS_PM_ENTRIES * 8;
  unsigned char *vec = (unsigned char *)c->pm_buf;
  for (size_t i = 0; i < c->n_maps && got < missing; i++) {
    const map_t *m = &c->maps[i];
    if (!(m->r && m->w && m->anon) || in_heaps(c, m->lo, m->hi)) continue;
    uint64_t vec_lo = 0, vec_n = 0;
    for (uint64_t a = m->lo; a + page <= m->hi && got < missing; a += page) {
      if (a >= vec_lo + vec_n * page) { /* the next batch's residency */
        vec_lo = a;
        vec_n = (m->hi - a) / page < batch ? (m->hi - a) / page : batch;
        if (mincore((void *)(uintptr_t)a, vec_n * page, vec) != 0) break;
      }
      if (!(vec[(a - vec_lo) / page] & 1) || in_chunks(c, from, a)) continue;
      uint64_t word = rd(a + 8), sz = word & ~(uint64_t)7;
      if (rd(a) != 0 || (word & 7) != 2 || sz < c->page || sz % c->page || sz > m->hi - a) continue;
      if (c->n_chunks == c->cap_chunks) break;
      c->chunks[c->n_chunks++] = (hs_chunk_t){a + 16, a + sz};
      got += sz;
      a += sz - c->page;
    }
  }
  if (got != missing) { /* not the chunks the hooks counted: take none */
    c->n_chunks = first;
    return 0;
  }
  for (size_t i = first; i < c->n_chunks; i++) exclude(ex, c->chunks[i].lo - 16, c->chunks[i].hi);
  return got;
}

/* Marks the blocks from the roots: every readable, writable mapping but the heaps, the
 * mmapped chunks, heapsight's own memory (the segment, the library's data, its thread's
 * stack and TLS, the copy's buffers) and, at exit, the exiting thread's stack below its
 * stack pointer (dead frames). Fills rec, and *list with the blocks not reachable. */
static void reach_why(hs_map_reach_t *rec, const char *why) {
  rec->status = 1; /* not marked */
  size_t n = strnlen(why, sizeof rec->why - 1);
  memcpy(rec->why, why, n);
  rec->why[n] = 0;
}

static void reach(child_t *c, int at_exit, hs_map_reach_t *rec, hs_map_block_t **list) {
  uint64_t r0 = _hs_now_ns();
  rec->status = 1;
  for (size_t i = 0; i < c->n_heaps; i++) {
    if (!c->heaps[i].out.walked) {
      reach_why(rec, "a heap was not walked: its blocks are not known");
      return;
    }
  }
  if (!c->chunks) {
    reach_why(rec, "no room in the copy for the list of blocks");
    return;
  }
  int glibc = !_hs_blockmap_on; /* else the blocks came from the hooks' record (blockmap.c) */
  size_t n_excl = c->n_heaps + g_n_own + 16 + (glibc ? 0 : HS_ALLOC_RANGES_MAX + 64);
  for (size_t i = 0; glibc && i < c->n_maps; i++) n_excl += c->maps[i].anon && c->maps[i].w ? 64 : 0;
  excl_t ex = {raw_map(n_excl * sizeof(hs_chunk_t), 0), 0, n_excl};
  if (!ex.r) {
    reach_why(rec, "no room in the copy for its lists");
    return;
  }
  if (glibc) {
    uint64_t mmapped = 0, counted = _hs_mmapped_chunk_bytes();
    size_t first_mmapped = c->n_chunks; /* the heaps' blocks come before */
    for (size_t i = 0; i < c->n_maps; i++) {
      const map_t *m = &c->maps[i];
      if (m->r && m->w && m->anon && !in_heaps(c, m->lo, m->hi)) mmapped += mmapped_chunks(c, m, &ex);
    }
    if (mmapped < counted) mmapped += mmapped_chunks_inside(c, &ex, first_mmapped, counted - mmapped);
    rec->mmapped_missing_bytes = counted > mmapped ? counted - mmapped : 0;
  } else {
    /* the allocator's own mappings (its heaps, its bookkeeping, which points at the
     * blocks) are no root; nor is the hooks' record of the blocks */
    long k = _hs_blockmap_ranges(ex.r, HS_ALLOC_RANGES_MAX);
    if (k < 0) {
      reach_why(rec, "the allocator made more mappings than heapsight keeps a list of");
      return;
    }
    ex.n = (size_t)k;
    ex.n += _hs_blockmap_own(ex.r + ex.n, 64);
  }
  size_t n = c->n_chunks;
  _hs_reach_sort(c->chunks, n);
  for (size_t i = 1; i < n; i++) {
    if (c->chunks[i].lo < c->chunks[i - 1].hi) {
      reach_why(rec, "two blocks overlap: the heap's layout was not understood");
      return;
    }
  }
  uint8_t *state = raw_map(n + 1, 0);
  uint32_t *stack = raw_map((2 * n + 1) * sizeof(uint32_t), 0);
  if (!state || !stack) {
    reach_why(rec, "no room in the copy for the marks");
    return;
  }
  /* heapsight's own memory, and what is not a root */
  for (size_t i = 0; i < c->n_heaps; i++) exclude(&ex, c->heaps[i].start, c->heaps[i].end);
  for (size_t i = 0; i < g_n_own; i++) exclude(&ex, g_own[i].lo, g_own[i].hi);
  hs_chunk_t tables[4];
  for (size_t i = 0, k = _hs_profile_own(tables, 4); i < k; i++) exclude(&ex, tables[i].lo, tables[i].hi);
  if (_hs_seg) {
    uint64_t seg = (uint64_t)(uintptr_t)_hs_seg;
    exclude(&ex, seg, seg + ((_hs_seg->size_bytes + c->page - 1) & ~(c->page - 1)));
  }
  const ElfW(Ehdr) *eh = &__ehdr_start;
  const ElfW(Phdr) *ph = (const ElfW(Phdr) *)((const char *)eh + eh->e_phoff);
  for (int i = 0; i < eh->e_phnum; i++) {
    if (ph[i].p_type != PT_LOAD || !(ph[i].p_flags & PF_W)) continue;
    uint64_t lo = (uint64_t)(uintptr_t)eh + ph[i].p_vaddr;
    exclude(&ex, lo & ~(c->page - 1), (lo + ph[i].p_memsz + c->page - 1) & ~(c->page - 1));
  }
  uint64_t sp = (uint64_t)(uintptr_t)__builtin_frame_address(0);
  const map_t *own_stack = map_at(c, sp);
  if (own_stack && _hs_helper_running()) {
    /* made on the helper: its stack, its TLS and its descriptor, at the mapping's top */
    uint64_t top = _hs_helper_self ? (_hs_helper_self + 0x900 + c->page - 1) & ~(c->page - 1) : 0;
    exclude(&ex, own_stack->lo, top > sp && top < own_stack->hi ? top : own_stack->hi);
  } else if (own_stack) {
    /* made on a thread of the program (at its exit, or in its heapsight_snapshot() call):
     * its stack is a root from here up; below are the copy's own frames */
    exclude(&ex, own_stack->lo, sp & ~(uint64_t)7);
  }
  uint64_t exit_sp = at_exit ? __atomic_load_n(&_hs_exit_sp, __ATOMIC_ACQUIRE) : 0;
  const map_t *exit_stack = exit_sp ? map_at(c, exit_sp) : NULL;
  if (exit_stack) exclude(&ex, exit_stack->lo, exit_sp & ~(uint64_t)7);
  _hs_reach_sort(ex.r, ex.n);

  hs_reach_t r;
  _hs_reach_init(&r, c->chunks, n, state, stack);
  r.glibc_chunks = glibc;
  r.deadline_ns = r0 + HS_REACH_LIMIT_NS;
  /* heapsight's own blocks (what its start-up's dlopen of the unwinder left in the heap:
   * the loader's records, reachable from the loader's data) first: out of every class,
   * with what only they reach */
  uint64_t own_blocks[64];
  for (size_t i = 0, k = _hs_own_blocks(own_blocks, 64); i < k; i++) _hs_reach_own(&r, own_blocks[i]);
  struct sigaction sa, old_segv, old_bus;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fault;
  sa.sa_flags = SA_NODEFER;
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
  uint64_t skipped = 0;
  for (size_t i = 0; i < c->n_maps; i++) {
    const map_t *m = &c->maps[i];
    if (!m->r || !m->w || m->dev) continue;
    uint64_t at = m->lo;
    for (size_t k = 0; k < ex.n && at < m->hi; k++) {
      if (ex.r[k].hi <= at) continue;
      if (ex.r[k].lo >= m->hi) break;
      if (ex.r[k].lo > at) skipped += scan_mapping(c, m, &r, at, ex.r[k].lo);
      at = ex.r[k].hi;
    }
    if (at < m->hi) skipped += scan_mapping(c, m, &r, at, m->hi);
  }
  sigaction(SIGSEGV, &old_segv, NULL);
  sigaction(SIGBUS, &old_bus, NULL);
  if (pm >= 0) close(pm);
  pm = -1;
  /* heapsight's thread's DTV (glibc's, for it): its TCB's second word points inside it */
  if (_hs_helper_self) _hs_reach_own(&r, rd(_hs_helper_self + 8));
  _hs_reach_finish(&r);
  if (r.late) {
    reach_why(rec, "the marking took longer than 20 s and was given up");
    rec->reach_ns = _hs_now_ns() - r0;
    return;
  }
  rec->status = 0;
  rec->root_bytes = r.root_bytes - skipped;
  rec->n_blocks = n;
  memcpy(rec->bytes, r.bytes, sizeof rec->bytes);
  memcpy(rec->blocks, r.blocks, sizeof rec->blocks);
  uint64_t unreached = r.blocks[HS_REACH_LOST] + r.blocks[HS_REACH_POSSIBLE] +
                       r.blocks[HS_REACH_INDIRECT];
  uint64_t listed = unreached < HS_REACH_LISTED ? unreached : HS_REACH_LISTED;
  *list = listed ? raw_map(listed * sizeof(hs_map_block_t), 0) : NULL;
  if (listed && !*list) listed = 0;
  size_t k = 0;
  for (size_t i = 0; i < n && k < listed; i++) {
    if (state[i] == HS_REACH_REACHABLE || state[i] == HS_REACH_OWN) continue;
    (*list)[k++] = (hs_map_block_t){c->chunks[i].lo, c->chunks[i].hi - c->chunks[i].lo, state[i]};
  }
  rec->n_listed = k;
  rec->n_unlisted = unreached - k;
  rec->reach_ns = _hs_now_ns() - r0;
}

/* Under another allocator than glibc: the live blocks from the hooks' record of where
 * each starts (blockmap.c), their sizes the allocator's own; none when the record is not
 * whole (rec says why). Room for the blocks counted live, and some. */
static void other_blocks(child_t *c, hs_map_reach_t *rec) {
  if (_hs_blockmap_incomplete()) {
    reach_why(rec, "the record of the blocks is not whole (a bitmap could not be made: an "
                   "address-space limit, ulimit -v, leaves none to reserve)");
    return;
  }
  uint64_t live = _hs_live_blocks(), cap = 1024 + live + live / 8;
  c->chunks = raw_map(cap * sizeof(hs_chunk_t), 0);
  if (!c->chunks) {
    reach_why(rec, "no room in the copy for the list of blocks");
    return;
  }
  size_t n = _hs_blockmap_blocks(c->chunks, cap);
  if (n > cap) {
    c->chunks = NULL;
    reach_why(rec, "more blocks were recorded than counted live");
    return;
  }
  c->n_chunks = n;
  c->cap_chunks = cap;
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
  if (!list_maps(&c)) _exit(3);
  if (glibc && !find_heaps(&c)) _exit(3); /* the others: the release figure only */
  uint64_t pages = 0;
  for (size_t i = 0; i < c.n_heaps; i++) {
    c.heaps[i].out.start = c.heaps[i].start;
    c.heaps[i].out.kind = (uint64_t)c.heaps[i].kind;
    c.heaps[i].out.pages = (c.heaps[i].end - c.heaps[i].start) / c.page;
    pages += c.heaps[i].out.pages;
  }
  /* the per-page arrays and the pagemap buffer, in memory before RSS is read: they are
   * not in the difference */
  size_t arr_bytes = ((size_t)pages * 5 + 64 + 7) & ~(size_t)7;
  char *arr = raw_map(arr_bytes + HS_PM_ENTRIES * 8, 1);
  if (!arr) _exit(4);
  c.pm_buf = (uint64_t *)(arr + arr_bytes);
  for (size_t i = 0, at = 0; i < c.n_heaps; i++) {
    c.heaps[i].live = (uint32_t *)(arr + at * 4);
    at += c.heaps[i].out.pages;
  }
  for (size_t i = 0, at = 0; i < c.n_heaps; i++) {
    c.heaps[i].flags = (uint8_t *)(arr + pages * 4 + at);
    at += c.heaps[i].out.pages;
  }

  _hs_read_status(&h.rss_before, &h.anon_before);
  uint64_t before = read_presence(&c, HS_PAGE_BEFORE);
  uint64_t r0 = _hs_now_ns();
  g_releasing = 1;
  _hs_allocator_release();
  g_releasing = 0;
  h.release_ns = _hs_now_ns() - r0;
  _hs_read_status(&h.rss_after, &h.anon_after);
  uint64_t after = read_presence(&c, HS_PAGE_AFTER);
  uint64_t dropped = 0;
  for (size_t i = 0; i < c.n_heaps; i++) {
    for (uint64_t k = 0; k < c.heaps[i].out.pages; k++)
      dropped += (c.heaps[i].flags[k] & (HS_PAGE_BEFORE | HS_PAGE_AFTER)) == HS_PAGE_BEFORE;
  }
  h.released_pages = dropped;
  (void)before;
  (void)after;

  if (glibc) {
    uint64_t w0 = _hs_now_ns();
    /* the release may have shrunk [heap]: only what is mapped now is read (the first
     * listing's memory is left: the child ends soon) */
    if (!list_maps(&c)) _exit(5);
    uint64_t main_arena = number_arenas(&c);
    c.finding_key = 1; /* no tcache key in any tcache struct: no block is in a tcache */
    walk_heaps(&c, main_arena);
    c.finding_key = 0;
    h.tcache_key_found = (uint64_t)c.key_found;
    if (_hs_opt.reach) { /* room for every block: reserved, backed only where written */
      uint64_t cap = 16;
      for (size_t i = 0; i < c.n_heaps; i++) cap += (c.heaps[i].end - c.heaps[i].start) / G_MINSIZE;
      for (size_t i = 0; i < c.n_maps; i++)
        if (c.maps[i].anon && c.maps[i].w) cap += (c.maps[i].hi - c.maps[i].lo) / c.page;
      c.chunks = raw_map(cap * sizeof(hs_chunk_t), 0);
      c.cap_chunks = c.chunks ? cap : 0;
    }
    walk_heaps(&c, main_arena);
    h.walk_ns = _hs_now_ns() - w0;
    if (_hs_opt.reach) {
      reach(&c, at_exit, &rec, &blocks);
      h.reach_bytes = sizeof rec + rec.n_listed * sizeof(hs_map_block_t);
    }
    if (c.n_heaps == 0) {
      h.status = 1;
      set_why(&h, "no glibc heap found ([heap] or a thread arena's heap)");
    } else {
      size_t unwalked = 0;
      for (size_t i = 0; i < c.n_heaps; i++) unwalked += !c.heaps[i].out.walked;
      if (unwalked) set_why(&h, "some heaps were not walked (their chunk headers did not "
                                "form a valid chain, or the arena layout was not glibc 2.36's)");
    }
  } else {
    h.status = 1;
    set_why(&h, not_mapped_why(h.allocator));
    if (_hs_opt.reach && _hs_blockmap_on) {
      /* the blocks from the hooks' record of their starts; the marking as glibc's */
      if (!list_maps(&c)) _exit(5);
      other_blocks(&c, &rec);
      if (c.chunks) reach(&c, at_exit, &rec, &blocks);
      h.reach_bytes = sizeof rec + rec.n_listed * sizeof(hs_map_block_t);
    }
  }
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0) {
    h.child_minflt = (uint64_t)ru.ru_minflt;
    h.child_cpu_ns = cpu_of(&ru);
  }
  h.child_ns = _hs_now_ns() - started;
  /* written beside, then renamed: the CLI never reads half a map (and its clean-up of
   * "<segment>.map.*" never takes the one being written) */
  char part[4200];
  size_t n = strnlen(path, sizeof part - 16), dot = n;
  while (dot > 0 && path[dot - 1] != '.') dot--;   /* "<segment>.map.<name>" */
  if (dot < 5 || n + 8 >= sizeof part) _exit(6);
  memcpy(part, path, dot - 4);                      /* "<segment>." */
  memcpy(part + dot - 4, "part-map.", 9);
  memcpy(part + dot + 5, path + dot, n - dot + 1);  /* "<segment>.part-map.<name>" */
  if (!write_map(part, &h, &c, &rec, blocks)) { unlink(part); _exit(6); }
  _exit(rename(part, path) == 0 ? 0 : 6);
}

/* ---- the parent's side: glibc's arena locks, taken as its fork() takes them ----
 * The copy is made by a raw clone() with exit signal 0: the program's wait(), waitpid(-1)
 * and waitid(P_ALL) without __WALL never see it and its end sends no SIGCHLD (wait(2)); it
 * is reaped with __WALL. A raw clone takes none of the locks glibc's fork takes, so this
 * takes the arena locks itself, as __malloc_fork_lock_parent does (malloc/arena.c: the main
 * arena, then ->next around the ring), with glibc's low-level lock (nptl/lowlevellock.c:
 * an int, 0 free, 1 taken, 2 taken with waiters). list_lock is not taken (it is static):
 * arenas are only ever linked in right after main_arena, so the ring is read again after
 * locking and after the clone, and an arena linked meanwhile is locked too (glibc holds at
 * most one arena lock at a time outside fork, so the order cannot deadlock). The copy
 * resets its copies of the locks to 0 before its malloc_trim. main_arena is not exported:
 * it is found in libc's writable data by its contents, see plausible_main. */
#define G_MSTATE_FLAGS 4u
#define G_NONCONTIGUOUS 2u
#define G_MSTATE_FASTBINS 16u
#define G_MSTATE_LAST_REMAINDER 104u
#define G_MSTATE_BINS 112u
#define G_NBINS_WORDS 254u
#define HS_ARENAS_MAX 4096
#define HS_LOCK_WAIT_NS 200000000ull   /* under probe.c's HS_PROBE_BLOCKED_NS */

static uint64_t g_main_arena;          /* found once, checked again at every map */
static uint64_t g_locked[HS_ARENAS_MAX];
static size_t g_n_locked;

static long futex_op(int *f, int op, int val, const struct timespec *ts) {
  return syscall(SYS_futex, f, op, val, ts, NULL, 0);
}

/* lll_lock, giving up at the deadline (then the lock is left as it was: taken). */
static int lll_lock_until(int *f, uint64_t deadline) {
  int free_ = 0;
  if (__atomic_compare_exchange_n(f, &free_, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return 1;
  while (__atomic_exchange_n(f, 2, __ATOMIC_ACQUIRE) != 0) {
    uint64_t now = _hs_now_ns();
    if (now >= deadline) return 0;
    struct timespec ts = {(time_t)((deadline - now) / 1000000000ull), (long)((deadline - now) % 1000000000ull)};
    futex_op(f, FUTEX_WAIT_PRIVATE, 2, &ts);
  }
  return 1;
}

static void lll_unlock(int *f) {
  if (__atomic_exchange_n(f, 0, __ATOMIC_RELEASE) > 1) futex_op(f, FUTEX_WAKE_PRIVATE, 1, NULL);
}

static void unlock_arenas(void) {
  while (g_n_locked) lll_unlock((int *)(uintptr_t)g_locked[--g_n_locked]);
}

/* Reads memory that may not be mapped: 0 instead of a fault. */
static int peek(uint64_t addr, void *buf, size_t n) {
  struct iovec local = {buf, n}, remote = {(void *)(uintptr_t)addr, n};
  return syscall(SYS_process_vm_readv, getpid(), &local, 1UL, &remote, 1UL, 0UL) == (long)n;
}

static uint64_t load(uint64_t addr) { return __atomic_load_n((const uint64_t *)(uintptr_t)addr, __ATOMIC_ACQUIRE); }

/* A thread arena: the malloc_state right after the heap_info at its heap's 64 MiB-aligned
 * start, whose ar_ptr names it. Read with peek: it is not known to be mapped. */
static int thread_arena_ok(uint64_t a) {
  uint64_t h = a & ~(HS_MAP_HEAP_MAX - 1), info[4], next;
  if (!a || (a & 15) || a - h < 32 || a - h > 128) return 0;
  if (!peek(h, info, sizeof info) || info[0] != a || !info[2] || info[2] > HS_MAP_HEAP_MAX ||
      info[3] < info[2] || a + G_MSTATE_BYTES > h + info[2])
    return 0;
  return peek(a + G_MSTATE_NEXT, &next, sizeof next);
}

/* libc's writable segment (.data, .bss): where main_arena is. */
typedef struct { uint64_t addr, lo, hi; } libc_data_t;

static int on_object(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  libc_data_t *d = arg;
  int mine = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uint64_t lo = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && d->addr >= lo && d->addr < lo + ph->p_memsz) mine = 1;
  }
  if (!mine) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_W)) {
      d->lo = info->dlpi_addr + ph->p_vaddr;
      d->hi = d->lo + ph->p_memsz;
    }
  }
  return 1;
}

/* Whether a is main_arena, by what glibc 2.36 keeps there (read racily: every word is
 * some value it had): its lock word 0, 1 or 2; each of the 127 bins' two links either the
 * bin itself (empty) or a chunk of the main heap, and so the fastbins and the last
 * remainder (or 0); the top chunk in the main heap (or the initial top, inside itself,
 * before the first sbrk); system_mem no more than the heap; and ->next a ring that
 * closes on a, through thread arenas only. */
static int plausible_main(uint64_t a, uint64_t heap_lo, uint64_t heap_hi) {
  int lock = *(const volatile int *)(uintptr_t)a, flags = *(const volatile int *)(uintptr_t)(a + 4);
  if (lock < 0 || lock > 2 || flags < 0 || flags > 7) return 0;
  uint64_t top = load(a + G_MSTATE_TOP), sys = load(a + G_MSTATE_SYSTEM_MEM);
  int fresh = top == a + G_MSTATE_TOP;
  if (fresh ? sys != 0 : !(top >= heap_lo && top < heap_hi && sys && sys <= heap_hi - heap_lo)) return 0;
  for (uint64_t i = 0; i < G_NBINS_WORDS; i++) {
    uint64_t w = load(a + G_MSTATE_BINS + 8 * i), self = a + G_MSTATE_BINS + 16 * (i / 2) - 16;
    if (w != self && !(w >= heap_lo && w < heap_hi && !(w & 15))) return 0;
  }
  for (uint64_t i = 0; i <= 10; i++) { /* the fastbins, then the last remainder */
    uint64_t w = load(a + (i < 10 ? G_MSTATE_FASTBINS + 8 * i : G_MSTATE_LAST_REMAINDER));
    if (w && !(w >= heap_lo && w < heap_hi && !(w & 15))) return 0;
  }
  uint64_t x = load(a + G_MSTATE_NEXT);
  for (int steps = 0; x != a; steps++) {
    if (steps >= HS_ARENAS_MAX || !thread_arena_ok(x)) return 0;
    x = load(x + G_MSTATE_NEXT);
  }
  return 1;
}

/* main_arena's address (cached once one was found alone), or 0. */
static uint64_t find_main_arena(uint64_t heap_lo, uint64_t heap_hi) {
  if (g_main_arena && plausible_main(g_main_arena, heap_lo, heap_hi)) return g_main_arena;
  libc_data_t d = {(uint64_t)(uintptr_t)&gnu_get_libc_version, 0, 0};
  if (!dl_iterate_phdr(on_object, &d) || d.hi <= d.lo + G_MSTATE_BYTES) return 0;
  uint64_t found = 0;
  int n = 0;
  for (uint64_t a = (d.lo + 7) & ~(uint64_t)7; a + G_MSTATE_BYTES <= d.hi; a += 8) {
    if (plausible_main(a, heap_lo, heap_hi)) { found = a; n++; }
  }
  return n == 1 ? (g_main_arena = found) : 0;
}

/* glibc's own figures without a lock or a walk of its free lists: the arenas on main_arena's
 * ring and the sum of their system_mem (what each holds from the OS: the main heap's sbrk'd
 * bytes, a thread arena's committed heaps; mallinfo2's `arena` field), read racily, each
 * word some value it had. Arenas are never freed, and a thread arena is read with peek: a
 * heap unmapped meanwhile reads as not an arena. 1 when main_arena was found, else 0. */
int _hs_glibc_arenas(uint64_t *arenas, uint64_t *system_mem) {
  uint64_t start_brk = read_start_brk(), brk = (uint64_t)syscall(SYS_brk, 0);
  if (!start_brk || brk < start_brk) return 0;
  uint64_t main_arena = find_main_arena(start_brk, brk + (64u << 20));
  if (!main_arena) return 0;
  uint64_t n = 1, sum = load(main_arena + G_MSTATE_SYSTEM_MEM);
  for (uint64_t a = load(main_arena + G_MSTATE_NEXT); a != main_arena && n < HS_ARENAS_MAX; n++) {
    uint64_t sys, next;
    if (!thread_arena_ok(a) || !peek(a + G_MSTATE_SYSTEM_MEM, &sys, sizeof sys) ||
        !peek(a + G_MSTATE_NEXT, &next, sizeof next))
      return 0;
    sum += sys;
    a = next;
  }
  *arenas = n;
  *system_mem = sum;
  return 1;
}

/* Where the CLI reads glibc's figures from outside (no thread of ours in the program):
 * main_arena's address and the two offsets it reads, in the segment. 1 when found. */
int _hs_glibc_publish_arena(void) {
  uint64_t arenas, system_mem;
  if (!_hs_glibc_arenas(&arenas, &system_mem) || !g_main_arena) return 0;
  _hs_seg->glibc_arena_next_off = G_MSTATE_NEXT;
  _hs_seg->glibc_arena_sysmem_off = G_MSTATE_SYSTEM_MEM;
  __atomic_store_n(&_hs_seg->glibc_main_arena, g_main_arena, __ATOMIC_RELEASE);
  return 1;
}

/* Locks the arenas from `from` along ->next up to `upto` (not included). */
static const char *lock_ring(uint64_t from, uint64_t upto, uint64_t deadline) {
  for (uint64_t a = from; a != upto; a = load(a + G_MSTATE_NEXT)) {
    if (g_n_locked == HS_ARENAS_MAX || !thread_arena_ok(a))
      return "an arena on glibc's list did not look like glibc 2.36's";
    if (!lll_lock_until((int *)(uintptr_t)a, deadline))
      return "a thread of the program kept an arena's lock for 0.2 s: no copy was made";
    g_locked[g_n_locked++] = a;
  }
  return NULL;
}

/* Every glibc arena lock, as fork() takes them; NULL, or why not (then none is held).
 * *head: main_arena's ->next once they are all held. */
static const char *lock_arenas(uint64_t *head, uint64_t deadline) {
  uint64_t start_brk = read_start_brk(), brk = (uint64_t)syscall(SYS_brk, 0);
  if (!start_brk || brk < start_brk) return "the program break could not be read";
  uint64_t heap_hi = brk + (64u << 20); /* a stale read may show a chunk above a trimmed break */
  uint64_t main_arena = find_main_arena(start_brk, heap_hi);
  if (!main_arena) return "glibc's main arena was not found in libc's data (not glibc 2.36's layout?)";
  g_n_locked = 0;
  if (!lll_lock_until((int *)(uintptr_t)main_arena, deadline))
    return "a thread of the program kept the main arena's lock for 0.2 s: no copy was made";
  g_locked[g_n_locked++] = main_arena;
  /* under its lock the main arena's top and the break stand still: exact checks */
  brk = (uint64_t)syscall(SYS_brk, 0);
  uint64_t top = load(main_arena + G_MSTATE_TOP);
  int flags = *(const volatile int *)(uintptr_t)(main_arena + G_MSTATE_FLAGS);
  int ok = top == main_arena + G_MSTATE_TOP
               ? load(main_arena + G_MSTATE_SYSTEM_MEM) == 0
               : !(flags & G_NONCONTIGUOUS) && top >= start_brk && top + 16 <= brk &&
                     top + (load(top + 8) & ~(uint64_t)7) == brk;
  if (!ok) {
    unlock_arenas();
    return "the main heap is not one piece ending at the program break (sbrk called by "
           "the program, or brk unavailable)";
  }
  uint64_t first = load(main_arena + G_MSTATE_NEXT);
  const char *why = lock_ring(first, main_arena, deadline);
  /* arenas linked in meanwhile sit ahead of the first one locked */
  for (uint64_t now; !why && (now = load(main_arena + G_MSTATE_NEXT)) != first; first = now)
    why = lock_ring(now, first, deadline);
  if (why) unlock_arenas();
  *head = first;
  return why;
}

/* Whether every glibc arena lock can be taken within HS_LOCK_WAIT_NS (then none is kept):
 * the exiting thread asks before it calls malloc_trim itself, since a program may call
 * exit() from a signal handler that interrupted malloc on that very thread (which then
 * holds an arena lock that malloc_trim would wait for forever). */
int _hs_glibc_locks_free(void) {
  uint64_t head = 0;
  const char *why = lock_arenas(&head, _hs_now_ns() + HS_LOCK_WAIT_NS);
  if (why) return 0;
  unlock_arenas();
  return 1;
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
  for (size_t i = 0; i < g_n_locked; i++) *(int *)(uintptr_t)g_locked[i] = 0;
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
  g_n_locked = 0;
  int fds[2] = {-1, -1};
  if (pipe2(fds, O_CLOEXEC) != 0) fds[0] = fds[1] = -1;
  if (glibc && (*why = lock_arenas(&head, deadline)) != NULL) {
    wait_fds_closed(fds, -1);
    return -1;
  }
  pid_t pid = -1;
  for (int tries = 0; tries < 4; tries++) {
    pid = clone_copy();
    if (pid == 0) {
      copy_starts();
      child_main(path, t0, at_exit);
    }
    if (pid < 0 || !glibc) break;
    uint64_t main_arena = g_locked[0], now = load(main_arena + G_MSTATE_NEXT);
    if (now == head) break;
    /* an arena was linked in just before the copy, maybe in use in it: lock it, again */
    kill(pid, SIGKILL);
    while (!g_parented && waitpid(pid, NULL, __WALL) < 0 && errno == EINTR) {}
    pid = -1;
    *why = lock_ring(now, head, deadline);
    if (*why) { unlock_arenas(); wait_fds_closed(fds, -1); return -1; }
    head = now;
  }
  unlock_arenas();
  wait_fds_closed(fds, pid);
  if (pid < 0 && !*why)
    *why = glibc && g_main_arena ? "clone failed, or new arenas kept being made during the copy"
                                 : "clone failed (no memory for a copy?)";
  return pid;
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
