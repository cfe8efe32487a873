/* reach.c: which of the heap's blocks the program can still reach, in the heap map's copy.
 *
 * The copy (heapmap.c) lists every in-use block (glibc's chunks in its heaps, and its
 * mmapped chunks) as user-byte ranges, sorts them, and hands over the roots: the program's
 * writable memory that is not a heap block (the objects' .data and .bss, the anonymous
 * mappings after them, every thread's stack and TLS; heapsight's own memory left out).
 * Marking is conservative, as memcheck's leak check and LeakSanitizer's: any aligned word
 * whose value lies in a block's usable bytes is taken for a pointer to it. A word equal to
 * the block's first byte is a start pointer, any other an interior pointer. The classes
 * are memcheck's:
 *   reachable        a chain of start pointers from a root ("still reachable");
 *   possible         reached from the roots only through an interior pointer somewhere on
 *                    the way ("possibly lost");
 *   lost             no pointer from the roots nor from a reached block ("definitely
 *                    lost"): the head of a lost structure;
 *   indirect         unreached, but pointed to (start or interior) by a lost block
 *                    ("indirectly lost").
 * The heads are found as memcheck finds them: unreached blocks in address order, each one
 * not yet taken is a head whose pointers take what they reach; a head reached from a later
 * one becomes part of it (a cycle keeps one head).
 *
 * Unreached blocks left after the heads are found are the heads: the lost state is the
 * unreached one (0). Nothing here allocates, locks or calls into libc but memset, pread
 * (of /proc/self/pagemap, when given) and, at exit, the system calls that make and wait
 * for a second process: it runs in the copy. The
 * mark stack holds each block at most twice (possible, then reachable), so 2n entries. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hs_internal.h"

/* The last block in [a, b) whose lo <= w, if w is inside it (else -1). */
static inline int64_t search(const hs_reach_t *r, size_t a, size_t b, uint64_t w) {
  if (a >= b || r->chunks[a].lo > w) return -1;
  while (b - a > 1) {
    size_t mid = a + (b - a) / 2;
    if (r->chunks[mid].lo <= w) a = mid;
    else b = mid;
  }
  /* glibc: a heap chunk's usable bytes end in the next chunk's first word (hi is 8 past a
   * multiple of 16): a word equal to the next chunk's address is glibc's own pointer to
   * that chunk (a bin's, the top's), not one to this block. Not so under the others: an
   * 8-byte block of jemalloc's at a multiple of 16 ends there too, and a pointer to its
   * first byte is one (the rule took glibc's locale names for lost under jemalloc). */
  uint64_t hi = r->chunks[a].hi;
  if (r->glibc_chunks && (hi & 15) == 8 && w >= hi - 8) return -1;
  return w < hi ? (int64_t)a : -1;
}

/* The block holding the word w, or -1. With the index: the run (a few, searched), then
 * the bucket's blocks (one or two, most often); without it, every block. A binary search
 * over two million blocks was 37% of a run's time on perl holding a 1M-entry hash. */
static int64_t find(const hs_reach_t *r, uint64_t w) {
  if (w < r->lo || w >= r->hi) return -1;
  if (!r->runs) return search(r, 0, r->n, w);
  size_t a = 0, b = r->n_runs;
  while (b - a > 1) {
    size_t mid = a + (b - a) / 2;
    if (r->runs[mid].lo <= w) a = mid;
    else b = mid;
  }
  const hs_run_t *run = &r->runs[a];
  if (w < run->lo || w >= run->hi) return -1;
  const uint32_t *bk = r->buckets + run->bucket + ((w - run->lo) >> r->shift);
  /* the bucket's first block, to the next bucket's first (which may start in this one) */
  size_t end = (size_t)bk[1] + 1;
  return search(r, bk[0], end < run->end ? end : run->end, w);
}

/* Runs of blocks no gap this wide splits. */
#define HS_REACH_GAP_BYTES (64ull << 20)

static size_t count_runs(const hs_chunk_t *c, size_t n, uint64_t *span) {
  size_t runs = 0;
  *span = 0;
  for (size_t i = 0, first = 0; i < n; i++) {
    if (i + 1 == n || c[i + 1].lo - c[i].hi > HS_REACH_GAP_BYTES) {
      runs++;
      *span += c[i].hi - c[first].lo;
      first = i + 1;
    }
  }
  return runs;
}

/* The index's size for n sorted blocks (0: none worth making), and its bucket size: the
 * smallest power of two from 64 bytes that keeps the buckets to 2 per block. */
size_t _hs_reach_index_bytes(const hs_chunk_t *c, size_t n, unsigned *shift) {
  if (n < 64) return 0;
  uint64_t span;
  size_t runs = count_runs(c, n, &span);
  unsigned s = 6;
  while (s < 40 && (span >> s) + 2 * runs > 2 * (uint64_t)n) s++;
  *shift = s;
  size_t buckets = (size_t)(span >> s) + 2 * runs;
  return runs * sizeof(hs_run_t) + buckets * sizeof(uint32_t);
}

/* Builds the index in mem (_hs_reach_index_bytes of it), after _hs_reach_init. */
void _hs_reach_index(hs_reach_t *r, void *mem, unsigned shift) {
  const hs_chunk_t *c = r->chunks;
  uint64_t span;
  size_t runs = count_runs(c, r->n, &span);
  r->runs = mem;
  r->buckets = (uint32_t *)(r->runs + runs);
  r->shift = shift;
  r->n_runs = 0;
  uint32_t at = 0;
  for (size_t i = 0, first = 0; i < r->n; i++) {
    if (i + 1 < r->n && c[i + 1].lo - c[i].hi <= HS_REACH_GAP_BYTES) continue;
    hs_run_t *run = &r->runs[r->n_runs++];
    run->lo = c[first].lo;
    run->hi = c[i].hi;
    run->first = (uint32_t)first;
    run->end = (uint32_t)(i + 1);
    run->bucket = at;
    /* bucket k: the first block ending past lo + k << shift; one more at the end */
    size_t nb = run->hi > run->lo ? (size_t)((run->hi - 1 - run->lo) >> shift) + 1 : 1, k = first;
    for (size_t b = 0; b <= nb; b++) {
      uint64_t start = run->lo + ((uint64_t)b << shift);
      while (k <= i && c[k].hi <= start) k++;
      r->buckets[at++] = (uint32_t)k;
    }
    first = i + 1;
  }
}

void _hs_reach_init(hs_reach_t *r, hs_chunk_t *chunks, size_t n, uint8_t *state, uint32_t *stack) {
  memset(r, 0, sizeof *r);
  r->pagemap = -1;
  r->chunks = chunks;
  r->n = n;
  r->state = state;
  r->stack = stack;
  memset(state, HS_REACH_UNREACHED, n);
  if (n) {
    r->lo = chunks[0].lo;
    r->hi = chunks[n - 1].hi;
  }
}

/* What block i becomes when reached through a start pointer from a reachable place
 * (definite) or not; its state as it was when it would not change. */
static inline uint8_t raised(uint8_t s, int definite) {
  if (s == HS_REACH_OWN) return s; /* heapsight's, wherever a pointer to it is */
  if (definite) return HS_REACH_REACHABLE;
  return s == HS_REACH_UNREACHED ? HS_REACH_POSSIBLE : s;
}

static void maybe_give(hs_reach_t *r);

/* Block i reached: pushed each time its state rises (at most twice: possible, then
 * reachable). While two processes mark, the rise is a compare-and-swap on the shared
 * states, so that each rise is pushed by exactly one of them. */
static void reached(hs_reach_t *r, size_t i, int definite) {
  uint8_t s = r->pool ? __atomic_load_n(&r->state[i], __ATOMIC_RELAXED) : r->state[i], to;
  for (;;) {
    to = raised(s, definite);
    if (to == s) return;
    if (!r->pool) {
      r->state[i] = to;
      break;
    }
    if (__atomic_compare_exchange_n(&r->state[i], &s, to, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      break;
  }
  r->stack[r->top++] = (uint32_t)i;
  if (r->pool) maybe_give(r); /* inside a large block's scan too (perl's 8 MB hash array) */
}

/* Past the deadline every scan stops at once (r->late): the figures are then not given. */
static int late(hs_reach_t *r, uint64_t words) {
  r->words += words;
  if (r->words - r->checked < (1u << 20)) return r->late;
  r->checked = r->words;
  if (r->deadline_ns && _hs_now_ns() > r->deadline_ns) r->late = 1;
  return r->late;
}

/* The range of sorted, disjoint ranges [0, n) holding a, or NULL. */
static const hs_chunk_t *range_of(const hs_chunk_t *v, size_t n, uint64_t a) {
  size_t i = hs_first_past(v, n, a);
  return i < n && a >= v[i].lo ? &v[i] : NULL;
}

static inline uint64_t word_at(uint64_t a) { return *(const volatile uint64_t *)(uintptr_t)a; }

/* memcheck's test of a vtable: p (aligned, past page 0) in a readable file mapping, where
 * the first words (up to 20, NULLs skipped) hold two pointers into executable file
 * mappings before anything else. */
static int is_vtable(const hs_reach_t *r, uint64_t p) {
  if ((p & 7) || p < 4096) return 0;
  const hs_chunk_t *m = range_of(r->rfile, r->n_rfile, p);
  if (!m) return 0;
  int fns = 0;
  for (uint64_t a = p; a + 8 <= m->hi && a < p + 20 * 8; a += 8) {
    uint64_t f = word_at(a);
    if (!f) continue;
    if (!range_of(r->xfile, r->n_xfile, f)) return 0;
    if (++fns == 2) return 1;
  }
  return 0;
}

/* A block the dynamic loader over-aligned by hand, from a pointer in the loader's own data
 * (scanned as root HS_ROOT_LOADER): malloc'd, a pointer aligned up inside it kept, the
 * block's start (what free needs) stored beside that pointer, in the word before it or in
 * one of the two at it. glibc's loader keeps its _dl_find_object segments so (dlopen makes
 * them: malloc, the pointer aligned up to 128 bytes, the start in the segment's second
 * word, _dlfo_loaded_mappings in ld.so's .bss the only pointer): they read possibly lost
 * in 7 layouts of 8 (2,312 bytes in python3 with extension modules), memcheck's too. Not
 * one of memcheck's heuristics: its reading of such a block depends on where malloc put
 * it. Only the loader's: taken from any root, it also took mawk's 2,048-byte block that
 * memcheck calls possibly lost for reachable. */
static int kept_start(uint64_t lo, uint64_t usable, uint64_t w) {
  if ((w & 31) || w <= lo) return 0;
  for (uint64_t a = w - 8; a <= w + 8; a += 8)
    if (a >= lo && a + 8 <= lo + usable && word_at(a) == lo) return 1;
  return 0;
}

#define HS_ROOT_LOADER 2 /* a root word of the loader's data (definite, and kept_start) */

/* Whether an interior pointer w into block j is one memcheck's leak check takes for a start
 * pointer (--leak-check-heuristics, all of them by default; its classes are the
 * reference): a block of C++'s new[] of a type with a destructor, pointed to 8 past its
 * start, where the element count is (newarray); a length stored before the data, SQLite's
 * allocator's (length64); a C++ object reached through a base class after its first: the
 * word pointed at and the block's first word both vtables (multipleinheritance). The
 * requested size memcheck tests against is not known here, the usable size is: it may
 * exceed it by the allocator's rounding (glibc: less than 24 bytes). A C++ program keeping
 * 100 arrays of new Foo[1000] and 100 objects by their second base read possibly lost,
 * memcheck still reachable. */
static int heuristic_start(const hs_reach_t *r, size_t j, uint64_t w) {
  uint64_t lo = r->chunks[j].lo, usable = r->chunks[j].hi - lo;
  if ((w & 7) || (lo & 7) || usable < 16) return 0;
  if (w == lo + 8) {
    uint64_t first = word_at(lo);
    if (first && first <= usable - 8) {
      if (first + 8 + 24 > usable) return 1;                  /* length64 */
      uint64_t each = (usable - 8) / first;                   /* newarray */
      if (8 + first * each + 24 > usable) return 1;
    }
  }
  return r->n_xfile && is_vtable(r, word_at(w)) && is_vtable(r, word_at(lo));
}

/* A thread's DTV, from its descriptor: glibc callocs each thread's dynamic thread vector
 * and keeps in the thread's TCB (x86_64's tcbhead_t: tcb, dtv, self, at the thread
 * pointer) only a pointer 16 bytes past its start (its first entry holds the length). The
 * TCB is told by its first and third words, both its own address. Found at a (in [lo, hi),
 * the range scanned): the descriptors of live threads on their stacks, and of ended ones
 * in glibc's cache of stacks. memcheck calls the live threads' DTVs possibly lost (a
 * false positive that projects suppress) and never sees the cached ones (its freeres frees
 * them); python3 whose four threads had ended read "possibly lost 920 B (3 blocks)". */
static int tcb_dtv(uint64_t blo, uint64_t w, uint64_t a, uint64_t lo, uint64_t hi) {
  if (w != blo + 16 || a < lo + 8 || a + 16 > hi) return 0;
  uint64_t tcb = a - 8;
  return word_at(tcb) == tcb && word_at(a + 8) == tcb;
}

/* A pointer w (at a, in the range [lo, hi) scanned) into block j from a place reached by
 * start pointers (definite): a start pointer, or an interior one memcheck's heuristics
 * take for one, or a thread descriptor's or the loader's own. */
static inline int start_pointer(const hs_reach_t *r, size_t j, uint64_t w, int definite,
                                uint64_t a, uint64_t lo, uint64_t hi) {
  if (!definite) return 0;
  uint64_t blo = r->chunks[j].lo;
  return w == blo || heuristic_start(r, j, w) || tcb_dtv(blo, w, a, lo, hi) ||
         (definite == HS_ROOT_LOADER && kept_start(blo, r->chunks[j].hi - blo, w));
}

/* The words of [lo, hi) (8-aligned), each looked up. */
static void scan_range(hs_reach_t *r, uint64_t lo, uint64_t hi, int definite) {
  if (hi <= lo || late(r, (hi - lo) / 8)) return;
  /* most words point nowhere in the heap (zeros, numbers, text): four at a time, each
   * tested with one subtraction against the blocks' whole range, before any is looked up */
  const uint64_t base = r->lo, span = r->hi - r->lo;
  uint64_t at = lo;
  for (; at + 32 <= hi; at += 32) {
    const volatile uint64_t *q = (const volatile uint64_t *)(uintptr_t)at;
    uint64_t w0 = q[0], w1 = q[1], w2 = q[2], w3 = q[3];
    if ((w0 - base >= span) & (w1 - base >= span) & (w2 - base >= span) & (w3 - base >= span))
      continue;
    uint64_t ws[4] = {w0, w1, w2, w3};
    for (int k = 0; k < 4; k++) {
      int64_t j = find(r, ws[k]);
      if (j >= 0)
        reached(r, (size_t)j, start_pointer(r, (size_t)j, ws[k], definite, at + 8 * (uint64_t)k, lo, hi));
    }
  }
  for (; at + 8 <= hi; at += 8) {
    uint64_t w = *(const volatile uint64_t *)(uintptr_t)at;
    int64_t j = find(r, w);
    if (j >= 0) reached(r, (size_t)j, start_pointer(r, (size_t)j, w, definite, at, lo, hi));
  }
}

/* fn on each run of [lo, hi) whose pages are present or swapped (/proc/self/pagemap, pm,
 * read into buf, entries at a time), and on all the rest from where pagemap cannot be
 * read: a page never touched holds zeros (anonymous memory) or the file's bytes, no
 * pointer of this run's. The sum of what fn returns. */
uint64_t _hs_resident_runs(int pm, uint64_t *buf, size_t entries, uint64_t page, uint64_t lo,
                           uint64_t hi, uint64_t (*fn)(void *ctx, uint64_t lo, uint64_t hi),
                           void *ctx) {
  uint64_t sum = 0, run_lo = 0;
  int in_run = 0;
  for (uint64_t pg = lo & ~(page - 1); pg < hi;) {
    uint64_t n = (hi - pg + page - 1) / page;
    if (n > entries) n = entries;
    ssize_t got = pread(pm, buf, n * 8, (off_t)(pg / page * 8));
    if (got <= 0) /* not known: every page taken */
      return sum + fn(ctx, in_run ? run_lo : (pg > lo ? pg : lo), hi);
    n = (uint64_t)got / 8;
    for (uint64_t k = 0; k < n; k++, pg += page) {
      int here = (buf[k] >> 62) != 0; /* present (63) or swapped (62) */
      if (here && !in_run) { run_lo = pg > lo ? pg : lo; in_run = 1; }
      if (!here && in_run) { sum += fn(ctx, run_lo, pg); in_run = 0; }
    }
  }
  return in_run ? sum + fn(ctx, run_lo, hi) : sum;
}

typedef struct { hs_reach_t *r; int definite; } words_t;
static uint64_t words_run(void *ctx, uint64_t lo, uint64_t hi) {
  words_t *w = ctx;
  scan_range(w->r, lo, hi, w->definite);
  return 0;
}

/* A block's words. A large one's pages never touched are not read (xz -9 allocates 674
 * MiB and touches a part; reading the rest cost the copy a fault and a scan per page). */
static void scan_words(hs_reach_t *r, uint64_t lo, uint64_t hi, int definite) {
  lo = (lo + 7) & ~(uint64_t)7;
  if (hi <= lo) return;
  if (r->pagemap < 0 || hi - lo < HS_REACH_SPARSE_BYTES) {
    scan_range(r, lo, hi, definite);
    return;
  }
  words_t w = {r, definite};
  _hs_resident_runs(r->pagemap, r->pm_buf, HS_REACH_PM_ENTRIES, r->page, lo, hi, words_run, &w);
}

static void drain(hs_reach_t *r) {
  while (r->top && !r->late) {
    size_t i = r->stack[--r->top];
    scan_words(r, r->chunks[i].lo, r->chunks[i].hi, r->state[i] == HS_REACH_REACHABLE);
  }
}

void _hs_reach_root(hs_reach_t *r, uint64_t lo, uint64_t hi) {
  r->root_bytes += hi > lo ? hi - lo : 0;
  scan_words(r, lo, hi, r->loader_root ? HS_ROOT_LOADER : 1);
  if (!r->defer) drain(r);
}

/* ---- two processes marking, at exit ----
 * Once the program is gone both cores are free, and the marking is most of the exit's copy
 * (perl holding a 1.5M-entry hash: 205 ms of 295). The roots are scanned first, pushing
 * what they reach (r->defer); then the copy makes a second process that shares its memory
 * (helper_main), and both drain: the states rise by compare-and-swap, each process has its
 * own mark stack, and work moves between them through the pool:
 * a process gives half its stack (a share at most) when the other waits, or a share when
 * it has two and the pool is low, and one with none takes a share. A large block is
 * scanned in pieces, and the half not yet scanned goes to the pool when the other waits
 * (perl's 1M-entry hash array: 1M lookups in one block, 100 ms that the other process
 * waited through). They are done when both wait and the pool is empty. The classes are
 * those of one process: each block's final state is the same fixpoint (a block is scanned
 * after each rise of its state, by whichever process raised it). */
#define HS_REACH_SHARE 1024
#define HS_REACH_POOL_ITEMS (16 * HS_REACH_SHARE)
#define HS_REACH_POOL_RANGES 64
#define HS_REACH_PIECE_BYTES (64u << 10)
typedef struct { uint64_t lo, hi, definite; } hs_reach_range_t;
struct hs_reach_pool_s {
  int lock, idle, workers, late;
  int child; /* the second process, as its parent knows it (0 in the child) */
  uint32_t count, n_ranges;
  uint32_t items[HS_REACH_POOL_ITEMS];
  hs_reach_range_t ranges[HS_REACH_POOL_RANGES];
};

static void pool_lock(struct hs_reach_pool_s *p) {
  while (__atomic_exchange_n(&p->lock, 1, __ATOMIC_ACQUIRE))
    while (__atomic_load_n(&p->lock, __ATOMIC_RELAXED)) __builtin_ia32_pause();
}

static void pool_unlock(struct hs_reach_pool_s *p) { __atomic_store_n(&p->lock, 0, __ATOMIC_RELEASE); }

/* The top of r's stack into the pool: half of it, at most a share, as much as the pool has
 * room for. */
static void give(hs_reach_t *r) {
  struct hs_reach_pool_s *p = r->pool;
  pool_lock(p);
  uint32_t n = HS_REACH_POOL_ITEMS - p->count, half = (uint32_t)(r->top / 2);
  n = n < half ? n : half;
  n = n < HS_REACH_SHARE ? n : HS_REACH_SHARE;
  memcpy(p->items + p->count, r->stack + r->top - n, n * sizeof(uint32_t));
  p->count += n;
  r->top -= n;
  pool_unlock(p);
}

/* To a process waiting for work at once; else a share, kept in the pool for later. */
static void maybe_give(hs_reach_t *r) {
  struct hs_reach_pool_s *p = r->pool;
  if (__atomic_load_n(&p->count, __ATOMIC_RELAXED) < HS_REACH_SHARE &&
      r->top >= (__atomic_load_n(&p->idle, __ATOMIC_RELAXED) ? 2u : 2u * HS_REACH_SHARE))
    give(r);
}

/* A block's words, in pieces: while the other process waits and the pool is empty, the
 * second half of what is left of a large block goes to the pool. */
static void scan_block(hs_reach_t *r, uint64_t lo, uint64_t hi, int definite) {
  struct hs_reach_pool_s *p = r->pool;
  while (hi - lo > HS_REACH_PIECE_BYTES && !r->late) {
    if (hi - lo >= 2 * HS_REACH_PIECE_BYTES && __atomic_load_n(&p->idle, __ATOMIC_RELAXED) &&
        !__atomic_load_n(&p->count, __ATOMIC_RELAXED) &&
        __atomic_load_n(&p->n_ranges, __ATOMIC_RELAXED) < HS_REACH_POOL_RANGES) {
      uint64_t mid = (lo + (hi - lo) / 2) & ~(uint64_t)7;
      pool_lock(p);
      if (p->n_ranges < HS_REACH_POOL_RANGES) {
        p->ranges[p->n_ranges++] = (hs_reach_range_t){mid, hi, (uint64_t)definite};
        hi = mid;
      }
      pool_unlock(p);
    }
    scan_words(r, lo, lo + HS_REACH_PIECE_BYTES, definite);
    lo += HS_REACH_PIECE_BYTES;
  }
  scan_words(r, lo, hi, definite);
}

/* Work from the pool, under the lock: a share onto r's empty stack (1), a piece of a block
 * into *range (2), or none (0). */
static int take_locked(hs_reach_t *r, hs_reach_range_t *range) {
  struct hs_reach_pool_s *p = r->pool;
  if (p->n_ranges) {
    *range = p->ranges[--p->n_ranges];
    return 2;
  }
  uint32_t n = p->count < HS_REACH_SHARE ? p->count : HS_REACH_SHARE;
  if (!n) return 0;
  p->count -= n;
  memcpy(r->stack, p->items + p->count, n * sizeof(uint32_t));
  r->top = n;
  return 1;
}

static int past_deadline(const hs_reach_t *r) {
  return r->deadline_ns && _hs_now_ns() > r->deadline_ns;
}

/* Whether the second process ended (killed: its work is lost), left unreaped. */
static int gone(int pid) {
  siginfo_t info;
  memset(&info, 0, sizeof info);
  return pid > 0 && syscall(SYS_waitid, P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT | __WALL, NULL) == 0 &&
         info.si_pid == pid;
}

/* Work for r, which has none: 1 with a share on its stack or a piece of a block scanned;
 * 0 when every process waits and the pool is empty (nothing is left: only a process with
 * work fills the pool), or one is late. */
static int take(hs_reach_t *r) {
  struct hs_reach_pool_s *p = r->pool;
  hs_reach_range_t range;
  pool_lock(p);
  int got = take_locked(r, &range);
  if (!got) p->idle++;
  pool_unlock(p);
  for (unsigned spins = 0; !got; spins++) {
    if (__atomic_load_n(&p->late, __ATOMIC_RELAXED)) return 0;
    if (__atomic_load_n(&p->count, __ATOMIC_RELAXED) || __atomic_load_n(&p->n_ranges, __ATOMIC_RELAXED)) {
      pool_lock(p);
      if ((got = take_locked(r, &range))) p->idle--;
      pool_unlock(p);
    } else if (__atomic_load_n(&p->idle, __ATOMIC_RELAXED) == p->workers) {
      return 0;
    } else if (spins % 64 == 63) {
      syscall(SYS_sched_yield); /* the other may be off its core (a loaded machine) */
      if (spins % 4096 == 4095 && (past_deadline(r) || gone(p->child))) {
        __atomic_store_n(&p->late, 1, __ATOMIC_RELAXED); /* the marks are not whole */
        return 0;
      }
    } else {
      __builtin_ia32_pause();
    }
  }
  if (got == 2) scan_block(r, range.lo, range.hi, (int)range.definite);
  return 1;
}

static void drain_shared(hs_reach_t *r) {
  struct hs_reach_pool_s *p = r->pool;
  do {
    while (r->top && !r->late) {
      size_t i = r->stack[--r->top];
      int definite = __atomic_load_n(&r->state[i], __ATOMIC_RELAXED) == HS_REACH_REACHABLE;
      scan_block(r, r->chunks[i].lo, r->chunks[i].hi, definite);
      maybe_give(r);
      if (__atomic_load_n(&p->late, __ATOMIC_RELAXED)) r->late = 1;
    }
    if (r->late) {
      __atomic_store_n(&p->late, 1, __ATOMIC_RELAXED);
      return;
    }
  } while (take(r));
}

/* The second marker: a process that shares the copy's memory (clone with CLONE_VM, on a
 * stack of its own; its hs_reach_t, mark stack and pagemap buffer are its own, after the
 * pool). It was a fork of the copy: the fork copied the page tables of the whole program
 * (10 ms for perl's 500 MiB heap, during which the copy waited), and the second process
 * then paid again for the first touch of every page it read (0.5 us a page on this VM: a
 * forked process's page table entries start old). */
typedef struct {
  hs_reach_t r;
  pid_t parent;
} helper_t;
#define HS_REACH_HELPER_STACK (256u << 10)

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t _hs_reach_pool_bytes(size_t n) {
  return align64(sizeof(struct hs_reach_pool_s)) + align64(sizeof(helper_t)) +
         align64((2 * n + 1) * sizeof(uint32_t)) + HS_REACH_PM_ENTRIES * 8 + HS_REACH_HELPER_STACK;
}

static int helper_main(void *arg) {
  helper_t *h = arg;
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0); /* the copy ended (its time limit): so does this */
  if (getppid() != h->parent) return 2;
  drain_shared(&h->r);
  return h->r.late ? 1 : 0;
}

/* What the roots pushed (r->defer), drained by two processes when pool (zeroed,
 * _hs_reach_pool_bytes(r->n)) is given and a second one can be made, else by this one.
 * The processes that marked (1 or 2), or 0 when the second one failed (the marks are then
 * not whole). */
int _hs_reach_workers(hs_reach_t *r, struct hs_reach_pool_s *pool) {
  r->defer = 0;
  if (!pool) {
    drain(r);
    return 1;
  }
  pool->workers = 2;
  r->pool = pool;
  char *at = (char *)pool + align64(sizeof *pool);
  helper_t *h = (helper_t *)at;
  at += align64(sizeof *h);
  h->r = *r;
  h->r.top = 0;
  h->r.words = h->r.checked = 0;
  h->r.stack = (uint32_t *)at;
  at += align64((2 * r->n + 1) * sizeof(uint32_t));
  h->r.pm_buf = r->pm_buf ? (uint64_t *)at : NULL;
  at += HS_REACH_PM_ENTRIES * 8;
  h->parent = getpid();
  /* no exit signal (the program's SIGCHLD handler is the copy's too), no fork handlers of
   * the program's; the stack grows down from the region's end */
  pid_t pid = clone(helper_main, at + HS_REACH_HELPER_STACK, CLONE_VM, h);
  if (pid < 0) pool->workers = 1; /* no second process: this one alone */
  else __atomic_store_n(&pool->child, pid, __ATOMIC_RELAXED);
  drain_shared(r);
  r->pool = NULL;
  if (__atomic_load_n(&pool->late, __ATOMIC_RELAXED)) r->late = 1; /* the other one was late */
  if (pid < 0) return 1;
  int status = 0;
  while (syscall(SYS_wait4, pid, &status, __WALL, NULL) < 0 && errno == EINTR) {}
  return WIFEXITED(status) && WEXITSTATUS(status) <= 1 ? 2 : 0;
}

/* Blocks of heapsight's own that the program's data points to (what its start-up's dlopen
 * of the unwinder left in the heap: the loader's records, in the loader's list of objects),
 * before the roots: each is out of every class, wherever a pointer to it is, and what it
 * points to is reached as from a root. The loader's list runs through them: the records of
 * every library the program loads later (python3's extension modules) hang after the
 * unwinder's, and are the program's, reachable (taking them as heapsight's with the rest
 * of what they reach left 66 of python3's 96 blocks out of every class). */
void _hs_reach_own_roots(hs_reach_t *r, const uint64_t *addrs, size_t n) {
  drain(r);
  int64_t found[64];
  size_t k = 0;
  for (size_t i = 0; i < n && k < 64; i++) {
    int64_t j = find(r, addrs[i]);
    if (j < 0 || r->state[j] != HS_REACH_UNREACHED) continue;
    r->state[j] = HS_REACH_OWN;
    found[k++] = j;
  }
  for (size_t i = 0; i < k; i++) scan_words(r, r->chunks[found[i]].lo, r->chunks[found[i]].hi, 1);
  if (!r->defer) drain(r);
}

/* A block of heapsight's own, found by an address inside it, and what only it reaches:
 * left out of every class. Its thread's DTV (which glibc allocated for it) after the roots,
 * so that nothing the program reaches is taken; the copy library's link map (attach's copy)
 * before them, so that the loader's pointers do not make its records the program's. */
void _hs_reach_own(hs_reach_t *r, uint64_t addr) {
  drain(r);
  int64_t i = find(r, addr);
  if (i < 0 || r->state[i] != HS_REACH_UNREACHED) return;
  r->state[i] = HS_REACH_OWN;
  r->stack[r->top++] = (uint32_t)i;
  while (r->top) {
    size_t k = r->stack[--r->top];
    uint64_t lo = (r->chunks[k].lo + 7) & ~(uint64_t)7;
    for (uint64_t at = lo; at + 8 <= r->chunks[k].hi; at += 8) {
      int64_t j = find(r, *(const volatile uint64_t *)(uintptr_t)at);
      if (j >= 0 && r->state[j] == HS_REACH_UNREACHED) {
        r->state[j] = HS_REACH_OWN;
        r->stack[r->top++] = (uint32_t)j;
      }
    }
  }
}

/* The unreached blocks: heads (lost) and what they reach (indirect). */
void _hs_reach_finish(hs_reach_t *r) {
  drain(r);
  for (size_t head = 0; head < r->n; head++) {
    if (r->state[head] != HS_REACH_UNREACHED) continue;
    r->state[head] = HS_REACH_LOST;
    r->stack[r->top++] = (uint32_t)head;
    while (r->top) {
      size_t i = r->stack[--r->top];
      if (late(r, (r->chunks[i].hi - r->chunks[i].lo) / 8)) {
        r->top = 0;
        return;
      }
      uint64_t lo = (r->chunks[i].lo + 7) & ~(uint64_t)7;
      for (uint64_t at = lo; at + 8 <= r->chunks[i].hi; at += 8) {
        int64_t j = find(r, *(const volatile uint64_t *)(uintptr_t)at);
        if (j < 0 || (size_t)j == head) continue;
        uint8_t s = r->state[j];
        if (s == HS_REACH_UNREACHED || s == HS_REACH_LOST) { /* an earlier head: taken in */
          r->state[j] = HS_REACH_INDIRECT;
          r->stack[r->top++] = (uint32_t)j;
        }
      }
    }
  }
  memset(r->bytes, 0, sizeof r->bytes);
  memset(r->blocks, 0, sizeof r->blocks);
  for (size_t i = 0; i < r->n; i++) {
    if (r->state[i] == HS_REACH_OWN) continue;
    r->bytes[r->state[i]] += r->chunks[i].hi - r->chunks[i].lo;
    r->blocks[r->state[i]]++;
  }
}

/* Sorts blocks by address, in place (heapsort: no allocation, no recursion). */
static void sift(hs_chunk_t *a, size_t i, size_t n) {
  for (;;) {
    size_t big = i, l = 2 * i + 1, rt = l + 1;
    if (l < n && a[l].lo > a[big].lo) big = l;
    if (rt < n && a[rt].lo > a[big].lo) big = rt;
    if (big == i) return;
    hs_chunk_t t = a[i];
    a[i] = a[big];
    a[big] = t;
    i = big;
  }
}

void _hs_reach_sort(hs_chunk_t *a, size_t n) {
  int sorted = 1;
  for (size_t i = 1; i < n && sorted; i++) sorted = a[i - 1].lo <= a[i].lo;
  if (sorted) return;
  for (size_t i = n / 2; i-- > 0;) sift(a, i, n);
  for (size_t end = n; end-- > 1;) {
    hs_chunk_t t = a[0];
    a[0] = a[end];
    a[end] = t;
    sift(a, 0, end);
  }
}
