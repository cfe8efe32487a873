"""The heap map's copy of the program is never the program's child as the program sees it:
its wait() never reaps the copy, its SIGCHLD handler never hears of it, and maps are still
taken while it forks, waits or allocates on many threads (native/src/heapmap.c)."""

import subprocess


WAITS = r"""
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* 200 children, one at a time, each reaped by a plain wait(): every pid it returns must be
 * the child just made, with the status it exited with. */
int main(void) {
  void *keep[256];
  int foreign = 0, bad_status = 0, reaped = 0;
  for (int i = 0; i < 200; i++) {
    keep[i & 255] = malloc(4096 + (size_t)i * 64);     /* a heap worth mapping */
    memset(keep[i & 255], i, 4096);
    pid_t child = fork();
    if (child < 0) { perror("fork"); return 2; }
    if (child == 0) { usleep(2000); _exit(i % 100); }
    int st;
    pid_t got = wait(&st);
    if (got != child) { foreign++; fprintf(stderr, "wait returned %d, not %d\n", (int)got, (int)child); }
    else if (!WIFEXITED(st) || WEXITSTATUS(st) != i % 100) bad_status++;
    else reaped++;
    if (got != child && got > 0) { waitpid(child, &st, 0); }
  }
  errno = 0;
  pid_t more = wait(NULL);
  printf("waits: reaped=%d foreign=%d bad_status=%d after=%s\n", reaped, foreign, bad_status,
         more < 0 && errno == ECHILD ? "ECHILD" : "a child");
  return foreign || bad_status || more >= 0;
}
"""

SIGCHLD = r"""
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* A SIGCHLD handler that reaps with waitpid(-1): one child alive at a time, so each signal
 * must reap exactly the child just made. */
static volatile sig_atomic_t signals, reaped, empty, foreign;
static volatile pid_t current;

static void on_chld(int sig) {
  (void)sig;
  int saved = errno, st, got_one = 0;
  signals++;
  pid_t p;
  while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
    got_one = 1;
    if (p == current) reaped++;
    else foreign++;
  }
  if (!got_one) empty++;
  errno = saved;
}

int main(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_chld;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGCHLD, &sa, NULL);
  sigset_t chld, old;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  void *keep[128];
  for (int i = 0; i < 100; i++) {
    keep[i & 127] = malloc(8192);
    memset(keep[i & 127], i, 8192);
    sigprocmask(SIG_BLOCK, &chld, &old);
    int before = reaped;
    pid_t child = fork();
    if (child == 0) { usleep(3000); _exit(0); }
    current = child;
    while (reaped == before && foreign == 0) sigsuspend(&old);
    sigprocmask(SIG_SETMASK, &old, NULL);
    usleep(2000);   /* a signal that is not about a child of ours would come in here */
  }
  printf("sigchld: signals=%d reaped=%d empty=%d foreign=%d\n", (int)signals, (int)reaped,
         (int)empty, (int)foreign);
  return !(signals == 100 && reaped == 100 && empty == 0 && foreign == 0);
}
"""

THREADS = r"""
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* 4 threads allocating and freeing hard (each in its own arena) for a while: the longest
 * a malloc waited is printed, in microseconds. */
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double until;

static void *churn(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void *slot[4096] = {0};
  double worst = 0;
  long n = 0;
  while (now() < until) {
    for (int k = 0; k < 1000; k++, n++) {
      int i = rand_r(&seed) & 4095;
      free(slot[i]);
      double t0 = now();
      slot[i] = malloc(16 + (rand_r(&seed) % 2000));
      double dt = now() - t0;
      if (dt > worst) worst = dt;
      memset(slot[i], 1, 16);
    }
  }
  for (int i = 0; i < 4096; i++) free(slot[i]);
  printf("thread: ops=%ld worst_malloc_us=%.0f\n", n, worst * 1e6);
  return NULL;
}

int main(int argc, char **argv) {
  until = now() + (argc > 1 ? atof(argv[1]) : 1.5);
  pthread_t t[4];
  for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, churn, (void *)(i + 1));
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  printf("threads: done\n");
  return 0;
}
"""


def build(tmp_path, name, source, *flags):
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    exe = tmp_path / name
    subprocess.run(["cc", "-O1", "-Wall", "-o", str(exe), str(src), *flags], check=True)
    return str(exe)


def snapshot_maps(summary):
    """The maps taken at snapshots (not the one at exit), and the statuses of all."""
    maps = summary["heapmaps"]
    return [m for m in maps if m["moment"] != "exit"], [m["status"] for m in maps]


# snapshots one by one, each with its map: every 20 ms for 3 s
EVERY_20_MS = ",".join(f"{0.02 * i:.2f}" for i in range(1, 151))


def test_the_programs_wait_never_reaps_the_maps_copy(hs, tmp_path):
    # GIVEN a program that forks 200 children one by one and reaps each with wait()
    exe = build(tmp_path, "waits", WAITS)
    # WHEN it runs with a map taken every 20 ms (--at: --every maps at most every 0.1 s)
    r = hs(exe, opts=["--at", EVERY_20_MS], timeout=180)
    # THEN each wait() returned the child it made, and nothing more was left to reap
    assert r.rc == 0, (r.stdout, r.stderr)
    assert r.truth("waits") == {"reaped": "200", "foreign": "0", "bad_status": "0", "after": "ECHILD"}
    # and the maps were taken, not refused, while it had children
    snaps, statuses = snapshot_maps(r.summary)
    assert len(snaps) >= 5, statuses
    assert all(s == "mapped" for s in statuses), statuses


def test_a_sigchld_handler_hears_of_the_programs_children_only(hs, tmp_path):
    # GIVEN a program whose SIGCHLD handler reaps any child, one child alive at a time
    exe = build(tmp_path, "sigchld", SIGCHLD)
    r = hs(exe, opts=["--at", EVERY_20_MS], timeout=180)
    # THEN one signal per child of its own, none empty, none about another process
    assert r.rc == 0, (r.stdout, r.stderr)
    assert r.truth("sigchld") == {"signals": "100", "reaped": "100", "empty": "0", "foreign": "0"}
    snaps, statuses = snapshot_maps(r.summary)
    assert len(snaps) >= 5, statuses
    assert all(s == "mapped" for s in statuses), statuses


def test_maps_while_four_threads_allocate_hard(hs, tmp_path):
    # GIVEN 4 threads in malloc/free all the time (the map takes every arena's lock)
    exe = build(tmp_path, "threads", THREADS, "-pthread")
    r = hs(exe, "2", opts=["--at", EVERY_20_MS], timeout=120)
    # THEN no deadlock, no crash, and the maps walked every arena
    assert r.rc == 0, (r.stdout, r.stderr)
    assert "threads: done" in r.stdout
    snaps, statuses = snapshot_maps(r.summary)
    assert len(snaps) >= 10, statuses
    assert all(s == "mapped" for s in statuses), statuses
    for m in snaps:
        assert len(m["arenas"]) >= 2, m["arenas"]          # the main arena and thread ones
        assert all(a["walked"] for a in m["arenas"]), m["note"]


SBRK = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
  char *a = malloc(1000);
  memset(a, 1, 1000);
  sbrk(1 << 20);                        /* the break moved behind malloc's back */
  usleep(600000);
  printf("sbrk: first=%d\n", a[0]);
  return 0;
}
"""


def test_no_lock_is_taken_where_the_main_arena_does_not_check_out(hs, tmp_path):
    # GIVEN a program that moved the break itself: the main arena's top no longer ends at it
    exe = build(tmp_path, "sbrk", SBRK)
    r = hs(exe, opts=["--every", "0.05"], timeout=120)
    # THEN it runs as ever, and each map says why it was not taken
    assert r.rc == 0 and r.truth("sbrk") == {"first": "1"}, (r.stdout, r.stderr)
    snaps, statuses = snapshot_maps(r.summary)
    assert snaps, statuses
    assert all("not one piece ending at the program break" in s for s in statuses), statuses
