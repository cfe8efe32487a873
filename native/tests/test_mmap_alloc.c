/* hs-test-mmap-alloc: correctness of libheapsight_mmap.so, the page-per-allocation
 * baseline allocator. Linked against it (so its malloc answers every call in this
 * program, libc's own included); run it bare, or under libheapsight.so (which then
 * forwards to it). Prints "N passed, M failed"; exits 1 on any failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint64_t heapsight_mmap_live_bytes(void);
uint64_t heapsight_mmap_live_blocks(void);
extern const int heapsight_mmap_allocator;

#define KEEP(p) __asm__ volatile("" ::"r"(p) : "memory")

static int passed, failed;

#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (cond) {                                           \
      passed++;                                           \
    } else {                                              \
      failed++;                                           \
      printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      printf(__VA_ARGS__);                                \
      printf("\n");                                       \
    }                                                     \
  } while (0)

static void fill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed + i * 7);
}

static int same(const unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(seed + i * 7)) return 0;
  return 1;
}

static void test_malloc_sizes(void) {
  static const size_t sizes[] = {0, 1, 15, 16, 17, 24, 100, 4079, 4080, 4081, 8192,
                                 100000, 1 << 20, (5 << 20) + 3};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t n = sizes[i];
    unsigned char *p = malloc(n);
    CHECK(p != NULL, "malloc(%zu)", n);
    if (!p) continue;
    CHECK((uintptr_t)p % 16 == 0, "malloc(%zu) = %p not 16-aligned", n, (void *)p);
    size_t u = malloc_usable_size(p);
    CHECK(u >= n && u >= 1, "malloc_usable_size(malloc(%zu)) = %zu", n, u);
    fill(p, u, (unsigned)i); /* the whole usable range is ours */
    CHECK(same(p, u, (unsigned)i), "malloc(%zu) contents", n);
    KEEP(p);
    free(p);
  }
  CHECK(malloc_usable_size(NULL) == 0, "malloc_usable_size(NULL)");
  void *a = malloc(0), *b = malloc(0);
  CHECK(a && b && a != b, "malloc(0) gives unique pointers");
  free(a);
  free(b);
  free(NULL);
}

static void test_calloc(void) {
  /* Dirty a block and free it first: a reusing allocator would hand the bytes back. */
  unsigned char *d = malloc(100000);
  memset(d, 0xab, 100000);
  KEEP(d);
  free(d);
  unsigned char *p = calloc(1000, 100);
  CHECK(p != NULL, "calloc(1000, 100)");
  if (p) {
    size_t u = malloc_usable_size(p), nz = 0;
    for (size_t i = 0; i < u; i++) nz += p[i] != 0;
    CHECK(nz == 0, "calloc: %zu non-zero bytes of %zu usable", nz, u);
    free(p);
  }
  volatile size_t huge = SIZE_MAX / 2; /* volatile: gcc warns about constant overflows */
  errno = 0;
  void *q = calloc(huge, 3);
  CHECK(q == NULL && errno == ENOMEM, "calloc overflow: %p errno %d", q, errno);
  q = malloc(huge * 2 - 99);
  CHECK(q == NULL && errno == ENOMEM, "malloc(SIZE_MAX - 100): %p errno %d", q, errno);
}

static void test_realloc(void) {
  unsigned char *p = realloc(NULL, 1000); /* realloc(NULL, n) is malloc */
  CHECK(p != NULL, "realloc(NULL, 1000)");
  fill(p, 1000, 3);
  static const size_t grow[] = {1001, 4080, 4081, 10000, 1 << 20, 10 << 20};
  size_t have = 1000;
  for (size_t i = 0; i < sizeof grow / sizeof *grow; i++) {
    unsigned char *q = realloc(p, grow[i]);
    CHECK(q != NULL, "realloc grow to %zu", grow[i]);
    if (!q) return;
    CHECK((uintptr_t)q % 16 == 0, "realloc(%zu) alignment", grow[i]);
    CHECK(same(q, have, 3), "realloc grow to %zu keeps the first %zu bytes", grow[i], have);
    CHECK(malloc_usable_size(q) >= grow[i], "usable after realloc to %zu", grow[i]);
    fill(q, grow[i], 3);
    have = grow[i];
    p = q;
  }
  static const size_t shrink[] = {1 << 20, 5000, 4000, 500, 1};
  for (size_t i = 0; i < sizeof shrink / sizeof *shrink; i++) {
    unsigned char *q = realloc(p, shrink[i]);
    CHECK(q != NULL, "realloc shrink to %zu", shrink[i]);
    if (!q) return;
    CHECK(same(q, shrink[i], 3), "realloc shrink to %zu keeps the data", shrink[i]);
    CHECK(malloc_usable_size(q) >= shrink[i], "usable after shrink to %zu", shrink[i]);
    p = q;
  }
  uint64_t blocks = heapsight_mmap_live_blocks();
  CHECK(realloc(p, 0) == NULL, "realloc(p, 0) frees and returns NULL");
  CHECK(heapsight_mmap_live_blocks() == blocks - 1, "realloc(p, 0) unmapped the block");

  /* An aligned block reallocated: data kept (alignment need not be). */
  void *a = NULL;
  CHECK(posix_memalign(&a, 4096, 3000) == 0, "posix_memalign for realloc");
  fill(a, 3000, 9);
  unsigned char *b = realloc(a, 50000);
  CHECK(b != NULL && same(b, 3000, 9), "realloc of an aligned block keeps the data");
  b = realloc(b, 100);
  CHECK(b != NULL && same(b, 100, 9), "realloc shrink of a copied block keeps the data");
  free(b);

  volatile size_t huge = SIZE_MAX / 2;
  errno = 0;
  unsigned char *r = reallocarray(NULL, huge, 4);
  CHECK(r == NULL && errno == ENOMEM, "reallocarray overflow");
  r = reallocarray(NULL, 100, 10);
  CHECK(r != NULL && malloc_usable_size(r) >= 1000, "reallocarray(NULL, 100, 10)");
  free(r);
}

static void test_aligned(void) {
  for (size_t align = 64; align <= 65536; align *= 2) {
    static const size_t sizes[] = {0, 1, 100, 4096, 5000, 70000};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      size_t n = sizes[i];
      void *p = NULL;
      int rc = posix_memalign(&p, align, n);
      CHECK(rc == 0 && p != NULL, "posix_memalign(%zu, %zu) = %d", align, n, rc);
      if (p) {
        CHECK((uintptr_t)p % align == 0, "posix_memalign(%zu, %zu) = %p", align, n, p);
        CHECK(malloc_usable_size(p) >= n, "usable of posix_memalign(%zu, %zu)", align, n);
        memset(p, 0x11, malloc_usable_size(p));
        KEEP(p);
        free(p);
      }
      void *q = aligned_alloc(align, n);
      CHECK(q != NULL && (uintptr_t)q % align == 0, "aligned_alloc(%zu, %zu) = %p", align, n, q);
      if (q) {
        CHECK(malloc_usable_size(q) >= n, "usable of aligned_alloc(%zu, %zu)", align, n);
        memset(q, 0x22, n);
        KEEP(q);
        free(q);
      }
      void *m = memalign(align, n);
      CHECK(m != NULL && (uintptr_t)m % align == 0, "memalign(%zu, %zu) = %p", align, n, m);
      free(m);
    }
  }
  void *p = NULL;
  CHECK(posix_memalign(&p, 24, 10) == EINVAL, "posix_memalign: 24 is not a power of two");
  CHECK(posix_memalign(&p, 4, 10) == EINVAL, "posix_memalign: 4 < sizeof(void *)");
  CHECK(posix_memalign(&p, 8, 10) == 0 && (uintptr_t)p % 8 == 0, "posix_memalign(8)");
  free(p);
  long page = sysconf(_SC_PAGESIZE);
  void *v = valloc(100);
  CHECK(v && (uintptr_t)v % (uintptr_t)page == 0 && malloc_usable_size(v) >= 100, "valloc");
  free(v);
  void *pv = pvalloc(100);
  CHECK(pv && (uintptr_t)pv % (uintptr_t)page == 0 && malloc_usable_size(pv) >= (size_t)page,
        "pvalloc rounds up to a page");
  free(pv);
}

/* Threads allocate, check and free independently: no locks needed in the allocator. */
static void *worker(void *arg) {
  uint64_t s = (uintptr_t)arg * 2654435761u + 1;
  enum { N = 64 };
  unsigned char *ptrs[N] = {0};
  size_t lens[N] = {0};
  long bad = 0;
  for (int it = 0; it < 20000; it++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    int k = (int)(s % N);
    if (ptrs[k]) {
      if (!same(ptrs[k], lens[k], (unsigned)k)) bad++;
      if (s & 256) {
        size_t n = (size_t)(s >> 20) % 20000;
        unsigned char *q = realloc(ptrs[k], n + 1);
        if (!q || !same(q, (n + 1) < lens[k] ? n + 1 : lens[k], (unsigned)k)) bad++;
        ptrs[k] = q;
        lens[k] = n + 1;
        fill(q, lens[k], (unsigned)k);
      } else {
        free(ptrs[k]);
        ptrs[k] = NULL;
      }
    } else {
      lens[k] = (size_t)(s >> 24) % 10000;
      ptrs[k] = malloc(lens[k]);
      if (!ptrs[k]) bad++;
      fill(ptrs[k], lens[k], (unsigned)k);
    }
  }
  for (int k = 0; k < N; k++) free(ptrs[k]);
  return (void *)bad;
}

static void test_threads(void) {
  pthread_t t[8];
  for (long i = 0; i < 8; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
  long bad = 0;
  for (int i = 0; i < 8; i++) {
    void *r;
    pthread_join(t[i], &r);
    bad += (long)r;
  }
  CHECK(bad == 0, "%ld bad blocks across 8 threads", bad);
}

int main(void) {
  CHECK(heapsight_mmap_allocator == 1, "marker symbol");
  /* stdio's buffer first, so it is not counted as a leak below. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("hs-test-mmap-alloc: page size %ld\n", sysconf(_SC_PAGESIZE));
  uint64_t bytes0 = heapsight_mmap_live_bytes(), blocks0 = heapsight_mmap_live_blocks();
  void *p = malloc(1);
  CHECK(heapsight_mmap_live_blocks() == blocks0 + 1, "malloc maps one block");
  CHECK(heapsight_mmap_live_bytes() == bytes0 + (uint64_t)sysconf(_SC_PAGESIZE),
        "malloc(1) maps one page");
  free(p);
  test_malloc_sizes();
  test_calloc();
  test_realloc();
  test_aligned();
  /* Everything freed went back (checked before the threads: glibc keeps each finished
   * thread's TLS vector, a malloc'ed block, with its cached stack). */
  CHECK(heapsight_mmap_live_blocks() == blocks0, "live blocks back to %llu: %llu",
        (unsigned long long)blocks0, (unsigned long long)heapsight_mmap_live_blocks());
  CHECK(heapsight_mmap_live_bytes() == bytes0, "live bytes back to %llu: %llu",
        (unsigned long long)bytes0, (unsigned long long)heapsight_mmap_live_bytes());
  test_threads();
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
