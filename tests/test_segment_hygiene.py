"""The stats segment never changes the program: no descriptor of heapsight's stays open in
it (a closefrom() and a fork must not hand the library a number the program now uses), no
file of heapsight's lands on fd 0, 1 or 2 when the program starts with them closed, and a
/dev/shm too small for the segment leaves the program running (without the library)
instead of killing it or heapsight with SIGBUS."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from heapsight import layout as L

HS = [sys.executable, "-m", "heapsight"]


def build(tmp_path, name: str, source: str) -> str:
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    exe = tmp_path / name
    subprocess.run(["cc", "-O2", "-Wall", "-pthread", "-o", str(exe), str(src)], check=True)
    return str(exe)


# closefrom(3), then a small regular file that takes fd 3, then a fork whose child allocates 50,000
# blocks and exits 3. With "unlink" it first removes the segment's file (the path the
# library attached): the child must then detach without it.
CLOSEFROM_FORK = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "unlink") == 0 && getenv("HEAPSIGHT_SEGMENT"))
    unlink(getenv("HEAPSIGHT_SEGMENT"));
  closefrom(3);
  int fd = open("data.txt", O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (write(fd, "ten bytes\n", 10) != 10) return 1;
  printf("fd=%d\n", fd);
  fflush(stdout);
  pid_t p = fork();
  if (p == 0) {
    for (int i = 0; i < 50000; i++) {
      char *volatile b = malloc(64);
      __asm__ volatile("" :: "r"(b) : "memory");
    }
    char *volatile big = malloc(1 << 20);
    __asm__ volatile("" :: "r"(big) : "memory");
    _exit(3);
  }
  int st = 0;
  waitpid(p, &st, 0);
  printf("child exit=%d signal=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1,
         WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return 0;
}
"""


@pytest.mark.parametrize("variant", ["kept", "unlink"])
def test_fork_after_closefrom_leaves_the_child_whole(hs, tmp_path, variant):
    # GIVEN a program that closes every fd from 3 up, opens a file (fd 3) and forks a
    # child that allocates; with "unlink" the segment's file is gone when it forks
    exe = build(tmp_path, "closefrom_fork", CLOSEFROM_FORK)
    bare = subprocess.run([exe, variant], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert bare.stdout == "fd=3\nchild exit=3 signal=0\n"
    r = hs(exe, variant, opts=["-q", "--no-save", "--no-heap-map"])
    # THEN the child ends as it does bare (it was killed by SIGBUS when the library
    # re-mapped the fd number it had kept, fd 3, now the program's 10-byte file)
    assert r.stdout == bare.stdout, r.stderr
    assert r.rc == 0
    # AND none of the child's allocations reached the parent's segment
    heap = r.summary["heap"]
    assert r.summary["preload"] == "active"
    assert heap["n_alloc"] < 1000, heap["n_alloc"]
    assert heap["peak_live_usable_bytes"] < (1 << 20), heap


# Lists its open fds (with their targets) at start, and again after 300 ms, while the
# library's thread has been reading /proc and heap maps have been taken.
FD_LIST = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void list(const char *when) {
  DIR *d = opendir("/proc/self/fd");
  int dfd = dirfd(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == dfd) continue;
    char path[300], target[512];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? n : 0] = 0;
    printf("%s fd %s -> %s\n", when, e->d_name, target);
  }
  closedir(d);
}

static void *volatile keep; /* free(malloc(n)) alone is compiled away: no call, no copy */

int main(void) {
  list("start");
  for (int i = 0; i < 300; i++) {
    keep = malloc(4096 + i);
    free(keep);
    usleep(1000);
  }
  list("later");
  return 0;
}
"""


def test_no_file_of_heapsight_takes_fd_0_or_2_when_they_start_closed(tmp_path):
    # GIVEN heapsight started with stdin and stderr closed (`2>&-`): the program inherits
    # them closed, and the next open() in it takes fd 0
    exe = build(tmp_path, "fd_list", FD_LIST)

    def closed_0_and_2():
        os.close(0)
        os.close(2)
    bare = subprocess.run([exe], stdout=subprocess.PIPE, text=True, preexec_fn=closed_0_and_2,
                          timeout=60, cwd=tmp_path)
    under = subprocess.run([*HS, "run", "-q", "--no-save", "--every", "0.05", "--", exe],
                           stdout=subprocess.PIPE, text=True, preexec_fn=closed_0_and_2,
                           timeout=120, cwd=tmp_path)
    # THEN the program sees the same fds as bare, at start and later: the segment was on
    # fd 2 (the program's stderr writes went into it) or fd 0
    assert under.returncode == bare.returncode == 0
    pipe = lambda out: [ln.split(" -> ")[0] if "pipe:" in ln else ln for ln in out.splitlines()]
    assert pipe(under.stdout) == pipe(bare.stdout), under.stdout
    assert "heapsight" not in under.stdout


def test_the_cli_hands_the_program_no_descriptor(tmp_path):
    # GIVEN the same program run bare and under heapsight run with an exporter port, heap
    # maps and snapshots (everything the CLI opens while the program runs)
    exe = build(tmp_path, "fd_list", FD_LIST)
    bare = subprocess.run([exe], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          stdin=subprocess.DEVNULL)
    under = subprocess.run([*HS, "run", "-q", "--no-save", "--every", "0.05",
                            "--openmetrics-port", "0", "--", exe], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert under.returncode == bare.returncode == 0, under.stderr
    # THEN its fds are the same (the pipes of its stdout and stderr aside)
    norm = lambda out: [ln.split(" -> ")[0] for ln in out.splitlines()]
    assert norm(under.stdout) == norm(bare.stdout)
    assert norm(bare.stdout) == [f"{w} fd {n}" for w in ("start", "later") for n in (0, 1, 2)]


# Four threads that malloc and free 1 MiB blocks: nearly every one is sampled, so the
# library writes its profile's pages one after another (on a full tmpfs: SIGBUS).
SAMPLED = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void *work(void *a) {
  for (long i = 0; i < 100000; i++) {
    char *volatile p = malloc(1 << 20);
    p[0] = 1;
    free(p);
  }
  return a;
}

int main(void) {
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, work, 0);
  for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
  printf("done\n");
  return 7;
}
"""


def _with_small_shm(size: str, argv: list, cwd) -> subprocess.CompletedProcess:
    """argv run in a mount namespace of its own whose /dev/shm is a tmpfs of size."""
    shell = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"'
    return subprocess.run(["unshare", "-m", "sh", "-c", shell, "sh", *argv],
                          capture_output=True, text=True, timeout=180, cwd=cwd)


needs_mount = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                 reason="mounting a small /dev/shm needs root and unshare")


@needs_mount
# (the segment: 72 KiB without the profile, 1.7 MiB with its least room; it takes at most
# a quarter of the free space)
@pytest.mark.parametrize("size", ["64k"])
def test_a_dev_shm_without_room_runs_the_program_without_the_library(tmp_path, size):
    exe = build(tmp_path, "sampled", SAMPLED)
    summary = tmp_path / "s.json"
    # GIVEN /dev/shm with less room than the segment needs
    r = _with_small_shm(size, [*HS, "run", "--no-save", "--json", str(summary), "--", exe],
                        tmp_path)
    # THEN the program runs to its end, heapsight says why the heap is not seen in one
    # line, and writes its report (it was the program, or heapsight, dead of SIGBUS)
    assert r.returncode == 7, r.stderr[-2000:]
    assert r.stdout.startswith("done\n")
    said = [ln for ln in r.stderr.splitlines() if "no room for the stats segment" in ln]
    assert len(said) == 1 and said[0].startswith("heapsight: "), r.stderr
    assert "Bus error" not in r.stderr
    s = json.loads(summary.read_text())
    assert s["preload"] == "not-attached" and "no room" in s["preload_note"]
    assert s["exit_code"] == 7 and s["peak_rss_bytes"] > 0


@needs_mount
def test_a_segment_that_fits_is_reserved_whole(tmp_path):
    # GIVEN a /dev/shm with room for the segment, and a program that writes the whole
    # profile (its events fill: samples are then dropped and counted)
    exe = build(tmp_path, "sampled", SAMPLED)
    summary = tmp_path / "s.json"
    r = _with_small_shm("12m", [*HS, "run", "--no-save", "--no-heap-map", "--json",
                                str(summary), "--", exe], tmp_path)
    # THEN the run is measured whole, with no SIGBUS anywhere
    assert r.returncode == 7, r.stderr[-2000:]
    s = json.loads(summary.read_text())
    assert s["preload"] == "active"
    assert s["heap"]["n_alloc"] >= 400000
    assert s["sites"]["dropped"] > 0 and s["sites"]["samples"] > 10000


# SAMPLED, then its own view at the end: VmRSS, and the Rss of heapsight's segment mapping
# (0 bare).
SAMPLED_SELF = SAMPLED.replace('  printf("done\\n");\n  return 7;', r'''
  FILE *f = fopen("/proc/self/smaps", "r");
  char line[512];
  long seg_kb = 0, rss_kb = 0;
  int in_seg = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) in_seg = strstr(line, "/heapsight-") != NULL;
    else if (in_seg) sscanf(line, "Rss: %ld kB", &seg_kb);
  }
  fclose(f);
  f = fopen("/proc/self/status", "r");
  while (fgets(line, sizeof line, f)) sscanf(line, "VmRSS: %ld kB", &rss_kb);
  fclose(f);
  printf("self: rss=%ld seg=%ld\n", rss_kb * 1024, seg_kb * 1024);
  return 0;''').replace("#include <stdlib.h>", "#include <stdlib.h>\n#include <string.h>")


def test_the_segment_is_not_counted_as_the_programs_memory(hs, tmp_path):
    # GIVEN four threads whose 1 MiB blocks are nearly all sampled: the library writes its
    # profile's events until they are full (they were 32 MiB, and counted in the program's
    # RSS: a 1.3 MiB program was reported at a 35 MiB peak)
    exe = build(tmp_path, "sampled_self", SAMPLED_SELF)
    bare = subprocess.Popen([exe], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(bare.pid, 0)
    bare.returncode = os.waitstatus_to_exitcode(status)
    bare_peak = usage.ru_maxrss * 1024
    assert bare.returncode == 0
    r = hs(exe, opts=["--no-save", "--no-heap-map", "--fail-if-rss", f"{bare_peak + (3 << 20)}"])
    assert r.rc == 0, r.stderr[-2000:]
    mine = {k: int(v) for k, v in r.truth("self").items()}
    s = r.summary
    # THEN the segment was written (its pages were resident in the program) ...
    assert mine["seg"] >= 1 << 20
    # ... and every figure leaves them out: RSS at exit is the program's RSS less them, the
    # peak stays within the program's bare peak and heapsight's code (libheapsight, libm,
    # libgcc_s: at most 3 MiB), and the smaps split shows no shared memory
    assert abs(s["final_rss_bytes"] - (mine["rss"] - mine["seg"])) <= 256 << 10, (s["final"], mine)
    assert s["peak_rss_bytes"] <= bare_peak + (3 << 20), (s["peak_rss_bytes"], bare_peak)
    assert s["resident_by_kind"].get("shared", 0) < 64 << 10, s["resident_by_kind"]
    # AND the summary says how much heapsight's segment took
    assert s["heapsight_rss_bytes"] >= mine["seg"] - (64 << 10)
    assert "heapsight's memory in the program (its stats segment and tables):" in r.stderr


def test_the_profile_holds_a_long_run_and_shrinks_only_where_room_is_short(tmp_path):
    # GIVEN a program whose 60,000 blocks of 1 MiB are nearly all sampled at the default mean
    # (120,000 events with their frees: more than the least room holds)
    exe = build(tmp_path, "long", SAMPLED.replace("100000", "15000"))
    summary = tmp_path / "s.json"
    r = subprocess.run([*HS, "run", "--no-save", "--no-heap-map", "--json", str(summary), "--",
                        exe], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 7, r.stderr[-2000:]
    s = json.loads(summary.read_text())
    # THEN every sample is recorded (the 4.6 MiB segment dropped all past the 16,384th)
    assert s["sites"]["dropped"] == 0
    assert s["sites"]["samples"] >= 50000   # 1 - e^-2 of 60,000: 51,900 expected
    assert "not recorded" not in r.stderr


@needs_mount
def test_a_dev_shm_short_of_the_default_room_gets_the_least(tmp_path):
    # GIVEN a /dev/shm of 8 MiB: the default segment (15.9 MiB) does not fit, the least does
    exe = build(tmp_path, "long", SAMPLED.replace("100000", "15000"))
    summary = tmp_path / "s.json"
    r = _with_small_shm("8m", [*HS, "run", "--no-save", "--no-heap-map", "--json",
                               str(summary), "--", exe], tmp_path)
    # THEN the run is measured with the library, its samples past the room counted and said
    assert r.returncode == 7, r.stderr[-2000:]
    s = json.loads(summary.read_text())
    assert s["preload"] == "active"
    assert 0 < s["sites"]["samples"] <= L.EVENTS_UNIT // 2
    assert s["sites"]["dropped"] > 0 and "not recorded" in r.stderr


@needs_mount
def test_a_dev_shm_with_room_for_the_counters_alone_gets_the_split_without_call_sites(tmp_path):
    # GIVEN 1 MiB of /dev/shm: a quarter holds the counters (72 KiB), not the least profile
    exe = build(tmp_path, "sampled", SAMPLED)
    summary = tmp_path / "s.json"
    r = _with_small_shm("1m", [*HS, "run", "--no-save", "--json", str(summary), "--", exe],
                        tmp_path)
    # THEN the heap is split, no call site is sampled, and heapsight says why
    assert r.returncode == 7, r.stderr[-2000:]
    assert "to leave the program its room; no call sites are sampled" in r.stderr, r.stderr
    s = json.loads(summary.read_text())
    assert s["preload"] == "active" and s["heap"]["n_alloc"] >= 400000
