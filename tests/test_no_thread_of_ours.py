"""heapsight changes nothing the program can see: no thread of heapsight's runs in a glibc
program (its thread count and single-threadedness are as bare, so a user namespace can be
made and a main() that ends in pthread_exit ends), the copies of the program heapsight
makes close every fd they share with it (a flock the program released is free, a pipe it
closed ends for its reader) and are no children of the program's (a reaper thread's
waitpid(-1, __WALL) never meets one), and SIGUSR1, SIGUSR2 or SIGALRM sent to heapsight
reach the program instead of ending the measurement. Each program here runs bare and under
`heapsight run`, and the two must agree."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import compile_c

HS = [sys.executable, "-m", "heapsight", "run", "--no-save"]

THREADS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
  char *p = malloc(100), line[256];
  strcpy(p, "x");
  FILE *f = fopen("/proc/self/status", "r");
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "Threads:", 8)) fputs(line, stdout);
  fclose(f);
  free(p);
  return 0;
}
"""

PTHREAD_EXIT = r"""
#include <pthread.h>
#include <stdlib.h>
int main(void) {
  void *volatile p = malloc(1000);
  (void)p;
  pthread_exit(0);   /* the process ends when its last thread does */
}
"""

# 1.5 M linked blocks: a copy of this program takes a few hundred ms to walk and mark, so
# a copy that kept the program's fds would hold them that long
HEAP = r"""
  static void *keep[1500000];
  for (int i = 0; i < 1500000; i++) { keep[i] = malloc(48); *(void **)keep[i] = i ? keep[i - 1] : 0; }
"""

FLOCK = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
""" + HEAP + r"""
  int held = 0;
  for (int i = 0; i < 20; i++) {
    int fd = open(argv[1], O_RDWR | O_CREAT, 0600);
    flock(fd, LOCK_EX);
    struct timespec ts = {0, 40000000};
    nanosleep(&ts, NULL);
    close(fd);
    int again = open(argv[1], O_RDWR);
    if (flock(again, LOCK_EX | LOCK_NB) != 0) held++;
    close(again);
  }
  printf("held=%d\n", held);
  return 0;
}
"""

PIPE_EOF = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}
int main(int argc, char **argv) {
""" + HEAP + r"""
  int fds[2];
  if (pipe(fds)) return 1;
  if (fork() == 0) {
    close(fds[1]);
    double t;
    char b;
    if (read(fds[0], &t, sizeof t) != sizeof t) _exit(2);
    while (read(fds[0], &b, 1) > 0) {}
    FILE *f = fopen(argv[1], "w");
    fprintf(f, "%.3f\n", now() - t);
    fclose(f);
    _exit(0);
  }
  close(fds[0]);
  double t = now();
  if (write(fds[1], &t, sizeof t) != sizeof t) return 1;
  exit(0);
}
"""

SIGNALS = r"""
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static volatile sig_atomic_t got[3];
static void on(int sig) { got[sig == SIGUSR1 ? 0 : sig == SIGUSR2 ? 1 : 2] = 1; }
int main(void) {
  signal(SIGUSR1, on);
  signal(SIGUSR2, on);
  signal(SIGALRM, on);
  printf("ready\n");
  fflush(stdout);
  for (int i = 0; i < 1000 && !(got[0] && got[1] && got[2]); i++) {
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  printf("usr1=%d usr2=%d alrm=%d\n", got[0], got[1], got[2]);
  return 0;
}
"""


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    d = tmp_path_factory.mktemp("no-thread")

    def make(name: str, source: str) -> str:
        return compile_c(d, name, source, "-lpthread")
    return make


def both(argv, timeout=120, **kw):
    """(bare, under heapsight): each a CompletedProcess."""
    bare = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    under = subprocess.run([*HS, "--", *argv], capture_output=True, text=True, timeout=timeout, **kw)
    return bare, under


def test_the_program_has_the_threads_it_has_bare(build):
    exe = build("threads", THREADS)
    bare, under = both([exe])
    assert under.returncode == 0, under.stderr
    assert bare.stdout == under.stdout == "Threads:\t1\n"


# allocates and frees between three looks at its thread count, 0.15 s apart: snapshots
# (--every) copy it meanwhile
THREADS_WHILE_COPIED = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
int main(void) {
  static void *keep[20000];
  char line[256];
  for (int r = 0; r < 3; r++) {
    for (int i = 0; i < 20000; i++) keep[i] = malloc(64 + i % 400);
    struct timespec ts = {0, 150000000};
    nanosleep(&ts, NULL);
    for (int i = 0; i < 20000; i++) free(keep[i]);
    FILE *f = fopen("/proc/self/status", "r");
    while (fgets(line, sizeof line, f))
      if (!strncmp(line, "Threads:", 8)) fputs(line, stdout);
    fclose(f);
  }
  return 0;
}
"""

LIBDIR = "/usr/lib/x86_64-linux-gnu"
ALLOCATOR_LIBS = {"glibc": None, "jemalloc": f"{LIBDIR}/libjemalloc.so.2",
                  "tcmalloc": f"{LIBDIR}/libtcmalloc_minimal.so.4",
                  "mimalloc": f"{LIBDIR}/libmimalloc.so.2"}


@pytest.mark.parametrize("allocator", sorted(ALLOCATOR_LIBS))
def test_snapshots_run_no_thread_in_the_program_under_any_allocator(build, allocator):
    # before, a thread of heapsight's took the snapshots' maps (and, under jemalloc,
    # tcmalloc and mimalloc, sampled their statistics): "Threads: 2"
    lib = ALLOCATOR_LIBS[allocator]
    if lib and not os.path.exists(lib):
        pytest.fail(f"{lib} is missing: `make test` installs the allocators (scripts/install-deps)")
    exe = build("threads-copied", THREADS_WHILE_COPIED)
    env = dict(os.environ, **({"LD_PRELOAD": lib} if lib else {}))
    bare, under = both([exe], env=env, timeout=120)
    under = subprocess.run([*HS, "--every", "0.1", "--", exe], capture_output=True, text=True,
                           timeout=120, env=env)
    assert under.returncode == 0, under.stderr
    assert bare.stdout == under.stdout == "Threads:\t1\n" * 3
    # the copies were made all the same, by the program's own thread
    assert under.stderr.count("reachable at snapshot") >= 2, under.stderr
    assert f"; {allocator}" in under.stderr or allocator == "glibc"


IDLE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(void) {
  static void *keep[1000];
  for (int i = 0; i < 1000; i++) keep[i] = malloc(1000);
  struct timespec ts = {1, 0};
  nanosleep(&ts, NULL);   /* no allocator call: a snapshot now is copied at the frees */
  for (int i = 0; i < 1000; i++) free(keep[i]);
  return 0;
}
"""


def test_a_snapshot_of_a_program_making_no_allocator_call_is_its_heap_then(build, tmp_path):
    # GIVEN a program asleep, with 1,000 blocks live, at the snapshot: it makes its copy at
    # its first allocator call after it (the first free, 0.7 s later)
    exe = build("idle", IDLE)
    js = tmp_path / "s.json"
    r = subprocess.run([*HS, "--at", "0.3", "--json", str(js), "--", exe], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s = json.loads(js.read_text())
    (m,) = [m for m in s["heapmaps"] if m["moment"] == "snapshot: --at 0.3"]
    # THEN the map holds the heap of the snapshot (before any free), copied later, and says so
    assert m["t_s"] > 0.9, m["t_s"]
    assert m["reach"]["still_reachable_blocks"] == 1000, m["reach"]
    said = " ".join(r.stderr.split())   # as wrapped to the terminal's width
    # (the time the terminal gives, to the hundredth: 0.99 s once in a loaded full suite, the
    # timeline's zero a few ms after the program's start)
    copied = re.search(r"\(copied at ([0-9.]+) s, at the program's first allocator call after "
                       r"the snapshot", said)
    assert copied and float(copied.group(1)) > 0.9, said


def test_a_snapshot_answered_by_the_next_ones_map_is_said(tmp_path):
    # `sleep` makes no allocator call after its start: the first snapshot's request is
    # still open when the second comes, whose map (made at exit) shows the same heap (the
    # first comes late enough for sleep to have started on a loaded machine: at 0.1 s it
    # could still be starting, and answer it)
    js = tmp_path / "s.json"
    r = subprocess.run([*HS, "--at", "0.5,0.8", "--json", str(js), "--", "sleep", "1.2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    moments = [m["moment"] for m in json.loads(js.read_text())["heapmaps"]]
    assert moments == ["snapshot: --at 0.8", "exit"], moments
    said = " ".join(r.stderr.split())
    assert "1 snapshot got no heap map: the program made no allocator call between it and the next one" in said, said


CHURN_THREADS = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static void *work(void *arg) {
  static __thread void *keep[5000];
  for (int r = 0; r < 40; r++) {
    for (int i = 0; i < 5000; i++) keep[i] = malloc(100);
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
    for (int i = 0; i < 5000; i++) free(keep[i]);
  }
  return arg;
}
int main(void) {
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, work, NULL);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  return 0;
}
"""


def test_the_pokes_leave_every_count_exact(build, tmp_path):
    # the CLI pokes every thread's countdowns at each snapshot (2^60 taken off, read modulo
    # 2^60): the counts, the live bytes and the peak are the same as with no snapshot
    exe = build("churn-threads", CHURN_THREADS)
    got = {}
    for name, extra in (("plain", []), ("poked", ["--every", "0.02"])):
        js = tmp_path / f"{name}.json"
        r = subprocess.run([*HS, *extra, "--json", str(js), "--", exe], capture_output=True,
                           text=True, timeout=240)
        assert r.returncode == 0, r.stderr
        got[name] = json.loads(js.read_text())["heap"]
    plain, poked = got["plain"], got["poked"]
    for h in (plain, poked):
        assert h["n_alloc"] - h["n_free"] == h["live_blocks"] <= 8, h   # the loader's, stdio's
        assert h["live_usable_bytes"] < 64 << 10, h
    # 4 threads x 5,000 x 100 bytes at most live at once (each thread's share counted
    # within its flush limit)
    assert 4 * 5000 * 100 * 0.2 < poked["peak_live_requested_bytes"] <= 4 * 5000 * 100 + (64 << 10)
    assert plain["n_alloc"] == poked["n_alloc"] and plain["n_free"] == poked["n_free"]


def test_a_main_that_ends_in_pthread_exit_ends(build):
    # before, heapsight's thread kept the process alive (a zombie leader, state Zl): the
    # run never ended
    exe = build("pexit", PTHREAD_EXIT)
    bare, under = both([exe], timeout=60)
    assert bare.returncode == under.returncode == 0, under.stderr


def test_a_user_namespace_can_be_made_as_bare():
    # unshare(CLONE_NEWUSER) needs a single-threaded caller (EINVAL otherwise)
    bare, under = both(["unshare", "-r", "id", "-u"])
    if bare.returncode != 0:
        pytest.skip(f"user namespaces are not available here (bare `unshare -r` failed: "
                    f"{bare.stderr.strip()})")
    assert under.returncode == 0, under.stderr
    assert under.stdout == bare.stdout == "0\n"


def test_a_lock_the_program_released_is_free_while_heapsight_copies_it(build, tmp_path):
    # --every 0.1 copies the program while it holds the lock: a copy that kept its fd kept
    # the lock after the program closed it (13 of 20 tries here before the copies closed
    # their fds)
    exe = build("flock", FLOCK)
    lock = str(tmp_path / "lockfile")
    bare = subprocess.run([exe, lock], capture_output=True, text=True, timeout=120)
    under = subprocess.run([*HS, "--every", "0.1", "--", exe, lock], capture_output=True,
                           text=True, timeout=240)
    assert under.returncode == 0, under.stderr
    assert bare.stdout == "held=0\n"
    # a copy closes its fds first thing, but until the kernel first runs it (on a loaded
    # machine, a few ms) it still holds them: a try may fall in that window
    held = int(under.stdout.split("=")[1])
    assert held <= 2, under.stdout


def eof_delay(path, timeout=30.0) -> float:
    """What the reader wrote: seconds from the writer's exit to its EOF."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return float(text)
        time.sleep(0.02)
    raise AssertionError(f"the reader never saw EOF within {timeout:g} s")


def test_a_pipe_the_program_closed_ends_for_its_reader(build, tmp_path):
    # the copy made at exit walks the heap after the program ended: had it kept the write
    # end, the reader would see EOF only when the walk ended (0.37 s here before)
    exe = build("pipe-eof", PIPE_EOF)
    out_bare, out_under = tmp_path / "bare.txt", tmp_path / "under.txt"
    subprocess.run([exe, str(out_bare)], timeout=120, check=True)
    under = subprocess.run([*HS, "--", exe, str(out_under)], capture_output=True, text=True,
                           timeout=120)
    assert under.returncode == 0, under.stderr
    assert "still reachable" in under.stderr   # the copy ran: it marked the blocks
    delay = eof_delay(out_under)
    assert delay < 0.15, (delay, eof_delay(out_bare))


def test_usr1_usr2_and_alrm_sent_to_heapsight_reach_the_program(build):
    exe = build("signals", SIGNALS)
    p = subprocess.Popen([*HS, "--", exe], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
            os.kill(p.pid, sig)   # to heapsight, not to the program
            time.sleep(0.05)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    # THEN heapsight lived to the end, the program got each one, and the run was not
    # marked interrupted (the summary was printed)
    assert p.returncode == 0, err
    assert out == "usr1=1 usr2=1 alrm=1\n"
    assert "VERDICT" in err and "interrupted" not in err


REAPER = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static pid_t mine[3], reaped[64];
static volatile int n_reaped, done;
static void *reaper(void *arg) {
  (void)arg;
  while (!done) {   /* every child of any kind, as a service's reaper thread does */
    pid_t p = waitpid(-1, NULL, __WALL | WNOHANG);
    if (p > 0 && n_reaped < 64) reaped[n_reaped++] = p;   /* judged once all are known */
    if (p <= 0) { struct timespec ts = {0, 2000000}; nanosleep(&ts, NULL); }
  }
  return NULL;
}
int main(void) {
  pthread_t t;
  pthread_create(&t, NULL, reaper, NULL);
  static void *keep[200000];
  for (int round = 0; round < 3; round++) {
    if ((mine[round] = fork()) == 0) _exit(0);
    for (int i = 0; i < 200000; i++) keep[i] = malloc(64);
    struct timespec ts = {0, 300000000};
    nanosleep(&ts, NULL);
  }
  struct timespec ts = {0, 50000000};
  nanosleep(&ts, NULL);   /* the last child reaped */
  done = 1;
  pthread_join(t, NULL);
  int foreign = 0;
  for (int i = 0; i < n_reaped; i++)
    foreign += reaped[i] != mine[0] && reaped[i] != mine[1] && reaped[i] != mine[2];
  printf("foreign=%d\n", foreign);
  return 0;
}
"""


def test_a_reaper_thread_never_reaps_a_copy_of_heapsights(build):
    # GIVEN a program whose thread reaps every child with waitpid(-1, __WALL), copied by
    # heapsight every 0.2 s (--every): the copies were its children (5 foreign pids)
    exe = build("reaper", REAPER)
    bare = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    under = subprocess.run([*HS, "--every", "0.2", "--", exe], capture_output=True, text=True,
                           timeout=240)
    assert under.returncode == 0, under.stderr
    # THEN its reaper sees only its own children, and the copies were taken (the maps)
    assert bare.stdout == under.stdout == "foreign=0\n"
    assert "reachable at snapshot" in under.stderr, under.stderr


SECCOMP = r"""
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
static const int forbidden[] = {SYS_mmap, SYS_munmap, SYS_openat, SYS_gettid, SYS_clone,
                                SYS_clone3, SYS_process_vm_readv, SYS_clock_gettime};
#define N (int)(sizeof forbidden / sizeof forbidden[0])
int main(int argc, char **argv) {
  struct sock_filter f[N + 3];
  f[0] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
  for (int k = 1; k <= N; k++)
    f[k] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, forbidden[k - 1], N + 1 - k, 0);
  f[N + 1] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  f[N + 2] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  struct sock_fprog prog = {N + 3, f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return 2;
  /* the way libseccomp installs one: the seccomp system call through syscall() */
  if (argc > 1 ? prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0
               : syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) return 3;
  /* then only small blocks, many of them live: glibc serves them from its heap (brk) */
  static void *keep[200000];
  for (int i = 0; i < 200000; i++) keep[i] = malloc(16 + i % 200);
  for (int i = 0; i < 200000; i += 2) free(keep[i]);
  printf("done\n");
  return 0;
}
"""


@pytest.mark.parametrize("way", ["syscall", "prctl"])
def test_a_program_under_its_own_seccomp_filter_runs_as_bare(build, way):
    # GIVEN a program that forbids mmap, munmap, openat, gettid, clone, process_vm_readv
    # and clock_gettime (killing itself on any), then allocates small blocks: the library
    # grew its tables with mmap inside its malloc, and it died of SIGSYS
    exe = build("seccomp", SECCOMP)
    args = [exe] + (["prctl"] if way == "prctl" else [])
    bare = subprocess.run(args, capture_output=True, text=True, timeout=60)
    under = subprocess.run([*HS, "--sample-bytes", "64", "--", *args], capture_output=True,
                           text=True, timeout=120)
    # THEN it runs to its end under heapsight as bare, and the summary says what heapsight
    # left unmeasured from the filter on
    assert bare.returncode == 0 and bare.stdout == "done\n", bare
    assert under.returncode == 0, under.stderr
    assert under.stdout == "done\n"
    assert "seccomp filter" in under.stderr, under.stderr


def _python_312() -> str | None:
    """A Python 3.12 or later: on PATH, or pyenv's."""
    import glob
    import shutil
    names = [shutil.which(n) for n in ("python3.13", "python3.12")]
    names += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    for py in filter(None, names):   # (a pyenv shim may name a version it cannot run)
        ok = subprocess.run([py, "-c", "import sys; assert sys.version_info >= (3, 12)"],
                            capture_output=True)
        if ok.returncode == 0:
            return py
    return None


def test_python_3_12_forks_without_its_multithreaded_warning():
    # Python 3.12 warns at os.fork() in a process with more than one thread (a
    # DeprecationWarning: with -W error, the fork fails): heapsight's thread made it so
    py = _python_312()
    if py is None:
        pytest.skip("no Python 3.12 or later here (the warning comes with 3.12)")
    code = ("import os; pid = os.fork()\n"
            "if pid == 0: os._exit(0)\n"
            "os.waitpid(pid, 0); print('forked')")
    bare, under = both([py, "-W", "error", "-c", code])
    assert bare.returncode == 0 and bare.stdout == "forked\n", bare.stderr
    assert under.returncode == 0 and under.stdout == "forked\n", under.stderr
    assert "multi-threaded" not in under.stderr


STRICT = r"""
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
  void *volatile p = malloc(1000);
  (void)p;
  printf("strict\n");
  fflush(stdout);
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0) return 2;
  syscall(SYS_exit, 0);   /* read, write, exit and sigreturn only: no exit_group */
  return 3;
}
"""


def test_a_strict_seccomp_program_that_ends_its_thread_ends(build):
    # SECCOMP_MODE_STRICT allows no exit_group: the program ends its one thread with exit;
    # heapsight's thread kept the process alive (a hang)
    exe = build("strict", STRICT)
    bare, under = both([exe], timeout=60)
    assert bare.returncode == 0 and bare.stdout == "strict\n", bare
    assert under.returncode == 0 and under.stdout == "strict\n", under.stderr


MALLINFO = r"""
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
void *keep[150000];
static void *more(void *a) { for (int i = 0; i < 50000; i++) keep[100000 + i] = malloc(200); return a; }
int main(void) {
  for (int i = 0; i < 100000; i++) keep[i] = malloc(100);
  pthread_t t;   /* a second arena */
  pthread_create(&t, 0, more, 0);
  pthread_join(t, 0);
  struct mallinfo2 m = mallinfo2();   /* glibc's own figure, under its locks */
  printf("arena=%zu\n", m.arena);
  fflush(stdout);
  usleep(600000);   /* held: heapsight reads it from outside meanwhile */
  return 0;
}
"""


def test_glibc_s_figures_read_from_outside_are_glibc_s_own(build, tmp_path):
    # glibc's figures are read from outside (no thread of ours in the program): while the
    # program holds still, every reading equals what mallinfo2() says inside it
    exe = build("mallinfo", MALLINFO)
    rec = tmp_path / "r.hsrun.json.gz"
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "-o", str(rec), "--", exe],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    arena = int(p.stdout.split("=")[1])
    tl = json.loads(gzip.open(rec).read())["timeline"]
    got = [(m, a) for t, m, a in zip(tl["t"], tl["alloc_mapped"], tl["arenas"])
           if m is not None and not math.isnan(m)]
    assert got[-1] == (arena, 2), got[-3:]


@pytest.mark.parametrize("allocator", ["jemalloc", "mimalloc", "tcmalloc"])
def test_the_exit_thread_for_another_allocator_is_heapsights_own(tmp_path, allocator):
    # jemalloc's, tcmalloc's and mimalloc's calls at exit run on a thread started then:
    # what starting it allocates (its TLS) is heapsight's, counted in no figure (before, one
    # block too many: "1 block the hooks counted live that the copy did not find")
    from conftest import scenario
    lib = ALLOCATOR_LIBS[allocator]
    js = tmp_path / "s.json"
    r = subprocess.run([*HS, "--json", str(js), "--", scenario("hs-retention")],
                       capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, LD_PRELOAD=lib))
    assert r.returncode == 0, r.stderr
    s = json.loads(js.read_text())
    (m,) = [m for m in s["heapmaps"] if m["moment"] == "exit"]
    assert m["reach"]["marked"] and m["reach"]["classes_minus_counted"] == 0, m["reach"]
    assert s["release"]["measured"], s["release"]   # the calls made on that thread


# 1.5 M linked blocks (a copy takes a few hundred ms to walk and mark), then small blocks
# allocated and freed for 1.5 s: a snapshot every 50 ms
BIG_HEAP_BUSY = r"""
#include <stdlib.h>
#include <time.h>
int main(void) {
""" + HEAP + r"""
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    void *volatile p = malloc(64);
    free(p);
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while ((now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9 < 1.5);
  return 0;
}
"""


def test_one_copy_at_a_time(build, tmp_path):
    # before, each snapshot's copy was made while the last one was still being walked:
    # a perl hash under --every 0.02 ran 330 s instead of 0.6, dozens of copies at once
    exe = build("big-heap-busy", BIG_HEAP_BUSY)
    js = tmp_path / "s.json"
    r = subprocess.run([*HS, "--every", "0.05", "--json", str(js), "--", exe],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    s = json.loads(js.read_text())
    maps = sorted((m for m in s["heapmaps"] if m["moment"] != "exit"), key=lambda m: m["t_s"])
    assert len(maps) >= 2, [m["moment"] for m in s["heapmaps"]]
    for a, b in zip(maps, maps[1:]):   # each copy made after the last one ended
        assert b["t_s"] >= a["t_s"] + a["map_ms"] / 1000 - 0.005, (a, b)
    assert "still being walked" in " ".join(r.stderr.split())
    assert s["duration_s"] < 10, s["duration_s"]


RSS_AT_END = r"""
#include <stdio.h>
#include <string.h>
__attribute__((destructor)) static void at_end(void) {
  char line[256];
  FILE *f = fopen("/proc/self/status", "r");
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) fprintf(stderr, "end %s", line);
  if (f) fclose(f);
}
"""


def test_under_jemalloc_the_program_ends_with_its_bare_memory(tmp_path):
    # before, the statistics thread's readings (10 a second, jemalloc's locks and epoch)
    # changed what jemalloc kept: hs-retention ended with 90.4 MiB resident under heapsight,
    # 60.7 MiB bare
    from conftest import scenario
    src, shim = tmp_path / "rss_at_end.c", tmp_path / "rss_at_end.so"
    src.write_text(RSS_AT_END)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(shim), str(src)], check=True)
    lib = ALLOCATOR_LIBS["jemalloc"]
    bare = subprocess.run([scenario("hs-retention")], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, LD_PRELOAD=f"{lib}:{shim}"))
    bare_kib = int(bare.stderr.split("end VmRSS:")[1].split()[0])
    js = tmp_path / "s.json"
    r = subprocess.run([*HS, "--json", str(js), "--", scenario("hs-retention")],
                       capture_output=True, text=True, timeout=240, env=dict(os.environ, LD_PRELOAD=lib))
    assert r.returncode == 0, r.stderr
    final_kib = json.loads(js.read_text())["final"]["rss_bytes"] / 1024
    assert abs(final_kib - bare_kib) <= 0.1 * bare_kib, (final_kib, bare_kib)
