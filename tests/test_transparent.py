"""The program sees under `heapsight run` exactly what it sees bare: its signal mask and
dispositions, its open fds, the children its wait() returns, its limits, its exit code and
its output bytes. One C program reports all of these about itself; it runs bare and under
heapsight with the same parent state, and the two reports must be identical."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from heapsight import layout as L

HS = [sys.executable, "-m", "heapsight"]

# Prints what a process can see of its own state, then forks children that malloc and
# exit with known codes, and reaps them with wait() until ECHILD: every pid wait() returns
# must be one of its own. Output bytes include a NUL and no newline at the end; the exit
# code is 37.
SELF_REPORT = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void status_line(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, key, strlen(key)) == 0) printf("%s", line);
  if (f) fclose(f);
}

int main(int argc, char **argv) {
  int children = argc > 1 ? atoi(argv[1]) : 20;
  status_line("SigBlk:");
  status_line("SigIgn:");
  status_line("SigCgt:");
  status_line("Threads:");
  for (int s = 1; s < NSIG; s++) {
    struct sigaction sa;
    if (sigaction(s, NULL, &sa) != 0) continue;
    if (sa.sa_handler == SIG_DFL) continue;
    printf("disposition %d %s\n", s, sa.sa_handler == SIG_IGN ? "ignored" : "handled");
  }
  DIR *d = opendir("/proc/self/fd");
  int dfd = d ? dirfd(d) : -1;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == dfd) continue;
    char path[300], target[512];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? n : 0] = 0;
    int flags = fcntl(atoi(e->d_name), F_GETFD);
    printf("fd %s -> %s cloexec=%d\n", e->d_name, target, flags >= 0 && (flags & FD_CLOEXEC));
  }
  if (d) closedir(d);
  for (int r = 0; r < RLIM_NLIMITS; r++) {
    struct rlimit rl;
    if (getrlimit(r, &rl) == 0)
      printf("rlimit %d %llu %llu\n", r, (unsigned long long)rl.rlim_cur,
             (unsigned long long)rl.rlim_max);
  }
  mode_t mask = umask(0);
  umask(mask);
  printf("umask %o\n", (unsigned)mask);
  printf("pgrp-is-own %d\n", getpgrp() == getpid());
  fflush(stdout);
  pid_t mine[256];
  for (int i = 0; i < children && i < 256; i++) {
    pid_t p = fork();
    if (p == 0) {
      char *volatile b = malloc(1000 + i);
      __asm__ volatile("" :: "r"(b) : "memory");
      usleep(1000 * (i % 5));
      _exit(i % 7);
    }
    mine[i] = p;
  }
  int reaped = 0, foreign = 0, codes = 0;
  for (;;) {
    int st;
    pid_t p = wait(&st);
    if (p < 0) break;
    int known = 0;
    for (int i = 0; i < children; i++) known |= mine[i] == p;
    if (!known) foreign++;
    else { reaped++; codes += WEXITSTATUS(st); }
  }
  printf("wait reaped=%d foreign=%d codes=%d errno=%s\n", reaped, foreign, codes,
         errno == ECHILD ? "ECHILD" : strerror(errno));
  fflush(stdout);
  fwrite("err\0bytes", 1, 9, stderr);
  fwrite("out\0end", 1, 7, stdout);
  return 37;
}
"""


@pytest.fixture(scope="module")
def self_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("transparent")
    src = d / "self_report.c"
    src.write_text(SELF_REPORT)
    exe = d / "self-report"
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(exe), str(src)], check=True)
    return str(exe)


def _preexec(ignore=(), block=()):
    """The parent's state, as a shell or a service manager may leave it."""
    def setup():
        for s in ignore:
            signal.signal(s, signal.SIG_IGN)
        if block:
            signal.pthread_sigmask(signal.SIG_BLOCK, set(block))
    return setup


def _run(argv, preexec, tmp_path, pass_fds=()):
    return subprocess.run(argv, capture_output=True, cwd=tmp_path, timeout=120,
                          preexec_fn=preexec, stdin=subprocess.DEVNULL, pass_fds=pass_fds)


# Every bit of SigIgn and SigCgt is the same, and the thread count: heapsight runs no thread
# in the program (before, under --every it ran one, and glibc installed its SIGSETXID handler,
# SigCgt's bit 32, in a process that creates a thread).
def _comparable(out: bytes) -> list:
    lines = out.decode(errors="replace").splitlines()
    for i, ln in enumerate(lines):
        # each run's stdout and stderr are new pipes: the kind of file is what must match
        lines[i] = re.sub(r"pipe:\[\d+\]", "pipe", lines[i])
    return lines


PARENT_STATES = {
    "default": {},
    "sigint-ignored": {"ignore": (signal.SIGINT, signal.SIGQUIT)},   # a shell's background job
    "sighup-ignored": {"ignore": (signal.SIGHUP,)},                  # nohup
    "usr1-blocked": {"block": (signal.SIGUSR1, signal.SIGTERM)},
}


@pytest.mark.parametrize("state", sorted(PARENT_STATES))
def test_program_sees_what_it_sees_bare(self_report, tmp_path, state):
    # GIVEN one parent state, the program run bare and under heapsight (a snapshot every
    # 50 ms, so that heap maps are taken while the program forks and waits)
    # and an inherited pipe (a make jobserver's, say) that the program must keep
    pre = _preexec(**PARENT_STATES[state])
    r, w = os.pipe()
    try:
        bare = _run([self_report, "40"], pre, tmp_path, pass_fds=(w,))
        under = _run([*HS, "run", "-q", "--no-save", "--every", "0.05", "--", self_report,
                      "40"], pre, tmp_path, pass_fds=(w,))
    finally:
        os.close(r)
        os.close(w)
    # THEN exit code, stdout and the program's stderr bytes are the same, line for line
    assert bare.returncode == 37
    assert under.returncode == bare.returncode, under.stderr.decode(errors="replace")
    assert _comparable(under.stdout) == _comparable(bare.stdout)
    assert f"fd {w} -> pipe:".encode() in bare.stdout
    assert under.stderr.endswith(b"err\0bytes"), under.stderr[-400:]
    assert b"wait reaped=40 foreign=0" in bare.stdout


def test_no_heapsight_fd_reaches_the_program_with_fds_closed(self_report, tmp_path):
    # GIVEN a program started with stdin and stderr closed: the next open() takes fd 0,
    # and anything heapsight's library opened there would be the program's "stdin"
    def closed_0_and_2():
        os.close(0)
        os.close(2)
    bare = subprocess.run([self_report, "0"], stdout=subprocess.PIPE, cwd=tmp_path,
                          preexec_fn=closed_0_and_2, timeout=60)
    under = subprocess.run([*HS, "run", "-q", "--no-save", "--", self_report, "0"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp_path,
                           timeout=60, preexec_fn=lambda: os.close(0))
    # (their stdout pipes are two different pipes: the pipe's number is left out)
    fds = lambda out: [re.sub(r"pipe:\[\d+\]", "pipe", ln) for ln in out.decode().splitlines()
                       if ln.startswith("fd ")]
    # heapsight itself needs its stderr for its messages: the program's fd 2 is then
    # heapsight's; what must match is fd 0 (closed) and everything from 3 on
    assert [f for f in fds(under.stdout) if not f.startswith("fd 2 ")] == \
        [f for f in fds(bare.stdout) if not f.startswith("fd 2 ")]
    assert not any(f.startswith("fd 0 ") for f in fds(under.stdout))


def test_address_space_limit_leaves_the_program_its_room(tmp_path):
    # GIVEN an address-space limit (ulimit -v) that heapsight's own process lives under
    # too, a program that mallocs 1 MiB blocks until malloc fails
    src = tmp_path / "fill.c"
    src.write_text(r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
  size_t n = 0;
  for (;;) { char *p = malloc(1 << 20); if (!p) break; memset(p, 1, 4096); n++; }
  printf("got %zu MiB\n", n);
  return 0;
}
""")
    exe = tmp_path / "fill"
    subprocess.run(["cc", "-O1", "-o", str(exe), str(src)], check=True)
    limit_kib = 400 * 1024
    shell = f"ulimit -v {limit_kib}; exec \"$@\""
    bare = subprocess.run(["sh", "-c", shell, "sh", str(exe)], capture_output=True, text=True,
                          timeout=60)
    # a limit the program sets itself, after heapsight made the segment: heapsight cannot
    # know of it and the profile's tables keep their default room
    under = subprocess.run([*HS, "run", "-q", "--no-save", "--", "sh", "-c", shell, "sh",
                            str(exe)], capture_output=True, text=True, timeout=120)
    # a limit heapsight is started under, as the program is (a shell's ulimit, systemd's
    # LimitAS): the segment is made with the least room
    inherited = subprocess.run(["sh", "-c", shell, "sh", *HS, "run", "-q", "--no-save", "--",
                                str(exe)], capture_output=True, text=True, timeout=120)
    got = lambda out: int(out.split("got ")[1].split()[0])
    assert under.returncode == 0, under.stderr
    assert inherited.returncode == 0, inherited.stderr
    # THEN the program gets the same room, less what the library's own mappings take (at
    # most 8 MiB: its code, the stats segment), and the default
    # profile's tables (13 MiB) only where heapsight could not know of the limit
    assert got(bare.stdout) - got(inherited.stdout) <= 8, (bare.stdout, inherited.stdout)
    tables = (L.segment_bytes(L.ROOM_DEFAULT) - L.segment_bytes(L.ROOM_SMALL)) / 2**20
    assert got(bare.stdout) - got(under.stdout) <= 8 + tables, (bare.stdout, under.stdout)


# Every scenario program whose output does not vary run to run (hs-churn prints its rate,
# hs-fork its children's pids; hs-snapshots prints how many snapshots heapsight took), with
# its default arguments
SCENARIOS = ("hs-alloc-errors", "hs-cxx", "hs-dlopen", "hs-free-first", "hs-idle", "hs-leak",
             "hs-new-handler", "hs-peak", "hs-reach", "hs-retention", "hs-sampling",
             "hs-sites", "hs-smallwaste", "hs-threads")


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_scenario_program_says_and_ends_as_it_does_bare(name):
    from conftest import scenario
    exe = scenario(name)
    where = os.path.dirname(exe)
    bare = subprocess.run([exe], capture_output=True, cwd=where, timeout=120,
                          stdin=subprocess.DEVNULL)
    under = subprocess.run([*HS, "run", "-q", "--no-save", "--", exe], capture_output=True,
                           cwd=where, timeout=240, stdin=subprocess.DEVNULL)
    # THEN the same bytes on stdout and on stderr (-q: heapsight says nothing), the same exit
    assert (under.returncode, under.stdout, under.stderr) == (bare.returncode, bare.stdout,
                                                              bare.stderr)


def test_glibc_s_internal_signals_start_as_bare(self_report, tmp_path):
    # glibc's posix_spawn (heapsight's way to start the program) left signals 32 and 33
    # ignored in it (SigIgn bits 31 and 32), where a shell's fork and exec leave them at
    # their default; and heapsight's thread made glibc install its SIGSETXID handler
    # (SigCgt bit 32). Without snapshots while it runs, the program's SigIgn and SigCgt are
    # its bare ones, every bit.
    def lines(out):
        return [ln for ln in out.decode().splitlines() if ln.startswith(("SigIgn:", "SigCgt:"))]
    bare = _run([self_report, "2"], None, tmp_path)
    under = _run([*HS, "run", "-q", "--no-save", "--", self_report, "2"], None, tmp_path)
    assert under.returncode == bare.returncode == 37, under.stderr
    assert lines(under.stdout) == lines(bare.stdout) and len(lines(bare.stdout)) == 2
