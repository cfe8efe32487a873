/* heapwalk.c: in the heap map's copy, glibc's heaps found in /proc/self/maps, their arenas
 * numbered and checked, their pages' residency read, and their chunks walked from the
 * headers (glibc 2.36's layouts: heapmap.c's top comment). Nothing here allocates, locks or
 * calls stdio: the copy's memory is its own mappings (_hs_copy_map). */
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
#include "hs_options.h"


static char *read_file(const char *path, size_t *len, size_t *cap) {
  size_t size = 1 << 20;
  for (int tries = 0; tries < 8; tries++, size *= 4) {
    char *buf = _hs_copy_map(size, 0);
    if (!buf) return NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { _hs_copy_unmap(buf, size); return NULL; }
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
    _hs_copy_unmap(buf, size); /* did not fit: again, larger */
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
int _hs_walk_maps(child_t *c) {
  size_t len, cap;
  char *text = read_file("/proc/self/maps", &len, &cap);
  if (!text) return 0;
  size_t lines = 0;
  for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
  size_t bytes = (lines + 1) * sizeof(map_t);
  c->maps = _hs_copy_map(bytes, 0);
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
      m.x = s[2] == 'x';
      m.file = plen > 0 && p[0] == '/' && !m.dev;
      m.shared = !priv;
      map_t *prev = n ? &c->maps[n - 1] : NULL;
      if (prev && prev->heap && m.heap && prev->hi == m.lo && prev->r == m.r && prev->w == m.w)
        prev->hi = m.hi; /* the break moved in a copy: the kernel may list [heap] in two parts */
      else
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
int _hs_walk_readable(const child_t *c, uint64_t lo, uint64_t hi) {
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

/* start_brk, field 47 of /proc/self/stat (after the command's closing parenthesis). */
static uint64_t stat_start_brk(void);

/* Read once: it is set at the image's exec and never moves. The statistics ask for it at
 * every reading, and a descriptor opened on the library's thread each time would show in
 * the program's /proc/self/fd. */
uint64_t _hs_start_brk(void) {
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
  ssize_t n = (ssize_t)_hs_proc_self_read("/proc/self/stat", buf, sizeof buf);
  if (n <= 0) return 0;
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
  uint64_t ar = hs_rd(h), size = hs_rd(h + 16), mprot = hs_rd(h + 24), pagesize = hs_rd(h + 32);
  if (!ar || (ar & 15) || !mprot || mprot > HS_MAP_HEAP_MAX || (mprot % c->page)) return 0;
  if (size < 64 || size > mprot || (size % c->page) || h + mprot > map_hi) return 0;
  return pagesize == c->page || pagesize == (2u << 20) || pagesize == (1u << 30);
}

/* The heaps to map: [heap], and every 64 MiB-aligned heap_info found in anonymous
 * read-write mappings (adjacent heaps may share one mapping). Thread heaps whose arena is
 * not the first heap of some heap found are dropped (not glibc's). */
int _hs_walk_find_heaps(child_t *c) {
  size_t cap = 16;
  for (size_t i = 0; i < c->n_maps; i++) {
    const map_t *m = &c->maps[i];
    if (m->w && m->anon) cap += (m->hi - m->lo + HS_MAP_HEAP_MAX - 1) / HS_MAP_HEAP_MAX;
  }
  c->heaps = _hs_copy_map(cap * sizeof(heap_t), 0);
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
      hp->end = h + hs_rd(h + 24);
      hp->size = hs_rd(h + 16);
      hp->ar = hs_rd(h);
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

uint64_t _hs_walk_number_arenas(child_t *c) {
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
      if (!_hs_walk_readable(c, a + G_MSTATE_NEXT, a + G_MSTATE_NEXT + 8)) break;
      a = hs_rd(a + G_MSTATE_NEXT);
      if (!a || (a & 7) || a == hp->ar) break;
      if (is_arena(c, a) || !_hs_walk_readable(c, a, a + G_MSTATE_BYTES)) continue;
      uint64_t top = hs_rd(a + G_MSTATE_TOP);
      if (top >= heap_lo && top < heap_hi) { main_arena = a; break; }
    }
  }
  uint64_t next_nr = 1;
  if (main_arena) {
    uint64_t a = main_arena;
    for (int steps = 0; steps < 4096; steps++) {
      a = hs_rd(a + G_MSTATE_NEXT);
      if (a == main_arena || !a || (a & 7)) break;
      int found = 0;
      for (size_t j = 0; j < c->n_heaps; j++) {
        if (c->heaps[j].kind == 1 && c->heaps[j].ar == a) { c->heaps[j].out.arena = next_nr; found = 1; }
      }
      if (!found || !_hs_walk_readable(c, a + G_MSTATE_NEXT, a + G_MSTATE_NEXT + 8)) break;
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
                    _hs_walk_readable(c, hp->ar, hp->ar + G_MSTATE_BYTES) &&
                    hs_rd(hp->ar + G_MSTATE_SYSTEM_MEM) == sum;
  }
  return main_arena;
}

/* ---- the child: pages ---- */
/* A page size is a power of two: a shift, not a division (three divisions a chunk were 28%
 * of the walk of 6M small blocks). */
static uint64_t page_of(const heap_t *hp, uint64_t addr, uint64_t page) {
  return (addr - hp->start) >> __builtin_ctzll(page);
}

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
uint64_t _hs_walk_presence(child_t *c, uint8_t f) {
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
    uint64_t e = hs_rd(u + 128 + 8 * i);
    uint16_t count = *(const volatile uint16_t *)(uintptr_t)(u + 2 * i);
    if (!e) continue;
    if (!count || (e & 15) || !_hs_walk_readable(c, e - 16, e + 16)) return;
    if ((hs_rd(e - 8) & ~(uint64_t)7) != 32 + 16 * i) return;
    uint64_t k = hs_rd(e + 8);
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
    uint64_t e = hs_rd(u + 128 + 8 * i);
    uint16_t count = *(const volatile uint16_t *)(uintptr_t)(u + 2 * i);
    if (!e != !count) return 0;
    if (!e) continue;
    if ((e & 15) || !_hs_walk_readable(c, e - 16, e + 16)) return 0;
    if ((hs_rd(e - 8) & ~(uint64_t)7) != 32 + 16 * i) return 0;
    if (c->key_found && hs_rd(e + 8) != c->key) return 0;
  }
  return 1;
}

static void classify(child_t *c, heap_t *hp, uint64_t ch, uint64_t sz, int inuse) {
  uint64_t page = c->page;
  if (sz < G_MINSIZE) { /* a fencepost */
    set_flag(hp, ch + 8, ch + sz, HS_PAGE_ALLOC, page);
    return;
  }
  if (inuse) {
    int cached = 0;
    if (c->key_found && sz <= G_TCACHE_MAX_CHUNK && hs_rd(ch + 24) == c->key) cached = 1;
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

/* ---- the release counted: glibc's fastbins told from the pages ---- */

/* A fastbin chunk's link: its fd, safe-linked (glibc >= 2.32: stored XOR its own address
 * >> 12), as a chunk address (0: the list's end). tcache entries link the same way. */
static inline uint64_t fast_next(uint64_t ch) { return hs_rd(ch + 16) ^ ((ch + 16) >> 12); }

/* The heap holding [a, a + 32), by a search over the heaps (in address order). */
static const heap_t *heap_of(const child_t *c, uint64_t a) {
  size_t lo = 0, hi = c->n_heaps;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c->heaps[mid].end <= a) lo = mid + 1;
    else hi = mid;
  }
  if (lo == c->n_heaps || a < c->heaps[lo].start || a + G_MINSIZE > c->heaps[lo].end) return NULL;
  return &c->heaps[lo];
}

#define NO_SLOT UINT64_MAX
static uint64_t slot_of(const child_t *c, uint64_t a) {
  const heap_t *hp = (a & 15) ? NULL : heap_of(c, a);
  return hp ? hp->bit0 + (a - hp->start) / 16 : NO_SLOT;
}
/* c->fast: for each 64 slots, a word of the chunks that may be in a fastbin, then a word
 * of those a candidate links to (one cache line for both) */
static inline uint64_t *fast_word(const child_t *c, uint64_t slot) { return &c->fast[slot / 64 * 2]; }
static inline int is_fast(const child_t *c, uint64_t slot) { return (int)(*fast_word(c, slot) >> (slot % 64)) & 1; }
static inline int is_linked(const child_t *c, uint64_t slot) { return (int)(fast_word(c, slot)[1] >> (slot % 64)) & 1; }

/* The first walk's test: an in-use-looking chunk of a fastbin's size whose link is the
 * end or the start of some 16-byte slot of a heap may be in a fastbin. (Not the tcache
 * key: a thread's tcache, emptied as the thread ends, leaves its chunks in the fastbins
 * with the key still in them. A tcache's own chunks are taken out after the walk.) */
static void fast_candidate(child_t *c, const heap_t *hp, uint64_t ch, uint64_t sz) {
  if (sz < G_MINSIZE || sz > G_FAST_MAX_CHUNK) return;
  uint64_t s = fast_next(ch), to = s ? slot_of(c, s) : NO_SLOT;
  if (s && to == NO_SLOT) return;
  uint64_t slot = hp->bit0 + (ch - hp->start) / 16;
  *fast_word(c, slot) |= 1ull << (slot % 64);
  if (s && c->n_links < c->cap_links) c->links[c->n_links++] = (hs_link_t){(uint32_t)slot, (uint32_t)to};
  else if (s) c->fast_unknown = 1; /* (no room: not counted) */
}

static inline int in_fast(const child_t *c, const heap_t *hp, uint64_t ch) {
  return is_fast(c, hp->bit0 + (ch - hp->start) / 16);
}

/* Pages [lo, hi) (page-aligned) dropped by the counted release: resident before, not after. */
static void drop_pages(child_t *c, heap_t *hp, uint64_t lo, uint64_t hi) {
  if (lo < hp->start) lo = hp->start;
  if (hi > hp->end) hi = hp->end;
  for (uint64_t pg = lo < hi ? page_of(hp, lo, c->page) : 0, last = lo < hi ? page_of(hp, hi, c->page) : 0;
       pg < last; pg++) {
    if (hp->flags[pg] & HS_PAGE_AFTER) {
      hp->flags[pg] &= (uint8_t)~HS_PAGE_AFTER;
      c->released++;
    }
  }
}

/* The walk reads one word a chunk, each depending on the one before: a cache miss and,
 * on a heap of 500 MiB, a TLB miss every few chunks (117 ns a chunk on perl's emptied
 * 1.4M-entry hash). The lines ahead are fetched while it waits (from the chunk it is at:
 * the inside of a large free chunk is skipped): the copy's last walk of that heap went
 * from 170 to 55 ms. */
#define HS_WALK_AHEAD 4096

/* A run of chunks malloc_consolidate merges (free ones and fastbin ones, next to each
 * other): one free chunk, of which mtrim's madvise drops the whole pages past its first
 * sizeof(struct malloc_chunk) bytes. */
static void counted_free(child_t *c, heap_t *hp, uint64_t ch, uint64_t sz) {
  classify(c, hp, ch, sz, 0);
  uint64_t page = c->page;
  if (sz <= page - 1 + G_CHUNK_STRUCT) return;
  uint64_t lo = (ch + G_CHUNK_STRUCT + page - 1) & ~(page - 1), rest = sz - (lo - ch);
  if (rest > page - 1) drop_pages(c, hp, lo, lo + (rest & ~(page - 1)));
}

/* Walks [c0, cend): 1 when every chunk was read and the walk ended exactly at the end (on
 * the top chunk, which must be `top` when that is known, or on the fenceposts). While
 * counting, a run of free and fastbin chunks is one free chunk (counted_free), and one
 * that ends at the top is part of it; the main heap's top is then shrunk as systrim
 * shrinks it: all but MINSIZE + 1 bytes, in whole pages, given back by lowering the break. */
static int walk(child_t *c, heap_t *hp, uint64_t c0, uint64_t cend, uint64_t top, int main_heap) {
  uint64_t page = c->page;
  int first_walk = c->finding_key || c->finding_fast;
  if ((c0 & 15) || c0 >= cend || !_hs_walk_readable(c, c0, cend)) return 0;
  if (c->finding_key) top = 0;
  if (!first_walk) set_flag(hp, hp->start, c0, HS_PAGE_ALLOC, page);   /* heap_info, malloc_state */
  uint64_t ch = c0, run = 0, pf = c0 & ~(uint64_t)63;
  /* the counted walk replays the first walk's words; the first walk keeps them */
  int replaying = c->counting && c->replay_ok && !c->finding_key;
  int keeping = c->finding_fast && c->replay_ok;
  while (ch < cend) {
    if (ch + 16 > cend) return 0;
    uint64_t word, kept = 0;
    if (replaying) {
      if (c->replay_at >= c->n_replay) return 0;
      kept = c->replay[c->replay_at++];
      word = kept & ~(uint64_t)2;
    } else {
      if (pf < ch) pf = ch & ~(uint64_t)63;
      for (uint64_t ahead = cend - ch > HS_WALK_AHEAD ? ch + HS_WALK_AHEAD : cend; pf < ahead; pf += 64)
        __builtin_prefetch((const void *)(uintptr_t)pf);
      word = hs_rd(ch + 8);
    }
    uint64_t sz = word & ~(uint64_t)7;
    if (keeping) {
      if (c->n_replay == c->cap_replay) c->replay_ok = keeping = 0; /* no room: read again */
      else c->replay[c->n_replay++] = word & ~(uint64_t)2; /* (bit 1 refused below) */
    }
    if (sz == 0) { /* the fenceposts that close a thread heap that is not the current one */
      if (main_heap || word != 1 || cend - ch > 2 * G_MINSIZE) return 0;
      if (!first_walk) set_flag(hp, ch, cend, HS_PAGE_ALLOC, page);
      return 1;
    }
    if ((sz & 15) || (word & 2) || sz > cend - ch) return 0;
    uint64_t next = ch + sz;
    if (next == cend) { /* the top chunk */
      if (c->finding_key) return 1;
      if (top && ch != top) return 0;
      if (first_walk) return 1;
      uint64_t t = run ? run : ch, end = cend;
      if (c->counting && main_heap && cend - t > G_TOP_KEEP) {
        end = cend - ((cend - t - G_TOP_KEEP) & ~(page - 1));
        drop_pages(c, hp, (end + page - 1) & ~(page - 1), hp->end);
      }
      hp->out.top_bytes += end - t;
      set_flag(hp, t, end, HS_PAGE_TOP, page);
      set_flag(hp, t + 8, t + G_TOP_KEEP, HS_PAGE_ALLOC, page);
      return 1;
    }
    if (next + 16 > cend) return 0;
    int inuse = replaying ? (int)(kept >> 1) & 1 : (int)(hs_rd(next + 8) & 1);
    if (keeping) c->replay[c->n_replay - 1] |= (uint64_t)inuse << 1;
    if (c->finding_key) {
      if (inuse && sz == G_TCACHE_STRUCT_CHUNK && !c->key_found) try_key(c, ch + 16);
      if (c->key_found) return 1; /* (the first tcache struct, usually the heap's first chunk) */
    } else if (c->finding_fast) {
      if (inuse && sz == G_TCACHE_STRUCT_CHUNK && is_tcache(c, ch + 16)) {
        if (c->n_tcaches < HS_TCACHES_MAX) c->tcaches[c->n_tcaches++] = ch + 16;
        else c->fast_unknown = 1; /* (more threads than that: not counted) */
      }
      if (inuse) fast_candidate(c, hp, ch, sz);
    } else if (c->counting && sz >= G_MINSIZE && (!inuse || in_fast(c, hp, ch))) {
      if (!run) run = ch;
    } else {
      if (run) counted_free(c, hp, run, ch - run);
      run = 0;
      classify(c, hp, ch, sz, inuse);
    }
    ch = next;
  }
  return 0;
}

void _hs_walk_heaps(child_t *c, uint64_t main_arena) {
  if (c->finding_fast) c->n_replay = 0;
  if (c->counting && !c->finding_key) c->replay_at = 0;
  for (size_t i = 0; i < c->n_heaps && !(c->finding_key && c->key_found); i++) {
    heap_t *hp = &c->heaps[i];
    int ok = 0;
    if (hp->kind == 0) {
      /* from start_brk (an unaligned one starts in the page before [heap], the end of the
       * executable's bss) to the break now (the release may have lowered it) */
      uint64_t start_brk = _hs_start_brk(), brk = (uint64_t)syscall(SYS_brk, 0);
      uint64_t c0 = (start_brk + 15) & ~(uint64_t)15;
      uint64_t top = main_arena ? hs_rd(main_arena + G_MSTATE_TOP) : 0;
      if (start_brk && c0 + c->page >= hp->start && c0 < hp->end)
        ok = walk(c, hp, c0, brk, top, 1);
      if (c->finding_key) continue;
    } else if (hp->ok_layout && _hs_walk_readable(c, hp->start, hp->start + 64)) {
      uint64_t c0 = hp->first ? (hp->ar + G_MSTATE_BYTES + 15) & ~(uint64_t)15
                              : hp->start + hp->info_bytes;
      uint64_t top = hs_rd(hp->ar + G_MSTATE_TOP), end = hp->start + hp->size;
      ok = walk(c, hp, c0, end, top >= hp->start && top < end ? top : 0, 0);
      /* the top chunk ends only the heap that holds it */
      if (ok && hp->out.top_bytes && !(top >= hp->start && top < end)) ok = 0;
    }
    if (c->finding_key) continue;
    if (c->finding_fast) {
      if (!ok) c->fast_unknown = 1; /* a heap not walked: its fastbin chunks are not known */
      continue;
    }
    hp->out.walked = (uint64_t)ok;
    if (!ok) { /* nothing half-read is kept */
      hp->out.top_bytes = hp->out.live_bytes = 0;
      hp->out.inuse_chunks = hp->out.free_chunks = hp->out.tcache_chunks = 0;
      memset(hp->live, 0, hp->out.pages * sizeof *hp->live);
      for (uint64_t k = 0; k < hp->out.pages; k++) hp->flags[k] &= HS_PAGE_BEFORE | HS_PAGE_AFTER;
    }
  }
}

void _hs_walk_fastbins_forget(child_t *c) {
  if (c->replay) _hs_copy_unmap(c->replay, c->cap_replay * sizeof *c->replay);
  c->replay = NULL;
  c->n_replay = c->cap_replay = c->replay_at = 0;
  c->replay_ok = 0;
  if (c->fast) _hs_copy_unmap(c->fast, (size_t)c->fast_bits / 4);
  if (c->links) _hs_copy_unmap(c->links, c->cap_links * sizeof *c->links);
  if (c->tcaches) _hs_copy_unmap(c->tcaches, HS_TCACHES_MAX * sizeof *c->tcaches);
  if (c->twice) _hs_copy_unmap(c->twice, HS_TWICE_MAX * sizeof *c->twice);
  if (c->heads) _hs_copy_unmap(c->heads, (c->n_heaps + 1) * G_NFASTBINS * sizeof *c->heads);
  c->twice = c->heads = NULL;
  c->fast = NULL;
  c->links = NULL;
  c->tcaches = NULL;
  c->fast_bits = c->n_links = c->cap_links = 0;
}

/* Every candidate's link (c->links, in address order): one that leads to no candidate is
 * dropped (*dropped set), the others mark the chunk they lead to as linked to (one linked
 * to again is listed in c->twice; *twice is set when that list is full). The links lead
 * all over the heap: the bitmap's words are fetched some links ahead. */
#define LINK_AHEAD 16
static void fast_links(child_t *c, int *dropped, int *twice) {
  for (size_t i = 0; i < c->n_links; i++) {
    if (i + LINK_AHEAD < c->n_links) __builtin_prefetch(fast_word(c, c->links[i + LINK_AHEAD].to), 1);
    hs_link_t *l = &c->links[i];
    if (l->at == UINT32_MAX) continue; /* dropped before */
    if (!is_fast(c, l->at)) { /* a tcache's (_hs_walk_fastbins) */
      l->at = UINT32_MAX;
      continue;
    }
    if (!is_fast(c, l->to)) {
      *fast_word(c, l->at) &= ~(1ull << (l->at % 64));
      l->at = UINT32_MAX;
      *dropped = 1;
    } else if (is_linked(c, l->to)) { /* again: kept, to be told apart (fast_false) */
      if (c->n_twice < HS_TWICE_MAX) c->twice[c->n_twice++] = (hs_fast_slot_t){l->to, 0};
      else *twice = 1;
    } else {
      fast_word(c, l->to)[1] |= 1ull << (l->to % 64);
    }
  }
}

/* Sorted by slot (a shell sort: the copy calls nothing that may allocate). */
static void sort_slots(hs_fast_slot_t *t, size_t n) {
  for (size_t gap = n / 2; gap; gap = gap == 2 ? 1 : gap * 5 / 11) {
    for (size_t i = gap; i < n; i++) {
      hs_fast_slot_t v = t[i];
      size_t j = i;
      for (; j >= gap && t[j - gap].slot > v.slot; j -= gap) t[j] = t[j - gap];
      t[j] = v;
    }
  }
}

/* The entry of a slot in a sorted list, or NULL. */
static hs_fast_slot_t *find_slot(hs_fast_slot_t *t, size_t n, uint32_t slot) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (t[mid].slot < slot) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && t[lo].slot == slot ? &t[lo] : NULL;
}

static uint64_t slot_addr(const child_t *c, uint64_t slot) {
  size_t lo = 0, hi = c->n_heaps;
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (c->heaps[mid].bit0 <= slot) lo = mid;
    else hi = mid;
  }
  return c->heaps[lo].start + (slot - c->heaps[lo].bit0) * 16;
}

/* A chunk's first word keeps its link when malloc hands it out (glibc clears only a
 * tcache entry's key), so a block the program has not written over yet is a candidate: a
 * list's end, or a link to a chunk still in a fastbin or to one now in use. Such a
 * candidate is on no list: it is linked to by no candidate, or by one that is on no list
 * either, while every chunk on a list is a head or linked to by its predecessor. So,
 * from each candidate no other links to that is no head (c->heads): it is dropped, and
 * so is the chunk it links to when that is now linked to by none and no head (a chunk
 * that was linked to twice is linked to once less: c->twice, its count of extra links). */
static void fast_false(child_t *c, uint64_t x) {
  for (;;) {
    *fast_word(c, x) &= ~(1ull << (x % 64));
    uint64_t s = fast_next(slot_addr(c, x));
    if (!s) return;
    uint32_t to = (uint32_t)slot_of(c, s);
    hs_fast_slot_t *t = find_slot(c->twice, c->n_twice, to);
    if (t && t->more) {
      t->more--;
      return;
    }
    fast_word(c, to)[1] &= ~(1ull << (to % 64));
    if (find_slot(c->heads, c->n_heads, to)) return;
    x = to;
  }
}

/* The arenas, for i from 0 to n_heaps: main_arena, then each thread arena at its first
 * heap (0 for the other i). */
static uint64_t arena_of(const child_t *c, size_t i, uint64_t main_arena) {
  if (!i) return main_arena;
  const heap_t *hp = &c->heaps[i - 1];
  return hp->kind == 1 && hp->first ? hp->ar : 0;
}

/* The copy's CPU time (not the clock's: a copy the machine leaves waiting must decide as
 * one that ran). */
static uint64_t cpu_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Whether glibc's fastbins hold `limit` chunks or more, by following their lists (each
 * link read, so at most `limit` of them), or take more than `budget_ns` of CPU to follow:
 * the release would read them in the same order, and more (consolidating perl's freed hash
 * entries, all over the heap: 0.7 us a link, 65536 of them followed in 50 ms only to
 * learn that counting costs less). */
int _hs_walk_fastbins_hold(const child_t *c, uint64_t main_arena, uint64_t limit,
                           uint64_t budget_ns) {
  uint64_t n = 0, until = cpu_ns() + budget_ns;
  for (size_t i = 0; i <= c->n_heaps; i++) {
    uint64_t a = arena_of(c, i, main_arena);
    if (!a) continue;
    for (uint64_t b = 0; b < G_NFASTBINS; b++) {
      for (uint64_t p = hs_rd(a + G_MSTATE_FASTBINS + 8 * b); p; p = fast_next(p)) {
        if (++n >= limit || (n % 256 == 0 && cpu_ns() > until)) return 1;
        if ((p & 15) || !heap_of(c, p)) break;
      }
    }
  }
  return 0;
}

static int64_t fast_refused(child_t *c, const char **why, const char *reason) {
  _hs_walk_fastbins_forget(c);
  *why = reason;
  return -1;
}

/* The chunks in glibc's fastbins, from the pages alone. Following each list from its head
 * reads them in the order they were freed, all over the heap (3 M chunks of perl's freed
 * hash: 0.6 s, as long as malloc_trim), so they are found in address order instead:
 *   1. a walk marks every chunk that could be in one (fast_candidate) and keeps its link;
 *   2. the threads' tcache entries are taken out (their lists are short and counted);
 *   3. candidates whose link leads to no candidate are dropped until none is (fast_links);
 *   4. from each candidate that no other links to and that is no fastbin's head, the
 *      chunks on no list are dropped (fast_false: blocks in use keep their old link).
 * The candidates left are exactly the fastbin chunks when then no chunk is linked to
 * twice and the chunks no candidate links to are exactly the non-empty bins' heads (every
 * arena's fastbinsY, each a chunk of its bin's size): each list is a path from its head
 * to its end, and every candidate is on one. (Only candidates linked in a ring, each one's
 * first word the next one's address XOR its own >> 12, would pass and be on no list.) -1
 * (*why) when that does not hold, or the heaps cannot be walked; else their number, and
 * the candidates in c->fast. */

int64_t _hs_walk_fastbins(child_t *c, uint64_t main_arena, const char **why) {
  uint64_t bits = 0;
  for (size_t i = 0; i < c->n_heaps; i++) {
    heap_t *hp = &c->heaps[i];
    if (i && hp->start < c->heaps[i - 1].end) /* heap_of needs them in order */
      return fast_refused(c, why, "the heaps were not listed in address order");
    hp->bit0 = bits;
    bits += ((hp->end - hp->start) / 16 + 63) & ~(uint64_t)63;
  }
  if (!main_arena) return fast_refused(c, why, "main_arena was not found");
  if (!bits || bits >= UINT32_MAX) return fast_refused(c, why, "no heap, or heaps of 64 GiB or more");
  c->fast_bits = bits;
  c->cap_links = bits / 2; /* a chunk is 32 bytes or more: backed only where written */
  c->n_links = c->n_tcaches = c->n_twice = c->n_heads = 0;
  c->fast_unknown = 0;
  if (!(c->fast = _hs_copy_map((size_t)bits / 4, 0)) || /* two bits a slot */
      !(c->links = _hs_copy_map(c->cap_links * sizeof *c->links, 0)) ||
      !(c->tcaches = _hs_copy_map(HS_TCACHES_MAX * sizeof *c->tcaches, 0)) ||
      !(c->twice = _hs_copy_map(HS_TWICE_MAX * sizeof *c->twice, 0)) ||
      !(c->heads = _hs_copy_map((c->n_heaps + 1) * G_NFASTBINS * sizeof *c->heads, 0)))
    return fast_refused(c, why, "no room in the copy for its bitmaps");
  /* room for every chunk's word: one per 32 bytes of heap, backed only where written */
  uint64_t heap_bytes = 0;
  for (size_t i = 0; i < c->n_heaps; i++) heap_bytes += c->heaps[i].end - c->heaps[i].start;
  c->cap_replay = heap_bytes / G_MINSIZE + 2 * c->n_heaps + 16;
  c->replay = _hs_copy_map(c->cap_replay * sizeof *c->replay, 0);
  c->replay_ok = c->replay != NULL;
  if (!c->replay) c->cap_replay = 0;
  c->finding_fast = 1;
  _hs_walk_heaps(c, main_arena);
  c->finding_fast = 0;
  if (c->fast_unknown)
    return fast_refused(c, why, "a heap was not walked, or had more tcaches than listed");
  /* the chunks in the threads' tcaches: not in a fastbin (each list as long as its count) */
  for (size_t t = 0; t < c->n_tcaches; t++) {
    uint64_t u = c->tcaches[t];
    for (uint64_t b = 0; b < G_NFASTBINS; b++) {
      uint64_t e = hs_rd(u + 128 + 8 * b), slot;
      unsigned count = *(const volatile uint16_t *)(uintptr_t)(u + 2 * b);
      for (unsigned j = 0; j < count && e; j++, e = hs_rd(e) ^ (e >> 12)) {
        if ((slot = slot_of(c, e - 16)) == NO_SLOT) break;
        *fast_word(c, slot) &= ~(1ull << (slot % 64));
      }
    }
  }
  /* dropped until every candidate's link leads to one (a pass that drops one counts the
   * links again) */
  int dropped = 1, twice = 0;
  for (int pass = 0; pass < 16 && dropped; pass++) {
    if (pass)
      for (uint64_t k = 0; k < bits / 64; k++) c->fast[2 * k + 1] = 0;
    c->n_twice = 0;
    dropped = twice = 0;
    fast_links(c, &dropped, &twice);
  }
  _hs_copy_unmap(c->links, c->cap_links * sizeof *c->links);
  c->links = NULL;
  c->n_links = c->cap_links = 0;
  if (dropped) return fast_refused(c, why, "the candidates' links did not settle");
  if (twice) return fast_refused(c, why, "too many chunks were linked to by two candidates");
  /* the heads: every arena's non-empty fastbins, each a candidate of its bin's size */
  c->n_heads = 0;
  for (size_t i = 0; i <= c->n_heaps; i++) {
    uint64_t a = arena_of(c, i, main_arena);
    if (!a) continue;
    for (uint64_t b = 0; b < G_NFASTBINS; b++) {
      uint64_t h = hs_rd(a + G_MSTATE_FASTBINS + 8 * b), slot;
      if (!h) continue;
      if ((slot = slot_of(c, h)) == NO_SLOT || !is_fast(c, slot) ||
          (hs_rd(h + 8) & ~(uint64_t)7) != G_MINSIZE + 16 * b)
        return fast_refused(c, why, "a fastbin's head was no candidate of its bin's size");
      c->heads[c->n_heads++] = (hs_fast_slot_t){(uint32_t)slot, 0};
    }
  }
  sort_slots(c->heads, c->n_heads);
  /* the extra links, as counts */
  sort_slots(c->twice, c->n_twice);
  size_t n = 0;
  for (size_t i = 0; i < c->n_twice; i++) {
    if (n && c->twice[n - 1].slot == c->twice[i].slot) c->twice[n - 1].more++;
    else c->twice[n++] = (hs_fast_slot_t){c->twice[i].slot, 1};
  }
  c->n_twice = n;
  for (uint64_t k = 0; k < bits / 64; k++) {
    for (uint64_t w = c->fast[2 * k] & ~c->fast[2 * k + 1]; w; w &= w - 1) {
      uint64_t slot = k * 64 + (unsigned)__builtin_ctzll(w);
      if (is_fast(c, slot) && !is_linked(c, slot) && !find_slot(c->heads, c->n_heads, (uint32_t)slot))
        fast_false(c, slot);
    }
  }
  for (size_t i = 0; i < c->n_twice; i++) {
    if (c->twice[i].more) return fast_refused(c, why, "a chunk was linked to by two candidates on lists");
  }
  uint64_t members = 0, roots = 0;
  for (uint64_t k = 0; k < bits / 64; k++) {
    members += (uint64_t)__builtin_popcountll(c->fast[2 * k]);
    roots += (uint64_t)__builtin_popcountll(c->fast[2 * k] & ~c->fast[2 * k + 1]);
  }
  if (roots != c->n_heads) return fast_refused(c, why, "the lists did not start at the fastbins' heads");
  return (int64_t)members;
}
