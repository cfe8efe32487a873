/* allocators.c: which allocator answers malloc, its own statistics, and its release-now
 * call. One adapter per allocator. Each resolves its allocator's own API with dlsym at
 * detect time (we never link against an allocator).
 *
 * The stats functions run on the library's statistics thread and in the exit probe: they
 * must not call malloc (an allocation there is counted in helper_mallocs and is a bug).
 * What each one calls:
 *   glibc     nothing of glibc's: each arena's system_mem read from its malloc_state (heapmap.c)
 *             and the mmapped chunks the hooks count (no lock, no walk, no malloc)
 *   jemalloc  mallctl by name: ctl uses jemalloc's internal base allocator, never malloc
 *             (the first call sets up the thread's tsd and tcache, also internally; the
 *             thread's end runs jemalloc's thread cleanup: probe.c waits for it at exit)
 *   tcmalloc  MallocExtension_GetNumericProperty: strcmp on the name, then its page heap
 *             and cache counters under its own spin locks (no malloc)
 *   mimalloc  mi_process_info: getrusage and mimalloc's global counters (no malloc)
 *   mmap      two atomic loads in libheapsight_mmap.so */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "hs_internal.h"
#include "hs_options.h"

int _hs_usable_by_header;

typedef struct hs_allocator_s {
  int id;
  const char *name;
  const char *soname_part; /* how its library file is recognised */
  void (*init)(void);      /* resolves its own API (dlsym, after us) once it answers malloc */
  int (*stats)(hs_alloc_stats_t *out);
  int (*release)(void);
  int release_on_caller;   /* its release acts on the calling thread's heap: run it there */
} hs_allocator_t;

/* ---- glibc: no call at all while the program runs ----
 * mallinfo2 and malloc_info take every arena's lock and walk its bins (malloc.c: int_mallinfo
 * under __libc_lock_lock (ar_ptr->mutex)): on a heap of many free chunks each reading
 * stalled the program's threads (a perl hash of 250,000 entries ran 1.8x its bare time).
 * What the split needs is what glibc holds from the OS, read without a lock: each arena's
 * system_mem on main_arena's ring (heapmap.c) and the mmapped chunks the hooks count. The
 * bytes in use and free inside the arenas would need the walk: unknown here (the heap map's
 * copy walks them, at exit and at snapshots). */
static int (*g_malloc_trim)(size_t);

static int glibc_stats(hs_alloc_stats_t *out) {
  uint64_t arenas = 0, system_mem = 0;
  if (!_hs_glibc_arenas(&arenas, &system_mem)) return 0;
  uint64_t mmapped = _hs_mmapped_chunk_bytes();
  memset(out->raw, 0, sizeof out->raw);
  out->raw[0] = system_mem; /* mallinfo2's arena and hblkhd, as it would give them */
  out->raw[4] = mmapped;
  out->in_use_bytes = HS_STATS_UNKNOWN;
  out->free_bytes = HS_STATS_UNKNOWN;
  out->mapped_bytes = system_mem + mmapped;
  out->mmapped_bytes = mmapped;
  out->resident_bytes = 0; /* glibc has no resident figure: see docs/numbers.md */
  out->top_pad_bytes = 0;
  out->arenas = arenas;
  return 1;
}

static int glibc_release(void) { return g_malloc_trim ? g_malloc_trim(0) : 0; }

/* ---- jemalloc 5.3: mallctl ----
 * Figures after mallctl("epoch") refreshes jemalloc's stats snapshot:
 *   in_use_bytes   = stats.allocated (bytes in live allocations, jemalloc's size classes)
 *   free_bytes     = (stats.active - stats.allocated) + (pdirty + pmuzzy) pages of all arenas:
 *                    free regions inside slabs in use, plus whole free pages not yet purged
 *                    (dirty: resident; muzzy: MADV_FREE'd, the kernel may take them back)
 *   resident_bytes = stats.resident (an upper bound of resident data + metadata pages; the
 *                    field notes: it tracks RSS)
 *   mapped_bytes   = stats.mapped (extents mapped and not returned to the OS; dirty and
 *                    muzzy pages count, stats.retained address space does not)
 *   arenas         = arenas initialised among "arenas.narenas" (arena.<i>.initialized)
 *   raw            = allocated, active, resident, mapped, retained, metadata, dirty bytes,
 *                    muzzy bytes
 * Release: mallctl("arena.4096.purge") purges dirty and muzzy pages of every arena
 * (4096 = MALLCTL_ARENAS_ALL). Freed blocks still in a thread's tcache are not purged. */
typedef int (*hs_mallctl_fn)(const char *, void *, size_t *, void *, size_t);
static hs_mallctl_fn g_mallctl;
#define HS_MALLCTL_ARENAS_ALL "4096"

static int je_size(const char *name, uint64_t *v) {
  size_t x = 0, sz = sizeof x;
  if (g_mallctl(name, &x, &sz, NULL, 0) != 0) return 0;
  *v = x;
  return 1;
}

static uint64_t je_arenas(void) {
  unsigned n = 0;
  size_t sz = sizeof n;
  if (g_mallctl("arenas.narenas", &n, &sz, NULL, 0) != 0) return 0;
  uint64_t count = 0;
  for (unsigned i = 0; i < n && i < 4096; i++) {
    char name[40]; /* "arena.<i>.initialized", formatted by hand: no stdio */
    char digits[12];
    int nd = 0;
    unsigned v = i;
    do { digits[nd++] = (char)('0' + v % 10); v /= 10; } while (v);
    memcpy(name, "arena.", 6);
    size_t at = 6;
    while (nd) name[at++] = digits[--nd];
    memcpy(name + at, ".initialized", sizeof ".initialized");
    _Bool init = 0;
    sz = sizeof init;
    if (g_mallctl(name, &init, &sz, NULL, 0) == 0 && init) count++;
  }
  return count;
}

static int jemalloc_stats(hs_alloc_stats_t *out) {
  if (!g_mallctl) return 0;
  uint64_t epoch = 1;
  size_t sz = sizeof epoch;
  g_mallctl("epoch", &epoch, &sz, &epoch, sz);
  uint64_t allocated, active, resident, mapped, retained = 0, metadata = 0, pdirty = 0,
           pmuzzy = 0, page = 4096;
  if (!je_size("stats.allocated", &allocated) || !je_size("stats.active", &active) ||
      !je_size("stats.resident", &resident) || !je_size("stats.mapped", &mapped))
    return 0; /* built without --enable-stats */
  je_size("stats.retained", &retained);
  je_size("stats.metadata", &metadata);
  je_size("arenas.page", &page);
  je_size("stats.arenas." HS_MALLCTL_ARENAS_ALL ".pdirty", &pdirty);
  je_size("stats.arenas." HS_MALLCTL_ARENAS_ALL ".pmuzzy", &pmuzzy);
  uint64_t raw[8] = {allocated, active, resident, mapped, retained, metadata,
                     pdirty * page, pmuzzy * page};
  for (int i = 0; i < 8; i++) out->raw[i] = raw[i];
  out->in_use_bytes = allocated;
  out->free_bytes = (active > allocated ? active - allocated : 0) + (pdirty + pmuzzy) * page;
  out->mapped_bytes = mapped;
  out->resident_bytes = resident;
  out->arenas = je_arenas();
  return 1;
}

static int jemalloc_release(void) {
  return g_mallctl ? g_mallctl("arena." HS_MALLCTL_ARENAS_ALL ".purge", NULL, NULL, NULL, 0) == 0
                   : 0;
}

/* ---- tcmalloc (gperftools 2.10): MallocExtension's C API ----
 *   in_use_bytes   = generic.current_allocated_bytes
 *   mapped_bytes   = generic.heap_size (everything obtained from the OS, including pages
 *                    since released with MADV_DONTNEED: tcmalloc.pageheap_unmapped_bytes)
 *   resident_bytes = heap_size - unmapped (tcmalloc's "actual memory used")
 *   free_bytes     = tcmalloc.pageheap_free_bytes (whole free pages in the page heap, still
 *                    mapped; freed objects in the thread, transfer and central caches,
 *                    resident - in_use - free = raw[4], are not in this figure)
 *   raw            = current_allocated, heap_size, pageheap_free, pageheap_unmapped,
 *                    cache bytes (thread + transfer + central free lists), metadata
 *                    (generic.total_physical_bytes less heap_size - unmapped: gperftools
 *                    counts its metadata there and nowhere else; 0 when not given)
 * Release: MallocExtension_ReleaseFreeMemory() returns the page heap's free pages to the
 * OS (MADV_DONTNEED); objects in the caches stay. */
static int (*g_tc_property)(const char *, size_t *);
static void (*g_tc_release)(void);

static uint64_t tc_get(const char *name, int *ok) {
  size_t v = 0;
  if (!g_tc_property(name, &v)) *ok = 0;
  return v;
}

static int tcmalloc_stats(hs_alloc_stats_t *out) {
  if (!g_tc_property) return 0;
  int ok = 1;
  uint64_t allocated = tc_get("generic.current_allocated_bytes", &ok);
  uint64_t heap = tc_get("generic.heap_size", &ok);
  uint64_t free_b = tc_get("tcmalloc.pageheap_free_bytes", &ok);
  uint64_t unmapped = tc_get("tcmalloc.pageheap_unmapped_bytes", &ok);
  if (!ok) return 0;
  uint64_t resident = heap > unmapped ? heap - unmapped : 0;
  uint64_t caches = resident > allocated + free_b ? resident - allocated - free_b : 0;
  int physical_ok = 1;
  uint64_t physical = tc_get("generic.total_physical_bytes", &physical_ok);
  uint64_t metadata = physical_ok && physical > resident ? physical - resident : 0;
  uint64_t raw[6] = {allocated, heap, free_b, unmapped, caches, metadata};
  for (int i = 0; i < 6; i++) out->raw[i] = raw[i];
  out->in_use_bytes = allocated;
  out->free_bytes = free_b;
  out->mapped_bytes = heap;
  out->resident_bytes = resident;
  return 1;
}

static int tcmalloc_release(void) {
  if (!g_tc_release) return 0;
  g_tc_release();
  return 1;
}

/* ---- mimalloc 2.0.9: mi_process_info ----
 * Its current_rss is not RSS (field notes): on Linux 2.0.9 reports committed memory
 * there. So:
 *   mapped_bytes   = current_commit (memory mimalloc has committed from the OS)
 *   resident_bytes = 0 (mimalloc has no resident figure of its own)
 *   in_use_bytes   = 0: no cheap figure. The per-size "malloc" statistics are kept only
 *                    in builds with MI_STAT > 1 (debug), and mi_heap_visit_blocks walks
 *                    every block of one thread's heap: too slow for 10 Hz, and blind to
 *                    other threads' heaps.
 *   free_bytes     = 0 for the same reason
 *   raw            = current_commit, peak_commit, current_rss, peak_rss, page_faults,
 *                    elapsed ms, user ms, system ms
 * Release: mi_collect(true) frees empty pages and segments (and, called from the main
 * thread, reclaims the segments of threads that exited) and returns them to the OS. */
typedef void (*hs_mi_process_info_fn)(size_t *, size_t *, size_t *, size_t *, size_t *,
                                      size_t *, size_t *, size_t *);
static hs_mi_process_info_fn g_mi_process_info;
static void (*g_mi_collect)(_Bool);

static int mimalloc_stats(hs_alloc_stats_t *out) {
  if (!g_mi_process_info) return 0;
  size_t elapsed = 0, user = 0, sys = 0, rss = 0, peak_rss = 0, commit = 0, peak_commit = 0,
         faults = 0;
  g_mi_process_info(&elapsed, &user, &sys, &rss, &peak_rss, &commit, &peak_commit, &faults);
  uint64_t raw[8] = {commit, peak_commit, rss, peak_rss, faults, elapsed, user, sys};
  for (int i = 0; i < 8; i++) out->raw[i] = raw[i];
  out->mapped_bytes = commit;
  return 1;
}

static int mimalloc_release(void) {
  if (!g_mi_collect) return 0;
  g_mi_collect(1);
  return 1;
}

/* ---- mmap: libheapsight_mmap.so, one mapping per block ----
 * in_use = mapped = the live mappings' bytes (pages, so waste included); nothing is ever
 * free-but-held, and the release has nothing to do: every free already unmapped. */
static uint64_t (*g_mmap_live_bytes)(void);
static uint64_t (*g_mmap_live_blocks)(void);

static int mmap_stats(hs_alloc_stats_t *out) {
  if (!g_mmap_live_bytes) return 0;
  uint64_t bytes = g_mmap_live_bytes();
  out->in_use_bytes = bytes;
  out->mapped_bytes = bytes;
  out->mmapped_bytes = bytes;
  out->raw[0] = bytes;
  out->raw[1] = g_mmap_live_blocks ? g_mmap_live_blocks() : 0;
  return 1;
}

static int mmap_release(void) { return 1; }

static int none_stats(hs_alloc_stats_t *out) { (void)out; return 0; }
static int none_release(void) { return 0; }


/* Check the header shortcut against the allocator's own answer before trusting it. Only
 * heap sizes: freeing an mmapped chunk would raise glibc's dynamic mmap threshold. */
static int header_matches_glibc(void) {
  static const size_t sizes[] = {1, 24, 25, 100, 1000, 5000, 60000};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    void *p = _hs_real.malloc(sizes[i]);
    if (!p) return 0;
    int ok = hs_glibc_usable(hs_glibc_header(p)) == _hs_real.malloc_usable_size(p);
    _hs_real.free(p);
    if (!ok) return 0;
  }
  return 1;
}

/* tcmalloc 2.10's malloc_usable_size is MallocExtension::instance()->GetAllocatedSize(p),
 * and instance() makes its object with operator new the first time it is called: our
 * operator new, whose malloc hook asks malloc_usable_size again, forever (the first
 * malloc comes from libstdc++'s start-up, before tcmalloc's own initialiser has run). And
 * until that initialiser registers tcmalloc's implementation, the default object answers
 * 0. So run the initialiser now, as each of tcmalloc's own files does (TCMallocGuard's
 * constructor is reference-counted: the later calls do nothing), with the usable-size call
 * pointed at a stub meanwhile. Nothing is counted yet: the segment is attached after
 * detection. */
static size_t zero_usable(void *p) { (void)p; return 0; }

static void tcmalloc_init_early(void) {
  void (*guard)(void *) = (void (*)(void *))dlsym(RTLD_NEXT, "_ZN13TCMallocGuardC1Ev");
  void *(*instance)(void) = (void *(*)(void))dlsym(RTLD_NEXT, "_ZN15MallocExtension8instanceEv");
  size_t (*usable)(void *) = _hs_real.malloc_usable_size;
  char self;
  _hs_real.malloc_usable_size = zero_usable;
  if (guard) guard(&self);
  else if (instance) instance(); /* at least no recursion; sizes are 0 until registered */
  _hs_real.malloc_usable_size = usable;
}

/* An entry point the allocator lacks (jemalloc has no pvalloc, jemalloc and tcmalloc no
 * reallocarray) is found further down, in glibc: its blocks would reach the allocator's
 * free. Keep only those from malloc's own object; preload.c falls back on posix_memalign
 * and realloc for the others. */
static void drop_foreign_entry_points(void) {
  uint64_t m, f;
  const char *name;
  if (!_hs_object_of((void *)_hs_real.malloc, &m, &name)) return;
  void **optional[] = {(void **)&_hs_real.reallocarray, (void **)&_hs_real.aligned_alloc,
                       (void **)&_hs_real.memalign, (void **)&_hs_real.valloc,
                       (void **)&_hs_real.pvalloc};
  for (size_t i = 0; i < sizeof optional / sizeof *optional; i++)
    if (*optional[i] && (!_hs_object_of(*optional[i], &f, &name) || f != m)) *optional[i] = NULL;
}

/* ---- each allocator's init: its API comes from the objects after us, as malloc did.
 * Those other than glibc use malloc_usable_size (each exports it): _hs_usable_by_header
 * stays 0. */
static void glibc_init(void) {
  g_malloc_trim = (int (*)(size_t))dlsym(RTLD_NEXT, "malloc_trim");
  _hs_usable_by_header = header_matches_glibc();
}

static void jemalloc_init(void) { g_mallctl = (hs_mallctl_fn)dlsym(RTLD_NEXT, "mallctl"); }

static void tcmalloc_init(void) {
  g_tc_property = (int (*)(const char *, size_t *))dlsym(RTLD_NEXT,
                                                        "MallocExtension_GetNumericProperty");
  g_tc_release = (void (*)(void))dlsym(RTLD_NEXT, "MallocExtension_ReleaseFreeMemory");
  tcmalloc_init_early();
}

static void mimalloc_init(void) {
  g_mi_process_info = (hs_mi_process_info_fn)dlsym(RTLD_NEXT, "mi_process_info");
  g_mi_collect = (void (*)(_Bool))dlsym(RTLD_NEXT, "mi_collect");
}

static void mmap_init(void) {
  g_mmap_live_bytes = (uint64_t (*)(void))dlsym(RTLD_NEXT, "heapsight_mmap_live_bytes");
  g_mmap_live_blocks = (uint64_t (*)(void))dlsym(RTLD_NEXT, "heapsight_mmap_live_blocks");
}

static void none_init(void) {}

/* The adapter table: one row per allocator, everything heapsight knows of it on this side
 * (docs/allocators.md). The first row whose soname part is in the file that holds the
 * malloc answering us wins; glibc last, as its libc.so is always loaded. */
static const hs_allocator_t g_allocators[] = {
    {HS_ALLOC_JEMALLOC, "jemalloc", "jemalloc", jemalloc_init, jemalloc_stats, jemalloc_release, 0},
    {HS_ALLOC_TCMALLOC, "tcmalloc", "tcmalloc", tcmalloc_init, tcmalloc_stats, tcmalloc_release, 0},
    {HS_ALLOC_MIMALLOC, "mimalloc", "mimalloc", mimalloc_init, mimalloc_stats, mimalloc_release, 1},
    {HS_ALLOC_MMAP, "mmap", "libheapsight_mmap", mmap_init, mmap_stats, mmap_release, 0},
    {HS_ALLOC_GLIBC, "glibc", "libc.so", glibc_init, glibc_stats, glibc_release, 0},
};
static const hs_allocator_t g_unknown = {HS_ALLOC_UNKNOWN, "unknown", "", none_init, none_stats,
                                         none_release, 0};
static const hs_allocator_t *g_alloc = &g_unknown;

void _hs_allocator_detect(void) {
  uint64_t base = 0;
  const char *file = NULL;
  if (!_hs_object_of((void *)_hs_real.malloc, &base, &file) || !file) file = "";
  for (size_t i = 0; i < sizeof g_allocators / sizeof *g_allocators; i++) {
    if (strstr(file, g_allocators[i].soname_part)) {
      g_alloc = &g_allocators[i];
      break;
    }
  }
  if (g_alloc->id != HS_ALLOC_GLIBC) drop_foreign_entry_points();
  g_alloc->init();
  /* their blocks' usable sizes are their request's class's (counters.c) */
  _hs_sizes_by_request = g_alloc->id == HS_ALLOC_JEMALLOC || g_alloc->id == HS_ALLOC_TCMALLOC ||
                         g_alloc->id == HS_ALLOC_MIMALLOC;
  /* under another allocator than glibc the hooks note where each block starts, and its
   * mappings are kept apart: the copy marks reachability from them (blockmap.c) */
  int other = g_alloc->id != HS_ALLOC_GLIBC && g_alloc->id != HS_ALLOC_UNKNOWN &&
              _hs_options_read_reach();
  _hs_blockmap_allocator(other ? base : 0, other);
}

/* The allocator's version as it gives it, from a constant of its own (no lock, no
 * allocation): glibc's, jemalloc's "version", gperftools' tc_version, mimalloc's
 * mi_version (209: 2.0.9). "" when it gives none. */
static void allocator_version(char *out, size_t n) {
  const char *v = NULL;
  char mi[16];
  if (g_alloc->id == HS_ALLOC_GLIBC) {
    v = gnu_get_libc_version();
  } else if (g_alloc->id == HS_ALLOC_JEMALLOC && g_mallctl) {
    size_t sz = sizeof v;
    if (g_mallctl("version", (void *)&v, &sz, NULL, 0) != 0) v = NULL;
  } else if (g_alloc->id == HS_ALLOC_TCMALLOC) {
    const char *(*tc)(int *, int *, const char **) =
        (const char *(*)(int *, int *, const char **))dlsym(RTLD_NEXT, "tc_version");
    int major, minor;
    const char *patch;
    if (tc) v = tc(&major, &minor, &patch);
  } else if (g_alloc->id == HS_ALLOC_MIMALLOC) {
    int (*miv)(void) = (int (*)(void))dlsym(RTLD_NEXT, "mi_version");
    int x = miv ? miv() : 0;
    if (x > 0 && x < 1000) { /* 209 -> "2.0.9" */
      char mi_s[6] = {(char)('0' + x / 100), '.', (char)('0' + x / 10 % 10), '.',
                      (char)('0' + x % 10), 0};
      memcpy(mi, mi_s, sizeof mi_s);
      v = mi;
    }
  }
  size_t k = v ? strnlen(v, n - 1) : 0;
  if (k) memcpy(out, v, k);
  out[k] = 0;
}

/* Whose malloc the program's own calls reach: the first definition in the global scope,
 * where the executable comes before every preloaded library (heapsight's is first after
 * it). "" when it is heapsight's; else the object's path (the executable's as it was
 * started, argv[0]; /proc/self/exe when that is empty). */
static void malloc_elsewhere(char *out, size_t n) {
  out[0] = 0;
  uint64_t bound, own;
  const char *path = NULL, *ours;
  void *m = dlsym(RTLD_DEFAULT, "malloc");
  if (!m || !_hs_object_of(m, &bound, &path) ||
      !_hs_object_of((void *)&malloc_elsewhere, &own, &ours) || bound == own)
    return;
  /* A position-dependent executable that takes malloc's address has a canonical PLT entry:
   * its dynamic symbol malloc is undefined (SHN_UNDEF) and has that entry's address, which
   * dlsym returns (Debian's python3.11); its calls reach the malloc after it, heapsight's.
   * dladdr counts such a symbol (glibc's dl-addr.c) and names it: only here, once. */
  Dl_info info;
  const ElfW(Sym) *sym = NULL;
  if (dladdr1(m, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_shndx == SHN_UNDEF)
    return;
  char exe[4096];
  if (!path || !*path) {
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[k > 0 ? k : 0] = 0;
    path = k > 0 ? exe : "the executable";
  }
  size_t len = strlen(path), keep = len < n - 1 ? len : n - 1;
  memcpy(out, path + len - keep, keep);
  out[keep] = 0;
}

/* full 0: the id and the name only (a segment no one else reads: whose malloc the program
 * reaches and the allocator's version cost a symbol search and a readlink). */
void _hs_allocator_describe(hs_segment_t *seg, int full) {
  seg->allocator_id = (uint64_t)g_alloc->id;
  strncpy(seg->allocator_name, g_alloc->name, sizeof seg->allocator_name - 1);
  if (!full) return;
  malloc_elsewhere(seg->malloc_elsewhere, sizeof seg->malloc_elsewhere);
  allocator_version(seg->allocator_version, sizeof seg->allocator_version);
}

int _hs_allocator_stats(hs_alloc_stats_t *out) {
  out->time_ns = _hs_now_ns();
  return g_alloc->stats(out);
}

int _hs_allocator_release(void) { return g_alloc->release(); }

int _hs_allocator_release_on_caller(void) { return g_alloc->release_on_caller; }
