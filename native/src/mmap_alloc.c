/* mmap_alloc.c: libheapsight_mmap.so, the page-per-allocation baseline allocator that
 * `heapsight compare` runs next to glibc, jemalloc, tcmalloc and mimalloc.
 *
 * NOT A PRODUCTION ALLOCATOR. Every allocation gets its own anonymous mmap and every free
 * munmaps it, so nothing freed is ever retained: it is the zero-retention reference point
 * for "how much did the real allocator keep?", and, at one system call (and one page
 * fault per page) per malloc and per free plus a page or more per block, the price of not
 * keeping anything. A 1-byte malloc costs a 4 KiB page, so a million small live blocks
 * cost 4 GiB of RSS; and once the process holds vm.max_map_count (65530) separate
 * mappings (the kernel merges adjacent ones; frees in between split them), mmap fails and
 * malloc returns NULL.
 *
 * Layout of one block: [ ... | header (16 bytes) | user bytes ... end of mapping ]
 * The header, just before the user pointer, holds the mapping's length and the user
 * pointer's offset from the mapping start; aligned requests over-allocate and place the
 * user pointer inside the mapping (the unused pages in front and behind are unmapped).
 * malloc_usable_size is mapping end - user pointer.
 *
 * Thread safety without locks: every call works on its own mapping; the two live counters
 * (heapsight_mmap_live_bytes/_blocks, read by libheapsight's adapter) are atomics.
 *
 * Use it under libheapsight, which forwards to it through RTLD_NEXT:
 *   LD_PRELOAD=".../libheapsight.so:.../libheapsight_mmap.so" PROGRAM
 * (`heapsight run` prepends libheapsight.so to the LD_PRELOAD it is given). C++ operator
 * new/delete need nothing here: libstdc++'s versions call malloc and free. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HS_EXPORT __attribute__((visibility("default")))
#define HDR 16 /* header bytes; also the alignment of plain malloc */

typedef struct {
  size_t map_len; /* bytes mapped for this block, a multiple of the page size */
  size_t offset;  /* user pointer - mapping start */
} hdr_t;

/* A marker libheapsight (and anyone else) can look for with dlsym. */
HS_EXPORT const int heapsight_mmap_allocator = 1;

static uint64_t g_live_bytes;  /* sum of the live mappings' lengths */
static uint64_t g_live_blocks; /* live mappings */
static size_t g_page;

HS_EXPORT uint64_t heapsight_mmap_live_bytes(void) {
  return __atomic_load_n(&g_live_bytes, __ATOMIC_RELAXED);
}
HS_EXPORT uint64_t heapsight_mmap_live_blocks(void) {
  return __atomic_load_n(&g_live_blocks, __ATOMIC_RELAXED);
}

static size_t page_size(void) {
  size_t p = __atomic_load_n(&g_page, __ATOMIC_RELAXED);
  if (p == 0) {
    long v = sysconf(_SC_PAGESIZE); /* no allocation */
    p = v > 0 ? (size_t)v : 4096;
    __atomic_store_n(&g_page, p, __ATOMIC_RELAXED);
  }
  return p;
}

static void account(int64_t bytes, int64_t blocks) {
  __atomic_fetch_add(&g_live_bytes, (uint64_t)bytes, __ATOMIC_RELAXED);
  __atomic_fetch_add(&g_live_blocks, (uint64_t)blocks, __ATOMIC_RELAXED);
}

static hdr_t *header_of(void *p) { return (hdr_t *)((char *)p - HDR); }

static void bad_pointer(void) {
  static const char msg[] = "libheapsight_mmap: free/realloc of a pointer it did not allocate\n";
  (void)!write(2, msg, sizeof msg - 1);
  __builtin_trap();
}

static hdr_t *checked_header(void *p) {
  hdr_t *h = header_of(p);
  size_t page = page_size();
  if (h->map_len == 0 || h->map_len % page || h->offset < HDR || h->offset >= h->map_len ||
      ((uintptr_t)p - h->offset) % page)
    bad_pointer();
  return h;
}

/* The one way memory is obtained: `size` user bytes aligned to `align` (a power of two,
 * at least HDR), with the header just in front. */
static void *map_block(size_t size, size_t align) {
  size_t page = page_size();
  if (align < HDR) align = HDR;
  /* Worst case: the user pointer lands `align` bytes in (align > page), or HDR/align bytes
   * in (align <= page: mappings are page aligned). */
  size_t lead = align <= page ? align : align + page;
  if (size > SIZE_MAX - lead - page) {
    errno = ENOMEM;
    return NULL;
  }
  /* At least one byte past the user pointer, so that malloc(0) is unique and the header
   * check (offset < map_len) holds. */
  size_t len = (lead + (size ? size : 1) + page - 1) & ~(page - 1);
  char *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    errno = ENOMEM;
    return NULL;
  }
  uintptr_t user = ((uintptr_t)base + HDR + align - 1) & ~(uintptr_t)(align - 1);
  if (align > page) {
    /* Give back the whole pages before the header's page and after the block. */
    char *keep = (char *)((user - HDR) & ~(uintptr_t)(page - 1));
    char *end = (char *)(((uintptr_t)user + size + page - 1) & ~(uintptr_t)(page - 1));
    if (end == (char *)user) end += page; /* size 0: keep one page for a unique pointer */
    if (keep > base) munmap(base, (size_t)(keep - base));
    if (end < base + len) munmap(end, (size_t)(base + len - end));
    base = keep;
    len = (size_t)(end - keep);
  }
  hdr_t *h = (hdr_t *)(user - HDR);
  h->map_len = len;
  h->offset = user - (uintptr_t)base;
  account((int64_t)len, 1);
  return (void *)user;
}

static void unmap_block(void *p) {
  hdr_t *h = checked_header(p);
  size_t len = h->map_len;
  munmap((char *)p - h->offset, len);
  account(-(int64_t)len, -1);
}

static size_t usable(void *p) {
  hdr_t *h = header_of(p);
  return h->map_len - h->offset;
}

static int pow2(size_t a) { return a != 0 && (a & (a - 1)) == 0; }

static size_t round_pow2(size_t a) {
  size_t r = HDR;
  while (r < a && r < ((size_t)1 << 62)) r <<= 1;
  return r;
}

HS_EXPORT void *malloc(size_t size) { return map_block(size, HDR); }

HS_EXPORT void free(void *p) {
  if (p) unmap_block(p);
}

HS_EXPORT void *calloc(size_t n, size_t m) {
  size_t size;
  if (__builtin_mul_overflow(n, m, &size)) {
    errno = ENOMEM;
    return NULL;
  }
  return map_block(size, HDR); /* fresh anonymous pages are zero */
}

HS_EXPORT void *realloc(void *p, size_t size) {
  if (p == NULL) return map_block(size, HDR);
  if (size == 0) { /* as glibc: free and return NULL */
    unmap_block(p);
    return NULL;
  }
  hdr_t *h = checked_header(p);
  if (h->offset == HDR) {
    /* A plain block: the user pointer sits HDR bytes into the mapping wherever it moves,
     * so mremap keeps its alignment and copies nothing. */
    size_t page = page_size();
    if (size > SIZE_MAX - HDR - page) {
      errno = ENOMEM;
      return NULL;
    }
    size_t len = (HDR + size + page - 1) & ~(page - 1), old = h->map_len;
    if (len == old) return p;
    char *base = mremap((char *)p - HDR, old, len, MREMAP_MAYMOVE);
    if (base == MAP_FAILED) {
      errno = ENOMEM;
      return NULL;
    }
    ((hdr_t *)base)->map_len = len;
    account((int64_t)len - (int64_t)old, 0);
    return base + HDR;
  }
  /* An aligned block: copy into a plain one. */
  void *q = map_block(size, HDR);
  if (q == NULL) return NULL;
  size_t have = usable(p);
  memcpy(q, p, have < size ? have : size);
  unmap_block(p);
  return q;
}

HS_EXPORT void *reallocarray(void *p, size_t n, size_t m) {
  size_t size;
  if (__builtin_mul_overflow(n, m, &size)) {
    errno = ENOMEM;
    return NULL;
  }
  return realloc(p, size);
}

HS_EXPORT int posix_memalign(void **out, size_t align, size_t size) {
  if (!pow2(align) || align % sizeof(void *)) return EINVAL;
  int saved = errno;
  void *p = map_block(size, align);
  errno = saved;
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
}

/* glibc 2.36 semantics: an alignment that is not a power of two is rounded up. */
HS_EXPORT void *memalign(size_t align, size_t size) {
  if (align > ((size_t)1 << 62)) {
    errno = EINVAL;
    return NULL;
  }
  return map_block(size, pow2(align) ? align : round_pow2(align));
}

HS_EXPORT void *aligned_alloc(size_t align, size_t size) { return memalign(align, size); }

HS_EXPORT void *valloc(size_t size) { return map_block(size, page_size()); }

HS_EXPORT void *pvalloc(size_t size) {
  size_t page = page_size();
  if (size > SIZE_MAX - page) {
    errno = ENOMEM;
    return NULL;
  }
  size = size ? (size + page - 1) & ~(page - 1) : page;
  return map_block(size, page);
}

HS_EXPORT size_t malloc_usable_size(void *p) { return p ? usable(p) : 0; }
