"""The process measured when the command starts others: the one started by default, a
child that held much more named with the option that measures it, and --follow NAME
(HEAPSIGHT_FOLLOW) to measure that one."""

import json
import subprocess
import sys

from conftest import scenario

HS = [sys.executable, "-m", "heapsight"]
MiB = 1 << 20


def run(tmp_path, *args, rc=0):
    js = tmp_path / "s.json"
    r = subprocess.run([*HS, "run", "--no-save", "--json", str(js), *args], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == rc, r.stderr
    return json.loads(js.read_text()), r


def test_a_child_that_held_more_is_named_with_the_option_that_measures_it(tmp_path):
    # GIVEN a shell that runs a program leaking 40 MiB, then a builtin
    cmd = f"{scenario('hs-leak')} --mb 40 --hold-ms 300; true"
    s, r = run(tmp_path, "--", "sh", "-c", cmd)
    # THEN the shell is measured (the process started), and the verdict says that its child
    # held the memory, with the command that measures the child
    assert s["pid"] == s["started_pid"]
    top = s["findings"][0]
    assert top["kind"] == "child" and s["verdict"].startswith("IN A CHILD PROCESS: hs-leak ")
    assert top["bytes"] >= 40 * MiB
    assert top["suggestions"][0].startswith("heapsight run --follow hs-leak -- sh -c ")
    # and following it measures the program: its leak, exact, with its pid
    s2, r2 = run(tmp_path, "--follow", "hs-leak", "--", "sh", "-c", cmd)
    truth = dict(kv.split("=") for kv in r2.stdout.split()[1:])
    assert s2["pid"] != s2["started_pid"]
    assert f"figures are for pid {s2['pid']}, a process started by pid {s2['started_pid']}" in s2["preload_note"]
    # the process measured is not among those that ran beside it (it was a child of the
    # shell until it took the segment)
    assert s2["pid"] not in [ch["pid"] for ch in s2["children"]], s2["children"]
    assert "ran beside it" not in s2["preload_note"], s2["preload_note"]
    leaked = int(truth["leaked_bytes"])
    assert abs(s2["heap"]["live_requested_bytes"] - leaked) <= 0.01 * leaked
    assert s2["verdict"].startswith("LEAK: ")
    # every sample with heap figures is the program's (none mixes the shell's RSS with the
    # program's counters): the peak's live bytes are within its RSS
    assert 39 * MiB <= s2["peak"]["live_bytes"] <= s2["peak"]["rss_bytes"] + s2["peak"]["untouched_bytes"]


BIG_PARENT = """
import subprocess, sys, time
big = bytearray(200 << 20)
for i in range(0, len(big), 4096):
    big[i] = 1
time.sleep(1.0)
subprocess.run([sys.argv[1], "--mb", "10", "--hold-ms", "200"], check=True)
time.sleep(1.0)
"""


def test_a_followed_process_is_measured_from_when_it_is_found_none_of_its_parent_read_as_its(tmp_path):
    # GIVEN a python3 parent that writes 200 MiB, then runs a program leaking 10 MiB (as
    # rustc, 120 MiB, runs its linker, 49 MiB): the parent is read until the child appears
    script = tmp_path / "parent.py"
    script.write_text(BIG_PARENT)
    s, r = run(tmp_path, "--follow", "hs-leak", "--", "/usr/bin/python3", str(script),
               scenario("hs-leak"))
    # THEN every figure is the child's: its peak RSS (the parent's 200 MiB read as the
    # child's peak before), its images, its page faults (the
    # parent's 51,200 and more were the command's, from wait4)
    assert s["pid"] != s["started_pid"]
    assert s["peak_rss_bytes"] < 64 * MiB, s["peak_rss_bytes"]
    assert [exe.rsplit("/", 1)[1] for _, exe in s["images"]] == ["hs-leak"], s["images"]
    assert s["minor_faults"] < 20000, s["minor_faults"]
    # and its time is its own: from when it was found to its end, the parent's second before
    # and after it not in it (the child holds its leak 0.2 s, then ends; it read 2.2 s and
    # more), nor read as its exit's time (1.0 s: the parent's second after it)
    assert s["duration_s"] < 1.5, s["duration_s"]
    assert s["exit_probe_s"] < 0.8, s["exit_probe_s"]
    assert s["verdict"].startswith("LEAK: ")
    # the exit status shown is the command's: the process followed is not heapsight's child
    assert f"pid {s['pid']} ended after " in r.stderr and "(the command exited with code 0)" in r.stderr


def test_the_commands_other_processes_are_named_beside_the_one_followed(tmp_path):
    # GIVEN a shell that runs the program twice, the second run larger, then a python3 that
    # writes 100 MiB (as gcc runs cc1 per file, then as)
    leak = scenario("hs-leak")
    # (each held long enough for the readings of the command's processes, 4 a second, to
    # see it on a loaded machine)
    big = "/usr/bin/python3 -c 'import time; b = bytearray(100 << 20); time.sleep(0.8)'"
    cmd = f"{leak} --mb 5 --hold-ms 300; {leak} --mb 40 --hold-ms 800; {big}"
    s, _ = run(tmp_path, "--follow", "hs-leak", "--", "sh", "-c", cmd)
    # THEN the first hs-leak is measured, and the note says the other ran, with its peak
    assert s["pid"] != s["started_pid"]
    assert 5 * MiB <= s["heap"]["live_requested_bytes"] < 6 * MiB
    note = s["preload_note"]
    assert "other process(es) of the command ran beside it" in note, note
    assert "--follow measures the first process of hs-leak: 1 more ran" in note, note
    second = next(ch for ch in s["children"] if ch["name"] == "hs-leak")
    assert second["peak_rss_bytes"] >= 40 * MiB and second["pid"] != s["pid"]
    # and the process that held the most, another program, is a finding after the measured
    # one's own (its leak: the verdict), with the option that measures it
    assert s["verdict"].startswith("LEAK: "), s["verdict"]
    top = s["findings"][-1]
    assert top["kind"] == "child" and top["bytes"] >= 100 * MiB, s["findings"]
    assert "the figures here are hs-leak's" in top["title"], top["title"]
    assert top["suggestions"][0].startswith("heapsight run --follow python3 -- sh -c ")


def test_follow_names_the_process_to_measure(tmp_path):
    # GIVEN the same command, the shell asked for by name
    s, _ = run(tmp_path, "--follow", "sh", "--", "sh", "-c", f"{scenario('hs-leak')} --mb 20; true")
    # THEN the shell is measured: its own few allocations, not the program's 20 MiB
    assert s["pid"] == s["started_pid"]
    assert s["heap"]["live_requested_bytes"] < MiB
    # and a name no process has: no figures from the library, said plainly
    s3, _ = run(tmp_path, "--follow", "nosuchprogram", "--", "sh", "-c", "true", rc=2)
    assert s3["heap"] is None and s3["preload"] == "not-attached"
    assert "no process of nosuchprogram ran under the preload library" in s3["preload_note"]


def test_a_follow_name_that_never_runs_is_said_and_a_mistyped_command_is_guessed():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "heapsight", "run", "--no-save", "-q", "--follow",
                        "pearl", "--", "sh", "-c", "true"], capture_output=True, text=True,
                       timeout=60)
    # (the program succeeded, but what was asked was not measured: exit 2, not 0)
    assert r.returncode == 2
    assert "error: --follow pearl: no process of that name ran" in r.stderr, r.stderr
    assert "the processes the command started: sh" in r.stderr or "none seen" in r.stderr
    r = subprocess.run([sys.executable, "-m", "heapsight", "rn", "true"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "did you mean `heapsight run`?" in r.stderr, r.stderr
    # and an option a command does not have: the one meant, before anything runs
    r = subprocess.run([sys.executable, "-m", "heapsight", "run", "--fail-if-retaned", "1M", "--",
                        "touch", "ran"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "unknown option '--fail-if-retaned': did you mean --fail-if-retained?" in r.stderr
    r = subprocess.run([sys.executable, "-m", "heapsight", "compare", "--rankby", "peak", "--",
                        "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "did you mean --rank-by?" in r.stderr, r.stderr


SPIKE = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(void) {
  size_t n = 64u << 20;
  char *p = malloc(n);   /* mapped, written, unmapped: a spike of tens of ms */
  memset(p, 1, n);
  if (((volatile char *)p)[n - 1] != 1) return 1;   /* (kept: the compiler drops it else) */
  free(p);
  sleep(1);
  return 0;
}
"""


def test_a_childs_peak_is_its_high_water_mark_not_the_rss_last_read(tmp_path):
    # GIVEN a shell whose child writes 64 MiB, frees it at once, then sleeps: its RSS, read
    # a few times a second, mostly misses the spike
    from conftest import compile_c
    exe = compile_c(tmp_path, "spike", SPIKE)
    s, _ = run(tmp_path, "--", "sh", "-c", f"{exe}; true")
    # THEN its peak is the kernel's high-water mark for it, read while it slept
    child = next(ch for ch in s["children"] if ch["name"] == "spike")
    assert child["peak_rss_bytes"] >= 64 * MiB, s["children"]


QUICK = r"""
#include <stdlib.h>
#include <string.h>
int main(void) {
  size_t n = 64u << 20;
  char *p = malloc(n);   /* written and gone in tens of ms: between two readings */
  memset(p, 1, n);
  return ((volatile char *)p)[n - 1] != 1;
}
"""


def test_a_child_between_two_readings_is_found_by_the_kernels_count(tmp_path):
    # GIVEN a shell that runs a program that writes 64 MiB and exits at once, as gcc runs cc1
    # on a small file (cc1 peaked at 30.8 MiB; the readings, a few a second, saw 6.4)
    from conftest import compile_c
    exe = compile_c(tmp_path, "quick", QUICK)
    s, _ = run(tmp_path, "--", "sh", "-c", f"{exe}; true")
    # THEN the kernel's count at the shell's end (wait4's ru_maxrss) says a process it
    # started peaked at 64 MiB or more, whether or not a reading saw it
    top = s["findings"][0]
    assert top["kind"] == "child" and top["bytes"] >= 64 * MiB, s["findings"]
    assert s["verdict"].startswith("IN A CHILD PROCESS: "), s["verdict"]
    seen = [ch["name"] for ch in s["children"]]
    if "quick" in seen:   # (read while it ran: named, with the option that measures it)
        assert top["suggestions"][0].startswith("heapsight run --follow quick -- sh -c ")


def test_the_kernels_count_is_the_programs_own_when_no_child_held_more():
    # (summary.descendants_peak: ru_maxrss above the program's own high-water mark alone)
    from heapsight.summary import descendants_peak
    from heapsight.timeline import IDX, COLUMNS, Timeline
    tl = Timeline(start_ns=1)
    row = [float("nan")] * len(COLUMNS)
    row[IDX["t"]], row[IDX["hwm"]] = 0.1, 40 * MiB
    tl.append_row(row)
    tl.child_maxrss = 41 * MiB           # its own peak (and heapsight's pages): no child's
    assert descendants_peak(tl) == 0
    tl.child_maxrss = 64 * MiB           # a child's
    assert descendants_peak(tl) == 64 * MiB
    assert descendants_peak(tl, follow="quick") == 0   # the count is the followed one's too
    tl.child_maxrss = 0                  # not read (a record before version 7)
    assert descendants_peak(tl) == 0


GROWS_THEN_EXITS = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(void) {
  size_t n = 64u << 20;
  char *p = malloc(n);   /* written and gone by _exit: no exit reading, none between */
  memset(p, 1, n);
  _exit(((volatile char *)p)[n - 1] != 1);
}
"""


def test_a_program_that_started_no_process_has_the_kernels_count_for_its_own_peak(tmp_path):
    # GIVEN a program that starts no process, writes 64 MiB and ends by _exit at once (no
    # reading at its exit, and likely none after the growth)
    from conftest import compile_c
    exe = compile_c(tmp_path, "grows", GROWS_THEN_EXITS)
    s, _ = run(tmp_path, "--", exe)
    # THEN no child is named for the kernel's count (it said "IN A CHILD PROCESS: a process
    # grows started peaked at 64.x MiB" whenever the last reading came before the memset),
    # and that count is its own peak RSS
    assert not [f for f in s["findings"] if f["kind"] == "child"], s["findings"]
    assert s["peak_rss_bytes"] >= 64 * MiB, s["peak_rss_bytes"]


DAEMON = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(void) {
  char *a = malloc(1 << 20);
  memset(a, 1, 1 << 20);
  pid_t p = fork();
  if (p > 0) { printf("daemon=%d\n", (int)p); fflush(stdout); _exit(0); }
  setsid();
  freopen("/dev/null", "w", stdout);   /* as a daemon does: the caller's pipes go */
  freopen("/dev/null", "w", stderr);
  for (int i = 0; i < 50; i++) { char *b = malloc(1 << 20); memset(b, 2, 1 << 20); usleep(100000); }
  return 0;
}
"""


def test_a_daemon_that_left_its_parent_is_named_still_running(tmp_path):
    # GIVEN a program that forks and leaves at once, its child running on (a daemon)
    import os
    import signal
    from conftest import compile_c
    exe = compile_c(tmp_path, "daemon", DAEMON)
    js = tmp_path / "s.json"
    r = subprocess.run([*HS, "run", "--no-save", "--json", str(js), "--", exe],
                       capture_output=True, text=True, timeout=120)
    child = int(r.stdout.split("daemon=")[1].split()[0])
    try:
        s = json.loads(js.read_text())
        # THEN the process that ran on is named, with heapsight's library in it, and how to
        # measure it (the figures are the parent's, which left at once)
        assert {"pid": child, "name": "daemon"} in s["outlived"], s["outlived"]
        assert "1 process(es) it started still ran when it ended" in s["preload_note"]
        assert "heapsight attach PID" in s["preload_note"]
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_child_named_as_the_command_is_followed_by_its_first_argument(tmp_path):
    # GIVEN python3 running `python3 child.py` (as git gc runs `git pack-objects`): the child
    # has the command's own name, which --follow alone would find in the started process
    (tmp_path / "child.py").write_text(
        "import time\nbig = bytearray(80 << 20)\nfor i in range(0, len(big), 4096):\n"
        "    big[i] = 1\ntime.sleep(0.8)\n")
    parent = ("import subprocess, sys\n"
              "subprocess.run([sys.executable, 'child.py'], check=True, cwd=sys.argv[1])\n")
    cmd = ["--", "/usr/bin/python3", "-c", parent, str(tmp_path)]
    s, _ = run(tmp_path, *cmd)
    # THEN the child is named with its first argument, and so is the option that measures it
    top = s["findings"][0]
    assert top["kind"] == "child" and top["title"].startswith("python3 child.py (pid "), top
    assert top["suggestions"][0].startswith("heapsight run --follow 'python3 child.py' -- "), top
    # and that option measures the child, not the python3 started
    s2, _ = run(tmp_path, "--follow", "python3 child.py", *cmd)
    assert s2["pid"] != s2["started_pid"] and s2["peak_rss_bytes"] >= 80 * MiB, s2["preload_note"]
