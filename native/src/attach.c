/* attach.c: the library loaded into a running process (`heapsight attach PID --track`).
 *
 * hs-inject (inject.c) calls dlopen on one of the process's threads that waits in a system
 * call, then heapsight_attach_begin(segment): the library starts as its constructor would
 * in a preloaded program (resolve the real functions, the segment the CLI made, the
 * sampler's unwinder), and routes the process's allocation calls to its hooks by writing
 * the hooks' addresses into the GOT entries (R_X86_64_JUMP_SLOT: the calls through the PLT)
 * of malloc, free, calloc, realloc, reallocarray, posix_memalign, aligned_alloc, memalign,
 * valloc and pvalloc in every object then loaded (libc's own included: glibc calls malloc
 * through its PLT so that it can be replaced; C++'s operator new and delete reach it
 * through libstdc++'s). A RELRO page is made writable for the write and read-only again.
 *
 * From then on every allocation is counted and sampled as in `run`. A block allocated
 * before the attach is not the hooks': a bit per block start (blockmap.c's bitmap, set as
 * the hooks count an allocation) says which are, and a free or realloc of one that is not
 * goes to the allocator uncounted (realloc moves it into a counted block).
 *
 * heapsight_attach_end() writes the original values back; hs-inject then waits until no
 * thread runs in the library or has a return address into it on its stack, and dlcloses
 * it; the destructor unmaps the segment, the sampler's tables and the bitmap (in a process
 * that exits while followed, it leaves them: the exit's last frees still reach the hooks).
 *
 * Not followed: objects loaded after the attach (their calls go to the allocator
 * uncounted), calls through a function pointer taken before it (R_X86_64_GLOB_DAT: such a
 * pointer may be kept by the program, and would outlive the library), and the loader's own
 * allocations. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hs_internal.h"

#define HS_ATTACH_EXPORT __attribute__((visibility("default")))
#define MAX_PATCHES 4096

HS_HIDDEN const char *_hs_attach_segment;
static char g_segment_path[4096];

static int ours(const void *p) {
  uint64_t *region = _hs_blockmap_region(p), g = _hs_blockmap_granule(p);
  if (!region) return 0;
  return (int)((__atomic_load_n(region + HS_BM_HEADER_BYTES / 8 + (g >> 6), __ATOMIC_RELAXED) >>
                (g & 63)) & 1);
}

static void *noted(void *p) {
  if (p) _hs_blockmap_set(p);
  return p;
}

static void *a_malloc(size_t n) { return noted(_hs_hook_malloc(n)); }
static void *a_calloc(size_t n, size_t m) { return noted(_hs_hook_calloc(n, m)); }
static void *a_aligned_alloc(size_t a, size_t n) { return noted(_hs_hook_aligned_alloc(a, n)); }
static void *a_memalign(size_t a, size_t n) { return noted(_hs_hook_memalign(a, n)); }
static void *a_valloc(size_t n) { return noted(_hs_hook_valloc(n)); }
static void *a_pvalloc(size_t n) { return noted(_hs_hook_pvalloc(n)); }

static int a_posix_memalign(void **out, size_t a, size_t n) {
  int rc = _hs_hook_posix_memalign(out, a, n);
  if (rc == 0) noted(*out);
  return rc;
}

static void a_free(void *p) {
  if (!p) return;
  if (!ours(p)) { _hs_real.free(p); return; } /* allocated before the attach */
  _hs_blockmap_clear(p);
  _hs_hook_free(p);
}

static void *a_realloc(void *old, size_t n) {
  if (!old) return a_malloc(n);
  if (!ours(old)) { /* allocated before the attach: moved into a counted block */
    if (n == 0) { _hs_real.free(old); return NULL; } /* glibc's realloc(p, 0) */
    void *p = a_malloc(n);
    if (!p) return NULL;
    size_t had = _hs_real.malloc_usable_size(old);
    memcpy(p, old, had < n ? had : n);
    _hs_real.free(old);
    return p;
  }
  _hs_blockmap_clear(old);
  void *p = _hs_hook_realloc(old, n);
  if (p) _hs_blockmap_set(p);
  else if (n) _hs_blockmap_set(old); /* failed: old stays */
  return p;
}

static void *a_reallocarray(void *old, size_t n, size_t m) {
  size_t size;
  if (__builtin_mul_overflow(n, m, &size)) { errno = ENOMEM; return NULL; }
  return a_realloc(old, size);
}

static const struct { const char *name; void *hook; } HOOKS[] = {
    {"malloc", (void *)a_malloc},         {"free", (void *)a_free},
    {"calloc", (void *)a_calloc},         {"realloc", (void *)a_realloc},
    {"reallocarray", (void *)a_reallocarray}, {"posix_memalign", (void *)a_posix_memalign},
    {"aligned_alloc", (void *)a_aligned_alloc}, {"memalign", (void *)a_memalign},
    {"valloc", (void *)a_valloc},         {"pvalloc", (void *)a_pvalloc},
};

typedef struct {
  uint64_t *slot;
  uint64_t old;
  int relro;
} patch_t;

static patch_t g_patches[MAX_PATCHES];
static size_t g_n_patches;

static void *hook_for(const char *name) {
  for (size_t i = 0; i < sizeof HOOKS / sizeof HOOKS[0]; i++)
    if (strcmp(HOOKS[i].name, name) == 0) return HOOKS[i].hook;
  return NULL;
}

/* Writes v into slot, the page made writable for it when it is RELRO (read-only). */
static int write_slot(uint64_t *slot, uint64_t v, int relro) {
  uintptr_t page = (uintptr_t)slot & ~(uintptr_t)4095;
  if (relro && mprotect((void *)page, 4096, PROT_READ | PROT_WRITE) != 0) return 0;
  __atomic_store_n(slot, v, __ATOMIC_RELEASE);
  if (relro) mprotect((void *)page, 4096, PROT_READ);
  return 1;
}

/* The value of a dynamic entry as an address: glibc adjusts most in place by the load
 * address; the others are offsets from it. */
static uint64_t dyn_ptr(uint64_t v, uint64_t base) { return v < base ? base + v : v; }

static int patch_object(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  const void *self = arg;
  uint64_t base = info->dlpi_addr, dyn = 0, relro_lo = 0, relro_hi = 0;
  int mine = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_DYNAMIC) dyn = base + ph->p_vaddr;
    if (ph->p_type == PT_GNU_RELRO) relro_lo = base + ph->p_vaddr, relro_hi = relro_lo + ph->p_memsz;
    if (ph->p_type == PT_LOAD && (uint64_t)(uintptr_t)self >= base + ph->p_vaddr &&
        (uint64_t)(uintptr_t)self < base + ph->p_vaddr + ph->p_memsz)
      mine = 1;
  }
  const char *name = info->dlpi_name ? info->dlpi_name : "";
  if (mine || !dyn || strstr(name, "linux-vdso")) return 0;
  uint64_t symtab = 0, strtab = 0, jmprel = 0, pltrelsz = 0, pltrel = 0;
  for (const ElfW(Dyn) *d = (const ElfW(Dyn) *)(uintptr_t)dyn; d->d_tag != DT_NULL; d++) {
    switch (d->d_tag) {
    case DT_SYMTAB: symtab = dyn_ptr(d->d_un.d_ptr, base); break;
    case DT_STRTAB: strtab = dyn_ptr(d->d_un.d_ptr, base); break;
    case DT_JMPREL: jmprel = dyn_ptr(d->d_un.d_ptr, base); break;
    case DT_PLTRELSZ: pltrelsz = d->d_un.d_val; break;
    case DT_PLTREL: pltrel = d->d_un.d_val; break;
    }
  }
  if (!symtab || !strtab || !jmprel || pltrel != DT_RELA) return 0;
  const ElfW(Rela) *r = (const ElfW(Rela) *)(uintptr_t)jmprel;
  for (size_t i = 0; i < pltrelsz / sizeof *r && g_n_patches < MAX_PATCHES; i++) {
    if (ELF64_R_TYPE(r[i].r_info) != R_X86_64_JUMP_SLOT) continue;
    const ElfW(Sym) *sym = (const ElfW(Sym) *)(uintptr_t)symtab + ELF64_R_SYM(r[i].r_info);
    void *hook = hook_for((const char *)(uintptr_t)strtab + sym->st_name);
    if (!hook) continue;
    uint64_t *slot = (uint64_t *)(uintptr_t)(base + r[i].r_offset);
    int relro = (uint64_t)(uintptr_t)slot >= relro_lo && (uint64_t)(uintptr_t)slot < relro_hi;
    patch_t p = {slot, __atomic_load_n(slot, __ATOMIC_ACQUIRE), relro};
    if (write_slot(slot, (uint64_t)(uintptr_t)hook, relro)) g_patches[g_n_patches++] = p;
  }
  return 0;
}

/* Starts the library in this process, counting into the segment at segment_path, and
 * routes the process's allocation calls to it. The number of GOT entries patched, or -1
 * (the segment could not be used: nothing patched). */
HS_ATTACH_EXPORT long heapsight_attach_begin(const char *segment_path) {
  if (g_n_patches || !segment_path) return -1;
  size_t n = strnlen(segment_path, sizeof g_segment_path);
  if (n == sizeof g_segment_path) return -1;
  memcpy(g_segment_path, segment_path, n + 1);
  _hs_attach_segment = g_segment_path;
  _hs_attach_start();
  if (!_hs_seg || !_hs_is_owner()) return -1;
  dl_iterate_phdr(patch_object, (void *)&heapsight_attach_begin);
  return (long)g_n_patches;
}

/* The GOT entries back as they were: the allocation calls go to the allocator again. The
 * number restored. */
HS_ATTACH_EXPORT long heapsight_attach_end(void) {
  size_t n = 0;
  for (size_t i = g_n_patches; i-- > 0;)
    n += (size_t)write_slot(g_patches[i].slot, g_patches[i].old, g_patches[i].relro);
  g_n_patches = 0;
  _hs_flush_current();
  return (long)n;
}

/* At dlclose (hs-inject made sure no thread is in the library): its memory unmapped. */
void _hs_attach_stop(void) {
  if (g_n_patches) return; /* the process exits while followed: its last frees still come */
  _hs_slots_forget();
  hs_chunk_t own[8];
  for (size_t i = 0, k = _hs_profile_own(own, 8); i < k; i++)
    munmap((void *)(uintptr_t)own[i].lo, own[i].hi - own[i].lo);
  for (size_t i = 0; i < HS_BM_REGIONS; i++) {
    uint64_t *r = _hs_bm_regions[i];
    if (r) munmap(r, HS_BM_HEADER_BYTES + HS_BM_REGION_BYTES);
  }
  _hs_segment_unmap();
}
