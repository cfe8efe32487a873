/* counters.c: the slow paths behind the inline hot path: a thread claims a slot on its
 * first allocation and gives it back when it exits; the global live figure and its peak. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "hs_internal.h"

HS_TLS hs_slot_t *_hs_tslot;    /* the hot path's slot: set only when glibc's header is read */
HS_TLS hs_slot_t *_hs_tslot_other; /* the slot of a thread when another allocator answers
                                     (NULL in heapsight's own calls: their slow path) */
static HS_TLS int t_busy;        /* inside a slow path: do not recurse */
static HS_TLS int t_exited;      /* our key destructor ran: later calls go to slot 0 */
HS_TLS int _hs_t_helper;         /* the stats thread: its allocations are a bug to report */
static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
/* A sink for calls that must not be counted (its countdown never reaches 0: not sampled). */
static hs_slot_t g_discard = {.left = INT64_MAX / 2, .free_left = INT64_MAX / 2,
                              .left_base = INT64_MAX / 2, .sample_left = INT64_MAX};
static uint64_t g_claimed;       /* slots owned by live threads */

/* heapsight's own allocations: what its start-up calls allocate in the program's heap (the
 * TLS vector glibc gives the helper thread in pthread_create, the loader's records of the
 * unwinder's library) is heapsight's, not the program's. Between _hs_own_begin and
 * _hs_own_end the thread's slot is g_own_slot, whose countdowns are always spent, so every
 * allocation reaches _hs_counted_due, which keeps the block in g_own (uncounted) and marks
 * it in the sampled-block map: its free, whenever it comes, reaches _hs_own_take through
 * the marked path and is not counted either. */
#define HS_OWN_MAX 32
static hs_slot_t g_own_slot = {.left = INT64_MIN / 2, .free_left = INT64_MIN / 2,
                               .sample_left = INT64_MIN / 2}; /* every free is looked at */
static void *g_own[HS_OWN_MAX];
static HS_TLS hs_slot_t *t_own_saved; /* the thread's slot, given back by _hs_own_end */
static HS_TLS int t_own;              /* depth: own calls may nest (a realloc of an own block) */

/* (not atomic against profile.c's updates of the same byte, which it makes under its lock:
 * own blocks are marked at start-up, before any sample, and after it only when one of them
 * is reallocated) */
static void own_mark(void *p, int add) {
  uintptr_t i = ((uintptr_t)p >> 4) & (HS_SAMPLE_MAP_SIZE - 1);
  unsigned char *c = &_hs_sample_map[i];
  _hs_map_written(i);
  unsigned char v = __atomic_load_n(c, __ATOMIC_RELAXED);
  if (v < 255 && (add || v > 0)) __atomic_store_n(c, (unsigned char)(add ? v + 1 : v - 1), __ATOMIC_RELAXED);
}

static int g_own_top; /* g_own's entries past this were never used: a free looks no further */

static int own_put(void *p) {
  for (int i = 0; i < HS_OWN_MAX; i++) {
    void *none = NULL;
    if (__atomic_compare_exchange_n(&g_own[i], &none, p, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
      int top = __atomic_load_n(&g_own_top, __ATOMIC_RELAXED);
      while (top < i + 1 && !__atomic_compare_exchange_n(&g_own_top, &top, i + 1, 0,
                                                         __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
      }
      own_mark(p, 1);
      return 1;
    }
  }
  return 0; /* full: counted as the program's */
}

int _hs_own_take(void *p) {
  int top = __atomic_load_n(&g_own_top, __ATOMIC_ACQUIRE);
  for (int i = 0; i < top; i++) {
    void *was = p;
    if (__atomic_load_n(&g_own[i], __ATOMIC_ACQUIRE) == p &&
        __atomic_compare_exchange_n(&g_own[i], &was, NULL, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
      own_mark(p, 0);
      return 1;
    }
  }
  return 0;
}

/* With glibc the hot path reads the chunk header through _hs_tslot, which then points at
 * g_own_slot; with another allocator _hs_tslot stays NULL (a header read there could fault)
 * and every call takes the slow path, where own_slot() gives g_own_slot. */
void _hs_own_begin(void) {
  if (t_own++) return; /* nested: the outermost keeps the thread's slot */
  t_own_saved = _hs_tslot ? _hs_tslot : _hs_tslot_other;
  if (_hs_usable_by_header) _hs_tslot = &g_own_slot;
  else _hs_tslot_other = NULL;
}

void _hs_own_end(void) {
  if (--t_own) return;
  if (_hs_usable_by_header) _hs_tslot = t_own_saved;
  else _hs_tslot_other = t_own_saved;
}

/* A free in own mode of a block that is not heapsight's: the program's, counted on the
 * thread's own slot. */
void _hs_own_free(void *p) {
  _hs_tslot = _hs_usable_by_header ? t_own_saved : NULL;
  hs_count_free_unsampled(p);
  if (_hs_tslot) t_own_saved = _hs_tslot;
  _hs_tslot = &g_own_slot;
}

int _hs_own_slot(const hs_slot_t *s) { return s == &g_own_slot; }

/* heapsight's own blocks live now (g_own): the copy leaves them out of every class. */
size_t _hs_own_blocks(uint64_t *out, size_t max, int *whole) {
  size_t n = 0;
  *whole = 1;
  int top = __atomic_load_n(&g_own_top, __ATOMIC_ACQUIRE);
  for (int i = 0; i < top && n < max; i++) {
    void *p = __atomic_load_n(&g_own[i], __ATOMIC_ACQUIRE);
    if (p) out[n++] = (uint64_t)(uintptr_t)p;
  }
  return n;
}

/* heapsight's own private memory: kept here and published in the segment (again at
 * attach, which clears it). The byte map's pages are counted as they are first written. */
static int64_t g_own_bytes;
static uint64_t g_map_pages[HS_SAMPLE_MAP_SIZE / 4096 / 64 + 1];

static void publish_own(void) {
  hs_segment_t *seg = _hs_seg;
  if (seg && _hs_is_owner()) __atomic_store_n(&seg->own_private_bytes, (uint64_t)__atomic_load_n(&g_own_bytes, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

void _hs_own_memory(int64_t bytes) {
  __atomic_add_fetch(&g_own_bytes, bytes, __ATOMIC_RELAXED);
  publish_own();
}

void _hs_map_written(uintptr_t index) {
  uintptr_t page = index / 4096;
  uint64_t bit = 1ull << (page % 64), *w = &g_map_pages[page / 64];
  if (__atomic_load_n(w, __ATOMIC_RELAXED) & bit) return;
  if (!(__atomic_fetch_or(w, bit, __ATOMIC_RELAXED) & bit)) _hs_own_memory(4096);
}

void _hs_own_publish(void) { publish_own(); }

uint64_t _hs_own_private(void) { return (uint64_t)__atomic_load_n(&g_own_bytes, __ATOMIC_RELAXED); }

/* The peak is raised only when a thread flushes, so it lags the true live figure by the
 * bytes threads still hold back: bound that sum, not each thread's share. Read on the hot
 * path (one load of a line that changes only when the thread count crosses a step). */
int64_t _hs_flush_limit = HS_FLUSH_BYTES;

static void set_flush_limit(uint64_t claimed) {
  int64_t limit = claimed ? HS_FLUSH_TOTAL_BYTES / (int64_t)claimed : HS_FLUSH_BYTES;
  if (limit > HS_FLUSH_BYTES) limit = HS_FLUSH_BYTES;
  if (limit < HS_FLUSH_MIN_BYTES) limit = HS_FLUSH_MIN_BYTES;
  if (__atomic_load_n(&_hs_flush_limit, __ATOMIC_RELAXED) != limit)
    __atomic_store_n(&_hs_flush_limit, limit, __ATOMIC_RELAXED);
}

/* The owner rewrites a slot's countdowns between two steps of seq (hs_slot_usable). */
static void slot_write_begin(hs_slot_t *s) {
  __atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void slot_write_end(hs_slot_t *s) {
  __atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELEASE);
}

static void raise_peak(hs_segment_t *seg, int64_t live) {
  uint64_t peak = __atomic_load_n(&seg->peak_usable_bytes, __ATOMIC_RELAXED);
  while (live > 0 && (uint64_t)live > peak) {
    if (__atomic_compare_exchange_n(&seg->peak_usable_bytes, &peak, (uint64_t)live, 0,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      __atomic_store_n(&seg->peak_ns, _hs_now_ns(), __ATOMIC_RELAXED);
      break;
    }
  }
}

static hs_slot_t *own_slot(void) {
  if (HS_UNLIKELY(t_own)) return &g_own_slot;
  return _hs_tslot ? _hs_tslot : _hs_tslot_other;
}

static void release_slot(void *arg) {
  (void)arg;
  hs_slot_t *s = own_slot();
  if (s == NULL || s == &g_discard) return;
  _hs_flush(s);
  _hs_tslot = _hs_tslot_other = NULL;
  t_exited = 1;
  __atomic_store_n(&s->claimed, 0, __ATOMIC_RELEASE); /* totals stay: readers only sum */
  set_flush_limit(__atomic_sub_fetch(&g_claimed, 1, __ATOMIC_RELAXED));
}

static int g_key_made;
static void make_key(void) { g_key_made = pthread_key_create(&g_key, release_slot) == 0; }

/* At dlclose (attach.c): the threads' exit must not call release_slot once the library is
 * gone; a deleted key's destructor is never called. */
void _hs_slots_forget(void) {
  if (g_key_made) pthread_key_delete(g_key);
  g_key_made = 0;
}

hs_slot_t *_hs_slot_claim(void) {
  if (t_busy) return &g_discard;
  if (_hs_t_helper) {
    __atomic_fetch_add(&_hs_seg->helper_mallocs, 1, __ATOMIC_RELAXED);
    return &g_discard;
  }
  if (t_exited || _hs_seg == NULL) return NULL;
  t_busy = 1;
  hs_segment_t *seg = _hs_seg;
  hs_slot_t *got = NULL;
  for (unsigned i = 1; i < HS_MAX_SLOTS && !got; i++) {
    uint64_t zero = 0;
    if (seg->slots[i].claimed == 0 &&
        __atomic_compare_exchange_n(&seg->slots[i].claimed, &zero, 1, 0, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED)) {
      got = &seg->slots[i];
      __atomic_fetch_add(&seg->slot_claims, 1, __ATOMIC_RELAXED);
      got->tid = 0; /* not read: a gettid here was a system call in the program's malloc */
      got->sample_left = HS_SAMPLE_FRESH; /* its first allocation draws the interval */
      slot_write_begin(got); /* the last owner's flush left nothing pending */
      got->left = got->left_base = 0;
      got->n_alloc_base = got->n_alloc;
      slot_write_end(got);
      uint64_t used = __atomic_load_n(&seg->slots_used, __ATOMIC_RELAXED);
      while (used < i + 1 && !__atomic_compare_exchange_n(&seg->slots_used, &used, i + 1, 0,
                                                          __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
      }
    }
  }
  if (got) {
    pthread_once(&g_key_once, make_key);
    pthread_setspecific(g_key, (void *)1); /* so release_slot runs at thread exit */
    /* Threads started together (a pool) claim their slots one by one: count those that
     * exist already, so the first ones do not hold back 64 KiB each until their next call. */
    /* the threads /proc shows, as the CLI last read them: opening /proc/self/status here
     * was a system call in the program's malloc (a seccomp filter may forbid it) */
    uint64_t claimed = __atomic_add_fetch(&g_claimed, 1, __ATOMIC_RELAXED),
             threads = __atomic_load_n(&seg->threads_seen, __ATOMIC_RELAXED);
    set_flush_limit(threads > claimed ? threads : claimed);
    _hs_flush(got); /* sets its flush countdown */
    if (_hs_usable_by_header) _hs_tslot = got;
    else if (!t_own) _hs_tslot_other = got;
    else t_own_saved = got; /* claimed in an own call: the thread's once it ends */
  } else {
    __atomic_fetch_add(&seg->slot_overflows, 1, __ATOMIC_RELAXED);
    t_exited = 1; /* keep using the shared slot: cheaper than rescanning every call */
  }
  t_busy = 0;
  return got;
}

/* Slot 0 is shared by threads that have no slot of their own: every update is atomic (its
 * countdowns stay at 0: each block is added to its chunk bytes at once). */
void _hs_count_shared(int is_alloc, size_t usable, size_t req, size_t hdr, void *p,
                      const void *caller) {
  if (_hs_seg == NULL) return;
  hs_slot_t *s = &_hs_seg->slots[0];
  if (is_alloc) {
    __atomic_fetch_add(&s->alloc_chunk_bytes, usable + HS_BLOCK_EXTRA, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->n_alloc, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->req_alloc_bytes, req, __ATOMIC_RELAXED);
    if (usable >= HS_GLIBC_MMAP_THRESHOLD_START && !(hdr & 2))
      __atomic_fetch_add(&s->n_large, 1, __ATOMIC_RELAXED);
    if (hdr & 2) {
      __atomic_fetch_add(&s->n_mmapped, 1, __ATOMIC_RELAXED);
      __atomic_fetch_add(&s->mmapped_alloc_bytes, hdr & ~(size_t)7, __ATOMIC_RELAXED);
    }
    /* the sample before the peak it may raise (as in _hs_counted_due); no slack here: the
     * peak is raised at once */
    _hs_sample_shared(p, usable, req, caller);
    raise_peak(_hs_seg, __atomic_add_fetch(&_hs_seg->live_usable_bytes, (int64_t)usable,
                                           __ATOMIC_RELAXED));
  } else {
    __atomic_fetch_add(&s->free_chunk_bytes, usable + HS_BLOCK_EXTRA, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->n_free, 1, __ATOMIC_RELAXED);
    if (hdr & 2) __atomic_fetch_add(&s->mmapped_free_bytes, hdr & ~(size_t)7, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&_hs_seg->live_usable_bytes, (int64_t)usable, __ATOMIC_RELAXED);
  }
}

/* The bytes the allocation countdown counted since left_base was set: folded into
 * alloc_chunk_bytes, and taken off the sample countdown as usable bytes (less
 * HS_BLOCK_EXTRA per block). Inside a slot write. left is read once: what a signal handler
 * of this thread counts after that stays pending (left_base - left). */
static void take_allocated(hs_slot_t *s) {
  int64_t left = __atomic_load_n(&s->left, __ATOMIC_RELAXED);
  uint64_t n = __atomic_load_n(&s->n_alloc, __ATOMIC_RELAXED);
  int64_t counted = hs_counted(s->left_base, left);
  s->alloc_chunk_bytes += (uint64_t)counted;
  s->sample_left -= counted - HS_BLOCK_EXTRA * (int64_t)(n - s->n_alloc_base);
  s->left_base = left;
  s->n_alloc_base = n;
}

/* The slot's usable bytes allocated less freed, as its owner sees them. */
static int64_t slot_net(const hs_slot_t *s) {
  uint64_t a, f;
  (void)hs_slot_usable(s, 0, &a, &f); /* its own: never in the middle of a fold */
  return (int64_t)(a - f);
}

/* Inside this thread's fold or flush: a signal handler's allocations and frees on this
 * thread are counted (the hot path's single read-modify-write of a countdown) and left
 * pending for the next fold, never folded inside this one. */
static HS_TLS int t_fold;

static void fold_enter(void) {
  t_fold = 1;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

static void fold_leave(void) {
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  t_fold = 0;
}

/* _hs_flush's work, inside fold_enter. The countdowns are refilled by adding to them (one
 * instruction, whole to a signal handler), not by setting them: a handler's counts between
 * the read and the refill stay pending. */
static void flush(hs_slot_t *s) {
  int64_t limit = __atomic_load_n(&_hs_flush_limit, __ATOMIC_RELAXED);
  slot_write_begin(s);
  take_allocated(s);
  int64_t to = s->sample_left < limit ? s->sample_left : limit;
  __atomic_fetch_add(&s->left, to - s->left_base, __ATOMIC_RELAXED);
  s->left_base = to;
  int64_t fl = __atomic_load_n(&s->free_left, __ATOMIC_RELAXED);
  s->free_chunk_bytes += (uint64_t)hs_counted(s->free_base, fl);
  __atomic_fetch_add(&s->free_left, limit - fl, __ATOMIC_RELAXED);
  s->free_base = limit;
  slot_write_end(s);
  int64_t net = slot_net(s), d = net - s->flushed_net;
  s->flushed_net = net;
  if (_hs_seg == NULL || d == 0) return;
  raise_peak(_hs_seg, __atomic_add_fetch(&_hs_seg->live_usable_bytes, d, __ATOMIC_RELAXED));
}

/* What a slow path looks at outside its fold: a heap map the CLI asked for, and whether
 * CPython began finalizing (the end's reading). A load each when there is nothing to do. */
static inline void polls(void) {
  _hs_map_poll();
  _hs_py_end_poll();
}

/* Move a thread's pending bytes into the global live figure, raise the peak, and start
 * the thread's countdowns again: the allocation countdown runs to the flush limit or the
 * next sample, whichever comes first, the free countdown to the limit. A thread flushes
 * after at most a limit's bytes allocated or freed, so the bytes it holds back are less
 * than the limit either way, and the peak is exact to within what all threads hold back
 * together: HS_FLUSH_TOTAL_BYTES, or HS_FLUSH_MIN_BYTES per thread past 256 threads
 * (_hs_flush_limit, taken by each thread at its next flush). */
void _hs_flush(hs_slot_t *s) {
  if (s == &g_discard || s == &g_own_slot || t_fold) return;
  fold_enter();
  flush(s);
  fold_leave();
  if (!t_own) polls();
}

/* The main thread holds slot 1 from the first allocation on; at exit its pending bytes
 * must still reach the global figure. */
void _hs_flush_current(void) {
  hs_slot_t *s = own_slot();
  if (s) _hs_flush(s);
}

/* The slow paths of hs_count_alloc / hs_count_free: no slot yet, another allocator than
 * glibc (malloc_usable_size), or an mmapped chunk. */
static hs_slot_t *slot_slow(void) {
  hs_slot_t *s = own_slot();
  return s ? s : _hs_slot_claim();
}

void _hs_count_alloc_slow(void *p, size_t req, const void *caller) {
  size_t hdr = 0, u;
  if (_hs_usable_by_header) {
    hdr = hs_glibc_header(p);
    u = hs_glibc_usable(hdr);
  } else {
    u = _hs_real.malloc_usable_size(p);
  }
  hs_slot_t *s = slot_slow();
  /* the block's start, for the copy's marking (not heapsight's own blocks) */
  if (_hs_blockmap_on && s != &g_own_slot) _hs_blockmap_set(p);
  if (s == NULL) { /* past the slots: every call comes here */
    _hs_count_shared(1, u, req, hdr, p, caller);
    polls();
    return;
  }
  if (hs_add_alloc(s, u + HS_BLOCK_EXTRA, req)) _hs_counted_due(s, p, u + HS_BLOCK_EXTRA, req, caller);
  if (hdr & 2) {
    s->n_mmapped++;
    s->mmapped_alloc_bytes += hdr & ~(size_t)7;
  }
}

void _hs_count_free_slow(void *p) {
  size_t hdr = _hs_usable_by_header ? hs_glibc_header(p) : 0;
  size_t u = _hs_usable_by_header ? hs_glibc_usable(hdr) : _hs_real.malloc_usable_size(p);
  if (_hs_blockmap_on) _hs_blockmap_clear(p);
  _hs_count_free_read(hdr, u);
}

void _hs_count_free_read(size_t hdr, size_t u) {
  hs_slot_t *s = slot_slow();
  if (s == NULL) { /* past the slots: every call comes here */
    _hs_count_shared(0, u, 0, hdr, NULL, NULL);
    polls();
    return;
  }
  if (hdr & 2) s->mmapped_free_bytes += hdr & ~(size_t)7;
  if (hs_add_free(s, u + HS_BLOCK_EXTRA)) _hs_flush(s);
}

/* One counter of every slot in use less another, summed (read racily: each a count some
 * moment had; in the heap map's copy, a snapshot). */
static uint64_t slots_net(size_t in_field, size_t out_field) {
  hs_segment_t *seg = _hs_seg;
  if (seg == NULL) return 0;
  uint64_t used = seg->slots_used < HS_MAX_SLOTS ? seg->slots_used + 1 : HS_MAX_SLOTS, in = 0, out = 0;
  for (uint64_t i = 0; i < used; i++) {
    const char *slot = (const char *)&seg->slots[i];
    in += __atomic_load_n((const uint64_t *)(const void *)(slot + in_field), __ATOMIC_RELAXED);
    out += __atomic_load_n((const uint64_t *)(const void *)(slot + out_field), __ATOMIC_RELAXED);
  }
  return in > out ? in - out : 0;
}

/* glibc's chunks served by their own mmap, live now (mallinfo2's hblkhd, counted by the
 * hooks). */
uint64_t _hs_mmapped_chunk_bytes(void) {
  return slots_net(offsetof(hs_slot_t, mmapped_alloc_bytes), offsetof(hs_slot_t, mmapped_free_bytes));
}

/* Blocks live now, as the slots count them. */
uint64_t _hs_live_blocks(void) {
  return slots_net(offsetof(hs_slot_t, n_alloc), offsetof(hs_slot_t, n_free));
}

/* The reading as the program's exit begins (preload.c's exit_begins, once, in the owner):
 * the slots' sums as the sampler reads them, each slot caught between folds if it can be
 * in a few tries (a thread in the middle of one gives what it had: off by one fold), and
 * RSS from statm, unless a seccomp filter is in (no system call of heapsight's then). No
 * lock, no allocation: the sampler is not there at that instant, and the "end" the user
 * reads is this moment, before exit handlers and destructors free what they free. */
void _hs_exit_begun_read(hs_segment_t *seg) {
  int saved_errno = errno; /* the program's, for its exit handlers */
  uint64_t used = __atomic_load_n(&seg->slots_used, __ATOMIC_RELAXED);
  used = used < 1 ? 1 : used > HS_MAX_SLOTS ? HS_MAX_SLOTS : used;
  uint64_t ua = 0, uf = 0, req = 0, na = 0, nf = 0;
  for (uint64_t i = 0; i < used; i++) {
    const hs_slot_t *s = &seg->slots[i];
    uint64_t a, f;
    (void)hs_slot_usable(s, 100, &a, &f);
    ua += a;
    uf += f;
    req += __atomic_load_n(&s->req_alloc_bytes, __ATOMIC_RELAXED);
    na += __atomic_load_n(&s->n_alloc, __ATOMIC_RELAXED);
    nf += __atomic_load_n(&s->n_free, __ATOMIC_RELAXED);
  }
  uint64_t rss = 0, anon = 0, arenas = 0, system_mem = 0, mapped = HS_STATS_UNKNOWN;
  if (!__atomic_load_n(&_hs_seccomp, __ATOMIC_RELAXED)) {
    if (!_hs_statm_read(&rss, &anon)) rss = anon = 0;
    /* what glibc held from the OS, as the sampler reads it (its peeks at thread arenas are
     * system calls): the split's retained memory at this moment is bounded by it, not by
     * the readings around it (another allocator's figures are its own calls: none here) */
    if (seg->allocator_id == HS_ALLOC_GLIBC && _hs_glibc_arenas_known(&arenas, &system_mem))
      mapped = system_mem + _hs_mmapped_chunk_bytes();
  }
  seg->exit_begun_rss = rss;
  seg->exit_begun_anon = anon;
  seg->exit_begun_own_private = _hs_own_private();
  seg->exit_begun_usable_alloc = ua;
  seg->exit_begun_usable_free = uf;
  seg->exit_begun_req_alloc = req;
  seg->exit_begun_n_alloc = na;
  seg->exit_begun_n_free = nf;
  seg->exit_begun_alloc_mapped = mapped;
  seg->exit_begun_arenas = arenas;
  __atomic_store_n(&seg->exit_begun_read, 1, __ATOMIC_RELEASE);
  errno = saved_errno;
}

/* The usable size of a block malloc or calloc just returned under jemalloc, tcmalloc or
 * mimalloc, by the request: each serves a request from the size class of its 8-byte
 * step (jemalloc's and tcmalloc's classes, mimalloc's bins are all multiples of 8), and
 * a block's usable size is its class's, so the first block of each step asks the
 * allocator (malloc_usable_size) and the rest read its answer here: the call (and the
 * registers it saves) cost 35-40 instructions an allocation. Not for realloc, whose block
 * may keep a larger class than the request's (tcmalloc keeps it down to half), nor for
 * an aligned block; nor above HS_SIZES_BY_REQUEST_MAX. The frees still ask: free() gives
 * no size. Written racily: every thread writes the same answer. */
#define HS_SIZES_BY_REQUEST_MAX 16384
static uint32_t g_sizes_by_request[HS_SIZES_BY_REQUEST_MAX / 8 + 1];
HS_HIDDEN int _hs_sizes_by_request; /* allocators.c: jemalloc, tcmalloc, mimalloc */

/* The counting once the usable size is known: a jump to _hs_counted_due when the
 * countdown ran out. */
static inline void *count_other(hs_slot_t *s, void *p, size_t u, size_t req, const void *caller) {
  if (HS_UNLIKELY(hs_add_alloc(s, u + HS_BLOCK_EXTRA, req)))
    return _hs_counted_due(s, p, u + HS_BLOCK_EXTRA, req, caller);
  return p;
}

/* Each case that calls out (the allocator, for a class not known yet or a block too large;
 * the record's slow path): apart, so that the common path saves no register. u is 0 when
 * not known. */
__attribute__((noinline)) static void *counted_other_cold(hs_slot_t *s, void *p, size_t u,
                                                          size_t req, const void *caller) {
  if (u == 0) {
    u = _hs_real.malloc_usable_size(p);
    if (req <= HS_SIZES_BY_REQUEST_MAX && _hs_sizes_by_request)
      __atomic_store_n(&g_sizes_by_request[(req + 7) >> 3], (uint32_t)u, __ATOMIC_RELAXED);
  }
  if (_hs_blockmap_on) _hs_blockmap_set(p);
  return count_other(s, p, u, req, caller);
}

/* Another allocator's counting, for a thread with its slot (_hs_tslot_other): what
 * _hs_count_alloc_slow and _hs_count_free_slow do for it, without their tests of the
 * allocator, the slot and heapsight's own calls (each such case has no slot here). The
 * usable size is the allocator's malloc_usable_size (an allocation's by its request's
 * class). Reached from malloc and calloc only. */
void *_hs_counted_other(hs_slot_t *s, void *p, size_t req, const void *caller) {
  size_t u = req <= HS_SIZES_BY_REQUEST_MAX && _hs_sizes_by_request
                 ? __atomic_load_n(&g_sizes_by_request[(req + 7) >> 3], __ATOMIC_RELAXED)
                 : 0;
  if (HS_UNLIKELY(u == 0) || (_hs_blockmap_on && HS_UNLIKELY(!_hs_blockmap_try_set(p))))
    return counted_other_cold(s, p, u, req, caller);
  return count_other(s, p, u, req, caller);
}

void _hs_count_free_other(hs_slot_t *s, void *p) {
  size_t u = _hs_real.malloc_usable_size(p);
  if (_hs_blockmap_on) _hs_blockmap_clear(p);
  if (HS_UNLIKELY(hs_add_free(s, u + HS_BLOCK_EXTRA))) _hs_flush(s);
}

/* The ways out of preload.c's counted(), each returning the block (a jump there). */
void *_hs_counted_slow(void *p, size_t req, const void *caller) {
  _hs_count_alloc_slow(p, req, caller);
  return p;
}

void *_hs_counted_due(hs_slot_t *s, void *p, size_t chunk, size_t req, const void *caller) {
  size_t u = chunk - HS_BLOCK_EXTRA;
  if (HS_UNLIKELY(s == &g_own_slot)) {
    if (!own_put(p)) { /* no room: the program's after all */
      int depth = t_own;
      if (_hs_usable_by_header) _hs_tslot = t_own_saved;
      t_own = 0;
      hs_count_alloc_by(p, req, caller);
      t_own = depth;
      if (_hs_usable_by_header) {
        if (_hs_tslot) t_own_saved = _hs_tslot;
        _hs_tslot = &g_own_slot;
      }
    }
    return p;
  }
  /* a block this large always ends the countdown (it starts at the flush limit or less) */
  if (u >= HS_GLIBC_MMAP_THRESHOLD_START && !(_hs_usable_by_header && (hs_glibc_header(p) & 2)))
    s->n_large++;
  /* a signal handler's allocation inside this thread's fold: counted, left pending (and
   * not sampled: its countdown is the interrupted fold's to set) */
  if (HS_UNLIKELY(t_fold)) return p;
  fold_enter();
  /* the sample first: its event's time then comes before the peak's that this block's flush
   * may raise, and the block that makes the peak is among the peak's call sites */
  slot_write_begin(s);
  take_allocated(s);
  slot_write_end(s);
  if (s->sample_left < 0) _hs_sample_alloc(s, p, u, req, caller);
  flush(s);
  fold_leave();
  if (!t_own) polls();
  return p;
}
