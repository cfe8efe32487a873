/* preload.c: the interposer. Each hook finds the real function (RTLD_NEXT), forwards, and
 * hands the result to the counters in hs_internal.h. Nothing here allocates or takes a
 * lock; the one wait is at start-up, for another thread resolving the real functions (a
 * second at most, then the pool: ready_slow). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "hs_internal.h"

#define HS_EXPORT __attribute__((visibility("default")))

/* Start-up, explicit (heaptrack's DummyPool idea): until the real functions are known,
 * the hooks cannot forward. One thread resolves them, once; dlsym may allocate on that
 * thread meanwhile (calloc for its error buffer, an IFUNC resolver it runs), and a static
 * pool answers those calls; its pointers never reach the real free or realloc. Other
 * threads wait until the segment is attached too, so nothing is counted half. Until then
 * free and the usable-size call go through stubs that resolve first, so the hot path of
 * free needs no check of its own. */
enum { HS_UNRESOLVED, HS_RESOLVING, HS_RESOLVED };
static int g_state;
static int g_funcs_known;        /* set by the resolving thread once dlsym is done */
static HS_TLS int t_resolving;   /* this thread is the one resolving */
static HS_TLS int t_waited_out;  /* this thread waited its second: pool until resolved */

static void bootstrap_free(void *p);
static size_t bootstrap_usable(void *p);
static void *bootstrap_malloc(size_t size);
hs_real_t _hs_real = {.malloc = bootstrap_malloc, .free = bootstrap_free,
                      .malloc_usable_size = bootstrap_usable};

static char g_pool[64 * 1024] __attribute__((aligned(64)));
static size_t g_pool_used;

static int in_pool(const void *p) {
  return (uintptr_t)p - (uintptr_t)g_pool < sizeof g_pool; /* one compare */
}

/* A pool block of n bytes at the given alignment (16 or more), its size stored in the 16
 * bytes before it for realloc. */
static void *pool_alloc_aligned(size_t align, size_t n) {
  if (align < 16) align = 16;
  if (n > sizeof g_pool || align > sizeof g_pool / 4) return NULL;
  size_t need = ((n + 15) & ~(size_t)15) + align + 16;
  size_t at = __atomic_fetch_add(&g_pool_used, need, __ATOMIC_RELAXED);
  if (at + need > sizeof g_pool) {
    static const char msg[] = "heapsight: bootstrap pool exhausted\n";
    (void)!write(2, msg, sizeof msg - 1);
    abort();
  }
  uintptr_t p = ((uintptr_t)(g_pool + at + 16) + align - 1) & ~(uintptr_t)(align - 1);
  ((size_t *)p)[-2] = n;
  /* 255 sticks (profile.c never counts it down); pool blocks come before any sample */
  __atomic_store_n(&_hs_sample_map[(p >> 4) & (HS_SAMPLE_MAP_SIZE - 1)], 255, __ATOMIC_RELAXED);
  _hs_map_written((p >> 4) & (HS_SAMPLE_MAP_SIZE - 1));
  return (void *)p;
}

static void *pool_alloc(size_t n) { return pool_alloc_aligned(16, n); }
static size_t pool_size(const void *p) { return ((const size_t *)p)[-2]; }

static void *must_find(const char *name, int required) {
  void *f = dlsym(RTLD_NEXT, name);
  if (!f && required) {
    char buf[160];
    int len = snprintf(buf, sizeof buf, "heapsight: cannot find the real %s; "
                       "is the program statically linked?\n", name);
    (void)!write(2, buf, (size_t)len);
    abort();
  }
  return f;
}

static void seccomp_hooks_setup(void);

static void resolve_now(void) {
  t_resolving = 1;
  /* free(NULL) takes the marked path (free_marked): the byte of address 0 sticks at 255
   * (so does every block whose address shares it: one 16-byte granule in 4 MiB), which
   * spares the hot path of free a test of its own. Set before any thread has a slot, so
   * before the hot path can read a header. */
  __atomic_store_n(&_hs_sample_map[0], 255, __ATOMIC_RELAXED);
  _hs_map_written(0);
  hs_real_t r;
  r.malloc = must_find("malloc", 1);
  r.free = must_find("free", 1);
  r.calloc = must_find("calloc", 1);
  r.realloc = must_find("realloc", 1);
  r.reallocarray = must_find("reallocarray", 0);
  r.posix_memalign = must_find("posix_memalign", 1);
  r.aligned_alloc = must_find("aligned_alloc", 0);
  r.memalign = must_find("memalign", 0);
  r.valloc = must_find("valloc", 0);
  r.pvalloc = must_find("pvalloc", 0);
  r.malloc_usable_size = must_find("malloc_usable_size", 1);
  _hs_real = r;
  seccomp_hooks_setup();
  __atomic_store_n(&g_funcs_known, 1, __ATOMIC_RELEASE);
  /* From here this thread forwards (uncounted: no segment yet); the others still wait. */
  _hs_allocator_detect();
  /* the lookups that found nothing (another allocator's functions) left dlerror()'s
   * message allocated in the heap: heapsight's, not the program's, and found by the copy
   * as a block no hook counted (56 bytes in every program). Two calls free it, here,
   * before any block is counted. */
  (void)dlerror();
  (void)dlerror();
  _hs_segment_attach();
  _hs_own_publish();
  _hs_profile_setup();
  t_resolving = 0;
  __atomic_store_n(&g_state, HS_RESOLVED, __ATOMIC_RELEASE);
}

/* 1: the real functions may be called; 0: use the pool (this thread is inside dlsym in
 * the resolver, or waited a second for another: a thread holding the loader's lock,
 * inside dlopen, would otherwise wait for a resolver that needs that lock). */
static __attribute__((noinline)) int ready_slow(void) {
  if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) == HS_RESOLVED) return 1;
  if (t_resolving) return __atomic_load_n(&g_funcs_known, __ATOMIC_ACQUIRE);
  int expected = HS_UNRESOLVED;
  if (__atomic_compare_exchange_n(&g_state, &expected, HS_RESOLVING, 0, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE)) {
    resolve_now();
    return 1;
  }
  if (t_waited_out) return 0; /* waited once already: no second wait per call */
  uint64_t until = _hs_now_ns() + 1000000000ull; /* by time: the resolver may be slow */
  do {
    for (int i = 0; i < 1000; i++) {
      if (__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) == HS_RESOLVED) return 1;
      sched_yield();
    }
  } while (_hs_now_ns() < until);
  t_waited_out = 1;
  return 0;
}

void _hs_resolve(void) { (void)ready_slow(); }

#define HS_READY_OR(fallback)                                                     \
  do {                                                                            \
    if (HS_UNLIKELY(__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != HS_RESOLVED) && \
        !ready_slow())                                                            \
      return (fallback);                                                          \
  } while (0)

/* malloc needs no test of its own either: until start-up is done it calls this. */
static void *bootstrap_malloc(size_t size) {
  if (ready_slow() && _hs_real.malloc != bootstrap_malloc) return _hs_real.malloc(size);
  return pool_alloc(size);
}

static void bootstrap_free(void *p) {
  if (ready_slow() && _hs_real.free != bootstrap_free) _hs_real.free(p);
  /* else: a block freed inside dlsym before free is known; it is left (never seen) */
}

static size_t bootstrap_usable(void *p) {
  if (ready_slow() && _hs_real.malloc_usable_size != bootstrap_usable)
    return _hs_real.malloc_usable_size(p);
  return 0;
}

/* A failed allocation sets errno as POSIX says, whatever the allocator did (mimalloc 2.0.9
 * and tcmalloc's calloc leave it alone): EINVAL for an alignment that is no power of two,
 * ENOMEM otherwise. Only on the failure path. */
__attribute__((noinline, cold)) static void *failed(size_t align) {
  errno = align & (align - 1) ? EINVAL : ENOMEM;
  return NULL;
}

/* The counting after a successful allocation, inline in malloc and calloc (a function of
 * its own, reached by a jump, cost 4 instructions more: the arguments moved and the
 * block returned again). Its one slow way out is a jump that returns the block, and only
 * there is the hook's caller read (for the sample's stack): with a way out per case, the
 * compiler read it on the common path. */
__attribute__((noinline)) static void *counted_cold(void *p, size_t req, const void *caller) {
  hs_slot_t *s = _hs_tslot;
  if (s == NULL || (hs_glibc_header(p) & 2)) {
    if (in_pool(p)) return p; /* from bootstrap_malloc: never counted */
    hs_slot_t *o = _hs_tslot_other; /* another allocator, a thread with its slot */
    if (o != NULL) return _hs_counted_other(o, p, req, caller);
    return _hs_counted_slow(p, req, caller);
  }
  /* counted inline, and the countdown ran out */
  return _hs_counted_due(s, p, hs_glibc_header(p) & ~(size_t)7, req, caller);
}

/* hs_count_alloc for malloc, shaped so that the hook's whole fast path is this test and a
 * return of p, everything else one tail call (always inline: the caller is the hook). */
__attribute__((always_inline)) static inline void *counted(void *p, size_t req) {
  hs_slot_t *s = _hs_tslot;
  size_t hdr;
  if (HS_UNLIKELY(s == NULL) || HS_UNLIKELY((hdr = hs_glibc_header(p)) & 2) ||
      HS_UNLIKELY(hs_add_alloc(s, hdr & ~(size_t)7, req)))
    return counted_cold(p, req, __builtin_return_address(0));
  return p;
}

HS_EXPORT void *malloc(size_t size) {
  void *p = _hs_real.malloc(size); /* bootstrap_malloc until start-up is done */
  if (HS_UNLIKELY(p == NULL)) return failed(1);
  return counted(p, size);
}

/* A glibc chunk whose free may give pages back to the OS is counted freed once glibc's free
 * returned: a chunk served by its own mmap (munmap), and a heap chunk of HS_TRIM_FREE or more
 * (it may make glibc trim its heap's top by sbrk). Counted before, a sample during the munmap
 * or the trim (1-2 ms for 32 MiB) read the pages still resident and the block gone: the peak
 * column of a program that writes and frees 32 MiB blocks read "live 0 B, retained 32.5 MiB"
 * in 2 runs of 3, memory glibc never kept. Its header is read before the free; nothing of it
 * after. 1 when it freed and counted p. */
#define HS_TRIM_FREE (64u * 1024u)

static inline int gives_back(size_t hdr) {
  return (hdr & 2) || (hdr & ~(size_t)7) >= HS_TRIM_FREE;
}

static void free_counted_after(void *p, size_t hdr) {
  if (_hs_blockmap_on) _hs_blockmap_clear(p);
  _hs_real.free(p);
  _hs_count_free_read(hdr, hs_glibc_usable(hdr));
}

static int free_then_count(void *p) {
  if (!_hs_usable_by_header || _hs_tslot_other != NULL) return 0;
  size_t hdr = hs_glibc_header(p);
  if (!gives_back(hdr)) return 0;
  free_counted_after(p, hdr);
  return 1;
}

/* The pool's blocks are marked in the sampled-block map (pool_alloc_aligned), so the one
 * byte load that looks for sampled blocks finds them too, and NULL (resolve_now). */
__attribute__((noinline)) static void free_marked(void *p) {
  if (p == NULL || in_pool(p)) return;
  if (_hs_own_take(p)) { _hs_real.free(p); return; } /* heapsight's own: never counted */
  _hs_sample_free(p);
  if (free_then_count(p)) return;
  hs_count_free_unsampled(p);
  _hs_real.free(p);
}

__attribute__((noinline)) static void free_slow(void *p) {
  if (p == NULL) return; /* before start-up, or on a thread without a slot */
  hs_slot_t *o = _hs_tslot_other; /* another allocator, a thread with its slot */
  if (o != NULL) _hs_count_free_other(o, p);
  else if (free_then_count(p)) return;
  else _hs_count_free_slow(p);
  _hs_real.free(p);
}

__attribute__((noinline)) static void free_flush(hs_slot_t *s, void *p) {
  if (HS_UNLIKELY(_hs_own_slot(s))) { _hs_own_free(p); _hs_real.free(p); return; }
  /* a large free (it always ends the countdown, which starts at 64 KiB or less; a glibc heap
   * chunk: the hook's fast path): the count the hook made inline is taken back (this
   * thread's own counters: a reader sees the state before the free) and made again after it */
  size_t hdr = hs_glibc_header(p);
  if (gives_back(hdr)) {
    s->free_left += (int64_t)(hdr & ~(size_t)7);
    s->n_free--;
    free_counted_after(p, hdr);
    return;
  }
  _hs_flush(s);
  _hs_real.free(p);
}

/* As counted(): every way out is a jump (the real free last), so nothing is saved. */
HS_EXPORT void free(void *p) {
  if (HS_UNLIKELY(hs_sample_maybe(p))) return free_marked(p); /* NULL too */
  hs_slot_t *s = _hs_tslot;
  size_t hdr;
  if (HS_UNLIKELY(s == NULL) || HS_UNLIKELY((hdr = hs_glibc_header(p)) & 2)) return free_slow(p);
  if (HS_UNLIKELY(hs_add_free(s, hdr & ~(size_t)7))) return free_flush(s, p);
  _hs_real.free(p);
}

HS_EXPORT void *calloc(size_t n, size_t m) {
  size_t size;
  if (__builtin_mul_overflow(n, m, &size)) { errno = ENOMEM; return NULL; }
  HS_READY_OR(pool_alloc(size)); /* the static pool is zeroed, never reused */
  void *p = _hs_real.calloc(n, m);
  if (HS_UNLIKELY(p == NULL)) return failed(1);
  return counted(p, size);
}

HS_EXPORT void *realloc(void *old, size_t size) {
  if (old == NULL) return malloc(size);
  if (HS_UNLIKELY(in_pool(old))) { /* a pool block moves out, its data with it */
    void *p = malloc(size);
    size_t had = pool_size(old);
    if (p) memcpy(p, old, had < size ? had : size);
    return p;
  }
  HS_READY_OR(failed(1)); /* not from the pool, yet before start-up: cannot be */
  /* Count the old block as freed before the call: afterwards it may belong to someone else.
   * (hs_count_free_unsampled after the sampled-block test, with heapsight's own blocks told
   * apart on its marked path) */
  if (HS_UNLIKELY(hs_sample_maybe(old))) {
    if (_hs_own_take(old)) { /* heapsight's own block: the new one is ours too */
      _hs_own_begin();
      void *q = _hs_real.realloc(old, size);
      if (q != NULL) (void)counted(q, size);
      _hs_own_end();
      return q;
    }
    _hs_sample_free(old);
  }
  hs_count_free_unsampled(old);
  void *p = _hs_real.realloc(old, size);
  if (p != NULL) {
    hs_count_alloc(p, size);
    if (_hs_tslot) _hs_tslot->n_realloc++;
  } else if (size != 0) {
    hs_count_alloc(old, _hs_real.malloc_usable_size(old)); /* failed: old is still live */
    return failed(1);
  }
  return p;
}

HS_EXPORT void *reallocarray(void *old, size_t n, size_t m) {
  size_t size;
  if (__builtin_mul_overflow(n, m, &size)) { errno = ENOMEM; return NULL; }
  return realloc(old, size);
}

HS_EXPORT int posix_memalign(void **out, size_t align, size_t size) {
  if (HS_UNLIKELY(__atomic_load_n(&g_state, __ATOMIC_ACQUIRE) != HS_RESOLVED) && !ready_slow()) {
    if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
    return (*out = pool_alloc_aligned(align, size)) ? 0 : ENOMEM;
  }
  int rc = _hs_real.posix_memalign(out, align, size);
  if (rc == 0 && *out != NULL) hs_count_alloc(*out, size);
  return rc;
}

/* The aligned entry points an allocator may lack fall back on posix_memalign, which every
 * allocator we forward to provides. posix_memalign returns its error instead of setting
 * errno: the fallback sets it, as memalign and aligned_alloc must (ENOMEM, EINVAL). An
 * alignment that is no power of two is rounded up, as glibc's memalign does. */
static void *aligned_via(void *(*f)(size_t, size_t), size_t align, size_t size) {
  void *p = NULL;
  if (f) {
    p = f(align, size);
    if (p == NULL) return failed(align);
  } else {
    if (align < sizeof(void *)) align = sizeof(void *);
    if (align & (align - 1)) {
      if (align > (SIZE_MAX >> 1) + 1) { errno = EINVAL; return NULL; }
      align = (size_t)1 << (64 - __builtin_clzl(align));
    }
    int rc = _hs_real.posix_memalign(&p, align, size);
    if (rc != 0) { errno = rc; p = NULL; }
  }
  if (p != NULL) hs_count_alloc(p, size);
  return p;
}

/* Before start-up is done, the aligned entry points answer from the pool like malloc: the
 * resolver is never entered again from inside itself. */
#define HS_READY_ALIGNED(align) HS_READY_OR(pool_alloc_aligned((align), size))

HS_EXPORT void *aligned_alloc(size_t align, size_t size) {
  HS_READY_ALIGNED(align);
  return aligned_via(_hs_real.aligned_alloc, align, size);
}

HS_EXPORT void *memalign(size_t align, size_t size) {
  HS_READY_ALIGNED(align);
  return aligned_via(_hs_real.memalign, align, size);
}

HS_EXPORT void *valloc(size_t size) {
  HS_READY_ALIGNED(4096);
  if (_hs_real.valloc) {
    void *p = _hs_real.valloc(size);
    if (p) hs_count_alloc(p, size);
    else return failed(1);
    return p;
  }
  return aligned_via(NULL, (size_t)sysconf(_SC_PAGESIZE), size);
}

/* pvalloc rounds the size up to whole pages; a size that cannot be rounded fails with
 * ENOMEM instead of wrapping to a small block (tcmalloc 2.10's own pvalloc wraps too, so
 * the check comes before any allocator is asked). */
HS_EXPORT void *pvalloc(size_t size) {
  HS_READY_ALIGNED(4096);
  size_t page = (size_t)sysconf(_SC_PAGESIZE), rounded;
  if (__builtin_add_overflow(size, page - 1, &rounded)) return failed(1);
  if (_hs_real.pvalloc) {
    void *p = _hs_real.pvalloc(size);
    if (p) hs_count_alloc(p, size);
    else return failed(1);
    return p;
  }
  return aligned_via(NULL, page, rounded & ~(page - 1));
}

/* ---- seccomp: a filter the program installs ----
 * prctl(PR_SET_SECCOMP, ...) and the seccomp system call through syscall() (libseccomp's
 * way) are watched: a filter may forbid any system call, and one the library made inside
 * the program's malloc (growing its tables, reading an interpreter's frames) or at exit
 * (the copy, /proc reads) would kill the program (SIGSYS). From the moment one is set the
 * library makes none: what it could not measure is said (seccomp_at_ns). */
HS_HIDDEN int _hs_seccomp;

static void seccomp_coming(void) {
  if (__atomic_exchange_n(&_hs_seccomp, 1, __ATOMIC_ACQ_REL)) return;
  hs_segment_t *seg = _hs_seg;
  if (seg && _hs_is_owner()) __atomic_store_n(&seg->seccomp_at_ns, _hs_now_ns(), __ATOMIC_RELEASE);
}

typedef int (*hs_prctl_fn)(int, unsigned long, unsigned long, unsigned long, unsigned long);
typedef long (*hs_syscall_fn)(long, long, long, long, long, long, long);

static hs_prctl_fn g_real_prctl;
static hs_syscall_fn g_real_syscall;

/* Both looked up at start (resolve_now): never from a copy of the program, where dlsym
 * could wait for a lock a thread of the program held when it was made. */
static void seccomp_hooks_setup(void) {
  g_real_prctl = (hs_prctl_fn)dlsym(RTLD_NEXT, "prctl");
  g_real_syscall = (hs_syscall_fn)dlsym(RTLD_NEXT, "syscall");
}

HS_EXPORT int prctl(int option, ...) {
  hs_prctl_fn real = g_real_prctl;
  va_list ap;
  va_start(ap, option);
  unsigned long a2 = va_arg(ap, unsigned long), a3 = va_arg(ap, unsigned long),
                a4 = va_arg(ap, unsigned long), a5 = va_arg(ap, unsigned long);
  va_end(ap);
  if (!real) real = g_real_prctl = (hs_prctl_fn)dlsym(RTLD_NEXT, "prctl");
  if (option == PR_SET_SECCOMP) seccomp_coming();
  return real ? real(option, a2, a3, a4, a5) : (errno = ENOSYS, -1);
}

HS_EXPORT long syscall(long number, ...) {
  hs_syscall_fn real = g_real_syscall;
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
  va_end(ap);
  if (!real) real = g_real_syscall = (hs_syscall_fn)dlsym(RTLD_NEXT, "syscall");
  if (number == SYS_seccomp) seccomp_coming();
  return real ? real(number, a[0], a[1], a[2], a[3], a[4], a[5]) : (errno = ENOSYS, -1);
}

/* The hooks under names of the library's own, for attach.c: in a process the library was
 * loaded into (not preloaded), the exported names resolve to the C library's first. */
#define HS_SELF(name, self) __typeof__(name) self __attribute__((alias(#name), visibility("hidden")))
HS_SELF(malloc, _hs_hook_malloc);
HS_SELF(free, _hs_hook_free);
HS_SELF(calloc, _hs_hook_calloc);
HS_SELF(realloc, _hs_hook_realloc);
HS_SELF(posix_memalign, _hs_hook_posix_memalign);
HS_SELF(aligned_alloc, _hs_hook_aligned_alloc);
HS_SELF(memalign, _hs_hook_memalign);
HS_SELF(valloc, _hs_hook_valloc);
HS_SELF(pvalloc, _hs_hook_pvalloc);

/* dlopen with RTLD_DEEPBIND puts the library's own dependencies (libc among them) ahead
 * of the global scope, so its malloc binds past these hooks while its blocks are freed
 * through them. Drop the flag, as heaptrack does. A tail call, so the real dlopen still
 * sees the caller's return address (its namespace, and its RPATH for the search). */
typedef void *(*hs_dlopen_fn)(const char *, int);

HS_EXPORT void *dlopen(const char *file, int mode) {
  static hs_dlopen_fn real;
  hs_dlopen_fn f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
  if (HS_UNLIKELY(f == NULL)) {
    f = (hs_dlopen_fn)must_find("dlopen", 1);
    __atomic_store_n(&real, f, __ATOMIC_RELEASE);
  }
  return f(file, mode & ~RTLD_DEEPBIND);
}

/* dlclose may unmap a library whose range the sampled stacks know: tell profile.c. */
typedef int (*hs_dlclose_fn)(void *);

HS_EXPORT int dlclose(void *handle) {
  static hs_dlclose_fn real;
  hs_dlclose_fn f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
  if (HS_UNLIKELY(f == NULL)) {
    f = (hs_dlclose_fn)must_find("dlclose", 1);
    __atomic_store_n(&real, f, __ATOMIC_RELEASE);
  }
  int rc = f(handle);
  _hs_profile_dlclosed();
  return rc;
}

/* C++ operator new/delete, all variants (mangled names, Itanium ABI). They forward to the
 * allocator's malloc. When it fails, libstdc++'s own operator new takes over: it runs the
 * new_handler and retries through malloc (these hooks, so the block is counted), and
 * throws, or for the nothrow forms returns NULL once there is no handler or it throws.
 * Found in libstdc++ itself, not with RTLD_NEXT: jemalloc, tcmalloc and mimalloc define
 * operator new too, and their retry would allocate past the hooks. */
typedef struct { int unused; } hs_nothrow_t;
typedef void *(*hs_new_fn)(size_t);
typedef void *(*hs_new_aligned_fn)(size_t, size_t);
typedef void *(*hs_new_nothrow_fn)(size_t, const hs_nothrow_t *);
typedef void *(*hs_new_aligned_nothrow_fn)(size_t, size_t, const hs_nothrow_t *);

static void *cxx_real(const char *name) {
  void *lib = dlopen("libstdc++.so.6", RTLD_NOLOAD | RTLD_LAZY);
  void *f = lib ? dlsym(lib, name) : NULL;
  if (lib) dlclose(lib);
  return f ? f : must_find(name, 1);
}

#define HS_REAL_NEW(type, name, ...)                                   \
  do {                                                                 \
    static type real;                                                  \
    type f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);                 \
    if (!f) {                                                          \
      f = (type)cxx_real(name);                                        \
      __atomic_store_n(&real, f, __ATOMIC_RELEASE);                    \
    }                                                                  \
    return f(__VA_ARGS__);                                             \
  } while (0)

static void *new_aligned(size_t size, size_t align) {
  HS_READY_ALIGNED(align);
  return aligned_via(NULL, align, size ? size : 1);
}

HS_EXPORT void *_Znwm(size_t size) {
  void *p = malloc(size ? size : 1);
  if (HS_LIKELY(p != NULL)) return p;
  HS_REAL_NEW(hs_new_fn, "_Znwm", size);
}
HS_EXPORT void *_Znam(size_t size) {
  void *p = malloc(size ? size : 1);
  if (HS_LIKELY(p != NULL)) return p;
  HS_REAL_NEW(hs_new_fn, "_Znam", size);
}
HS_EXPORT void *_ZnwmRKSt9nothrow_t(size_t size, const hs_nothrow_t *nt) {
  void *p = malloc(size ? size : 1);
  if (HS_LIKELY(p != NULL)) return p;
  HS_REAL_NEW(hs_new_nothrow_fn, "_ZnwmRKSt9nothrow_t", size, nt);
}
HS_EXPORT void *_ZnamRKSt9nothrow_t(size_t size, const hs_nothrow_t *nt) {
  void *p = malloc(size ? size : 1);
  if (HS_LIKELY(p != NULL)) return p;
  HS_REAL_NEW(hs_new_nothrow_fn, "_ZnamRKSt9nothrow_t", size, nt);
}
HS_EXPORT void *_ZnwmSt11align_val_t(size_t size, size_t align) {
  void *p = new_aligned(size, align);
  if (HS_LIKELY(p != NULL)) return p;
  HS_REAL_NEW(hs_new_aligned_fn, "_ZnwmSt11align_val_t", size, align);
}
HS_EXPORT void *_ZnamSt11align_val_t(size_t size, size_t align) {
  void *p = new_aligned(size, align);
  if (HS_LIKELY(p != NULL)) return p;
  HS_REAL_NEW(hs_new_aligned_fn, "_ZnamSt11align_val_t", size, align);
}
HS_EXPORT void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t size, size_t align, const hs_nothrow_t *nt) {
  void *p = new_aligned(size, align);
  if (HS_LIKELY(p != NULL)) return p;
  HS_REAL_NEW(hs_new_aligned_nothrow_fn, "_ZnwmSt11align_val_tRKSt9nothrow_t", size, align, nt);
}
HS_EXPORT void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t size, size_t align, const hs_nothrow_t *nt) {
  void *p = new_aligned(size, align);
  if (HS_LIKELY(p != NULL)) return p;
  HS_REAL_NEW(hs_new_aligned_nothrow_fn, "_ZnamSt11align_val_tRKSt9nothrow_t", size, align, nt);
}

HS_EXPORT void _ZdlPv(void *p) { free(p); }
HS_EXPORT void _ZdaPv(void *p) { free(p); }
HS_EXPORT void _ZdlPvm(void *p, size_t n) { (void)n; free(p); }
HS_EXPORT void _ZdaPvm(void *p, size_t n) { (void)n; free(p); }
HS_EXPORT void _ZdlPvRKSt9nothrow_t(void *p, const hs_nothrow_t *nt) { (void)nt; free(p); }
HS_EXPORT void _ZdaPvRKSt9nothrow_t(void *p, const hs_nothrow_t *nt) { (void)nt; free(p); }
HS_EXPORT void _ZdlPvSt11align_val_t(void *p, size_t a) { (void)a; free(p); }
HS_EXPORT void _ZdaPvSt11align_val_t(void *p, size_t a) { (void)a; free(p); }
HS_EXPORT void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t a) { (void)n; (void)a; free(p); }
HS_EXPORT void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t a) { (void)n; (void)a; free(p); }
HS_EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const hs_nothrow_t *nt) {
  (void)a; (void)nt; free(p);
}
HS_EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const hs_nothrow_t *nt) {
  (void)a; (void)nt; free(p);
}

/* ---- when the program's exit begins ----
 * The exit probe runs in the library's destructor, after the program's atexit handlers,
 * static destructors and an interpreter's teardown have freed what they free: the program's
 * work was done before. main's return (seen by a main of ours, which __libc_start_main is
 * given in its place) and a call of exit() are that moment; the first one writes it
 * (exit_begun_ns, _how) and takes the reading of that moment (counters.c:
 * _hs_exit_begun_read), in the owner only (a forked child's segment is a copy, not the
 * run's). A compare-and-swap, the clock (the vDSO's: no system call), the slots' sums and
 * one read of statm (none under a seccomp filter): no lock, no allocation. Both real
 * functions are looked up at start (hs_start), never from inside malloc. */
typedef int (*hs_main_fn)(int, char **, char **);
typedef void (*hs_fn)(void);
typedef int (*hs_start_main_fn)(hs_main_fn, int, char **, hs_fn, hs_fn, hs_fn, void *);
typedef void (*hs_exit_fn)(int) __attribute__((noreturn));
static hs_start_main_fn g_real_start_main;
static hs_main_fn g_program_main;
HS_HIDDEN void *_hs_real_exit; /* glibc's exit: probe.c finds its frame */

static void exit_begins(uint64_t how) {
  hs_segment_t *seg = _hs_seg;
  if (!seg || !_hs_is_owner()) return;
  uint64_t none = 0;
  if (__atomic_compare_exchange_n(&seg->exit_begun_ns, &none, _hs_now_ns(), 0, __ATOMIC_RELEASE,
                                  __ATOMIC_RELAXED)) {
    __atomic_store_n(&seg->exit_begun_how, how, __ATOMIC_RELEASE);
    _hs_exit_begun_read(seg);
  }
}

static void exit_hooks_setup(void) {
  __atomic_store_n(&g_real_start_main, (hs_start_main_fn)must_find("__libc_start_main", 0),
                   __ATOMIC_RELEASE);
  __atomic_store_n(&_hs_real_exit, must_find("exit", 0), __ATOMIC_RELEASE);
}

/* CPython's exit begins when Py_FinalizeEx sets _PyRuntime._finalizing (interp.c), after
 * the program's atexit callbacks and its threads, before its modules and objects go: its
 * main() returns only after that teardown. The first flush of a thread's counters after it
 * (counters.c: at most a flush limit's bytes allocated or freed later), or the first munmap
 * (mappings.c, before the pages go: pymalloc gives its arenas back by munmap, with no
 * free() to flush: a script holding 40 MB of small objects was read after they had gone),
 * takes the reading of that moment, where the CLI's ticks saw it within a tick: python3
 * closing an in-memory sqlite3 database in its last line freed 48 MiB in that tick, and the
 * run's verdict gave CPython's teardown the retention it left (healthy in one run,
 * retention in the next). One load while not CPython; two per flush or munmap while it
 * runs; none once taken. */
static const uint64_t *g_py_finalizing;

void _hs_py_end_poll(void) {
  const uint64_t *fin = __atomic_load_n(&g_py_finalizing, __ATOMIC_RELAXED);
  if (!fin || !__atomic_load_n(fin, __ATOMIC_RELAXED)) return;
  __atomic_store_n(&g_py_finalizing, NULL, __ATOMIC_RELAXED);
  exit_begins(HS_EXIT_BEGUN_PY_FINALIZING);
}

static int main_of_ours(int argc, char **argv, char **envp) {
  int rc = g_program_main(argc, argv, envp);
  exit_begins(HS_EXIT_BEGUN_MAIN_RETURNED);
  return rc;
}

/* Everything but main is passed on as given (init's and fini's types vary with glibc's
 * version: they are only handed through). */
HS_EXPORT int __libc_start_main(hs_main_fn main, int argc, char **argv, hs_fn init, hs_fn fini,
                                hs_fn rtld_fini, void *stack_end) {
  hs_start_main_fn real = __atomic_load_n(&g_real_start_main, __ATOMIC_ACQUIRE);
  if (!real) real = (hs_start_main_fn)must_find("__libc_start_main", 1); /* before hs_start */
  g_program_main = main;
  return real(main_of_ours, argc, argv, init, fini, rtld_fini, stack_end);
}

HS_EXPORT void exit(int status) {
  exit_begins(HS_EXIT_BEGUN_EXIT_CALLED);
  hs_exit_fn real = (hs_exit_fn)__atomic_load_n(&_hs_real_exit, __ATOMIC_ACQUIRE);
  if (!real) real = (hs_exit_fn)must_find("exit", 1); /* called before hs_start ran */
  real(status);
}

/* Start-up and exit. The constructor runs before main; the destructor after the program's
 * own atexit handlers and static destructors, which is when the release probe belongs. */
/* glibc's posix_spawn, which starts the program, leaves its two internal signals (32 and
 * 33) ignored in it when the spawning process handled them (an ignored disposition
 * survives exec): a program started from a shell has them at their default. The CLI names
 * those it was itself started with at their default (HEAPSIGHT_INTERNAL_SIGNALS="32,33",
 * or one of them), and they are put back here, in the process it started (not in the
 * program's own children: posix_spawn does the same to them bare), with the raw system
 * call (glibc's sigaction refuses these two). */
static void internal_signals_as_started(void) {
  const char *v = getenv("HEAPSIGHT_INTERNAL_SIGNALS");
  hs_segment_t *seg = _hs_seg;
  if (!v || !seg || !_hs_is_owner() || __atomic_load_n(&seg->execs, __ATOMIC_RELAXED) != 0)
    return;
  for (int sig = 32; sig <= 33; sig++) {
    if (!strstr(v, sig == 32 ? "32" : "33")) continue; /* it started ignored: stays so */
    struct { void *handler; unsigned long flags; void *restorer; uint64_t mask; } old, dfl;
    memset(&dfl, 0, sizeof dfl);
    if (syscall(SYS_rt_sigaction, sig, NULL, &old, 8) == 0 && old.handler == (void *)1)
      syscall(SYS_rt_sigaction, sig, &dfl, NULL, 8); /* SIG_IGN (1) back to SIG_DFL (0) */
  }
}

/* Whether the library was preloaded (the process started with it in LD_PRELOAD, or its
 * malloc is the one the process's names resolve to): loaded later by `heapsight attach
 * --track` (attach.c), it is neither, and starts only when asked to. */
static int preloaded(void) {
  static int known = -1;
  if (known < 0) {
    const char *v = getenv("LD_PRELOAD");
    known = (v && strstr(v, "libheapsight.so")) || dlsym(RTLD_DEFAULT, "malloc") == (void *)&_hs_hook_malloc;
  }
  return known;
}

__attribute__((constructor)) static void hs_start(void) {
  if (!preloaded()) return;
  _hs_resolve();
  internal_signals_as_started();
  _hs_own_begin(); /* what the unwinder's dlopen allocates is ours */
  exit_hooks_setup();
  if (_hs_seg && _hs_is_owner()) {
    _hs_seg->py_finalizing_addr = _hs_py_finalizing_addr();
    __atomic_store_n(&g_py_finalizing, (const uint64_t *)(uintptr_t)_hs_seg->py_finalizing_addr,
                     __ATOMIC_RELAXED);
  }
  _hs_profile_start();
  _hs_probe_start();
  _hs_own_end();
}

/* In a process the library was loaded into: started by heapsight_attach_begin (attach.c). */
void _hs_attach_start(void) {
  _hs_resolve();
  _hs_profile_start();
  _hs_probe_start();
}

__attribute__((destructor)) static void hs_stop(void) {
  if (!preloaded()) {
    _hs_attach_stop(); /* dlclose after heapsight_attach_end: the segment unmapped */
    return;
  }
  _hs_exit_probe();
  _hs_segment_remove_own();
}
