/* allocators.c: which allocator answers malloc, its own statistics, and its release-now
 * call. One adapter per allocator; glibc's is complete, the others are found by name and
 * report no statistics yet. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "hs_internal.h"

int _hs_usable_by_header;

typedef struct hs_allocator_s {
  int id;
  const char *name;
  const char *soname_part; /* how its library file is recognised */
  int (*stats)(hs_alloc_stats_t *out);
  int (*release)(void);
} hs_allocator_t;

/* ---- glibc: mallinfo2 (all arenas) and malloc_info (arena count) ---- */
static struct mallinfo2 (*g_mallinfo2)(void);
static int (*g_malloc_info)(int, FILE *);
static int (*g_malloc_trim)(size_t);
static FILE *g_info_fp;              /* fmemopen over g_info_buf, unbuffered: no malloc later */
static char g_info_buf[512 * 1024];

static pthread_mutex_t g_info_lock = PTHREAD_MUTEX_INITIALIZER;

static int glibc_count_arenas(void) {
  if (!g_info_fp || !g_malloc_info) return 0;
  pthread_mutex_lock(&g_info_lock); /* the stats thread and the exit probe share the FILE */
  rewind(g_info_fp);
  g_malloc_info(0, g_info_fp);
  long len = ftell(g_info_fp);
  int n = 0;
  if (len > 0) {
    if ((size_t)len >= sizeof g_info_buf) len = sizeof g_info_buf - 1;
    g_info_buf[len] = 0;
    for (const char *p = g_info_buf; (p = strstr(p, "<heap nr=")) != NULL; p += 9) n++;
  }
  pthread_mutex_unlock(&g_info_lock);
  return n;
}

static int glibc_stats(hs_alloc_stats_t *out) {
  if (!g_mallinfo2) return 0;
  struct mallinfo2 m = g_mallinfo2();
  size_t raw[10] = {m.arena, m.ordblks, m.smblks, m.hblks, m.hblkhd,
                    m.usmblks, m.fsmblks, m.uordblks, m.fordblks, m.keepcost};
  for (int i = 0; i < 10; i++) out->raw[i] = raw[i];
  out->in_use_bytes = m.uordblks + m.hblkhd;
  out->free_bytes = m.fordblks;
  out->mapped_bytes = m.arena + m.hblkhd;
  out->mmapped_bytes = m.hblkhd;
  out->resident_bytes = 0; /* glibc has no resident figure: see docs/numbers.md */
  out->top_pad_bytes = m.keepcost;
  out->arenas = (uint64_t)glibc_count_arenas();
  return 1;
}

static int glibc_release(void) { return g_malloc_trim ? g_malloc_trim(0) : 0; }

static int none_stats(hs_alloc_stats_t *out) { (void)out; return 0; }
static int none_release(void) { return 0; }

static const hs_allocator_t g_allocators[] = {
    {HS_ALLOC_JEMALLOC, "jemalloc", "jemalloc", none_stats, none_release},
    {HS_ALLOC_TCMALLOC, "tcmalloc", "tcmalloc", none_stats, none_release},
    {HS_ALLOC_MIMALLOC, "mimalloc", "mimalloc", none_stats, none_release},
    {HS_ALLOC_MMAP, "mmap", "libheapsight_mmap", none_stats, none_release},
    {HS_ALLOC_GLIBC, "glibc", "libc.so", glibc_stats, glibc_release},
};
static const hs_allocator_t g_unknown = {HS_ALLOC_UNKNOWN, "unknown", "", none_stats, none_release};
static const hs_allocator_t *g_alloc = &g_unknown;

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

void _hs_allocator_detect(void) {
  Dl_info info;
  const char *file = "";
  if (dladdr((void *)_hs_real.malloc, &info) && info.dli_fname) file = info.dli_fname;
  for (size_t i = 0; i < sizeof g_allocators / sizeof *g_allocators; i++) {
    if (strstr(file, g_allocators[i].soname_part)) {
      g_alloc = &g_allocators[i];
      break;
    }
  }
  if (g_alloc->id == HS_ALLOC_GLIBC) {
    g_mallinfo2 = (struct mallinfo2 (*)(void))dlsym(RTLD_NEXT, "mallinfo2");
    g_malloc_info = (int (*)(int, FILE *))dlsym(RTLD_NEXT, "malloc_info");
    g_malloc_trim = (int (*)(size_t))dlsym(RTLD_NEXT, "malloc_trim");
    _hs_usable_by_header = header_matches_glibc();
  }
}

/* Runs in the constructor, on the main thread: the FILE and its cookie are allocated here,
 * once, so the stats thread itself never allocates. */
void _hs_allocator_prepare(void) {
  if (g_alloc->id == HS_ALLOC_GLIBC && !g_info_fp) {
    g_info_fp = fmemopen(g_info_buf, sizeof g_info_buf, "w");
    if (g_info_fp) setvbuf(g_info_fp, NULL, _IONBF, 0);
  }
}

void _hs_allocator_describe(hs_segment_t *seg) {
  seg->allocator_id = (uint64_t)g_alloc->id;
  strncpy(seg->allocator_name, g_alloc->name, sizeof seg->allocator_name - 1);
}

int _hs_allocator_stats(hs_alloc_stats_t *out) {
  out->time_ns = _hs_now_ns();
  return g_alloc->stats(out);
}

int _hs_allocator_release(void) { return g_alloc->release(); }
