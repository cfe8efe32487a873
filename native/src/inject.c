/* inject.c: hs-inject, how `heapsight attach` copies a running process and calls into it
 * without gdb (x86-64 Linux, ptrace).
 *
 *   hs-inject copy PID LIB DLOPEN DLSYM MAP [TIMEOUT_S [REACH]]   (`attach`, `--leaks`)
 *   hs-inject call PID FN [ARG...]                                 (`--trim`)
 *   hs-inject load PID DLOPEN DLSYM DLCLOSE LIB SEGMENT            (`--track`: attach.c)
 *   hs-inject unload PID DLSYM DLCLOSE HANDLE LO HI
 *
 * 1. Every thread of PID is stopped (PTRACE_SEIZE, PTRACE_INTERRUPT; threads made
 *    meanwhile are found by listing /proc/PID/task again until none is new).
 * 2. One stopped thread makes a system call it did not ask for: clone() with no flags and
 *    exit signal 0 (a copy of the process: no SIGCHLD, invisible to wait() without __WALL),
 *    at a `syscall` instruction of the process's own code. The thread's registers are then
 *    put back exactly as they were, and the kernel's own logic restarts the call the thread
 *    was in, if any: the thread is stopped once more on its way back to user mode (an
 *    interrupt), where the kernel applies a system call's restart as for any stop. Nothing
 *    is written to the process's memory and no extended (FPU) state is touched.
 * 3. Every thread is let go: the process's pause ends here (printed: pause_us).
 * 4. In the copy (a traced child of ours, stopped; never the process): close_range() and
 *    an mmap for a stack of its own; dlopen(LIB) and dlsym(.., "heapsight_copy_main")
 *    called at the addresses the CLI found in the process's libc (DLOPEN, DLSYM, hex);
 *    then heapsight_copy_main(MAP, REACH), which writes the map file (with the reach marked
 *    unless REACH is 0) and ends the copy.
 * 5. The copy, ended, is the process's zombie child: one thread of the process is stopped
 *    again and makes a wait4(copy, __WALL | WNOHANG) (printed: reap_pause_us).
 *
 * call: a function of the process's own (FN, hex: the allocator's release) is called on
 * one of its threads, with up to five arguments (numbers, or s:TEXT for a string placed on
 * that thread's stack below its red zone). Every thread is stopped while one is chosen: a
 * thread blocked in a system call that waits (read, poll, epoll_wait, a sleep, accept;
 * a futex only when no other), which holds no lock of the allocator's or the loader's;
 * the others are let go at once (a lock one of them holds is then released as usual). The
 * chosen thread's registers and its whole extended state (PTRACE_GETREGSET NT_X86_XSTATE,
 * written back as read) are saved; the call returns to address 0, whose fault the tracer
 * catches (the process never sees it); everything is put back as in copy's step 2. Printed:
 * threads, all_stopped_us (every thread), pause_us (the chosen thread), result.
 *
 * load and unload: calls made as call's, of dlopen and heapsight_attach_begin, then of
 * heapsight_attach_end and, once no thread runs in the library or has a return address
 * into it on its stack (in_use), dlclose.
 *
 * Output: "key value" lines on stdout; a failure's reason on stderr. Exit codes: 0 the map
 * is written; 3 the process cannot be traced (permissions, Yama); 4 the process ended;
 * 5 the copy failed (why on stderr); 7 the copy met a held lock (an arena's, or the
 * loader's): another try may succeed. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define EXIT_REFUSED 3
#define EXIT_ENDED 4
#define EXIT_FAILED 5
#define EXIT_BUSY 7
#define COPY_BUSY 7            /* copylib.c's HS_COPY_BUSY */
#define MAX_THREADS 65536
#define COPY_STACK (1u << 20)
#define CALL_LIMIT_NS 5000000000ull /* dlopen or dlsym in the copy: a held lock if longer */

typedef struct {
  pid_t tid;
  int sig;  /* a signal that stopped it meanwhile: delivered when it is let go */
  int gone; /* exited while stopped */
} thread_t;

static thread_t *g_threads;
static size_t g_n;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void say(const char *key, unsigned long long v) { printf("%s %llu\n", key, v); }

static void fail_msg(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static int known(pid_t tid) {
  for (size_t i = 0; i < g_n; i++)
    if (g_threads[i].tid == tid) return 1;
  return 0;
}

/* Seizes and interrupts every thread not yet known; the number seized, -1 (errno) when
 * the process's first thread cannot be. */
static long seize_new(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR *d = opendir(path);
  if (!d) return -1;
  long added = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    pid_t tid = (pid_t)atoi(e->d_name);
    if (tid <= 0 || known(tid) || g_n == MAX_THREADS) continue;
    if (ptrace(PTRACE_SEIZE, tid, 0, 0) != 0) {
      if (errno == ESRCH) continue; /* ended meanwhile */
      int saved = errno;
      closedir(d);
      errno = saved;
      return -1;
    }
    ptrace(PTRACE_INTERRUPT, tid, 0, 0);
    g_threads[g_n++] = (thread_t){tid, 0, 0};
    added++;
  }
  closedir(d);
  return added;
}

/* Waits for t's stop; a signal that stops it first is kept for later (and the thread
 * stays stopped there). 0 when it ended. */
static int wait_stopped(thread_t *t) {
  int st;
  for (;;) {
    if (waitpid(t->tid, &st, __WALL) < 0) {
      if (errno == EINTR) continue;
      t->gone = 1;
      return 0;
    }
    if (WIFEXITED(st) || WIFSIGNALED(st)) {
      t->gone = 1;
      return 0;
    }
    if (WIFSTOPPED(st)) {
      if ((st >> 16) == 0 && WSTOPSIG(st) != SIGTRAP) t->sig = WSTOPSIG(st);
      return 1;
    }
  }
}

static void let_go(void) {
  for (size_t i = 0; i < g_n; i++)
    if (!g_threads[i].gone) ptrace(PTRACE_DETACH, g_threads[i].tid, 0, (void *)(long)g_threads[i].sig);
  g_n = 0;
}

/* Whether the process is ending (a zombie, or gone): it then refuses to be traced. */
static int ending(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 1;
  buf[n] = 0;
  const char *paren = strrchr(buf, ')');
  return !paren || paren[1] == 0 || paren[2] == 'Z' || paren[2] == 'X';
}

/* Every thread of pid stopped; 0 ok, else an exit code (the reason said). */
static int stop_all(pid_t pid) {
  for (int rounds = 0;; rounds++) {
    long added = seize_new(pid);
    if (added < 0) {
      int e = errno;
      let_go();
      if (e == ESRCH || e == ENOENT || ending(pid)) return EXIT_ENDED;
      fail_msg("cannot trace process %d: %s", pid, strerror(e));
      return EXIT_REFUSED;
    }
    if (added == 0) break;
    if (rounds > 100) { /* threads made faster than they are stopped */
      let_go();
      fail_msg("process %d kept starting threads while they were being stopped", pid);
      return EXIT_FAILED;
    }
  }
  size_t alive = 0;
  for (size_t i = 0; i < g_n; i++) alive += wait_stopped(&g_threads[i]);
  if (!alive) {
    let_go();
    return EXIT_ENDED;
  }
  return 0;
}

/* A system call made by the stopped thread tid at `gadget` (a syscall instruction), its
 * registers otherwise those in base; the result (rax), *child the pid of a process it
 * made (clone); -ESRCH-style negative values are the call's own. *ended when the thread
 * ended. The caller puts the registers back. */
static long remote_syscall(thread_t *t, const struct user_regs_struct *base, uint64_t gadget,
                           long nr, long a1, long a2, long a3, long a4, long a5, long a6,
                           pid_t *child, int *ended) {
  struct user_regs_struct r = *base;
  r.rip = gadget;
  r.rax = (unsigned long long)nr;
  r.orig_rax = (unsigned long long)-1; /* no restart of the call the thread was in */
  r.rdi = (unsigned long long)a1, r.rsi = (unsigned long long)a2, r.rdx = (unsigned long long)a3;
  r.r10 = (unsigned long long)a4, r.r8 = (unsigned long long)a5, r.r9 = (unsigned long long)a6;
  *ended = 0;
  if (ptrace(PTRACE_SETOPTIONS, t->tid, 0, (void *)(long)(PTRACE_O_TRACESYSGOOD | PTRACE_O_TRACECLONE)) != 0 ||
      ptrace(PTRACE_SETREGS, t->tid, 0, &r) != 0) {
    *ended = errno == ESRCH;
    return -errno;
  }
  int in_call = 0;
  for (;;) {
    if (ptrace(PTRACE_SYSCALL, t->tid, 0, 0) != 0) { *ended = 1; return -ESRCH; }
    int st;
    while (waitpid(t->tid, &st, __WALL) < 0) {
      if (errno != EINTR) { *ended = 1; return -ESRCH; }
    }
    if (WIFEXITED(st) || WIFSIGNALED(st)) { t->gone = 1; *ended = 1; return -ESRCH; }
    int event = st >> 16;
    if (WSTOPSIG(st) == (SIGTRAP | 0x80)) { /* the call's entry, then its exit */
      if (in_call++ == 0) continue;
      struct user_regs_struct out;
      if (ptrace(PTRACE_GETREGS, t->tid, 0, &out) != 0) { *ended = 1; return -ESRCH; }
      return (long)out.rax;
    }
    if (event == PTRACE_EVENT_CLONE || event == PTRACE_EVENT_FORK) {
      unsigned long msg = 0;
      ptrace(PTRACE_GETEVENTMSG, t->tid, 0, &msg);
      if (child) *child = (pid_t)msg;
      continue;
    }
    if (event == 0 && WSTOPSIG(st) != SIGTRAP) t->sig = WSTOPSIG(st); /* kept for later */
  }
}

/* The thread's registers back as they were, and one more stop on its way back to user
 * mode: there the kernel restarts (or ends with EINTR) the call the thread was in, as it
 * does after any stop. 0 when it ended meanwhile. */
static int put_back(thread_t *t, const struct user_regs_struct *saved) {
  if (ptrace(PTRACE_SETREGS, t->tid, 0, saved) != 0) return 0;
  ptrace(PTRACE_SETOPTIONS, t->tid, 0, 0);
  ptrace(PTRACE_INTERRUPT, t->tid, 0, 0);
  if (ptrace(PTRACE_CONT, t->tid, 0, 0) != 0) return 0;
  for (;;) {
    int st;
    if (waitpid(t->tid, &st, __WALL) < 0) {
      if (errno == EINTR) continue;
      return 0;
    }
    if (WIFEXITED(st) || WIFSIGNALED(st)) { t->gone = 1; return 0; }
    if ((st >> 16) == PTRACE_EVENT_STOP) return 1;
    if ((st >> 16) == 0 && WSTOPSIG(st) != SIGTRAP) t->sig = WSTOPSIG(st);
    if (ptrace(PTRACE_CONT, t->tid, 0, 0) != 0) return 0;
  }
}

static int read_mem(pid_t pid, uint64_t addr, void *buf, size_t n) {
  struct iovec local = {buf, n}, remote = {(void *)(uintptr_t)addr, n};
  return process_vm_readv(pid, &local, 1, &remote, 1, 0) == (ssize_t)n;
}

static int write_mem(pid_t pid, uint64_t addr, const void *buf, size_t n) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/mem", pid);
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t w = pwrite(fd, buf, n, (off_t)addr);
  close(fd);
  return w == (ssize_t)n;
}

/* A syscall instruction (0f 05) the thread can run: right behind where it stopped (it
 * was in a system call), else the first in the process's libc text. 0 when none. */
static uint64_t find_gadget(pid_t pid, uint64_t rip) {
  unsigned char b[2];
  if (rip >= 2 && read_mem(pid, rip - 2, b, 2) && b[0] == 0x0f && b[1] == 0x05) return rip - 2;
  char path[64], line[4352];
  snprintf(path, sizeof path, "/proc/%d/maps", pid);
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  uint64_t found = 0;
  static unsigned char buf[1 << 16];
  while (!found && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || perms[2] != 'x' ||
        !strstr(line, "/libc.so"))
      continue;
    for (uint64_t at = lo; at < hi && !found; at += sizeof buf - 1) {
      size_t n = hi - at < sizeof buf ? hi - at : sizeof buf;
      if (!read_mem(pid, at, buf, n)) break;
      for (size_t i = 0; i + 1 < n; i++)
        if (buf[i] == 0x0f && buf[i + 1] == 0x05) { found = at + i; break; }
    }
  }
  fclose(f);
  return found;
}

/* Starts fn(a[0..4]) on the stopped thread t, its registers otherwise base's, its stack
 * below sp, returning to address 0 (see call_fn). 0 when the thread could not be set. */
static int start_call(thread_t *t, const struct user_regs_struct *base, uint64_t sp, uint64_t fn,
                      const uint64_t a[5]) {
  struct user_regs_struct r = *base;
  uint64_t zero = 0;
  sp = (sp & ~15ull) - 8; /* as after a call: (sp + 8) a multiple of 16 */
  r.rsp = sp, r.rip = fn, r.rax = 0, r.orig_rax = (unsigned long long)-1;
  r.rdi = a[0], r.rsi = a[1], r.rdx = a[2], r.rcx = a[3], r.r8 = a[4];
  return !t->gone && write_mem(t->tid, sp, &zero, 8) && ptrace(PTRACE_SETREGS, t->tid, 0, &r) == 0 &&
         ptrace(PTRACE_CONT, t->tid, 0, 0) == 0;
}

/* fn(a[0..4]) on the stopped thread t (start_call): the fault at address 0 it returns to,
 * caught here, ends the call (the process never sees it). A signal meant for the thread
 * meanwhile is kept for when it is let go (t->sig); a fault of the call's own (SIGSEGV
 * elsewhere, SIGBUS) is passed on. The result; *status 0, or 1 the thread ended, 2 out of
 * time (limit_ns; 0: none). */
static long call_fn(thread_t *t, const struct user_regs_struct *base, uint64_t sp, uint64_t fn,
                    const uint64_t a[5], uint64_t limit_ns, int *status) {
  *status = 1;
  if (!start_call(t, base, sp, fn, a)) return 0;
  uint64_t until = now_ns() + limit_ns;
  for (;;) {
    int st;
    pid_t w = waitpid(t->tid, &st, __WALL | (limit_ns ? WNOHANG : 0));
    if (w == 0) {
      if (now_ns() > until) { *status = 2; return 0; }
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 || WIFEXITED(st) || WIFSIGNALED(st)) { t->gone = 1; return 0; }
    int sig = (st >> 16) == 0 ? WSTOPSIG(st) : 0;
    if (sig == SIGSEGV) {
      struct user_regs_struct out;
      if (ptrace(PTRACE_GETREGS, t->tid, 0, &out) == 0 && out.rip == 0) {
        *status = 0;
        return (long)out.rax;
      }
    }
    if (sig && sig != SIGTRAP && sig != SIGSTOP && sig != SIGSEGV && sig != SIGBUS)
      t->sig = sig;
    ptrace(PTRACE_CONT, t->tid, 0, (void *)(long)(sig == SIGSEGV || sig == SIGBUS ? sig : 0));
  }
}

/* Waits for the copy, running, to end (it bounds itself, copylib.c); its exit code, or -1. */
static int copy_end(pid_t copy, uint64_t limit_ns) {
  uint64_t until = now_ns() + limit_ns;
  for (;;) {
    int st;
    pid_t w = waitpid(copy, &st, __WALL | WNOHANG);
    if (w == 0) {
      if (now_ns() > until) {
        kill(copy, SIGKILL);
        continue;
      }
      struct timespec ts = {0, 2000000};
      nanosleep(&ts, NULL);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -1;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    int sig = (st >> 16) == 0 ? WSTOPSIG(st) : 0;
    if (sig == SIGTRAP || sig == (SIGTRAP | 0x80)) sig = 0;
    ptrace(PTRACE_CONT, copy, 0, (void *)(long)sig);
  }
}

static void kill_copy(pid_t copy) {
  kill(copy, SIGKILL);
  int st;
  while (waitpid(copy, &st, __WALL) < 0 && errno == EINTR) {}
}

/* The ended copy, a zombie child of the process, reaped by one of the process's threads
 * (wait4 with __WALL | WNOHANG, made as in copy's step 2). 1 when reaped. */
static int reap_in_process(pid_t pid, pid_t copy, uint64_t *pause_ns) {
  uint64_t t0 = now_ns();
  int rc = stop_all(pid);
  if (rc) return 0;
  thread_t *t = NULL;
  for (size_t i = 0; i < g_n && !t; i++)
    if (!g_threads[i].gone) t = &g_threads[i];
  struct user_regs_struct saved;
  int reaped = 0, ended = 0;
  if (t && ptrace(PTRACE_GETREGS, t->tid, 0, &saved) == 0) {
    uint64_t gadget = find_gadget(pid, saved.rip);
    if (gadget) {
      long got = remote_syscall(t, &saved, gadget, SYS_wait4, copy, 0, __WALL | WNOHANG, 0, 0, 0,
                                NULL, &ended);
      reaped = got == copy;
      if (!ended) put_back(t, &saved);
    }
  }
  let_go();
  *pause_ns = now_ns() - t0;
  return reaped;
}

static thread_t *choose_idle(pid_t pid, struct user_regs_struct *regs);

static int copy_process(pid_t pid, const char *lib, uint64_t dlopen_at, uint64_t dlsym_at,
                        const char *map, uint64_t limit_ns, int reach) {
  /* 1-3: the process's pause */
  uint64_t t0 = now_ns();
  int rc = stop_all(pid);
  if (rc) return rc;
  size_t n_threads = 0;
  struct user_regs_struct saved;
  /* the copy's one thread: one waiting in a system call holds no lock of the allocator's or
   * the loader's, which the copy's dlopen takes; else any not stopped by a signal (the copy
   * then says so, or its dlopen runs out of time, and another copy is made) */
  thread_t *t = choose_idle(pid, &saved);
  for (size_t i = 0; i < g_n; i++) {
    if (g_threads[i].gone) continue;
    n_threads++;
    if (!t && !g_threads[i].sig && ptrace(PTRACE_GETREGS, g_threads[i].tid, 0, &saved) == 0)
      t = &g_threads[i];
  }
  if (!t) {
    let_go();
    fail_msg("no thread of process %d could make the copy (each was stopped by a signal)", pid);
    return EXIT_FAILED;
  }
  uint64_t gadget = find_gadget(pid, saved.rip);
  if (!gadget) {
    let_go();
    fail_msg("no system call instruction found in process %d's libc", pid);
    return EXIT_FAILED;
  }
  pid_t copy = 0;
  int ended = 0;
  long got = remote_syscall(t, &saved, gadget, SYS_clone, 0, 0, 0, 0, 0, 0, &copy, &ended);
  if (!ended) put_back(t, &saved);
  let_go();
  uint64_t pause = now_ns() - t0;
  say("threads", n_threads);
  say("pause_us", pause / 1000);
  if (got <= 0 || copy <= 0) {
    fail_msg("the copy could not be made: clone() in process %d returned %ld (%s)", pid, got,
             got < 0 ? strerror((int)-got) : "no process");
    if (copy > 0) { /* (a copy the call's result does not name: ended, and reaped) */
      uint64_t reap_pause;
      kill_copy(copy);
      reap_in_process(pid, copy, &reap_pause);
    }
    return ended ? EXIT_ENDED : EXIT_FAILED;
  }
  say("copy_pid", (unsigned long long)copy);
  fflush(stdout);

  /* 4: in the copy */
  int st;
  while (waitpid(copy, &st, __WALL) < 0 && errno == EINTR) {} /* its first stop */
  thread_t c = {copy, 0, 0};
  struct user_regs_struct base;
  int result = EXIT_FAILED;
  if (ptrace(PTRACE_GETREGS, copy, 0, &base) != 0) goto reap;
  uint64_t cgadget = find_gadget(copy, base.rip);
  long closed = remote_syscall(&c, &base, cgadget, SYS_close_range, 0, ~0L, 0, 0, 0, 0, NULL, &ended);
  long stack = ended ? -1 : remote_syscall(&c, &base, cgadget, SYS_mmap, 0, COPY_STACK,
                                           PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                           -1, 0, NULL, &ended);
  if (ended || closed != 0 || stack <= 0) {
    fail_msg("the copy could not close its files or map a stack (%ld, %ld)", closed, stack);
    goto kill;
  }
  /* the strings at the stack's top, the calls below them */
  uint64_t top = (uint64_t)stack + COPY_STACK, at = top;
  const char *strings[3] = {lib, "heapsight_copy_main", map};
  uint64_t addr[3];
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(strings[i]) + 1;
    at = (at - n) & ~15ull;
    addr[i] = at;
    if (!write_mem(copy, at, strings[i], n)) goto kill;
  }
  uint64_t sp = at - 256;
  int why = 0;
  uint64_t a_open[5] = {addr[0], RTLD_NOW, 0, 0, 0};
  long handle = call_fn(&c, &base, sp, dlopen_at, a_open, CALL_LIMIT_NS, &why);
  if (handle <= 0) {
    if (why == 2) { result = EXIT_BUSY; fail_msg("the copy's dlopen did not return: a lock held at the copy"); }
    else fail_msg("the copy could not load %s (the process's user must be able to read it)", lib);
    goto kill;
  }
  uint64_t a_sym[5] = {(uint64_t)handle, addr[1], 0, 0, 0};
  long fn = call_fn(&c, &base, sp, dlsym_at, a_sym, CALL_LIMIT_NS, &why);
  if (fn <= 0) {
    if (why == 2) result = EXIT_BUSY;
    fail_msg("heapsight_copy_main not found in %s", lib);
    goto kill;
  }
  uint64_t a_main[5] = {addr[2], (uint64_t)reach, 0, 0, 0};
  if (!start_call(&c, &base, sp, (uint64_t)fn, a_main)) goto kill; /* it never returns */
  uint64_t c0 = now_ns();
  int code = copy_end(copy, limit_ns);
  say("copy_ms", (now_ns() - c0) / 1000000);
  say("copy_status", (unsigned long long)(code < 0 ? 255 : code));
  result = code == 0 ? 0 : code == COPY_BUSY ? EXIT_BUSY : EXIT_FAILED;
  if (code != 0 && code != COPY_BUSY) fail_msg("the copy ended with status %d", code);
  goto reap;
kill:
  kill_copy(copy);
reap:;
  uint64_t reap_pause = 0;
  int reaped = reap_in_process(pid, copy, &reap_pause);
  say("reaped", (unsigned long long)reaped);
  say("reap_pause_us", reap_pause / 1000);
  return result;
}

/* ---- call: a function of the process's, on one of its threads ---- */

/* System calls a thread waits in when it has nothing to do (x86-64 numbers): a thread
 * stopped in one is not inside malloc or the loader. A futex is a last choice: it may be
 * a lock's wait (so may restart_syscall, which goes on with one). */
static int idle_call(long nr) {
  static const long idle[] = {0, 7, 23, 34, 35, 43, 45, 47, 61, 128, 130, 230, 232, 247, 270,
                              271, 281, 288, 299, 426, 441};
  for (size_t i = 0; i < sizeof idle / sizeof idle[0]; i++)
    if (idle[i] == nr) return 2;
  /* a futex, or restart_syscall (a sleep, poll or futex wait with a timeout, interrupted
   * by an earlier stop and going on) */
  return nr == 202 || nr == 219 ? 1 : 0;
}

/* Whether rip lies in a mapping of the dynamic loader's (ld-linux): a thread there may hold
 * its lock. */
static int in_loader(pid_t pid, uint64_t rip) {
  char path[64], line[4352];
  snprintf(path, sizeof path, "/proc/%d/maps", pid);
  FILE *f = fopen(path, "re");
  if (!f) return 1;
  int inside = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && rip >= lo && rip < hi) {
      inside = strstr(line, "/ld-linux") != NULL || strstr(line, "/ld-") != NULL;
      break;
    }
  }
  fclose(f);
  return inside;
}

/* The thread to make the call on: the most idle, not in the loader; NULL when none. */
static thread_t *choose_idle(pid_t pid, struct user_regs_struct *regs) {
  thread_t *best = NULL;
  int best_score = 0;
  for (size_t i = 0; i < g_n; i++) {
    thread_t *t = &g_threads[i];
    struct user_regs_struct r;
    if (t->gone || t->sig || ptrace(PTRACE_GETREGS, t->tid, 0, &r) != 0) continue;
    int blocked = (long)r.rax == -512 || (long)r.rax == -513 || (long)r.rax == -514 ||
                  (long)r.rax == -516 || (long)r.rax == -EINTR || (long)r.rax == -ENOSYS;
    int score = (long)r.orig_rax >= 0 && blocked ? idle_call((long)r.orig_rax) : 0;
    if (score > best_score && !in_loader(pid, r.rip)) {
      best = t, best_score = score, *regs = r;
      if (score == 2) break;
    }
  }
  return best;
}

/* A thread of the process, stopped for calls of ours (see call above). */
typedef struct {
  pid_t pid;
  thread_t *t;
  struct user_regs_struct saved;
  struct iovec xs;
  int have_xstate;
  uint64_t t0, all_stopped_ns, at; /* at: where the next string goes, below the red zone */
  size_t n_threads;
} live_t;

static unsigned char g_xstate[1 << 16];

/* Every thread stopped, an idle one chosen and its state saved, the others let go. 0, or
 * an exit code (the reason said). */
static int live_begin(live_t *L, pid_t pid) {
  memset(L, 0, sizeof *L);
  L->pid = pid;
  for (int tries = 0; tries < 100 && !L->t; tries++) { /* a second at most */
    int rc = stop_all(pid);
    if (rc) return rc;
    L->t0 = now_ns();
    L->n_threads = 0;
    for (size_t i = 0; i < g_n; i++) L->n_threads += !g_threads[i].gone;
    L->t = choose_idle(pid, &L->saved);
    if (!L->t) {
      let_go();
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL);
    }
  }
  if (!L->t) {
    fail_msg("no thread of process %d was waiting in a system call (each may be inside malloc "
             "or the loader): no call was made", pid);
    return EXIT_BUSY;
  }
  L->xs = (struct iovec){g_xstate, sizeof g_xstate};
  L->have_xstate = ptrace(PTRACE_GETREGSET, L->t->tid, (void *)NT_X86_XSTATE, &L->xs) == 0;
  if (!L->have_xstate) {
    L->xs.iov_len = 512;
    if (ptrace(PTRACE_GETREGSET, L->t->tid, (void *)NT_PRFPREG, &L->xs) != 0) {
      let_go();
      fail_msg("the chosen thread's floating-point state could not be read: no call was made");
      return EXIT_FAILED;
    }
  }
  for (size_t i = 0; i < g_n; i++) { /* the others go on */
    thread_t *o = &g_threads[i];
    if (o != L->t && !o->gone) {
      ptrace(PTRACE_DETACH, o->tid, 0, (void *)(long)o->sig);
      o->gone = 1;
    }
  }
  L->all_stopped_ns = now_ns() - L->t0;
  L->at = (L->saved.rsp - 128 - 4096) & ~15ull;
  return 0;
}

/* A string placed on the chosen thread's stack, below its red zone: its address, 0 if not. */
static uint64_t live_string(live_t *L, const char *text) {
  size_t n = strlen(text) + 1;
  L->at = (L->at - n) & ~15ull;
  return write_mem(L->pid, L->at, text, n) ? L->at : 0;
}

/* fn(a[0..4]) on the chosen thread (call_fn, no time limit); its result. *ok 0 when the
 * thread ended. */
static long live_call(live_t *L, uint64_t fn, const uint64_t a[5], int *ok) {
  int status;
  long result = call_fn(L->t, &L->saved, L->at - 256, fn, a, 0, &status);
  *ok = status == 0;
  return result;
}

/* The chosen thread put back as it was (registers, extended state) and let go. */
static void live_end(live_t *L) {
  thread_t *t = L->t;
  if (t && !t->gone) {
    ptrace(PTRACE_SETREGSET, t->tid, (void *)(long)(L->have_xstate ? NT_X86_XSTATE : NT_PRFPREG), &L->xs);
    put_back(t, &L->saved);
  }
  let_go();
  say("threads", L->n_threads);
  say("all_stopped_us", L->all_stopped_ns / 1000);
  say("pause_us", (now_ns() - L->t0) / 1000);
}

static int call_process(pid_t pid, uint64_t fn, int argc, char **argv) {
  live_t L;
  int rc = live_begin(&L, pid);
  if (rc) return rc;
  uint64_t args[5] = {0};
  for (int i = 0; i < argc && i < 5; i++) {
    if (strncmp(argv[i], "s:", 2) == 0) {
      if (!(args[i] = live_string(&L, argv[i] + 2))) { live_end(&L); return EXIT_FAILED; }
    } else {
      args[i] = strtoull(argv[i], NULL, 0);
    }
  }
  int ok;
  long result = live_call(&L, fn, args, &ok);
  live_end(&L);
  if (!ok) {
    fail_msg("process %d ended during the call", pid);
    return EXIT_ENDED;
  }
  printf("result %ld\n", result);
  return 0;
}

/* load: heapsight's library into the process, started on its segment (attach.c). */
static int load_library(pid_t pid, uint64_t dlopen_at, uint64_t dlsym_at, uint64_t dlclose_at,
                        const char *lib, const char *segment) {
  live_t L;
  int rc = live_begin(&L, pid);
  if (rc) return rc;
  uint64_t s_lib = live_string(&L, lib), s_begin = live_string(&L, "heapsight_attach_begin"),
           s_seg = live_string(&L, segment);
  int ok = s_lib && s_begin && s_seg;
  uint64_t a[5] = {s_lib, RTLD_NOW, 0, 0, 0};
  long handle = ok ? live_call(&L, dlopen_at, a, &ok) : 0;
  long fn = 0, patched = -1;
  if (ok && handle) {
    uint64_t b[5] = {(uint64_t)handle, s_begin, 0, 0, 0};
    fn = live_call(&L, dlsym_at, b, &ok);
  }
  if (ok && fn) {
    uint64_t c[5] = {s_seg, 0, 0, 0, 0};
    patched = live_call(&L, (uint64_t)fn, c, &ok);
  }
  if (ok && handle && patched < 0) { /* started on no segment: unloaded at once */
    uint64_t d[5] = {(uint64_t)handle, 0, 0, 0, 0};
    live_call(&L, dlclose_at, d, &ok);
  }
  live_end(&L);
  if (!ok) {
    fail_msg("process %d ended while heapsight's library was being loaded", pid);
    return EXIT_ENDED;
  }
  if (!handle) {
    fail_msg("the process could not load %s (its user must be able to read it)", lib);
    return EXIT_FAILED;
  }
  if (patched < 0) {
    fail_msg("heapsight's library could not start in the process (its segment %s)", segment);
    return EXIT_FAILED;
  }
  printf("handle %lx\n", (unsigned long)handle);
  say("patched", (unsigned long long)patched);
  return 0;
}

/* Whether any thread runs in [lo, hi) or has a word of it on its stack (a return address
 * into it); every thread stopped for the look, then let go (*paused_ns grows by that
 * stop). -1 when the process ended. */
static int in_use(pid_t pid, uint64_t lo, uint64_t hi, uint64_t *paused_ns) {
  uint64_t t0 = now_ns();
  if (stop_all(pid)) return -1;
  int busy = 0;
  static uint64_t words[1 << 15];
  for (size_t i = 0; i < g_n && !busy; i++) {
    struct user_regs_struct r;
    if (g_threads[i].gone || ptrace(PTRACE_GETREGS, g_threads[i].tid, 0, &r) != 0) continue;
    if (r.rip >= lo && r.rip < hi) { busy = 1; break; }
    /* the stack from its pointer up, to the end of its mapping (256 KiB at most) */
    for (uint64_t at = r.rsp & ~7ull, n; !busy && at < (r.rsp & ~7ull) + (256u << 10); at += n * 8) {
      n = sizeof words / 8;
      struct iovec local = {words, sizeof words}, remote = {(void *)(uintptr_t)at, sizeof words};
      ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
      if (got <= 0) {
        /* the mapping's end: read what is left a page at a time */
        got = 0;
        for (uint64_t p = at; p < at + sizeof words; p += 4096) {
          struct iovec l1 = {(char *)words + (p - at), 4096}, r1 = {(void *)(uintptr_t)p, 4096};
          if (process_vm_readv(pid, &l1, 1, &r1, 1, 0) != 4096) break;
          got += 4096;
        }
        if (got == 0) break;
      }
      n = (uint64_t)got / 8;
      for (uint64_t k = 0; k < n; k++)
        if (words[k] >= lo && words[k] < hi) { busy = 1; break; }
      if ((uint64_t)got < sizeof words) break;
    }
  }
  let_go();
  *paused_ns += now_ns() - t0;
  return busy;
}

/* unload: the GOT entries put back (heapsight_attach_end), then, once no thread runs in the
 * library or returns into it, dlclose. */
static int unload_library(pid_t pid, uint64_t dlsym_at, uint64_t dlclose_at, uint64_t handle,
                          uint64_t lo, uint64_t hi) {
  live_t L;
  int rc = live_begin(&L, pid);
  if (rc) return rc;
  uint64_t s_end = live_string(&L, "heapsight_attach_end");
  int ok = s_end != 0;
  uint64_t a[5] = {handle, s_end, 0, 0, 0};
  long fn = ok ? live_call(&L, dlsym_at, a, &ok) : 0;
  long restored = -1;
  if (ok && fn) {
    uint64_t b[5] = {0};
    restored = live_call(&L, (uint64_t)fn, b, &ok);
  }
  live_end(&L);
  if (!ok) return EXIT_ENDED;
  printf("restored %ld\n", restored);
  if (restored < 0) return EXIT_FAILED;
  /* the last calls into the hooks finish (a thread inside the allocator, called from one) */
  int busy = 1, waits = 0;
  uint64_t checks_ns = 0;
  for (; waits < 250 && busy; waits++) { /* 5 s at most */
    busy = in_use(pid, lo, hi, &checks_ns);
    if (busy < 0) return EXIT_ENDED;
    if (busy) {
      struct timespec ts = {0, 20000000};
      nanosleep(&ts, NULL);
    }
  }
  say("quiet_waits", (unsigned long long)waits);
  say("checks_pause_us", checks_ns / 1000); /* every thread's, for the looks */
  if (busy) {
    fail_msg("a thread of process %d kept a return address into heapsight's library: it is "
             "left loaded, inert (its hooks are no longer called)", pid);
    say("closed", 0);
    return 0;
  }
  rc = live_begin(&L, pid);
  if (rc) return rc;
  uint64_t c[5] = {handle, 0, 0, 0, 0};
  long closed = live_call(&L, dlclose_at, c, &ok);
  live_end(&L);
  if (!ok) return EXIT_ENDED;
  say("closed", closed == 0);
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  int copy = argc >= 7 && strcmp(mode, "copy") == 0, call = argc >= 4 && strcmp(mode, "call") == 0,
      load = argc == 8 && strcmp(mode, "load") == 0, unload = argc == 8 && strcmp(mode, "unload") == 0;
  if (!copy && !call && !load && !unload) {
    fprintf(stderr, "usage: hs-inject copy PID LIB DLOPEN DLSYM MAP [TIMEOUT_S [REACH]]\n"
                    "       hs-inject call PID FN [ARG...]\n"
                    "       hs-inject load PID DLOPEN DLSYM DLCLOSE LIB SEGMENT\n"
                    "       hs-inject unload PID DLSYM DLCLOSE HANDLE LO HI\n"
                    "(run by `heapsight attach PID --leaks`, `--trim` and `--track`)\n");
    return 2;
  }
  pid_t pid = (pid_t)atoi(argv[2]);
  g_threads = calloc(MAX_THREADS, sizeof *g_threads);
  if (!g_threads || pid <= 0) return pid <= 0 ? 2 : EXIT_FAILED;
  /* a process stopped, or a thread in a call of ours, is never left so: it ends its work
   * whatever its caller does (the CLI starts it in a session of its own) */
  signal(SIGPIPE, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  int rc;
  if (call) {
    uint64_t fn = strtoull(argv[3], NULL, 16);
    if (!fn || argc > 9) {
      fprintf(stderr, "hs-inject: bad arguments\n");
      return 2;
    }
    rc = call_process(pid, fn, argc - 4, argv + 4);
  } else if (load) {
    rc = load_library(pid, strtoull(argv[3], NULL, 16), strtoull(argv[4], NULL, 16),
                      strtoull(argv[5], NULL, 16), argv[6], argv[7]);
  } else if (unload) {
    rc = unload_library(pid, strtoull(argv[3], NULL, 16), strtoull(argv[4], NULL, 16),
                        strtoull(argv[5], NULL, 16), strtoull(argv[6], NULL, 16),
                        strtoull(argv[7], NULL, 16));
  } else {
    uint64_t dlopen_at = strtoull(argv[4], NULL, 16), dlsym_at = strtoull(argv[5], NULL, 16);
    double limit_s = argc > 7 ? atof(argv[7]) : 60.0;
    if (!dlopen_at || !dlsym_at || limit_s <= 0) {
      fprintf(stderr, "hs-inject: bad arguments\n");
      return 2;
    }
    int reach = argc > 8 ? atoi(argv[8]) != 0 : 1;
    rc = copy_process(pid, argv[3], dlopen_at, dlsym_at, argv[6], (uint64_t)(limit_s * 1e9), reach);
  }
  fflush(stdout);
  return rc;
}
