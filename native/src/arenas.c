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


/* arenas.c: in the program, glibc's arenas: main_arena found in libc's data, the figures the
 * CLI reads from outside, and the arena locks taken as glibc's fork() takes them, around
 * the heap map's copy (heapmap.c).
 *
 * The copy is made by a raw clone() with exit signal 0: the program's wait(), waitpid(-1)
 * and waitid(P_ALL) without __WALL never see it and its end sends no SIGCHLD (wait(2)); it
 * is reaped with __WALL. A raw clone takes none of the locks glibc's fork takes, so this
 * takes the arena locks itself, as __malloc_fork_lock_parent does (malloc/arena.c: the main
 * arena, then ->next around the ring), with glibc's low-level lock (nptl/lowlevellock.c:
 * an int, 0 free, 1 taken, 2 taken with waiters). list_lock is not taken (it is static):
 * arenas are only ever linked in right after main_arena, so the ring is read again after
 * locking and after the clone, and an arena linked meanwhile is locked too (glibc holds at
 * most one arena lock at a time outside fork, so the order cannot deadlock). The copy
 * resets its copies of the locks to 0 before its malloc_trim. main_arena is not exported:
 * it is found in libc's writable data by its contents, see plausible_main. */
#define G_MSTATE_LAST_REMAINDER 104u
#define G_MSTATE_BINS 112u
#define G_NBINS_WORDS 254u
#define HS_ARENAS_MAX 4096

static uint64_t g_main_arena;          /* found once, checked again at every map */
static uint64_t g_locked[HS_ARENAS_MAX];
static size_t g_n_locked;

static long futex_op(int *f, int op, int val, const struct timespec *ts) {
  return syscall(SYS_futex, f, op, val, ts, NULL, 0);
}

/* lll_lock, giving up at the deadline (then the lock is left as it was: taken). */
static int lll_lock_until(int *f, uint64_t deadline) {
  int free_ = 0;
  if (__atomic_compare_exchange_n(f, &free_, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return 1;
  while (__atomic_exchange_n(f, 2, __ATOMIC_ACQUIRE) != 0) {
    uint64_t now = _hs_now_ns();
    if (now >= deadline) return 0;
    struct timespec ts = {(time_t)((deadline - now) / 1000000000ull), (long)((deadline - now) % 1000000000ull)};
    futex_op(f, FUTEX_WAIT_PRIVATE, 2, &ts);
  }
  return 1;
}

static void lll_unlock(int *f) {
  if (__atomic_exchange_n(f, 0, __ATOMIC_RELEASE) > 1) futex_op(f, FUTEX_WAKE_PRIVATE, 1, NULL);
}

void _hs_arenas_unlock(void) {
  while (g_n_locked) lll_unlock((int *)(uintptr_t)g_locked[--g_n_locked]);
}

/* Reads memory that may not be mapped: 0 instead of a fault. */
static int peek(uint64_t addr, void *buf, size_t n) {
  struct iovec local = {buf, n}, remote = {(void *)(uintptr_t)addr, n};
  return syscall(SYS_process_vm_readv, getpid(), &local, 1UL, &remote, 1UL, 0UL) == (long)n;
}

static uint64_t load(uint64_t addr) { return __atomic_load_n((const uint64_t *)(uintptr_t)addr, __ATOMIC_ACQUIRE); }

/* A thread arena: the malloc_state right after the heap_info at its heap's 64 MiB-aligned
 * start, whose ar_ptr names it. Read with peek: it is not known to be mapped. */
static int thread_arena_ok(uint64_t a) {
  uint64_t h = a & ~(HS_MAP_HEAP_MAX - 1), info[4], next;
  if (!a || (a & 15) || a - h < 32 || a - h > 128) return 0;
  if (!peek(h, info, sizeof info) || info[0] != a || !info[2] || info[2] > HS_MAP_HEAP_MAX ||
      info[3] < info[2] || a + G_MSTATE_BYTES > h + info[2])
    return 0;
  return peek(a + G_MSTATE_NEXT, &next, sizeof next);
}

/* libc's writable segment (.data, .bss): where main_arena is. */
typedef struct { uint64_t addr, lo, hi; } libc_data_t;

static int on_object(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  libc_data_t *d = arg;
  int mine = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uint64_t lo = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && d->addr >= lo && d->addr < lo + ph->p_memsz) mine = 1;
  }
  if (!mine) return 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && (ph->p_flags & PF_W)) {
      d->lo = info->dlpi_addr + ph->p_vaddr;
      d->hi = d->lo + ph->p_memsz;
    }
  }
  return 1;
}

/* Whether a is main_arena, by what glibc 2.36 keeps there (read racily: every word is
 * some value it had): its lock word 0, 1 or 2; each of the 127 bins' two links either the
 * bin itself (empty) or a chunk of the main heap, and so the fastbins and the last
 * remainder (or 0); the top chunk in the main heap (or the initial top, inside itself,
 * before the first sbrk); system_mem no more than the heap; and ->next a ring that
 * closes on a, through thread arenas only. */
static int plausible_main(uint64_t a, uint64_t heap_lo, uint64_t heap_hi) {
  int lock = *(const volatile int *)(uintptr_t)a, flags = *(const volatile int *)(uintptr_t)(a + 4);
  if (lock < 0 || lock > 2 || flags < 0 || flags > 7) return 0;
  uint64_t top = load(a + G_MSTATE_TOP), sys = load(a + G_MSTATE_SYSTEM_MEM);
  int fresh = top == a + G_MSTATE_TOP;
  if (fresh ? sys != 0 : !(top >= heap_lo && top < heap_hi && sys && sys <= heap_hi - heap_lo)) return 0;
  for (uint64_t i = 0; i < G_NBINS_WORDS; i++) {
    uint64_t w = load(a + G_MSTATE_BINS + 8 * i), self = a + G_MSTATE_BINS + 16 * (i / 2) - 16;
    if (w != self && !(w >= heap_lo && w < heap_hi && !(w & 15))) return 0;
  }
  for (uint64_t i = 0; i <= 10; i++) { /* the fastbins, then the last remainder */
    uint64_t w = load(a + (i < 10 ? G_MSTATE_FASTBINS + 8 * i : G_MSTATE_LAST_REMAINDER));
    if (w && !(w >= heap_lo && w < heap_hi && !(w & 15))) return 0;
  }
  uint64_t x = load(a + G_MSTATE_NEXT);
  for (int steps = 0; x != a; steps++) {
    if (steps >= HS_ARENAS_MAX || !thread_arena_ok(x)) return 0;
    x = load(x + G_MSTATE_NEXT);
  }
  return 1;
}

/* main_arena's address (cached once one was found alone), or 0. */
static uint64_t find_main_arena(uint64_t heap_lo, uint64_t heap_hi) {
  if (g_main_arena && plausible_main(g_main_arena, heap_lo, heap_hi)) return g_main_arena;
  libc_data_t d = {(uint64_t)(uintptr_t)&gnu_get_libc_version, 0, 0};
  if (!dl_iterate_phdr(on_object, &d) || d.hi <= d.lo + G_MSTATE_BYTES) return 0;
  uint64_t found = 0;
  int n = 0;
  for (uint64_t a = (d.lo + 7) & ~(uint64_t)7; a + G_MSTATE_BYTES <= d.hi; a += 8) {
    if (plausible_main(a, heap_lo, heap_hi)) { found = a; n++; }
  }
  return n == 1 ? (g_main_arena = found) : 0;
}

/* glibc's own figures without a lock or a walk of its free lists: the arenas on main_arena's
 * ring and the sum of their system_mem (what each holds from the OS: the main heap's sbrk'd
 * bytes, a thread arena's committed heaps; mallinfo2's `arena` field), read racily, each
 * word some value it had. Arenas are never freed, and a thread arena is read with peek: a
 * heap unmapped meanwhile reads as not an arena. 1 when main_arena was found, else 0. */
static int ring_sum(uint64_t main_arena, uint64_t *arenas, uint64_t *system_mem);

int _hs_glibc_arenas(uint64_t *arenas, uint64_t *system_mem) {
  uint64_t start_brk = _hs_start_brk(), brk = (uint64_t)syscall(SYS_brk, 0);
  if (!start_brk || brk < start_brk) return 0;
  uint64_t main_arena = find_main_arena(start_brk, brk + (64u << 20));
  return main_arena && ring_sum(main_arena, arenas, system_mem);
}

/* The same figures from main_arena as found before (0 when it never was): no search of
 * libc's data, so no loader lock, for a reading taken inside the program's own allocator
 * call (counters.c, the reading as the exit begins). main_arena is libc's static: it
 * never moves once found. */
int _hs_glibc_arenas_known(uint64_t *arenas, uint64_t *system_mem) {
  uint64_t main_arena = __atomic_load_n(&g_main_arena, __ATOMIC_ACQUIRE);
  return main_arena && ring_sum(main_arena, arenas, system_mem);
}

/* The ring from main_arena: how many arenas, and the sum of their system_mem. */
static int ring_sum(uint64_t main_arena, uint64_t *arenas, uint64_t *system_mem) {
  uint64_t n = 1, sum = load(main_arena + G_MSTATE_SYSTEM_MEM);
  for (uint64_t a = load(main_arena + G_MSTATE_NEXT); a != main_arena && n < HS_ARENAS_MAX; n++) {
    uint64_t sys, next;
    if (!thread_arena_ok(a) || !peek(a + G_MSTATE_SYSTEM_MEM, &sys, sizeof sys) ||
        !peek(a + G_MSTATE_NEXT, &next, sizeof next))
      return 0;
    sum += sys;
    a = next;
  }
  *arenas = n;
  *system_mem = sum;
  return 1;
}

/* Where the CLI reads glibc's figures from outside (no thread of ours in the program):
 * main_arena's address and the two offsets it reads, in the segment. 1 when found. */
int _hs_glibc_publish_arena(void) {
  uint64_t arenas, system_mem;
  if (!_hs_glibc_arenas(&arenas, &system_mem) || !g_main_arena) return 0;
  _hs_seg->glibc_arena_next_off = G_MSTATE_NEXT;
  _hs_seg->glibc_arena_sysmem_off = G_MSTATE_SYSTEM_MEM;
  __atomic_store_n(&_hs_seg->glibc_main_arena, g_main_arena, __ATOMIC_RELEASE);
  return 1;
}

/* Locks the arenas from `from` along ->next up to `upto` (not included). */
const char *_hs_arenas_lock_ring(uint64_t from, uint64_t upto, uint64_t deadline) {
  for (uint64_t a = from; a != upto; a = load(a + G_MSTATE_NEXT)) {
    if (g_n_locked == HS_ARENAS_MAX || !thread_arena_ok(a))
      return "an arena on glibc's list did not look like glibc 2.36's";
    if (!lll_lock_until((int *)(uintptr_t)a, deadline))
      return "a thread of the program kept an arena's lock for 0.2 s: no copy was made";
    g_locked[g_n_locked++] = a;
  }
  return NULL;
}

/* Every glibc arena lock, as fork() takes them; NULL, or why not (then none is held).
 * *head: main_arena's ->next once they are all held. */
const char *_hs_arenas_lock(uint64_t *head, uint64_t deadline) {
  uint64_t start_brk = _hs_start_brk(), brk = (uint64_t)syscall(SYS_brk, 0);
  if (!start_brk || brk < start_brk) return "the program break could not be read";
  uint64_t heap_hi = brk + (64u << 20); /* a stale read may show a chunk above a trimmed break */
  uint64_t main_arena = find_main_arena(start_brk, heap_hi);
  if (!main_arena) return "glibc's main arena was not found in libc's data (not glibc 2.36's layout?)";
  g_n_locked = 0;
  if (!lll_lock_until((int *)(uintptr_t)main_arena, deadline))
    return "a thread of the program kept the main arena's lock for 0.2 s: no copy was made";
  g_locked[g_n_locked++] = main_arena;
  /* under its lock the main arena's top and the break stand still: exact checks */
  brk = (uint64_t)syscall(SYS_brk, 0);
  uint64_t top = load(main_arena + G_MSTATE_TOP);
  int flags = *(const volatile int *)(uintptr_t)(main_arena + G_MSTATE_FLAGS);
  int ok = top == main_arena + G_MSTATE_TOP
               ? load(main_arena + G_MSTATE_SYSTEM_MEM) == 0
               : !(flags & G_NONCONTIGUOUS) && top >= start_brk && top + 16 <= brk &&
                     top + (load(top + 8) & ~(uint64_t)7) == brk;
  if (!ok) {
    _hs_arenas_unlock();
    return "the main heap is not one piece ending at the program break (sbrk called by "
           "the program, or brk unavailable)";
  }
  uint64_t first = load(main_arena + G_MSTATE_NEXT);
  const char *why = _hs_arenas_lock_ring(first, main_arena, deadline);
  /* arenas linked in meanwhile sit ahead of the first one locked */
  for (uint64_t now; !why && (now = load(main_arena + G_MSTATE_NEXT)) != first; first = now)
    why = _hs_arenas_lock_ring(now, first, deadline);
  if (why) _hs_arenas_unlock();
  *head = first;
  return why;
}

/* Whether every glibc arena lock can be taken within HS_LOCK_WAIT_NS (then none is kept):
 * the exiting thread asks before it calls malloc_trim itself, since a program may call
 * exit() from a signal handler that interrupted malloc on that very thread (which then
 * holds an arena lock that malloc_trim would wait for forever). */
int _hs_glibc_locks_free(void) {
  uint64_t head = 0;
  const char *why = _hs_arenas_lock(&head, _hs_now_ns() + HS_LOCK_WAIT_NS);
  if (why) return 0;
  _hs_arenas_unlock();
  return 1;
}

void _hs_arenas_forget(void) { g_n_locked = 0; }

void _hs_arenas_free_in_copy(void) {
  for (size_t i = 0; i < g_n_locked; i++) *(int *)(uintptr_t)g_locked[i] = 0;
}

uint64_t _hs_arenas_ring_head(void) { return load(g_locked[0] + G_MSTATE_NEXT); }

int _hs_arenas_main_known(void) { return g_main_arena != 0; }

uint64_t _hs_arenas_main(void) { return __atomic_load_n(&g_main_arena, __ATOMIC_ACQUIRE); }

