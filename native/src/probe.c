/* probe.c: the library's own measurements: RSS from /proc/self/status (open/read into a
 * stack buffer: fopen would allocate), the heap maps the CLI asks for while the program runs
 * (taken on the program's own threads, heapmap.c), and the release probe at exit, which
 * never waits without bound. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <unwind.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/single_threaded.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "hs_fd.h"
#include "hs_internal.h"
#include "hs_options.h"

uint64_t _hs_segment_resident(void); /* segment.c */

/* VmRSS less the segment's pages (heapsight's, not the program's), and RssAnon. */
int _hs_read_status(uint64_t *rss_bytes, uint64_t *anon_bytes) {
  uint64_t rss, anon;
  if (!_hs_status_read(&rss, &anon)) return 0;
  /* less heapsight's own: the segment's resident pages (shared), its private memory */
  uint64_t own = _hs_segment_resident() + _hs_own_private(), priv = _hs_own_private();
  *rss_bytes = rss > own ? rss - own : 0;
  *anon_bytes = anon > priv ? anon - priv : 0;
  return 1;
}

/* No thread of the library's runs in the program while it runs: a thread the program did
 * not make changes it (a user namespace needs a single-threaded caller; a main() that ends
 * in pthread_exit lives while any thread does; Python 3.12 warns at fork). glibc's figures
 * are read without a lock, by the CLI from outside (through /proc/PID/mem, at the addresses
 * the segment gives); the others' (jemalloc, tcmalloc, mimalloc: their statistics calls
 * take their locks) only at exit, where the sampler reads their mappings' size meanwhile
 * (mappings.c). A heap map the CLI asks for while the program runs (a snapshot) is taken
 * by the first thread of the program's that enters the library's slow path after the
 * request (_hs_map_poll: a flush of its counters, at most HS_FLUSH_BYTES allocated or
 * freed after it, or a call of an allocator other than glibc), where it holds no lock of
 * the allocator's; one the program asks for (heapsight_snapshot()) on the asking thread.
 *
 * At exit, the probe runs in exit(), on whichever thread called it, and a program may call
 * exit() from a signal handler that interrupted malloc (not async-signal-safe, and
 * common). That thread then holds the allocator's lock, and a statistics, release or trim
 * call on it would wait forever. glibc's calls run on the exiting thread (they take no
 * lock but the copy's, which it takes with a deadline, and the release only when every
 * lock is free); for the other allocators a helper thread is started at exit (unless exit()
 * runs inside a signal handler), the exiting thread hands each call to it and waits,
 * bounded: it gives up once the helper has slept (state S in /proc/self/task/TID/stat,
 * i.e. it waits for a lock) for HS_PROBE_BLOCKED_NS in a row, or after HS_PROBE_LIMIT_NS in
 * all (a walk of a huge heap runs, it does not sleep), and records why in
 * exit_probe_status. Nothing is added to the hot path. */
#define HS_PROBE_BLOCKED_NS 300000000ull
#define HS_PROBE_LIMIT_NS (HS_PROBE_LIMIT_S * 1000000000ull)

enum { HS_JOB_NONE, HS_JOB_STATS_BEFORE, HS_JOB_RELEASE, HS_JOB_STATS_AFTER, HS_JOB_MAP_EXIT };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv;           /* CLOCK_MONOTONIC; job posted, job done */
static int g_job, g_job_done, g_stop;
static int g_helper_started;
static pid_t g_helper_tid;
static uint64_t g_release_ns;
HS_HIDDEN uint64_t _hs_exit_sp;
HS_HIDDEN uint64_t _hs_helper_self;
static int g_in_map;                  /* the helper is taking a heap map */
static uint64_t g_map_seen;           /* the last heapmap_seq answered */
static int g_poll_maps;               /* the CLI may ask for maps while the program runs */
static int g_figures;                 /* the allocator gives figures (_hs_allocator_stats) */

/* "<segment path>.map.<suffix>", or 0 when the segment has no path of ours. */
static int map_path(char *buf, size_t len, const char *suffix) {
  const char *seg = _hs_segment_path();
  if (!seg) return 0;
  int n = snprintf(buf, len, "%s.map.%s", seg, suffix);
  return n > 0 && (size_t)n < len;
}

/* A heap map (heapmap.c copies the process from the calling thread). */
static void take_map(const char *suffix, int at_exit) {
  char path[4200];
  if (!map_path(path, sizeof path, suffix)) return;
  __atomic_store_n(&g_in_map, 1, __ATOMIC_RELEASE);
  _hs_heapmap_write(path, at_exit);
  __atomic_store_n(&g_in_map, 0, __ATOMIC_RELEASE);
}

/* The CLI asked for map N (heapmap_seq): take it, then answer (heapmap_ack). Requests
 * that came meanwhile are answered by the one map. */
static int answer_map_request(void) {
  uint64_t want = __atomic_load_n(&_hs_seg->heapmap_seq, __ATOMIC_ACQUIRE);
  if (want == __atomic_load_n(&g_map_seen, __ATOMIC_RELAXED)) return 0;
  __atomic_store_n(&g_map_seen, want, __ATOMIC_RELAXED);
  char num[24];
  int n = snprintf(num, sizeof num, "%llu", (unsigned long long)want);
  if (n > 0) take_map(num, 0);
  __atomic_store_n(&_hs_seg->heapmap_ack, want, __ATOMIC_RELEASE);
  return 1;
}

static struct timespec mono_in(uint64_t ns) {
  uint64_t at = _hs_now_ns() + ns;
  struct timespec ts = {(time_t)(at / 1000000000ull), (long)(at % 1000000000ull)};
  return ts;
}

static void run_job(int job) {
  hs_segment_t *seg = _hs_seg;
  if (job == HS_JOB_STATS_BEFORE) {
    _hs_allocator_stats(&seg->exit_stats_before);
  } else if (job == HS_JOB_RELEASE) {
    uint64_t t0 = _hs_now_ns();
    _hs_allocator_release();
    g_release_ns = _hs_now_ns() - t0;
  } else if (job == HS_JOB_STATS_AFTER) {
    _hs_allocator_stats(&seg->exit_stats_after);
  } else if (job == HS_JOB_MAP_EXIT) {
    take_map("exit", 1);
  }
}

/* CPU time of the calling thread: the library's own work is counted apart from the
 * program's (hs_segment_t.library_cpu_ns). */
static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t g_probe_cpu_ns; /* the exiting thread's share, during the exit probe */
static uint64_t g_helper_cpu_ns; /* the exit helper's own CPU, as it last read it */
static uint64_t g_inline_cpu_ns; /* program threads' time making the copies for heap maps */

/* The library's own CPU time in the program: the exit probe's, the exit helper's, and the
 * program threads' while they made the heap maps' copies (the copies themselves are the
 * CLI's children, not in the program's CPU time). */
static void publish_cpu(void) {
  __atomic_store_n(&_hs_seg->library_cpu_ns,
                   g_helper_cpu_ns + g_probe_cpu_ns + __atomic_load_n(&g_inline_cpu_ns, __ATOMIC_RELAXED),
                   __ATOMIC_RELAXED);
}

static void helper_publish_cpu(void) {
  g_helper_cpu_ns = thread_cpu_ns();
  publish_cpu();
}

static void *helper_main(void *arg) {
  (void)arg;
  _hs_t_helper = 1;
  _hs_helper_self = (uint64_t)pthread_self(); /* its stack and TLS: never a root (reach.c) */
  __atomic_store_n(&g_helper_tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
  pthread_mutex_lock(&g_mu);
  while (!g_stop) {
    if (g_job == HS_JOB_NONE) {
      pthread_cond_wait(&g_cv, &g_mu);
      continue;
    }
    int job = g_job;
    pthread_mutex_unlock(&g_mu);
    run_job(job);
    helper_publish_cpu();
    pthread_mutex_lock(&g_mu);
    g_job = HS_JOB_NONE;
    g_job_done = job;
    pthread_cond_broadcast(&g_cv);
  }
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

/* Whether a thread of ours is asleep (waiting for a lock), from /proc/self/task/TID/stat:
 * "TID (comm) S ...", the state after the last ')'. */
static int thread_sleeping(pid_t tid) {
  char path[64], buf[512];
  int n = snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
  if (n <= 0) return 0;
  int fd = hs_open(path, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  ssize_t got = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (got <= 0) return 0;
  buf[got] = 0;
  const char *p = strrchr(buf, ')');
  return p && p[1] == ' ' && p[2] == 'S';
}

/* Runs one exit job on the helper; HS_PROBE_DONE once it is done, or why not. A heap map
 * (the exit job, or one the CLI asked for just before) waits for its child process,
 * asleep, and bounds itself (heapmap.c): only its copy, which takes the allocator's
 * locks, counts as possibly blocked, and its time does not count toward the limit. */
static int on_helper(int job) {
  if (!g_helper_started) return HS_PROBE_NO_HELPER;
  pid_t tid = __atomic_load_n(&g_helper_tid, __ATOMIC_ACQUIRE);
  uint64_t start = _hs_now_ns(), asleep_since = 0;
  int status = HS_PROBE_DONE;
  pthread_mutex_lock(&g_mu);
  g_job = job;
  pthread_cond_broadcast(&g_cv);
  while (g_job_done != job) {
    struct timespec until = mono_in(5000000ull);
    pthread_cond_timedwait(&g_cv, &g_mu, &until);
    if (g_job_done == job) break;
    uint64_t now = _hs_now_ns();
    int mapping = __atomic_load_n(&g_in_map, __ATOMIC_ACQUIRE) && !_hs_heapmap_forking();
    if (mapping) {
      start = now;
      asleep_since = 0;
      continue;
    }
    if (tid > 0 && thread_sleeping(tid)) {
      if (!asleep_since) asleep_since = now;
      if (now - asleep_since >= HS_PROBE_BLOCKED_NS) { status = HS_PROBE_ALLOCATOR_LOCKED; break; }
    } else {
      asleep_since = 0;
    }
    if (now - start >= HS_PROBE_LIMIT_NS) { status = HS_PROBE_TIMED_OUT; break; }
  }
  pthread_mutex_unlock(&g_mu);
  if (status != HS_PROBE_DONE) g_helper_started = 0; /* it is stuck: post nothing more */
  return status;
}

/* Whether exit() runs inside a signal handler (a kernel signal frame on this thread's
 * stack above us): the return address glibc's handlers get (their sa_restorer, read back
 * from any handler installed), with the saved context after it pointing its stack pointer
 * above that slot. A single-threaded glibc process takes no arena lock in malloc
 * (SINGLE_THREAD_P), so a handler that interrupted malloc leaves no lock to find: the
 * heap may be mid-change, and neither a copy nor a release is made then. */
#define HS_SIGFRAME_SCAN_BYTES (512u * 1024u)
#ifndef SA_RESTORER
#define SA_RESTORER 0x04000000 /* the kernel's; glibc sets it on every handler */
#endif
static int exit_in_signal_handler(void) {
  uint64_t restorer = 0;
  for (int sig = 1; sig < NSIG && !restorer; sig++) {
    struct sigaction sa;
    if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa) != 0) continue;
    if (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN && (sa.sa_flags & SA_RESTORER))
      restorer = (uint64_t)(uintptr_t)sa.sa_restorer;
  }
  if (!restorer) return 0; /* no handler: not in one */
  uint64_t at = (uint64_t)(uintptr_t)__builtin_frame_address(0) & ~(uint64_t)7, buf[512];
  for (uint64_t done = 0; done < HS_SIGFRAME_SCAN_BYTES; done += sizeof buf, at += sizeof buf) {
    struct iovec local = {buf, sizeof buf}, remote = {(void *)(uintptr_t)at, sizeof buf};
    if (syscall(SYS_process_vm_readv, getpid(), &local, 1UL, &remote, 1UL, 0UL) != (long)sizeof buf)
      return 0; /* the stack's end */
    for (size_t i = 0; i + 23 < sizeof buf / 8; i++) {
      if (buf[i] != restorer) continue;
      /* rt_sigframe: the return address, then the ucontext: flags, link, stack (3 words),
       * then the registers, RSP the 16th and RIP the 17th */
      uint64_t rsp = buf[i + 6 + 15], rip = buf[i + 6 + 16], slot = at + 8 * i;
      if (rsp > slot && rsp - slot < (64u << 20) && rip) return 1;
    }
  }
  return 0;
}

/* One exit job: on the helper when it runs, else here (glibc: see _hs_exit_probe). */
static int exit_job(int job) {
  if (g_helper_started) return on_helper(job);
  if (job == HS_JOB_RELEASE && !_hs_glibc_locks_free()) return HS_PROBE_ALLOCATOR_LOCKED;
  run_job(job);
  return HS_PROBE_DONE;
}

/* Where exit() was called from: the stack pointer of its caller (the CFA of exit's own
 * frame), found by libgcc's unwinder from the exit probe. The frames below it are exit's
 * and its handlers' (heapsight's probe among them), laid over the dead frames of what
 * ran before (malloc's, main's): uninitialised slots there hold stale pointers, which
 * memcheck does not read (they are undefined to it) and the copy must not either. The
 * unwinder's functions are looked up at start, never while the program exits. */
typedef _Unwind_Reason_Code (*hs_bt_fn)(_Unwind_Trace_Fn, void *);
typedef _Unwind_Ptr (*hs_region_fn)(struct _Unwind_Context *);
typedef _Unwind_Word (*hs_cfa_fn)(struct _Unwind_Context *);
static hs_bt_fn g_bt;
static hs_region_fn g_region;
static hs_cfa_fn g_cfa;

struct exit_find { uint64_t exit_fn, hook_fn, cfa; int frames; };

/* glibc's exit, called by glibc itself when main returned, or by the library's exit()
 * (preload.c) when the program called it: then the hook's frame, the next one out, is the
 * one whose caller is the program's. */
static _Unwind_Reason_Code exit_cb(struct _Unwind_Context *ctx, void *arg) {
  struct exit_find *f = arg;
  uint64_t fn = (uint64_t)g_region(ctx);
  if (fn == f->hook_fn) {
    f->cfa = (uint64_t)g_cfa(ctx);
    return _URC_END_OF_STACK;
  }
  if (f->cfa) return _URC_END_OF_STACK; /* glibc's exit, and no hook around it */
  if (fn == f->exit_fn) f->cfa = (uint64_t)g_cfa(ctx);
  return ++f->frames < 64 ? _URC_NO_REASON : _URC_END_OF_STACK;
}

/* In the owner's constructor (or at attach), before the program's main: libgcc_s is no
 * dependency of the library (CMakeLists.txt), so it is loaded here when the sampling did not
 * load it already. */
static void exit_unwinder_setup(void) {
  void *gcc = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!gcc) gcc = dlopen("libgcc_s.so.1", RTLD_NOW);
  if (!gcc) return;
  g_region = (hs_region_fn)dlsym(gcc, "_Unwind_GetRegionStart");
  g_cfa = (hs_cfa_fn)dlsym(gcc, "_Unwind_GetCFA");
  if (g_region && g_cfa) g_bt = (hs_bt_fn)dlsym(gcc, "_Unwind_Backtrace");
}

/* exit()'s caller's stack pointer, or the one given when exit() is not on the stack. */
static uint64_t exit_caller_sp(uint64_t here) {
  if (!g_bt) return here;
  struct exit_find f = {(uint64_t)(uintptr_t)__atomic_load_n(&_hs_real_exit, __ATOMIC_ACQUIRE),
                        (uint64_t)(uintptr_t)&exit, 0, 0};
  g_bt(exit_cb, &f);
  return f.cfa > here ? f.cfa : here;
}

int _hs_helper_running(void) { return g_helper_started; }

/* A map the CLI asked for, taken on the calling thread of the program (one in the
 * library's slow path, or one that waits in heapsight_snapshot()); 1 when one was taken.
 * Not on the exit helper's watch, nor twice at once (a signal handler's allocation on a
 * thread making a copy). */
int _hs_answer_map_request(void) {
  static int busy;
  if (g_helper_started || __atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE)) return 0;
  uint64_t cpu0 = thread_cpu_ns();
  int took = answer_map_request();
  if (took) {
    __atomic_fetch_add(&g_inline_cpu_ns, thread_cpu_ns() - cpu0, __ATOMIC_RELAXED);
    publish_cpu();
  }
  __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
  return took;
}

/* From the slow path of the counters (counters.c), outside their fold: a map the CLI asked
 * for since the last one is taken here, on this thread. One load when none is asked. */
void _hs_map_poll(void) {
  if (!__atomic_load_n(&g_poll_maps, __ATOMIC_RELAXED)) return;
  if (__atomic_load_n(&_hs_seg->heapmap_seq, __ATOMIC_ACQUIRE) ==
      __atomic_load_n(&g_map_seen, __ATOMIC_RELAXED))
    return;
  if (_hs_t_helper || __atomic_load_n(&_hs_seccomp, __ATOMIC_RELAXED) || !_hs_is_owner()) return;
  _hs_answer_map_request();
}

void _hs_probe_start(void) {
  _hs_options_read();
  if (!_hs_is_owner()) return;
  exit_unwinder_setup();
  hs_alloc_stats_t st;
  memset(&st, 0, sizeof st);
  g_figures = _hs_allocator_stats(&st);
  __atomic_store_n(&g_map_seen, __atomic_load_n(&_hs_seg->heapmap_ack, __ATOMIC_ACQUIRE),
                   __ATOMIC_RELAXED); /* after an execve */
  if (g_figures && _hs_seg->allocator_id == HS_ALLOC_GLIBC)
    _hs_glibc_publish_arena(); /* the CLI reads glibc's figures from outside */
  __atomic_store_n(&g_poll_maps, _hs_opt.maps_while_running, __ATOMIC_RELEASE);
}

/* The exit helper (see above), started with every signal blocked so that the program's
 * handlers never run on it. */
static void start_helper(void) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g_cv, &ca);
  pthread_condattr_destroy(&ca);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  /* the exit map's copy starts on this stack (heapmap.c): room for it */
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED); /* never joined: see above */
  pthread_t t;
  _hs_own_begin(); /* what pthread_create allocates (the thread's TLS) is heapsight's */
  g_helper_started = pthread_create(&t, &attr, helper_main, NULL) == 0;
  _hs_own_end();
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (g_helper_started) __atomic_store_n(&_hs_seg->library_threads, 1, __ATOMIC_RELAXED);
}

/* Why the exit map's copy was not made, as its file says. */
static const char *exit_map_why(int able, int in_handler, int glibc) {
  if (in_handler && glibc)
    return "exit() was called from a signal handler in a single-threaded program, where glibc "
           "takes no lock: the handler may have interrupted malloc mid-change, so no copy was made";
  if (in_handler)
    return "exit() was called from a signal handler, which may have interrupted the allocator "
           "holding its lock: no copy was made";
  if (!able && !glibc && g_figures)
    return "the library's thread for the allocator's calls at exit could not start";
  if (!able) return "the allocator gives no figures heapsight can read (an allocator it does not know)";
  return "the allocator's lock stayed taken at exit";
}

/* At exit, in the owner only: RSS and allocator figures, the exit map's copy (which also
 * measures the allocator's release, in the copy: the program keeps its memory and does not
 * wait for it), the release-now call in the program itself only where asked (or where the
 * copy cannot reach it: mimalloc's acts on the calling thread's heap), and the same figures
 * again. What a release in the program gave back is the difference. The allocator
 * calls run on the helper (bounded, see above), but for an allocator whose release acts on
 * the calling thread's own heap (mimalloc's mi_collect, which takes no lock): that one
 * runs here. Without a helper (an allocator with no figures of its own) nothing that
 * could wait is called. */
void _hs_exit_probe(void) {
  hs_segment_t *seg = _hs_seg;
  if (!seg || !_hs_is_owner()) return;
  if (__atomic_load_n(&_hs_seccomp, __ATOMIC_ACQUIRE)) {
    /* under a seccomp filter: the counters (memory writes only), nothing that makes a
     * system call (RSS, the allocator's calls, the copy): the filter may forbid any */
    _hs_flush_current();
    seg->exit_probe_status = HS_PROBE_SECCOMP;
    __atomic_store_n(&seg->state, HS_STATE_DONE, __ATOMIC_RELEASE);
    return;
  }
  uint64_t cpu0 = thread_cpu_ns();
  _hs_flush_current();
  __atomic_store_n(&seg->state, HS_STATE_EXITING, __ATOMIC_RELEASE);
  seg->exit_ns = _hs_now_ns();
  _hs_read_status(&seg->exit_rss_before, &seg->exit_anon_before);
  /* glibc's calls run here: its figures take no lock, its heap map's locks are taken with
   * a deadline, and its release only once every lock was free. A single-threaded glibc
   * takes no lock at all (SINGLE_THREAD_P): exit() from a handler that interrupted malloc
   * leaves the heap mid-change. The others' calls run on the exit helper, bounded; not
   * when exit() runs in a handler (the helper's own start may allocate, and the handler
   * may have interrupted the allocator holding its lock on this thread). */
  int glibc = seg->allocator_id == HS_ALLOC_GLIBC;
  int able = glibc ? __atomic_load_n(&seg->glibc_main_arena, __ATOMIC_ACQUIRE) != 0 : g_figures;
  int in_handler = able && (!glibc || __libc_single_threaded) && exit_in_signal_handler();
  if (able && !glibc && !in_handler) start_helper();
  int helper = g_helper_started, status;
  if (!glibc && !helper && !in_handler) able = 0;
  if (able) status = in_handler ? HS_PROBE_ALLOCATOR_LOCKED : exit_job(HS_JOB_STATS_BEFORE);
  else status = seg->allocator_id == HS_ALLOC_UNKNOWN ? HS_PROBE_DONE : HS_PROBE_NO_HELPER;
  /* The heap map asked for at exit: before the release. Its copy gives up on an arena
   * lock a thread of the program keeps (heapmap.c), and says so in the map. */
  if (__atomic_load_n(&seg->heapmap_at_exit, __ATOMIC_ACQUIRE) == 1) {
    int mapped = able && status == HS_PROBE_DONE;
    /* the copy scans this thread's stack from exit()'s caller up (exit_caller_sp) */
    if (mapped && _hs_opt.reach)
      __atomic_store_n(&_hs_exit_sp, exit_caller_sp((uint64_t)(uintptr_t)__builtin_frame_address(0)),
                       __ATOMIC_RELEASE);
    if (mapped) status = exit_job(HS_JOB_MAP_EXIT);
    __atomic_store_n(&_hs_exit_sp, 0, __ATOMIC_RELEASE);
    char path[4200];
    if ((!mapped || status != HS_PROBE_DONE) && map_path(path, sizeof path, "exit"))
      _hs_heapmap_write_refusal(path, exit_map_why(able, in_handler, glibc));
  }
  int on_caller = _hs_allocator_release_on_caller();
  int asked = _hs_opt.release_at_exit < 0 ? !_hs_segment_is_own() : _hs_opt.release_at_exit;
  int release = asked == 1 || (asked == HS_RELEASE_IN_COPY && on_caller);
  if (able && status == HS_PROBE_DONE && release) {
    if (on_caller) {
      uint64_t t0 = _hs_now_ns();
      _hs_allocator_release();
      g_release_ns = _hs_now_ns() - t0;
    } else {
      status = exit_job(HS_JOB_RELEASE);
    }
    if (status == HS_PROBE_DONE) {
      seg->release_ns = g_release_ns;
      seg->exit_release_kind = seg->allocator_id;
    }
  }
  _hs_read_status(&seg->exit_rss_after, &seg->exit_anon_after);
  if (able && status == HS_PROBE_DONE) status = exit_job(HS_JOB_STATS_AFTER);
  seg->exit_probe_status = (uint64_t)status;
  g_probe_cpu_ns = thread_cpu_ns() - cpu0;
  if (helper) __atomic_fetch_add(&seg->library_cpu_ns, g_probe_cpu_ns, __ATOMIC_RELAXED);
  else publish_cpu();
  pthread_mutex_lock(&g_mu);
  g_stop = 1; /* a helper that finished its jobs ends; a stuck one dies with the process */
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  seg->exit_done_ns = _hs_now_ns();
  __atomic_store_n(&seg->state, HS_STATE_DONE, __ATOMIC_RELEASE);
}
