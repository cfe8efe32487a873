/* profile.c: sampled call sites. Allocations are sampled by usable bytes, a Poisson process
 * of mean M (HEAPSIGHT_SAMPLE_BYTES): each thread counts down an exponentially drawn
 * number of bytes (hs_slot_t.sample_left: the hot path's own countdown, `left`, runs out no
 * later than it would, and its slow path takes the bytes off it) and the allocation that
 * crosses zero is sampled, so a block of s bytes is sampled with probability 1 - exp(-s/M)
 * whatever came before it. A sample unwinds the stack, stores it once (deduplicated), and
 * appends an ALLOC event to the segment's profile; the free of a sampled block appends a
 * FREE event naming it. The owner process only; nothing here calls malloc.
 *
 * The unwinder is libgcc's _Unwind_Backtrace (.eh_frame, DWARF CFI: Debian's binaries have
 * no frame pointers). bench/unwind measures it against libunwind's unw_backtrace, and
 * libunwind is faster per stack once warm (0.3-0.8 us against 2.8-4.5 us in perl and
 * python3; libgcc works out every frame anew, about 200 ns or 2,000 instructions each),
 * but it buys that speed with a cache per thread that it fills in full on the thread's
 * first stack: 270 KiB of resident memory per sampling thread (bench/unwind: 64 threads,
 * +17 MiB), memory the program would be charged with. It also costs 0.3 ms on its first
 * stack, is a package the program may not have, and its 1.6 cache has known faults when
 * re-entered from a signal handler. libgcc is on every system (it is the C++ exception
 * unwinder), keeps no cache, and with glibc 2.35+ finds each frame's object with
 * _dl_find_object, which takes no lock. At the default mean it costs the churn bench about
 * 10 instructions per malloc/free pair (bench/overhead). It is found with dlsym in
 * libgcc_s itself: a libunwind loaded in the program exports _Unwind_Backtrace too.
 *
 * In a Python or Perl program, the interpreter's own frames (function, file, line: interp.c)
 * take the place of its loop's native frame in the stack, as tagged words naming records
 * in the stack region (heapsight.h: HS_IFRAME_TAG).
 *
 * Locks: one spin lock guards the private tables (live blocks, stacks) and the appends to
 * the profile. It is never held while unwinding or while the loader is asked anything, so
 * a thread inside the loader (dl_iterate_phdr's lock) that allocates cannot wait for us
 * while we wait for it. A thread that re-enters (a signal handler that allocates while its
 * thread samples) is counted but not sampled, and its frees are not matched while the lock
 * is held by its own thread. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <unwind.h>

#include "hs_internal.h"
#include "hs_math.h"
#include "hs_options.h"

HS_HIDDEN unsigned char _hs_sample_map[HS_SAMPLE_MAP_SIZE];

enum { P_UNSET, P_OFF, P_ON };
static int g_state;              /* P_*: until attach, nothing is decided */
static double g_mean;            /* M, bytes: the mean the sampling reaches */
/* Adaptive sampling (the default, when HEAPSIGHT_SAMPLE_BYTES is not set). The mean is
 * M / 2^level: it starts at HS_SAMPLE_START (level 5 for the default M = 512 KiB) and only
 * ever doubles (the level goes down by one), for either of two reasons:
 * - what is live: the sampled blocks still live that were drawn at the current level
 *   reach HS_LIVE_QUOTA. A level is left only once about HS_LIVE_QUOTA x its mean bytes
 *   are live, so the peak, the largest live set, keeps about HS_LIVE_QUOTA / 2 samples or
 *   more whatever was allocated and freed before it (the 95% error of an estimate of B bytes
 *   in small blocks is about 1.96 sqrt(mean / B) of B: 6% at 1,024 samples, 4.3% at 2,048).
 *   This stops at M. The count is kept under the lock, where a sample is recorded and where
 *   a sampled block's free is matched: nothing on the hot path.
 * - the room: churn costs samples (one per mean bytes allocated, freed or not) and room (two
 *   events each: the profile is a log, it never takes an event back), so each level may
 *   take at most half of the room left when it began (level_quota), the levels finer than
 *   M less the quarter kept for M and what comes after: in the default room 49,152 samples
 *   at 16 KiB (768 MiB allocated), 24,576 at 32 KiB (768 MiB)..., then about 9 GiB
 *   allocated at M. Past that, and only for this, the mean goes beyond M (negative levels),
 *   doubling every 9 GiB or so: the room never fills, where a fixed M drops every sample
 *   after 64 GiB.
 * The mean never refines: the peak is the largest live set, so a mean that coarsens with
 * what is live is never too coarse for it (a later, smaller live set has fewer samples, as
 * many as at M at the least while the room lasts); what makes it coarser than the live set
 * asks is churn of more than 768 MiB at a level, and a finer mean after it would take room
 * the program's further churn needs.
 * Each thread's countdown is drawn at the level current then (t_level), and its sample
 * carries that level (the event's kind, bits 8-15, signed): its inclusion probability is
 * 1 - exp(-size / (M / 2^level)), known when it was taken, and a level depends only on the
 * samples before it, so the estimates stay unbiased (docs/holders.md). */
#define HS_SAMPLE_START 16384.0
#define HS_LIVE_QUOTA 2048
#define HS_LEVEL_QUOTA_MIN 256  /* a level finer than M: its room share at the least */
#define HS_LEVEL_MIN (-24)      /* the coarsest: M x 2^24 */
#define HS_LEVEL_MAX 24         /* the finest (_hs_profile_setup) */
#define HS_NO_LEVEL 0x7fff
static int g_adaptive;           /* the mean was not given: it adapts */
static int g_level;              /* atomic */
static int64_t g_level_samples;  /* atomic: samples taken at g_level */
static int64_t g_level_quota;    /* atomic: the samples g_level may take (its room share) */
static uint32_t g_live_at[HS_LEVEL_MAX + 1]; /* under g_lock: recorded blocks live, by level */
static int g_shared_level;       /* the level of g_shared_left's countdown */
static HS_TLS int t_level = HS_NO_LEVEL; /* the level of this thread's countdown */
static int64_t g_shared_left = 0; /* the countdown of threads without a slot (atomic) */
static HS_TLS uint64_t t_rng;    /* xorshift64 state, 0 until seeded */
static HS_TLS int t_sampling;    /* inside a sample: allocations here are not sampled */
static HS_TLS int t_locked;      /* this thread holds g_lock, or is taking it */
static int g_lock;

/* The unwinder (resolved by the constructor: until then samples have the empty stack). */
typedef _Unwind_Reason_Code (*hs_backtrace_fn)(_Unwind_Trace_Fn, void *);
typedef _Unwind_Ptr (*hs_getipinfo_fn)(struct _Unwind_Context *, int *);
static hs_backtrace_fn g_backtrace;
static hs_getipinfo_fn g_getipinfo;
static int g_unwinder_ready;
static uintptr_t g_self_lo, g_self_hi; /* this library: its frames are left out */
static uintptr_t g_gcc_lo, g_gcc_hi;   /* libgcc_s: a malloc it makes is not unwound */

/* Objects by address: _dl_find_object (glibc 2.35+, no lock), else dl_iterate_phdr. */
typedef int (*hs_find_object_fn)(void *, struct dl_find_object *);
static hs_find_object_fn g_find_object;
static char g_exe[sizeof ((hs_module_t *)0)->path]; /* /proc/self/exe, its last bytes */
static uintptr_t g_vdso;

/* Pages known to lie in a recorded module (page number + 1; 0 empty), and the modules a
 * dlclose has unloaded since they were recorded (their ranges no longer count). */
#define HS_PAGE_CACHE 1024
static uint64_t g_known_pages[HS_PAGE_CACHE];
static unsigned char g_dead[HS_PROFILE_ROOM_MAX * HS_PROFILE_MODULES_UNIT];
/* The profile's tables and their room, from the segment file's size (_hs_profile_setup). */
static hs_event_t *g_events;
static uint64_t *g_words;
static hs_module_t *g_modules;
static uint64_t g_events_cap, g_words_cap, g_modules_cap;
static unsigned g_dlclose_gen, g_dlclose_seen;
static int g_revalidating;

/* ---- private tables, in mmapped memory that grows (never malloc) ---- */
typedef struct { uint64_t key, val; } hs_entry_t;
typedef struct { hs_entry_t *e; uint64_t cap, used; } hs_table_t;
static hs_table_t g_live;   /* block address -> its ALLOC event's index */
static hs_table_t g_stacks; /* stack hash -> word offset (val), several per hash allowed */
static hs_table_t g_irecs;  /* interpreter frame hash -> its record's word offset, likewise */
static int g_full;          /* a region filled up: record no more ALLOCs */

/* The system calls themselves, not the mmap hooks (mappings.c): those call dladdr, which
 * takes the loader's lock, and this runs under g_lock (a thread inside dlopen may be
 * waiting for g_lock); and they would record heapsight's tables as the program's. */
void *_hs_raw_mmap(size_t bytes) {
  if (__atomic_load_n(&_hs_seccomp, __ATOMIC_RELAXED)) return NULL; /* a filter may forbid it */
  long r = syscall(SYS_mmap, NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  return r < 0 && r > -4096 ? NULL : (void *)r;
}

/* heapsight's own memory in the program (reach.c must not take it for roots): the
 * tables' mappings. Read in the heap map's copy, where nothing changes them. */
size_t _hs_profile_own(hs_chunk_t *out, size_t max) {
  size_t n = 0;
  const hs_table_t *t[3] = {&g_live, &g_stacks, &g_irecs};
  for (int i = 0; i < 3 && n < max; i++) {
    if (t[i]->e)
      out[n++] = (hs_chunk_t){(uint64_t)(uintptr_t)t[i]->e,
                              (uint64_t)(uintptr_t)t[i]->e + t[i]->cap * sizeof(hs_entry_t)};
  }
  return n + _hs_unwind_own(out + n, max - n);
}

static int table_grow(hs_table_t *t) {
  uint64_t cap = t->cap ? t->cap * 2 : 1024;
  void *m = _hs_raw_mmap(cap * sizeof(hs_entry_t));
  if (!m) return 0;
  _hs_own_memory((int64_t)((cap - t->cap) * sizeof(hs_entry_t))); /* the old one goes below */
  hs_entry_t *e = m;
  for (uint64_t i = 0; i < t->cap; i++) {
    if (!t->e[i].key) continue;
    uint64_t j = mix64(t->e[i].key) & (cap - 1);
    while (e[j].key) j = (j + 1) & (cap - 1);
    e[j] = t->e[i];
  }
  if (t->e) syscall(SYS_munmap, t->e, t->cap * sizeof(hs_entry_t));
  t->e = e;
  t->cap = cap;
  return 1;
}

/* Room for one more entry at a load of at most 1/2. */
static int table_room(hs_table_t *t) {
  return (t->used + 1) * 2 <= t->cap || table_grow(t);
}

static void table_put(hs_table_t *t, uint64_t key, uint64_t val) {
  uint64_t j = mix64(key) & (t->cap - 1);
  while (t->e[j].key && t->e[j].key != key) j = (j + 1) & (t->cap - 1);
  if (!t->e[j].key) t->used++;
  t->e[j].key = key;
  t->e[j].val = val;
}

/* Removes key; returns its value + 1, or 0 when absent (linear probing, backward shift). */
static uint64_t table_take(hs_table_t *t, uint64_t key) {
  if (!t->cap) return 0;
  uint64_t mask = t->cap - 1, j = mix64(key) & mask;
  while (t->e[j].key && t->e[j].key != key) j = (j + 1) & mask;
  if (!t->e[j].key) return 0;
  uint64_t val = t->e[j].val;
  for (uint64_t i = j, k = (j + 1) & mask;; k = (k + 1) & mask) {
    if (!t->e[k].key) { t->e[i].key = 0; break; }
    uint64_t home = mix64(t->e[k].key) & mask;
    /* move k back to the hole at i unless its home lies cyclically in (i, k] */
    if (i <= k ? (home <= i || home > k) : (home <= i && home > k)) {
      t->e[i] = t->e[k];
      i = k;
    }
  }
  t->used--;
  return val + 1;
}

/* t_locked is set before the lock is taken and cleared after it is let go: a signal
 * handler that allocates or frees on this thread meanwhile sees it, and neither samples
 * nor looks its block up (it would wait for a lock its own thread holds). */
static void lock(void) {
  __atomic_store_n(&t_locked, 1, __ATOMIC_RELAXED);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  while (__atomic_exchange_n(&g_lock, 1, __ATOMIC_ACQUIRE)) {
    while (__atomic_load_n(&g_lock, __ATOMIC_RELAXED)) sched_yield();
  }
}

static void unlock(void) {
  __atomic_store_n(&g_lock, 0, __ATOMIC_RELEASE);
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&t_locked, 0, __ATOMIC_RELAXED);
}

/* ---- the intervals ---- */
static uint64_t next_random(void) {
  uint64_t x = t_rng;
  if (HS_UNLIKELY(x == 0)) {
    static uint64_t salt;
    x = mix64(_hs_now_ns() ^ (uint64_t)(uintptr_t)&t_rng ^
              __atomic_add_fetch(&salt, 0x9e3779b97f4a7c15ull, __ATOMIC_RELAXED));
    if (!x) x = 1;
  }
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  t_rng = x;
  return x * 0x2545f4914f6cdd1dull;
}

/* The mean at a level: M / 2^level (a negative level: coarser than M). */
static double mean_at(int level) {
  return level >= 0 ? g_mean / (double)(1ull << level) : g_mean * (double)(1ull << -level);
}

/* A sample's level in its event's kind (bits 8-15, signed), and back. */
static inline uint32_t level_bits(int level) {
  return (uint32_t)(uint8_t)(int8_t)level << HS_EVENT_LEVEL_SHIFT;
}
static inline int kind_level(uint32_t kind) { return (int8_t)(uint8_t)(kind >> HS_EVENT_LEVEL_SHIFT); }

/* Bytes to the next sample: exponential of mean M / 2^level. */
static int64_t draw_at(int level) {
  double u = (double)((next_random() >> 11) + 1) * 0x1.0p-53; /* (0, 1] */
  double v = -hs_log(u) * mean_at(level);
  return v < 9.0e18 ? (int64_t)v : INT64_MAX;
}

static int64_t draw(void) {
  t_level = __atomic_load_n(&g_level, __ATOMIC_RELAXED);
  return draw_at(t_level);
}

/* The samples a level beginning now may take: half of the room left (two events a sample:
 * the ALLOC and the FREE; the FREEs of the blocks live now are kept room already), less,
 * for a level finer than M, the quarter of the room kept for M and coarser. */
static int64_t level_quota(int level) {
  int64_t left = (int64_t)g_events_cap -
                 (int64_t)__atomic_load_n(&_hs_seg->profile.events_used, __ATOMIC_RELAXED) -
                 (int64_t)__atomic_load_n(&g_live.used, __ATOMIC_RELAXED);
  if (level <= 0) return left / 4 > 1 ? left / 4 : 1;
  left -= (int64_t)(g_events_cap / 4);
  return left / 4 > HS_LEVEL_QUOTA_MIN ? left / 4 : HS_LEVEL_QUOTA_MIN;
}

/* The mean doubles: `level` ends, once (threads that find it over a quota race here). */
static void coarsen(int level) {
  int expect = level;
  if (level <= HS_LEVEL_MIN ||
      !__atomic_compare_exchange_n(&g_level, &expect, level - 1, 0, __ATOMIC_RELAXED,
                                   __ATOMIC_RELAXED))
    return;
  __atomic_store_n(&g_level_samples, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&g_level_quota, level_quota(level - 1), __ATOMIC_RELAXED);
}

/* A sample was taken at `level` (recorded or not): the level's room share. */
static void count_sample(int level) {
  if (!g_adaptive || level != __atomic_load_n(&g_level, __ATOMIC_RELAXED)) return;
  if (__atomic_add_fetch(&g_level_samples, 1, __ATOMIC_RELAXED) >=
      __atomic_load_n(&g_level_quota, __ATOMIC_RELAXED))
    coarsen(level);
}

/* Under the lock: a sampled block drawn at `level` was recorded (dir 1) or freed (-1); the
 * live set at the current level past its quota doubles the mean (down to M). */
static void count_live(int level, int dir) {
  if (level <= 0 || level > HS_LEVEL_MAX) return;
  if (dir < 0) {
    if (g_live_at[level]) g_live_at[level]--;
  } else if (++g_live_at[level] >= HS_LIVE_QUOTA && g_adaptive) {
    coarsen(level); /* nothing unless it is the current level */
  }
}

/* ---- modules ---- */
/* The program's own file as the profile's modules name it (/proc/self/exe), NULL before it
 * is known: mappings.c names the objects that map memory the same way, so that the two
 * meet (php started as "php" is /usr/bin/php8.2). */
const char *_hs_exe_path(void) { return g_exe[0] ? g_exe : NULL; }

static void keep_tail(char *dst, size_t size, const char *src) {
  size_t n = strlen(src), keep = n < size - 1 ? n : size - 1;
  memcpy(dst, src + n - keep, keep);
  dst[keep] = 0;
}

static void name_module(hs_module_t *m, const char *name) {
  if (g_vdso && g_vdso >= m->lo && g_vdso < m->hi) keep_tail(m->path, sizeof m->path, "[vdso]");
  else if (!name || !*name) memcpy(m->path, g_exe, sizeof m->path);
  else keep_tail(m->path, sizeof m->path, name);
}

struct hs_find { uintptr_t addr; hs_module_t *m; int found; };

static int find_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  struct hs_find *f = arg;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t a = info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
    if (a < lo) lo = a;
    if (b > hi) hi = b;
  }
  if (lo >= hi || f->addr < lo || f->addr >= hi) return 0;
  f->m->lo = lo;
  f->m->hi = hi;
  f->m->bias = info->dlpi_addr;
  name_module(f->m, info->dlpi_name);
  f->found = 1;
  return 1;
}

/* The loaded object holding addr, as a module entry (first_event not set). */
static int find_object(uintptr_t addr, hs_module_t *m) {
  memset(m, 0, sizeof *m);
  if (g_find_object) {
    struct dl_find_object r;
    if (g_find_object((void *)addr, &r) != 0 || !r.dlfo_link_map) return 0;
    m->lo = (uint64_t)(uintptr_t)r.dlfo_map_start;
    m->hi = (uint64_t)(uintptr_t)r.dlfo_map_end;
    m->bias = r.dlfo_link_map->l_addr;
    name_module(m, r.dlfo_link_map->l_name);
    return 1;
  }
  struct hs_find f = {addr, m, 0};
  dl_iterate_phdr(find_cb, &f);
  return f.found;
}

/* Whether a recorded, still loaded module holds addr (reads the profile: modules are
 * written once, before modules_used counts them). */
static int covered(hs_profile_t *pr, uintptr_t a) {
  uint64_t page = (a >> 12) + 1, *slot = &g_known_pages[mix64(page) & (HS_PAGE_CACHE - 1)];
  if (__atomic_load_n(slot, __ATOMIC_RELAXED) == page) return 1;
  uint64_t n = __atomic_load_n(&pr->modules_used, __ATOMIC_ACQUIRE);
  for (uint64_t i = 0; i < n; i++) {
    if (a >= g_modules[i].lo && a < g_modules[i].hi && !g_dead[i]) {
      __atomic_store_n(slot, page, __ATOMIC_RELAXED);
      return 1;
    }
  }
  return 0;
}

/* After a dlclose: modules that are gone (or reloaded elsewhere) no longer cover their
 * range, so a library later loaded there is recorded anew (first_event says from when). */
static void revalidate(hs_profile_t *pr) {
  unsigned gen = __atomic_load_n(&g_dlclose_gen, __ATOMIC_ACQUIRE);
  if (gen == __atomic_load_n(&g_dlclose_seen, __ATOMIC_RELAXED) ||
      __atomic_exchange_n(&g_revalidating, 1, __ATOMIC_ACQUIRE))
    return;
  __atomic_store_n(&g_dlclose_seen, gen, __ATOMIC_RELAXED);
  uint64_t n = __atomic_load_n(&pr->modules_used, __ATOMIC_ACQUIRE);
  for (uint64_t i = 0; i < n; i++) {
    hs_module_t now;
    if (g_dead[i]) continue;
    if (!find_object(g_modules[i].lo, &now) || now.lo != g_modules[i].lo ||
        now.bias != g_modules[i].bias)
      g_dead[i] = 1;
  }
  for (unsigned i = 0; i < HS_PAGE_CACHE; i++) __atomic_store_n(&g_known_pages[i], 0, __ATOMIC_RELAXED);
  __atomic_store_n(&g_revalidating, 0, __ATOMIC_RELEASE);
}

void _hs_profile_dlclosed(void) {
  __atomic_add_fetch(&g_dlclose_gen, 1, __ATOMIC_RELEASE);
  _hs_unwind_forget(); /* its rules may name code that is gone: a new table */
}

/* ---- unwinding ---- */
struct hs_walk { uint64_t *out; int n; };

static _Unwind_Reason_Code walk_cb(struct _Unwind_Context *ctx, void *arg) {
  struct hs_walk *w = arg;
  int before = 0;
  uintptr_t ip = g_getipinfo(ctx, &before);
  if (ip == 0) return _URC_END_OF_STACK;
  /* A signal frame's ip is the interrupted instruction itself: + 1 makes every address a
   * return address, so the reader subtracts 1 from all of them alike. */
  if (before) ip++;
  /* the hooks (this file), and the main of ours that calls the program's (preload.c) */
  if (ip >= g_self_lo && ip < g_self_hi) return _URC_NO_REASON;
  w->out[w->n++] = ip;
  return w->n < HS_MAX_FRAMES ? _URC_NO_REASON : _URC_END_OF_STACK;
}

static int g_unwind_check; /* HEAPSIGHT_UNWIND_CHECK=1: both ways, differences counted */

/* The stack at the allocation, heapsight's own frames left out, innermost first: from the
 * rules cached per return address (unwind.c), or where a frame has a rule that walk does
 * not follow, libgcc's. Inline, like record(): libgcc works out every frame it passes,
 * ours too (about 2,000 instructions each), so the sample's own part of the stack is kept
 * to one frame. */
static inline __attribute__((always_inline)) int unwind(uint64_t *out) {
  hs_profile_t *pr = &_hs_seg->profile;
  int n = _hs_unwind_ready() ? _hs_unwind_fast(out, HS_MAX_FRAMES, g_self_lo, g_self_hi) : -1;
  if (n >= 0) __atomic_fetch_add(&pr->unwind_cached, 1, __ATOMIC_RELAXED);
  if (n >= 0 && !g_unwind_check) return n;
  uint64_t theirs[HS_MAX_FRAMES];
  struct hs_walk w = {n >= 0 ? theirs : out, 0};
  g_backtrace(walk_cb, &w);
  if (n < 0) return w.n;
  __atomic_fetch_add(&pr->unwind_checked, 1, __ATOMIC_RELAXED);
  if (w.n != n || memcmp(theirs, out, (size_t)n * 8) != 0)
    __atomic_fetch_add(&pr->unwind_mismatches, 1, __ATOMIC_RELAXED);
  return n;
}

/* ---- recording (under the lock) ---- */

/* The word offset of this stack, stored on first sight; 0 when there is no room. */
static uint32_t stack_offset(hs_profile_t *pr, const uint64_t *f, int n) {
  if (n == 0) return 0;
  uint64_t h = (uint64_t)n;
  for (int i = 0; i < n; i++) h = mix64(h ^ f[i]) + (uint64_t)i;
  if (!h) h = 1;
  if (g_stacks.cap) {
    uint64_t mask = g_stacks.cap - 1;
    for (uint64_t j = mix64(h) & mask; g_stacks.e[j].key; j = (j + 1) & mask) {
      if (g_stacks.e[j].key != h) continue;
      const uint64_t *w = &g_words[g_stacks.e[j].val];
      if (w[0] == (uint64_t)n && memcmp(w + 1, f, (size_t)n * 8) == 0) return (uint32_t)g_stacks.e[j].val;
    }
  }
  uint64_t o = pr->stack_words_used;
  if (o + 1 + (uint64_t)n > g_words_cap || !table_room(&g_stacks)) return 0;
  g_words[o] = (uint64_t)n;
  memcpy(&g_words[o + 1], f, (size_t)n * 8);
  __atomic_store_n(&pr->stack_words_used, o + 1 + (uint64_t)n, __ATOMIC_RELEASE);
  /* several stacks may share a hash: put keeps one entry per (hash, offset) pair */
  uint64_t mask = g_stacks.cap - 1, j = mix64(h) & mask;
  while (g_stacks.e[j].key) j = (j + 1) & mask;
  g_stacks.e[j].key = h;
  g_stacks.e[j].val = o;
  g_stacks.used++;
  return (uint32_t)o;
}

/* ---- the interpreter's frames (interp.c reads them; stored here, under the lock) ---- */

/* The tagged word of an interpreter frame: its record, written on first sight (the names
 * are read then, with checked reads: the only reads made under the lock, once per frame
 * record); 0 when there is no room. */
static uint64_t iframe_word(hs_profile_t *pr, const hs_iframe_t *f, int kind) {
  uint64_t h = mix64(mix64(mix64(f->code ^ (uint64_t)(uint32_t)f->line) ^ f->name) ^ f->file);
  if (!h) h = 1;
  if (g_irecs.cap) {
    uint64_t mask = g_irecs.cap - 1;
    for (uint64_t j = mix64(h) & mask; g_irecs.e[j].key; j = (j + 1) & mask) {
      if (g_irecs.e[j].key != h) continue;
      const uint64_t *w = &g_words[g_irecs.e[j].val];
      if (w[1] == f->code && w[2] == f->name && w[3] == f->file && (uint32_t)w[4] == (uint32_t)f->line)
        return HS_IFRAME_TAG | (uint64_t)kind << HS_IFRAME_KIND_SHIFT | g_irecs.e[j].val;
    }
  }
  char names[512];
  uint32_t nlen = 0, flen = 0;
  size_t bytes = _hs_interp_names(f, names, sizeof names, &nlen, &flen);
  if (!nlen) return 0; /* its name could not be read: the native frame stays */
  uint64_t o = pr->stack_words_used, words = 5 + (bytes + 7) / 8;
  if (o + words > g_words_cap || !table_room(&g_irecs)) return 0;
  uint64_t *w = &g_words[o];
  w[0] = HS_IFRAME_MAGIC;
  w[1] = f->code;
  w[2] = f->name;
  w[3] = f->file;
  w[4] = (uint64_t)(uint32_t)f->line | (uint64_t)nlen << HS_IFRAME_NAME_SHIFT |
         (uint64_t)flen << HS_IFRAME_FILE_SHIFT;
  w[4 + (bytes + 7) / 8] = 0; /* the last word's padding */
  memcpy(&w[5], names, bytes);
  __atomic_store_n(&pr->stack_words_used, o + words, __ATOMIC_RELEASE);
  uint64_t mask = g_irecs.cap - 1, j = mix64(h) & mask;
  while (g_irecs.e[j].key) j = (j + 1) & mask;
  g_irecs.e[j].key = h;
  g_irecs.e[j].val = o;
  g_irecs.used++;
  return HS_IFRAME_TAG | (uint64_t)kind << HS_IFRAME_KIND_SHIFT | o;
}

/* The native stack with each eval loop's frame replaced by the interpreter frames it runs
 * (innermost first, as both are): a loop's frames end with its entry frame. A loop frame
 * past the interpreter frames read (or whose frames could not be stored) stays. */
static int splice(hs_profile_t *pr, const uint64_t *nat, int n, const hs_iframe_t *py,
                  int npy, uint64_t *out) {
  int m = 0, p = 0;
  for (int i = 0; i < n && m < HS_MAX_FRAMES; i++) {
    int put = 0;
    if (p < npy && _hs_interp_is_loop((uintptr_t)nat[i])) {
      while (p < npy && m < HS_MAX_FRAMES) {
        const hs_iframe_t *f = &py[p++];
        uint64_t w = f->skip ? 0 : iframe_word(pr, f, _hs_interp_kind());
        if (w) { out[m++] = w; put = 1; }
        if (f->entry) break;
      }
    }
    if (!put && m < HS_MAX_FRAMES) out[m++] = nat[i];
  }
  return m;
}

static void put_event(uint64_t i, uint64_t addr, uint64_t size, uint32_t stack, uint32_t kind) {
  hs_event_t *e = &g_events[i];
  e->addr = addr;
  e->size = size;
  e->time_ns = _hs_now_ns();
  e->stack = stack;
  __atomic_store_n(&e->kind, kind, __ATOMIC_RELEASE);
}

static void drop(hs_profile_t *pr) {
  __atomic_fetch_add(&pr->dropped_samples, 1, __ATOMIC_RELAXED);
}

static void add_modules(hs_profile_t *pr, hs_module_t *fresh, int n) {
  for (int k = 0; k < n; k++) {
    if (covered(pr, (uintptr_t)fresh[k].lo)) continue; /* another thread was first */
    uint64_t m = pr->modules_used;
    if (m >= g_modules_cap) { g_full = 1; return; }
    fresh[k].first_event = pr->events_used;
    g_modules[m] = fresh[k];
    __atomic_store_n(&pr->modules_used, m + 1, __ATOMIC_RELEASE);
  }
}

/* Live blocks and mappings share the table: a mapping has two keys, its start | 1 and its
 * end | 2 (a block's address is at least 8-aligned, so none of them meet), so that a
 * munmap finds the mapping it begins or ends. Under the lock, with room for one entry. */
static inline uint64_t page_up(uint64_t a) {
  uint64_t page = (uint64_t)getpagesize(); /* glibc's, kept by the loader: no call to the kernel */
  return (a + page - 1) & ~(page - 1);
}
static void map_put(uint64_t lo, uint64_t hi, uint64_t index) {
  table_put(&g_live, lo | 1, index);
  if (table_room(&g_live)) table_put(&g_live, page_up(hi) | 2, index); /* else: by its start only */
}

/* A block's weight by its usable size and level, kept: the sizes sampled repeat (a churn's
 * sixteen, a program's few hot ones), and the expm1 and the division cost a sample ~190
 * instructions at its allocation and again at its free. Direct-mapped, under the lock; an
 * empty entry (usable 0, level 0) holds the weight of a zero-byte block, none. */
#define HS_WEIGHTS 64
static struct weight_s { uint64_t usable; int level; double w, v; } g_weights[HS_WEIGHTS];

static const struct weight_s *weight_of(uint64_t usable, int level) {
  struct weight_s *e = &g_weights[((usable >> 3) ^ ((uint64_t)level << 5)) & (HS_WEIGHTS - 1)];
  if (e->usable == usable && e->level == level) return e;
  double prob = -hs_expm1_neg(-(double)usable / mean_at(level));
  e->usable = usable;
  e->level = level;
  e->w = prob > 0 ? 1.0 / prob : 0;          /* it stands for 1/p blocks */
  e->v = prob > 0 ? (1.0 - prob) * e->w * e->w : 0; /* their count's variance */
  return e;
}

/* The size histogram (hs_hist_t), under the lock: a sampled block of `usable` bytes taken
 * at `level` had probability p = 1 - exp(-usable / mean) to be sampled (the mean then:
 * M / 2^level), so it stands for 1/p blocks. dir 1: its allocation (req: its requested
 * bytes); -1: its free. */
static void hist_add(uint64_t usable, uint64_t req, int level, int dir) {
  hs_hist_t *h = &_hs_seg->hist;
  const struct weight_s *e = weight_of(usable, level);
  if (!(e->w > 0)) return;
  double w = e->w, d = (double)dir;
  unsigned c = hs_class_of(usable);
  if (dir > 0) {
    h->alloc_w[c] += w;
    h->waste_w[c] += w * (double)(usable - (req < usable ? req : usable));
  }
  h->live_w[c] += d * w;
  h->live_u_w[c] += d * w * (double)usable;
  double v = d * e->v, u = (double)usable;
  h->live_var[c] += v;
  h->live_var_u[c] += v * u;
  h->live_var_uu[c] += v * u * u;
  h->live_samples += (uint64_t)(int64_t)dir;
}

static inline __attribute__((always_inline)) void record(void *p, size_t usable, size_t req,
                                                         const void *caller, uint32_t kind) {
  hs_profile_t *pr = &_hs_seg->profile;
  if (__atomic_load_n(&g_full, __ATOMIC_RELAXED)) { drop(pr); return; }
  uint64_t frames[HS_MAX_FRAMES];
  int n = 0;
  /* A malloc that libgcc_s makes itself (it sorts registered FDEs under its own lock) is
   * not unwound: the unwinder would wait for that lock. Its sample keeps the empty stack. */
  if (__atomic_load_n(&g_unwinder_ready, __ATOMIC_ACQUIRE) &&
      !((uintptr_t)caller >= g_gcc_lo && (uintptr_t)caller < g_gcc_hi)) {
    uint64_t t0 = _hs_now_ns();
    n = unwind(frames);
    uint64_t dt = _hs_now_ns() - t0;
    __atomic_fetch_add(&pr->unwind_ns, dt, __ATOMIC_RELAXED);
    __atomic_fetch_add(&pr->unwinds, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&pr->unwind_frames, (uint64_t)n, __ATOMIC_RELAXED);
  }
  /* Not unwound (before the unwinder is set up: a runtime's start-up, such as libstdc++'s
   * emergency exception pool; or a malloc of libgcc_s's own): the caller alone names it. */
  if (n == 0 && caller) frames[n++] = (uint64_t)(uintptr_t)caller;
  /* The interpreter's frames (interp.c), where the stack runs through its loop: read
   * before the lock, stored and spliced in under it. */
  hs_iframe_t py[HS_INTERP_DEPTH];
  int npy = 0;
  if (n && _hs_interp_ready()) {
    int loop = 0;
    for (int i = 0; i < n && !loop; i++) loop = _hs_interp_is_loop((uintptr_t)frames[i]);
    if (loop) {
      uint64_t t0 = _hs_now_ns();
      npy = _hs_interp_frames(py, HS_INTERP_DEPTH);
      __atomic_fetch_add(&pr->interp_ns, _hs_now_ns() - t0, __ATOMIC_RELAXED);
      __atomic_fetch_add(&pr->interp_walks, 1, __ATOMIC_RELAXED);
      __atomic_fetch_add(&pr->interp_frames, (uint64_t)npy, __ATOMIC_RELAXED);
    }
  }
  /* Objects the stack reaches that are not recorded yet: found before the lock, and
   * recorded before the event (a few at a time, to keep this frame small). */
  hs_module_t fresh[4];
  int nfresh = 0;
  if (n) revalidate(pr);
  for (int i = 0; i < n; i++) {
    uintptr_t a = (uintptr_t)frames[i] - 1;
    if (covered(pr, a)) continue;
    int dup = 0;
    for (int k = 0; k < nfresh && !dup; k++) dup = a >= fresh[k].lo && a < fresh[k].hi;
    if (dup || !find_object(a, &fresh[nfresh])) continue;
    if (++nfresh == 4 && i + 1 < n) {
      lock();
      add_modules(pr, fresh, nfresh);
      unlock();
      nfresh = 0;
    }
  }
  lock();
  add_modules(pr, fresh, nfresh);
  if (npy && !g_full) {
    uint64_t hybrid[HS_MAX_FRAMES];
    n = splice(pr, frames, n, py, npy, hybrid);
    memcpy(frames, hybrid, (size_t)n * 8);
  }
  uint32_t stack = g_full ? 0 : stack_offset(pr, frames, n);
  /* room for this ALLOC and for the FREE of every block still live, this one included */
  uint64_t used = pr->events_used;
  if (g_full || (n && !stack) || used + g_live.used + 2 > g_events_cap ||
      !table_room(&g_live)) {
    g_full = 1;
    unlock();
    drop(pr);
    return;
  }
  __atomic_store_n(&pr->events_used, used + 1, __ATOMIC_RELEASE);
  put_event(used, (uint64_t)(uintptr_t)p, usable, stack, kind);
  if (kind == HS_EVENT_MAP) {
    map_put((uint64_t)(uintptr_t)p, (uint64_t)(uintptr_t)p + usable, used);
  } else {
    table_put(&g_live, (uint64_t)(uintptr_t)p, used);
    hist_add(usable, req, kind_level(kind), 1);
    count_live(kind_level(kind), 1);
    uintptr_t i = ((uintptr_t)p >> 4) & (HS_SAMPLE_MAP_SIZE - 1);
    unsigned char *c = &_hs_sample_map[i];
    if (*c < 255) __atomic_store_n(c, (unsigned char)(*c + 1), __ATOMIC_RELAXED); /* 255 sticks */
    _hs_map_written(i);
  }
  unlock();
}

/* Whether samples are taken in this process: in the owner, once set up, with M > 0. A
 * forked child keeps the parent's state but is no owner: it stops here. */
static int sampling_here(void) {
  if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != P_ON) return 0;
  if (HS_LIKELY(_hs_is_owner())) return 1;
  __atomic_store_n(&g_state, P_OFF, __ATOMIC_RELAXED);
  __atomic_store_n(&g_shared_left, INT64_MAX, __ATOMIC_RELAXED);
  return 0;
}

/* The slow path of the countdown: s->sample_left went below 0 with this block. */
void _hs_sample_alloc(hs_slot_t *s, void *p, size_t usable, size_t req, const void *caller) {
  int state = __atomic_load_n(&g_state, __ATOMIC_ACQUIRE);
  if (state == P_UNSET) return; /* before attach: decided at the next allocation */
  hs_segment_t *seg = _hs_seg;
  if (!sampling_here() || s < seg->slots || s >= seg->slots + HS_MAX_SLOTS) {
    s->sample_left = INT64_MAX; /* off: the countdown never ends */
    return;
  }
  int saved = errno;
  if (HS_UNLIKELY(s->sample_left < HS_SAMPLE_FRESH / 2)) {
    /* a new thread's first interval starts with its first allocation */
    int64_t left = draw() + (s->sample_left - HS_SAMPLE_FRESH);
    if (left >= 0) { s->sample_left = left; errno = saved; return; }
  }
  int level = t_level == HS_NO_LEVEL ? 0 : t_level; /* the countdown that ended: its level */
  count_sample(level);
  s->sample_left = draw(); /* memoryless: the next interval starts at this block's end */
  if (!t_sampling && !t_locked) { /* not inside a sample, or a lookup, of this thread */
    t_sampling = 1;
    record(p, usable, req, caller, HS_EVENT_ALLOC | level_bits(level));
    t_sampling = 0;
  }
  errno = saved;
}

/* Threads without a slot (past 255) share one atomic countdown; the thread that finds it
 * below 0 and refills it samples. */
void _hs_sample_shared(void *p, size_t usable, size_t req, const void *caller) {
  int64_t left = __atomic_sub_fetch(&g_shared_left, (int64_t)usable, __ATOMIC_RELAXED);
  if (HS_LIKELY(left >= 0) || !sampling_here()) return;
  int saved = errno;
  int level = __atomic_load_n(&g_shared_level, __ATOMIC_RELAXED);
  int next_level = __atomic_load_n(&g_level, __ATOMIC_RELAXED);
  int64_t next = draw_at(next_level);
  if (__atomic_compare_exchange_n(&g_shared_left, &left, next, 0, __ATOMIC_RELAXED,
                                  __ATOMIC_RELAXED)) {
    __atomic_store_n(&g_shared_level, next_level, __ATOMIC_RELAXED);
    count_sample(level);
    if (!t_sampling && !t_locked) {
      t_sampling = 1;
      record(p, usable, req, caller, HS_EVENT_ALLOC | level_bits(level));
      t_sampling = 0;
    }
  }
  errno = saved;
}

/* The filter said p may be a live sampled block: look it up, and end it with a FREE. */
void _hs_sample_free(void *p) {
  if (t_locked || !_hs_is_owner()) return;
  hs_profile_t *pr = &_hs_seg->profile;
  lock();
  uint64_t found = table_take(&g_live, (uint64_t)(uintptr_t)p);
  if (found) {
    unsigned char *c = &_hs_sample_map[((uintptr_t)p >> 4) & (HS_SAMPLE_MAP_SIZE - 1)];
    if (*c < 255) __atomic_store_n(c, (unsigned char)(*c - 1), __ATOMIC_RELAXED);
    uint64_t i = pr->events_used; /* room was kept when its ALLOC was recorded */
    const hs_event_t *a = &g_events[found - 1];
    hist_add(a->size, 0, kind_level(a->kind), -1);
    count_live(kind_level(a->kind), -1);
    __atomic_store_n(&pr->events_used, i + 1, __ATOMIC_RELEASE);
    put_event(i, found - 1, 0, 0, HS_EVENT_FREE);
  }
  unlock();
}

/* ---- set-up ---- */

/* At attach (in the resolving thread, before other threads count): the owner writes the
 * mean and the profile's magic; everyone else never samples. */
void _hs_profile_setup(void) {
  int saved = errno;
  _hs_options_read_sampling();
  hs_segment_t *seg = _hs_seg;
  /* a segment made without the profile's tables (the run samples nothing) has no room */
  uint64_t room = seg && _hs_is_owner() ? hs_profile_room(seg->size_bytes) : 0;
  int on = room && _hs_opt.sample_bytes > 0;
  if (room) {
    hs_profile_t *pr = &seg->profile;
    g_events = hs_profile_events(pr);
    g_words = hs_profile_words(pr, room);
    g_modules = hs_profile_modules(pr, room);
    g_events_cap = room * HS_PROFILE_EVENTS_UNIT;
    g_words_cap = room * HS_PROFILE_WORDS_UNIT;
    g_modules_cap = room * HS_PROFILE_MODULES_UNIT;
    pr->mean_bytes = _hs_opt.sample_bytes;
    if (on) {
      g_words[0] = 0; /* offset 0: the empty stack */
      __atomic_store_n(&pr->stack_words_used, 1, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&pr->magic, HS_PROFILE_MAGIC, __ATOMIC_RELEASE);
  }
  if (on) {
    g_mean = (double)_hs_opt.sample_bytes;
    memset(g_weights, 0, sizeof g_weights); /* (kept for another mean) */
    /* adaptive unless the mean was given: from HS_SAMPLE_START (or M, if smaller) */
    int level = 0;
    g_adaptive = !getenv("HEAPSIGHT_SAMPLE_BYTES");
    if (g_adaptive)
      while (level < HS_LEVEL_MAX && g_mean / (double)(1ull << (level + 1)) >= HS_SAMPLE_START)
        level++;
    __atomic_store_n(&g_level, level, __ATOMIC_RELAXED);
    __atomic_store_n(&g_shared_level, level, __ATOMIC_RELAXED);
    __atomic_store_n(&g_level_quota, level_quota(level), __ATOMIC_RELAXED);
    char exe[1024];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[len > 0 ? len : 0] = 0;
    keep_tail(g_exe, sizeof g_exe, exe);
    g_vdso = (uintptr_t)getauxval(AT_SYSINFO_EHDR);
    __atomic_store_n(&g_shared_left, draw(), __ATOMIC_RELAXED);
  } else {
    __atomic_store_n(&g_shared_left, INT64_MAX, __ATOMIC_RELAXED);
  }
  __atomic_store_n(&g_state, on ? P_ON : P_OFF, __ATOMIC_RELEASE);
  errno = saved;
}

static void object_range(void *addr, uintptr_t *lo, uintptr_t *hi) {
  hs_module_t m;
  if (find_object((uintptr_t)addr, &m)) { *lo = m.lo; *hi = m.hi; }
}

/* From the library's constructor: the unwinder, found in libgcc_s itself. */
void _hs_profile_start(void) {
  if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != P_ON) return;
  int saved = errno;
  g_find_object = (hs_find_object_fn)dlsym(RTLD_DEFAULT, "_dl_find_object");
  void *gcc = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!gcc) gcc = dlopen("libgcc_s.so.1", RTLD_NOW);
  if (gcc) {
    g_backtrace = (hs_backtrace_fn)dlsym(gcc, "_Unwind_Backtrace");
    g_getipinfo = (hs_getipinfo_fn)dlsym(gcc, "_Unwind_GetIPInfo");
  }
  if (_hs_seg) {
    int kind = 0, status = 0;
    uint64_t version = 0;
    _hs_interp_start(&kind, &status, &version);
    hs_profile_t *pr = &_hs_seg->profile;
    pr->interp_kind = (uint64_t)kind;
    pr->interp_status = (uint64_t)status;
    pr->interp_version = version;
  }
  if (g_backtrace && g_getipinfo) {
    const char *cache = getenv("HEAPSIGHT_UNWIND_CACHE"), *check = getenv("HEAPSIGHT_UNWIND_CHECK");
    if (!(cache && cache[0] == '0')) _hs_unwind_start(gcc);
    g_unwind_check = check && check[0] == '1';
    object_range((void *)&_hs_profile_start, &g_self_lo, &g_self_hi);
    object_range((void *)g_backtrace, &g_gcc_lo, &g_gcc_hi);
    if (g_self_lo < g_self_hi) __atomic_store_n(&g_unwinder_ready, 1, __ATOMIC_RELEASE);
  }
  errno = saved;
}

/* The owner re-attached after execve: the old image's profile is gone with it. Used parts
 * are given back to the file system (a hole reads as zeros), or zeroed. */
static void clear(void *start, uint64_t bytes) {
  if (!bytes) return;
  uint64_t round = (bytes + 4095) & ~(uint64_t)4095; /* each region is a whole number of pages */
  if (madvise(start, round, MADV_REMOVE) != 0) memset(start, 0, bytes);
}

void _hs_profile_reset(hs_segment_t *seg) {
  hs_profile_t *pr = &seg->profile;
  uint64_t room = hs_profile_room(seg->size_bytes);
  uint64_t ev = pr->events_used, sw = pr->stack_words_used, mo = pr->modules_used;
  uint64_t ev_cap = room * HS_PROFILE_EVENTS_UNIT, sw_cap = room * HS_PROFILE_WORDS_UNIT,
           mo_cap = room * HS_PROFILE_MODULES_UNIT;
  clear(hs_profile_events(pr), (ev < ev_cap ? ev : ev_cap) * sizeof(hs_event_t));
  clear(hs_profile_words(pr, room), (sw < sw_cap ? sw : sw_cap) * 8);
  clear(hs_profile_modules(pr, room), (mo < mo_cap ? mo : mo_cap) * sizeof(hs_module_t));
  memset(pr, 0, sizeof *pr);
}

/* Anonymous memory the program maps itself (mappings.c): every mapping is recorded with its
 * stack, and its munmap (from its start) ends it. */
void _hs_profile_map(void *p, size_t len, const void *caller) {
  if (!sampling_here() || t_sampling || t_locked) return;
  int saved = errno;
  t_sampling = 1;
  record(p, len, 0, caller, HS_EVENT_MAP);
  t_sampling = 0;
  errno = saved;
}

/* A munmap (or the old place of an mremap) of len bytes at p: the mapping recorded that
 * begins or ends there ends (a FREE). When it went only in part, the rest stays mapped: a
 * runtime that maps more than it needs and unmaps the unaligned head or tail (Ruby's heap
 * pages: 32 KiB mapped, 16 KiB kept; PHP's 2 MiB chunks) keeps memory that counted for no
 * one, and Ruby's object heap read "11.3 MiB of anonymous memory did not come from malloc,
 * no object heapsight saw mapping memory accounts for it". The rest is recorded again (a
 * MAP now, with the stack of the first). A munmap inside a mapping, touching neither end,
 * leaves it recorded whole (smaps gives the part gone no resident bytes). 1: it was
 * recorded. */
int _hs_profile_unmap(void *p, size_t len) {
  if (t_locked || !_hs_is_owner() || __atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != P_ON) return 0;
  hs_profile_t *pr = &_hs_seg->profile;
  uint64_t lo = (uint64_t)(uintptr_t)p, hi = page_up(lo + (uint64_t)len);
  uint64_t rest_lo = 0, rest_hi = 0;
  lock();
  uint64_t found = table_take(&g_live, lo | 1);
  if (found) { /* its start: the mapping whole, or its head */
    uint64_t end = page_up(g_events[found - 1].addr + g_events[found - 1].size);
    table_take(&g_live, end | 2);
    if (hi < end) rest_lo = hi, rest_hi = end;
  } else if ((found = table_take(&g_live, hi | 2))) { /* its end: its tail */
    uint64_t start = g_events[found - 1].addr;
    table_take(&g_live, start | 1);
    if (start < lo) rest_lo = start, rest_hi = lo;
  }
  if (found) {
    uint32_t stack = g_events[found - 1].stack;
    uint64_t i = pr->events_used; /* room was kept when its MAP was recorded */
    __atomic_store_n(&pr->events_used, i + 1, __ATOMIC_RELEASE);
    put_event(i, found - 1, 0, 0, HS_EVENT_FREE);
    /* the rest: room for its MAP and for the FREE of every mapping and block live */
    if (rest_hi > rest_lo && !g_full && i + 1 + g_live.used + 2 <= g_events_cap &&
        table_room(&g_live)) {
      __atomic_store_n(&pr->events_used, i + 2, __ATOMIC_RELEASE);
      put_event(i + 1, rest_lo, rest_hi - rest_lo, stack, HS_EVENT_MAP);
      map_put(rest_lo, rest_hi, i + 1);
    }
  }
  unlock();
  return found != 0;
}
