"""The stacks walked from unwind rules cached per return address (native/src/unwind.c) are
libgcc's stacks, frame for frame: with HEAPSIGHT_UNWIND_CHECK=1 the library walks every
sampled stack both ways and counts the stacks that differ, on programs whose frames are
built every way a compiler builds them (frame pointer or not, alloca, deep recursion,
threads), on perl and python3, through a signal handler (a frame the cache leaves to
libgcc) and across dlcloses (each starts a new table; the fifth turns the cache off)."""

from __future__ import annotations

import subprocess

import pytest

CHECK = {"HEAPSIGHT_UNWIND_CHECK": "1"}
FINE = ("--sample-bytes", "2048")

FRAMES = r"""
#define _GNU_SOURCE
#include <alloca.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static void *volatile sink;
static volatile sig_atomic_t ticks;

__attribute__((noinline)) static void leaf(int n) {
  for (int i = 0; i < n; i++) { void *p = malloc(64 + (i % 512)); sink = p; free(p); }
}

/* a variable-length frame: the CFA is rbp-based here */
__attribute__((noinline)) static void with_alloca(int n) {
  char *buf = alloca(16 + (n % 4096));
  memset(buf, 1, 16);
  sink = buf;
  leaf(n);
}

__attribute__((noinline)) static void deep(int d, int n) {
  if (d == 0) { with_alloca(n); return; }
  deep(d - 1, n);
  __asm__ volatile("" ::: "memory"); /* not a tail call */
}

/* A sample here unwinds through the signal frame. 1000 bytes: a size of glibc's per-thread
 * cache that nothing else uses, primed in each thread with the signal blocked, so the
 * handler's malloc and free never wait on the arena lock the code it interrupts may hold
 * (4096 bytes did: glibc deadlocked on itself about one run in a few hundred). */
static void on_alarm(int sig) {
  (void)sig;
  ticks++;
  void *p = malloc(1000);
  sink = p;
  free(p);
}

static void alarms(int how) {
  sigset_t alarm;
  sigemptyset(&alarm);
  sigaddset(&alarm, SIGALRM);
  pthread_sigmask(how, &alarm, NULL);
}

/* (blocked again before the thread ends: its exit frees its cache under the arena lock)
 * Seven blocks primed, the cache's most per size: an allocation of that size made for the
 * thread by someone else (libgcc's unwinder sorting an object's frames at its first walk)
 * leaves the handler one still (with one primed, a full suite run hung here once). */
static void *worker(void *arg) {
  void *prime[7];
  for (int i = 0; i < 7; i++) prime[i] = malloc(1000);
  for (int i = 0; i < 7; i++) free(prime[i]);
  alarms(SIG_UNBLOCK);
  for (int r = 0; r < 200; r++) deep(5 + r % 30, 200 + (int)(long)arg);
  alarms(SIG_BLOCK);
  return NULL;
}

int main(void) {
  alarms(SIG_BLOCK); /* the threads start with it blocked */
  signal(SIGALRM, on_alarm);
  struct itimerval it = {{0, 200}, {0, 200}};
  setitimer(ITIMER_REAL, &it, NULL);
  pthread_t t[3];
  for (long i = 0; i < 3; i++) pthread_create(&t[i], NULL, worker, (void *)i);
  worker((void *)7);
  for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  return ticks > 0 ? 0 : 3;
}
"""


@pytest.fixture(scope="module")
def frames_programs(tmp_path_factory):
    """The program above, built three ways."""
    d = tmp_path_factory.mktemp("frames")
    src = d / "frames.c"
    src.write_text(FRAMES)
    out = {}
    for name, flags in (("O2", ["-O2"]), ("O2-fp", ["-O2", "-fno-omit-frame-pointer"]),
                        ("O0", ["-O0"])):
        exe = d / f"frames-{name}"
        subprocess.run(["cc", *flags, "-pthread", "-o", str(exe), str(src)], check=True)
        out[name] = str(exe)
    return out


def checked(r) -> dict:
    assert r.rc == 0, r.stderr[-2000:]
    return r.summary["sites"]


@pytest.mark.parametrize("build", ["O2", "O2-fp", "O0"])
def test_cached_stacks_are_libgccs_in_compiled_code(hs, frames_programs, build):
    s = checked(hs(frames_programs[build], opts=FINE, env=CHECK))
    # every sampled stack was walked both ways, and none differed
    assert s["unwind_checked"] > 500, s
    assert s["unwind_mismatches"] == 0, s
    # the cache walked most of them (a sample in the signal handler is libgcc's)
    assert s["unwinder"].startswith("unwind rules cached per return address"), s["unwinder"]


@pytest.mark.parametrize("command", [
    ["perl", "-e", 'my %h; $h{$_} = [$_, "v$_"] for 1..100000; sub f { my $n = shift; '
                   'return $n ? f($n - 1) : [map { "x" x $_ } 1..50] } f($_ % 40) for 1..2000;'],
    ["python3", "-c", "import json\nd = {i: str(i) * 3 for i in range(100000)}\n"
                      "def f(n): return f(n - 1) if n else json.dumps(list(range(200)))\n"
                      "[f(i % 50) for i in range(3000)]"],
], ids=["perl", "python3"])
def test_cached_stacks_are_libgccs_in_interpreters(hs, command):
    s = checked(hs(*command, opts=FINE, env=CHECK))
    assert s["unwind_checked"] > 200, s
    assert s["unwind_mismatches"] == 0, s
    assert s["unwinder"] == "unwind rules cached per return address", s["unwinder"]


DLCLOSES = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static void *volatile sink;

int main(int argc, char **argv) {
  /* six times: load a library, allocate through it (qsort's callback frames), unload it */
  for (int round = 0; round < 6; round++) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    void *(*make)(size_t) = (void *(*)(size_t))dlsym(h, "make");
    for (int i = 0; i < 4000; i++) { void *p = make(100 + i % 900); sink = p; free(p); }
    dlclose(h);
    for (int i = 0; i < 4000; i++) { void *p = malloc(100 + i % 900); sink = p; free(p); }
  }
  return 0;
}
"""

PLUGIN = r"""
#include <stdlib.h>
__attribute__((noinline)) static void *inner(size_t n) { void *p = malloc(n); return p; }
void *make(size_t n) { return inner(n); }
"""


def test_a_dlclose_starts_a_new_table_and_the_fifth_leaves_the_rest_to_libgcc(hs, tmp_path):
    # GIVEN a program that loads a library, allocates through it and unloads it, six times
    (tmp_path / "plugin.c").write_text(PLUGIN)
    (tmp_path / "main.c").write_text(DLCLOSES)
    lib, exe = tmp_path / "libplug.so", tmp_path / "dlcloses"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "plugin.c")], check=True)
    subprocess.run(["cc", "-O2", "-o", str(exe), str(tmp_path / "main.c"), "-ldl"], check=True)
    s = checked(hs(str(exe), str(lib), opts=FINE, env=CHECK))
    # THEN no stack differed from libgcc's, before or after each dlclose
    assert s["unwind_mismatches"] == 0, s
    assert s["unwind_checked"] > 200, s
    # AND the cached walk went on after the first four dlcloses, and stopped after the fifth
    assert "for the rest" in s["unwinder"], s["unwinder"]


def test_a_signal_handler_that_allocates_never_waits_for_its_own_thread(hs, frames_programs):
    # GIVEN a program whose SIGALRM handler mallocs and frees every 200 µs while its threads
    # allocate: the handler lands, sooner or later, while its thread holds the profile's
    # lock (looking up a sampled block's free); it used to wait there for itself, forever
    for build in ("O0", "O2"):
        r = hs(frames_programs[build], opts=FINE, timeout=60)
        # THEN it ran to its end, every time
        assert r.rc == 0 and r.summary["exit_code"] == 0, r.stderr[-2000:]
