/* heaproots.c: in the heap map's copy, what reach.c marks: the blocks (glibc's in-use
 * chunks, its mmapped chunks found outside the heaps, or under another allocator the hooks'
 * record of the blocks) and the roots (every writable mapping but the heaps, the blocks and
 * heapsight's own memory), read page by page where they are resident; then the classes and
 * the blocks not reachable, for the map's reach section. */
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
#include <sys/auxv.h>
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
#include "hs_fd.h"
#include "hs_options.h"


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

/* A root range, its resident (or swapped) pages only (_hs_resident_runs): a large
 * reservation costs nothing. Returns the bytes that faulted. */
#define HS_REACH_LIMIT_NS 20000000000ull
static int pm = -1;
static uint64_t root_run(void *r, uint64_t lo, uint64_t hi) {
  return scan_root(r, lo, hi) ? 0 : hi - lo;
}
static uint64_t scan_resident(child_t *c, hs_reach_t *r, uint64_t lo, uint64_t hi) {
  if (pm < 0) pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (pm < 0) return root_run(r, lo, hi);
  return _hs_resident_runs(pm, c->pm_buf, HS_PM_ENTRIES, c->page, lo, hi, root_run, r);
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

/* The dynamic loader's mappings: from the one holding its base (AT_BASE) on, while file
 * mappings follow one another (its text, then its data and bss). [0, 0) when there is no
 * loader (a static program) or it was run as the command (ld.so ./prog: no AT_BASE). */
static void loader_range(const child_t *c, uint64_t *lo, uint64_t *hi) {
  uint64_t base = (uint64_t)getauxval(AT_BASE);
  const map_t *m = base ? map_at(c, base) : NULL;
  *lo = *hi = 0;
  if (!m || !m->file) return;
  *lo = m->lo;
  *hi = m->hi;
  for (size_t i = (size_t)(m - c->maps) + 1; i < c->n_maps && c->maps[i].lo == *hi && c->maps[i].file; i++)
    *hi = c->maps[i].hi;
}

static int in_heaps(const child_t *c, uint64_t lo, uint64_t hi) {
  for (size_t i = 0; i < c->n_heaps; i++) {
    if (lo < c->heaps[i].end && hi > c->heaps[i].start) return 1;
  }
  return 0;
}

typedef struct excl_s { hs_chunk_t *r; size_t n, cap; } excl_t;
/* (a range that continues the last one extends it: glibc's mmapped chunks one after the
 * other in a mapping the kernel merged, 20,000 of them in a few mappings, took one entry
 * each, past the room of 64 a mapping, and the rest were scanned as roots: 160 MB, 2 s) */
static void exclude(excl_t *e, uint64_t lo, uint64_t hi) {
  if (hi <= lo) return;
  if (e->n > 0 && e->r[e->n - 1].hi == lo) e->r[e->n - 1].hi = hi;
  else if (e->n < e->cap) e->r[e->n++] = (hs_chunk_t){lo, hi};
}

/* Where the chunk of a glibc mapping of sz bytes at a begins: a, or further in for an
 * aligned block. glibc's memalign on an mmapped chunk (posix_memalign or aligned_alloc of a
 * block past the mmap threshold: malloc.c _int_memalign) leaves the mapping's first header
 * as it was (prev_size 0, the whole mapping) and writes the aligned chunk's where the
 * alignment puts it (the first aligned user address past a + 16, moved one alignment on
 * when that leaves less than MINSIZE before it): prev_size its lead, its size the rest with
 * IS_MMAPPED. Taken at a, a kept block read as reached only through an interior pointer
 * (possibly lost, where memcheck says still reachable). The lead of the first alignment
 * from 32 bytes up whose header there says so; 0 for none. */
static uint64_t aligned_lead(uint64_t a, uint64_t sz) {
  for (uint64_t al = 32; al && al <= sz; al <<= 1) {
    uint64_t h = ((a + 16 + al - 1) & ~(al - 1)) - 16;
    if (h - a < G_MINSIZE) h += al;
    uint64_t lead = h - a;
    if (lead + G_MINSIZE > sz) break;
    if (hs_rd(h) == lead && hs_rd(h + 8) == ((sz - lead) | 2)) return lead;
  }
  return 0;
}

/* glibc's mmapped chunks at the start of an anonymous mapping outside the heaps: prev_size
 * 0, a size of whole pages with IS_MMAPPED alone, inside the mapping; one after the other
 * when the kernel merged their mappings (an aligned block's further in: aligned_lead).
 * Appended to the blocks and excluded from the roots; the bytes their chunks hold, as the
 * hooks count them. */
static uint64_t mmapped_chunks(child_t *c, const map_t *m, excl_t *ex) {
  uint64_t a = m->lo, found = 0;
  while (a + 4096 <= m->hi && c->n_chunks < c->cap_chunks) {
    uint64_t word = hs_rd(a + 8), sz = word & ~(uint64_t)7;
    if (hs_rd(a) != 0 || (word & 7) != 2 || sz < c->page || sz % c->page || sz > m->hi - a) break;
    uint64_t lead = aligned_lead(a, sz);
    c->chunks[c->n_chunks++] = (hs_chunk_t){a + lead + 16, a + sz};
    exclude(ex, a, a + sz);
    found += sz - lead;
    a += sz;
  }
  return found;
}

/* Where the mapping of an mmapped chunk whose block begins at lo starts: its header less
 * its prev_size (the lead of an aligned block, 0 otherwise). */
static uint64_t mapping_of(uint64_t lo) { return lo - 16 - hs_rd(lo - 16); }

/* Whether a lies in one of the mmapped chunks c->chunks[from..to) (found at mappings'
 * starts, in address order: a binary search for the first that ends past a; 20,000 chunks
 * looked through one by one for each page took 2 s). */
static int in_chunks(const child_t *c, size_t from, size_t to, uint64_t a) {
  size_t i = from + hs_first_past(c->chunks + from, to - from, a);
  return i < to && a >= mapping_of(c->chunks[i].lo);
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
      if (!(vec[(a - vec_lo) / page] & 1) || in_chunks(c, from, first, a)) continue;
      uint64_t word = hs_rd(a + 8), sz = word & ~(uint64_t)7;
      if (hs_rd(a) != 0 || (word & 7) != 2 || sz < c->page || sz % c->page || sz > m->hi - a) continue;
      if (c->n_chunks == c->cap_chunks) break;
      uint64_t lead = aligned_lead(a, sz);
      c->chunks[c->n_chunks++] = (hs_chunk_t){a + lead + 16, a + sz};
      got += sz - lead;
      a += sz - c->page;
    }
  }
  if (got != missing) { /* not the chunks the hooks counted: take none */
    c->n_chunks = first;
    return 0;
  }
  /* (each mapping's whole: an aligned chunk's lead is glibc's) */
  for (size_t i = first; i < c->n_chunks; i++) exclude(ex, mapping_of(c->chunks[i].lo), c->chunks[i].hi);
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

void _hs_roots_reach(child_t *c, int at_exit, hs_map_reach_t *rec, hs_map_block_t **list) {
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
  size_t n_excl = c->n_heaps + _hs_copy_n_own + 16 + (glibc ? 0 : HS_ALLOC_RANGES_MAX + 64);
  for (size_t i = 0; glibc && i < c->n_maps; i++) n_excl += c->maps[i].anon && c->maps[i].w ? 64 : 0;
  excl_t ex = {_hs_copy_map(n_excl * sizeof(hs_chunk_t), 0), 0, n_excl};
  if (!ex.r) {
    reach_why(rec, "no room in the copy for its lists");
    return;
  }
  if (glibc) {
    uint64_t mmapped = 0, counted = _hs_copy_mmapped_bytes;
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
  /* two processes mark at exit, once the program is gone (reach.c), past a size of blocks
   * to scan that pays for a fork: their states shared. Only where the program was the
   * command heapsight started (the copy is then the CLI's child): a process followed
   * among others (--follow cc1 under make) ends while the rest of the command runs on */
  int workers = _hs_opt.reach_workers, two = at_exit && workers == 2;
  pid_t cli = _hs_seg ? (pid_t)__atomic_load_n(&_hs_seg->creator_pid, __ATOMIC_RELAXED) : 0;
  if (at_exit && workers == 0 && cli > 0 && getppid() == cli) {
    uint64_t block_bytes = 0;
    for (size_t i = 0; i < n; i++) block_bytes += c->chunks[i].hi - c->chunks[i].lo;
    two = block_bytes >= HS_REACH_WORKERS_MIN_BYTES;
  }
  struct hs_reach_pool_s *pool = two ? _hs_copy_map(_hs_reach_pool_bytes(n), 0) : NULL;
  uint8_t *state = _hs_copy_map(n + 1, 0);
  uint32_t *stack = _hs_copy_map((2 * n + 1) * sizeof(uint32_t), 0);
  if (!state || !stack) {
    reach_why(rec, "no room in the copy for the marks");
    return;
  }
  /* heapsight's own memory, and what is not a root */
  for (size_t i = 0; i < c->n_heaps; i++) exclude(&ex, c->heaps[i].start, c->heaps[i].end);
  for (size_t i = 0; i < _hs_copy_n_own; i++) exclude(&ex, _hs_copy_own[i].lo, _hs_copy_own[i].hi);
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
  /* the file mappings, for the vtables of memcheck's multipleinheritance heuristic */
  hs_chunk_t *files = _hs_copy_map(2 * c->n_maps * sizeof(hs_chunk_t) + 16, 0);
  if (files) {
    size_t nr = 0, nx = 0;
    for (size_t i = 0; i < c->n_maps; i++)
      if (c->maps[i].file && c->maps[i].r) files[nr++] = (hs_chunk_t){c->maps[i].lo, c->maps[i].hi};
    hs_chunk_t *x = files + nr;
    for (size_t i = 0; i < c->n_maps; i++)
      if (c->maps[i].file && c->maps[i].r && c->maps[i].x) x[nx++] = (hs_chunk_t){c->maps[i].lo, c->maps[i].hi};
    r.rfile = files, r.n_rfile = nr, r.xfile = x, r.n_xfile = nx;
  }
  r.defer = pool != NULL;
  unsigned shift = 0;
  size_t index_bytes = _hs_opt.reach_index ? _hs_reach_index_bytes(c->chunks, n, &shift) : 0;
  void *index = index_bytes ? _hs_copy_map(index_bytes, 0) : NULL;
  if (index) _hs_reach_index(&r, index, shift); /* else: a search over every block */
  r.pm_buf = _hs_copy_map(HS_REACH_PM_ENTRIES * 8, 0);
  r.pagemap = r.pm_buf ? open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC) : -1;
  r.page = c->page;
  r.deadline_ns = r0 + HS_REACH_LIMIT_NS;
  /* heapsight's own blocks (what its start-up's dlopen of the unwinder left in the heap:
   * the loader's records, reachable from the loader's data) first: out of every class, and
   * what they point to reached as from a root. Where only the first of them is known (the
   * copy library's link map, the last in the loader's list), with what it reaches. */
  uint64_t own_blocks[64];
  int own_whole = 1;
  size_t n_own = _hs_own_blocks(own_blocks, 64, &own_whole);
  if (own_whole) _hs_reach_own_roots(&r, own_blocks, n_own);
  else
    for (size_t i = 0; i < n_own; i++) _hs_reach_own(&r, own_blocks[i]);
  struct sigaction sa, old_segv, old_bus;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fault;
  sa.sa_flags = SA_NODEFER;
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
  uint64_t skipped = 0, loader_lo, loader_hi;
  loader_range(c, &loader_lo, &loader_hi);
  for (size_t i = 0; i < c->n_maps; i++) {
    const map_t *m = &c->maps[i];
    if (!m->r || !m->w || m->dev) continue;
    r.loader_root = m->lo >= loader_lo && m->hi <= loader_hi;
    uint64_t at = m->lo;
    for (size_t k = 0; k < ex.n && at < m->hi; k++) {
      if (ex.r[k].hi <= at) continue;
      if (ex.r[k].lo >= m->hi) break;
      if (ex.r[k].lo > at) skipped += scan_mapping(c, m, &r, at, ex.r[k].lo);
      at = ex.r[k].hi;
    }
    if (at < m->hi) skipped += scan_mapping(c, m, &r, at, m->hi);
  }
  r.loader_root = 0;
  sigaction(SIGSEGV, &old_segv, NULL);
  sigaction(SIGBUS, &old_bus, NULL);
  if (pm >= 0) close(pm);
  pm = -1;
  int marked_by = _hs_reach_workers(&r, pool);
  if (!marked_by) {
    reach_why(rec, "the second process that marked the blocks did not finish (killed, or it crashed)");
    rec->reach_ns = _hs_now_ns() - r0;
    return;
  }
  /* heapsight's thread's DTV (glibc's, for it): its TCB's second word points inside it */
  if (_hs_helper_self) _hs_reach_own(&r, hs_rd(_hs_helper_self + 8));
  _hs_reach_finish(&r);
  if (r.pagemap >= 0) close(r.pagemap);
  if (r.late) {
    reach_why(rec, "the marking took longer than 20 s and was given up");
    rec->reach_ns = _hs_now_ns() - r0;
    return;
  }
  rec->status = 0;
  rec->workers = (uint64_t)marked_by;
  rec->root_bytes = r.root_bytes - skipped;
  rec->n_blocks = n;
  memcpy(rec->bytes, r.bytes, sizeof rec->bytes);
  memcpy(rec->blocks, r.blocks, sizeof rec->blocks);
  uint64_t unreached = r.blocks[HS_REACH_LOST] + r.blocks[HS_REACH_POSSIBLE] +
                       r.blocks[HS_REACH_INDIRECT];
  uint64_t listed = unreached < HS_REACH_LISTED ? unreached : HS_REACH_LISTED;
  *list = listed ? _hs_copy_map(listed * sizeof(hs_map_block_t), 0) : NULL;
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
void _hs_roots_other_blocks(child_t *c, hs_map_reach_t *rec) {
  if (_hs_blockmap_incomplete()) {
    reach_why(rec, "the record of the blocks is not whole (a bitmap could not be made: an "
                   "address-space limit, ulimit -v, leaves none to reserve)");
    return;
  }
  uint64_t live = _hs_copy_live_blocks, cap = 1024 + live + live / 8;
  c->chunks = _hs_copy_map(cap * sizeof(hs_chunk_t), 0);
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
