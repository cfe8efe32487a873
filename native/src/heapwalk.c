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

/* Walks [c0, cend): 1 when every chunk was read and the walk ended exactly at the end (on
 * the top chunk, which must be `top` when that is known, or on the fenceposts). */
static int walk(child_t *c, heap_t *hp, uint64_t c0, uint64_t cend, uint64_t top, int main_heap) {
  uint64_t page = c->page;
  if ((c0 & 15) || c0 >= cend || !_hs_walk_readable(c, c0, cend)) return 0;
  if (c->finding_key) top = 0;
  else set_flag(hp, hp->start, c0, HS_PAGE_ALLOC, page);   /* heap_info, malloc_state */
  uint64_t ch = c0;
  while (ch < cend) {
    if (ch + 16 > cend) return 0;
    uint64_t word = hs_rd(ch + 8), sz = word & ~(uint64_t)7;
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
    classify(c, hp, ch, sz, (int)(hs_rd(next + 8) & 1));
    ch = next;
  }
  return 0;
}

void _hs_walk_heaps(child_t *c, uint64_t main_arena) {
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
    hp->out.walked = (uint64_t)ok;
    if (!ok) { /* nothing half-read is kept */
      hp->out.top_bytes = hp->out.live_bytes = 0;
      hp->out.inuse_chunks = hp->out.free_chunks = hp->out.tcache_chunks = 0;
      memset(hp->live, 0, hp->out.pages * sizeof *hp->live);
      for (uint64_t k = 0; k < hp->out.pages; k++) hp->flags[k] &= HS_PAGE_BEFORE | HS_PAGE_AFTER;
    }
  }
}
