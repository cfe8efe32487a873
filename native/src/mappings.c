/* mappings.c: anonymous memory the program maps itself, outside malloc, by the object
 * whose code called mmap: a runtime's own heap (CPython's pymalloc arenas, the JVM's heap,
 * V8's) is then named instead of lumped into "non-heap". glibc's malloc maps its chunks
 * and heaps with its internal __mmap, not through these hooks, so they are not counted
 * here. munmap and mremap are counted against the object that calls them (a runtime frees
 * its own arenas); a total never goes below 0. Not on the hot path: mmap is rare. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>

#include "hs_internal.h"

#define HS_EXPORT __attribute__((visibility("default")))

typedef void *(*hs_mmap_fn)(void *, size_t, int, int, int, off_t);
typedef int (*hs_munmap_fn)(void *, size_t);
typedef void *(*hs_mremap_fn)(void *, size_t, size_t, int, ...);

static hs_mmap_fn g_mmap, g_mmap64;
static hs_munmap_fn g_munmap;
static hs_mremap_fn g_mremap;
static int g_lock;

static void *real(void **slot, const char *name) {
  void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (!f) {
    f = dlsym(RTLD_NEXT, name);
    __atomic_store_n(slot, f, __ATOMIC_RELEASE);
  }
  return f;
}

/* The object whose code is at pc: its load base and file name (the program's: its file, as
 * /proc/self/exe names it and the profile's modules do; before that is read, the name it
 * was started by). _dl_find_object (glibc 2.35+) finds it from the
 * loader's sorted table without a lock; dladdr also looks for the nearest symbol, which
 * in a program with a huge symbol table (node exports V8's) took 55% of its time. */
int _hs_object_of(const void *pc, uint64_t *base, const char **name) {
  struct dl_find_object fo;
  if (_dl_find_object((void *)pc, &fo) == 0 && fo.dlfo_link_map) {
    *base = (uint64_t)(uintptr_t)fo.dlfo_map_start;
    const char *n = fo.dlfo_link_map->l_name;
    const char *exe = _hs_exe_path();
    *name = (n && *n) ? n : exe ? exe : program_invocation_name;
    return *base != 0;
  }
  Dl_info at; /* not in a loaded object's table (JIT code, say): dladdr's answer */
  if (!dladdr(pc, &at) || !at.dli_fbase) return 0;
  *base = (uint64_t)(uintptr_t)at.dli_fbase;
  *name = at.dli_fname;
  return 1;
}

static void account(const void *caller, int64_t bytes, int calls) {
  hs_segment_t *seg = _hs_seg;
  if (!seg || !_hs_is_owner() || !caller) return;
  static uint64_t own_base; /* heapsight's own object: its mappings are not the program's */
  uint64_t base, self = __atomic_load_n(&own_base, __ATOMIC_RELAXED);
  const char *fname = NULL, *ignored;
  if (!self && _hs_object_of((void *)account, &self, &ignored))
    __atomic_store_n(&own_base, self, __ATOMIC_RELAXED);
  if (!_hs_object_of(caller, &base, &fname) || base == self) return;
  while (__atomic_exchange_n(&g_lock, 1, __ATOMIC_ACQUIRE)) {}
  hs_owner_t *o = NULL;
  for (int i = 0; i < HS_MAX_OWNERS && !o; i++) {
    if (seg->owners[i].base == base) o = &seg->owners[i];
  }
  for (int i = 0; i < HS_MAX_OWNERS && !o && bytes > 0; i++) {
    if (seg->owners[i].base == 0) {
      o = &seg->owners[i];
      const char *name = fname ? fname : "";
      size_t n = strlen(name), keep = n < sizeof o->name - 1 ? n : sizeof o->name - 1;
      memcpy(o->name, name + n - keep, keep);
      o->name[keep] = 0;
      o->base = base;
    }
  }
  if (o) {
    int64_t now = o->mapped_bytes + bytes;
    o->mapped_bytes = now > 0 ? now : 0;
    if ((uint64_t)o->mapped_bytes > o->peak_bytes) o->peak_bytes = (uint64_t)o->mapped_bytes;
    if (calls > 0) o->mappings += (uint64_t)calls;
  }
  __atomic_store_n(&g_lock, 0, __ATOMIC_RELEASE);
}

static int counted(int flags) { return (flags & MAP_ANONYMOUS) && !(flags & MAP_SHARED); }

/* A mapping noted with the object that made it, for the copy's marking (blockmap.c: the
 * allocator's own mappings are never roots). */
static void note(uint64_t lo, uint64_t hi, const void *caller) {
  uint64_t base;
  const char *name;
  if (caller && _hs_blockmap_noting() && _hs_object_of(caller, &base, &name))
    _hs_blockmap_mapped(lo, hi, base);
}

/* A mapping counted for its caller's object, and recorded with its stack (profile.c). */
static void mapped(void *p, size_t len, const void *caller) {
  account(caller, (int64_t)len, 1);
  note((uint64_t)(uintptr_t)p, (uint64_t)(uintptr_t)p + len, caller);
  if (caller) _hs_profile_map(p, len, caller);
}

HS_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  hs_mmap_fn f = (hs_mmap_fn)real((void **)&g_mmap, "mmap");
  void *p = f(addr, len, prot, flags, fd, off);
  if (p != MAP_FAILED && counted(flags)) mapped(p, len, __builtin_return_address(0));
  return p;
}

HS_EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  hs_mmap_fn f = (hs_mmap_fn)real((void **)&g_mmap64, "mmap64");
  void *p = f(addr, len, prot, flags, fd, off);
  if (p != MAP_FAILED && counted(flags)) mapped(p, len, __builtin_return_address(0));
  return p;
}

HS_EXPORT int munmap(void *addr, size_t len) {
  hs_munmap_fn f = (hs_munmap_fn)real((void **)&g_munmap, "munmap");
  /* before the pages go: CPython's teardown frees its object arenas by munmap, with no
   * call of free() that would flush (preload.c, _hs_py_end_poll) */
  _hs_py_end_poll();
  int rc = f(addr, len);
  if (rc == 0) {
    _hs_blockmap_unmapped((uint64_t)(uintptr_t)addr, (uint64_t)(uintptr_t)addr + len);
    account(__builtin_return_address(0), -(int64_t)len, 0);
    _hs_profile_unmap(addr, len);
  }
  return rc;
}

HS_EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...) {
  hs_mremap_fn f = (hs_mremap_fn)real((void **)&g_mremap, "mremap");
  void *p;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    void *to = va_arg(ap, void *);
    va_end(ap);
    p = f(old, old_len, new_len, flags, to);
  } else {
    p = f(old, old_len, new_len, flags);
  }
  if (p != MAP_FAILED) {
    _hs_blockmap_unmapped((uint64_t)(uintptr_t)old, (uint64_t)(uintptr_t)old + old_len);
    note((uint64_t)(uintptr_t)p, (uint64_t)(uintptr_t)p + new_len, __builtin_return_address(0));
    account(__builtin_return_address(0), (int64_t)new_len - (int64_t)old_len, 0);
    if (_hs_profile_unmap(old, old_len)) /* recorded again, at its new size and place */
      _hs_profile_map(p, new_len, __builtin_return_address(0));
  }
  return p;
}

/* brk and sbrk called by the program itself (glibc's malloc grows its heap with its
 * internal __sbrk, not through these): counted against the caller like an mmap. */
typedef void *(*hs_sbrk_fn)(intptr_t);
static hs_sbrk_fn g_sbrk;

HS_EXPORT void *sbrk(intptr_t increment) {
  hs_sbrk_fn f = (hs_sbrk_fn)real((void **)&g_sbrk, "sbrk");
  void *p = f(increment);
  if (p != (void *)-1 && increment) {
    uint64_t at = (uint64_t)(uintptr_t)p;
    if (increment > 0) note(at, at + (uint64_t)increment, __builtin_return_address(0));
    else _hs_blockmap_unmapped(at - (uint64_t)-increment, at);
    account(__builtin_return_address(0), (int64_t)increment, increment > 0);
  }
  return p;
}

/* The functions underneath, all at once (before a lookup that may fail: a failed dlsym
 * leaves an error string that the next dl call frees, and when the program's malloc is
 * one that maps each block, that free comes back here through munmap, whose lookup is a
 * dl call that frees the same string again). */
void _hs_mappings_resolve(void) {
  real((void **)&g_mmap, "mmap");
  real((void **)&g_mmap64, "mmap64");
  real((void **)&g_munmap, "munmap");
  real((void **)&g_mremap, "mremap");
  real((void **)&g_sbrk, "sbrk");
}
