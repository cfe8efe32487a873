"""`heapsight run` on bad input and hard cases: each must end in a clear message or a
summary, never a crash, a hang or a half-written file."""

import json
import subprocess
import sys

import pytest

from conftest import scenario, shm_segments

MiB = 1024 * 1024


def test_command_not_found_exits_127_and_writes_nothing(hs, tmp_path):
    r = hs("no-such-program-xyz", "--flag")
    assert r.rc == 127
    assert "command not found: no-such-program-xyz" in r.stderr
    assert r.summary is None
    assert not list(tmp_path.glob("heapsight-*.hsrun*"))


def test_not_executable_exits_127(hs, tmp_path):
    script = tmp_path / "notexec.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    r = hs(str(script))
    assert r.rc == 127
    assert "not executable" in r.stderr and "chmod +x" in r.stderr
    assert not list(tmp_path.glob("heapsight-*.hsrun*"))
    # a directory is not told to be made executable (it is, and is no program)
    r = hs(str(tmp_path))
    assert r.rc == 127
    assert "is a directory: give the program to run" in r.stderr and "chmod" not in r.stderr


def test_static_program_gets_proc_figures_only(hs):
    r = hs(scenario("hs-static"))
    assert r.rc == 0, r.stderr
    assert "statically linked" in r.stderr and "/proc figures only" in r.stderr
    s = r.summary
    assert s["preload"] == "static" and s["heap"] is None
    assert s["peak_rss_bytes"] > 10 * MiB  # 10 MiB touched
    assert "preload library was not active" in s["verdict"]


@pytest.mark.parametrize("how,code,signal_no", [("kill", 137, 9), ("segv", 139, 11),
                                                 ("abort", 134, 6), ("_exit", 3, 0)])
def test_program_that_dies_still_gets_a_summary(hs, how, code, signal_no):
    r = hs(scenario("hs-die"), "--how", how, "--mb", "20")
    # heapsight ends as the program did: by its signal (its parent sees -N), or its code
    assert r.rc == (-signal_no if signal_no else code)
    s = r.summary
    assert s is not None and s["exit_code"] == code and s["exit_signal"] == signal_no
    # no exit handlers ran, so no release probe: said, not invented
    assert s["release"]["measured"] is False
    assert "without running exit handlers" in s["release"]["why_not"]
    # figures from the last samples: the 20 MiB it allocated is there
    assert s["peak_rss_bytes"] >= 20 * MiB
    assert s["heap"]["live_requested_bytes"] >= 20 * MiB


@pytest.mark.parametrize("mode", ["fork", "exec"])
def test_fork_child_figures_are_not_mixed_into_the_parent(hs, mode):
    r = hs(scenario("hs-fork"), "--mode", mode, "--parent-mb", "10", "--child-mb", "100")
    assert r.rc == 0, r.stderr
    s, truth = r.summary, r.truth("fork")
    assert s["pid"] == s["started_pid"]
    assert s["forks"] == 1
    parent = int(truth["parent_live_bytes"])
    # the parent's 10 MiB, not the child's 100 MiB on top
    assert parent <= s["heap"]["live_requested_bytes"] <= parent + 256 * 1024
    assert s["heap"]["peak_live_requested_bytes"] < parent + 1 * MiB
    if mode == "exec":
        assert s["other_processes"] == 1  # the exec'd child found the segment taken
    assert "not counted" in s["preload_note"]


def test_64_threads(hs):
    r = hs(scenario("hs-threads"), "--threads", "64")
    assert r.rc == 0, r.stderr
    kept = int(r.truth("threads")["kept_bytes"])
    # requested bytes are estimated per size class (docs/numbers.md): within 1%
    live = r.summary["heap"]["live_requested_bytes"]
    assert abs(live - kept) <= 0.01 * kept + 64 * 1024
    assert r.summary["heap"]["live_usable_bytes"] >= kept  # usable bytes are exact
    assert r.summary["heap"]["threads_seen"] >= 2


def test_dlopen_plugin(hs):
    r = hs(scenario("hs-dlopen"))
    assert r.rc == 0, r.stderr
    plugin = int(r.truth("dlopen")["plugin_live_bytes"])
    assert plugin <= r.summary["heap"]["live_requested_bytes"] <= plugin + 256 * 1024


def test_two_runs_at_once_and_no_segment_left_behind(tmp_path):
    before = shm_segments()
    procs = []
    for i, mb in enumerate((30, 60)):
        out = tmp_path / f"s{i}.json"
        procs.append((out, mb, subprocess.Popen(
            [sys.executable, "-m", "heapsight", "run", "--no-save", "-q", "--json", str(out), "--",
             scenario("hs-leak"), "--mb", str(mb), "--hold-ms", "500"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    for out, mb, p in procs:
        stdout, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        leaked = int(stdout.split("leaked_bytes=")[1].split()[0])
        live = json.loads(out.read_text())["heap"]["live_requested_bytes"]
        assert abs(live - leaked) <= 0.01 * leaked, (mb, live, leaked)
    # no segment of either run is left (names carry the heapsight process's pid)
    left = {n for n in shm_segments() - before
            if any(n.startswith(f"heapsight-{p.pid}-") for _, _, p in procs)}
    assert left == set()


def test_json_to_stdout_keeps_program_output_on_stderr(tmp_path):
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "--no-save", "--json", "-", "--",
                        scenario("hs-leak"), "--mb", "5"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert p.returncode == 0
    s = json.loads(p.stdout)  # nothing but the JSON on stdout
    assert s["schema_version"] == 1 and s["verdict"].startswith("LEAK: ")
    assert "leak: leaked_bytes=" in p.stderr and "VERDICT" in p.stderr


def test_run_record_is_saved_and_readable(tmp_path):
    from heapsight import record
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "--", scenario("hs-leak"),
                        "--mb", "5"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 0
    files = list(tmp_path.glob("heapsight-hs-leak.*.hsrun.json.gz"))
    assert len(files) == 1
    doc = record.load(str(files[0]))
    assert doc["schema_version"] == 1
    tl = doc["timeline"]
    assert len(tl["t"]) == doc["summary"]["samples"] > 0
    assert max(v for v in tl["rss"] if v is not None) >= 5 * MiB


def test_exit_code_of_the_program_is_passed_on(hs):
    r = hs("sh", "-c", "exit 7")
    assert r.rc == 7 and r.summary["exit_code"] == 7


def test_bad_option_values_are_refused(hs):
    r = hs(scenario("hs-idle"), opts=["--hz", "5000"])
    assert r.rc == 2 and "--hz 5000 is out of range" in r.stderr and r.summary is None


@pytest.mark.parametrize("command", [
    ["perl", "-e", "my %h; $h{$_} = 'x' x 100 for 1..200000; undef %h; print qq(done\\n)"],
    [sys.executable, "-c", "d = {i: 'x' * 600 + str(i) for i in range(150000)}; del d; print('done')"],
])
def test_programs_nobody_here_wrote(hs, command):
    r = hs(*command)
    assert r.rc == 0 and "done" in r.stdout, r.stderr
    s = r.summary
    assert s["preload"] == "active" and s["heap"]["n_alloc"] > 100000
    assert s["release"]["measured"]


SHORT_THREADS = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
static void *w(void *a) { void *volatile p = malloc(100); free(p); return a; }
int main(void) {   /* 1,500 threads, 20 at a time, each allocating */
  for (int round = 0; round < 75; round++) {
    pthread_t t[20];
    for (int i = 0; i < 20; i++) pthread_create(&t[i], NULL, w, NULL);
    for (int i = 0; i < 20; i++) pthread_join(t[i], NULL);
  }
  printf("threads 1501\n");
  return 0;
}
"""


def test_short_lived_threads_are_all_counted(tmp_path):
    # GIVEN 1,500 short-lived threads: /proc, sampled 100 times a second, sees a few dozen
    # at once ("369 thread(s)" for a program that had 1,501)
    src, exe = tmp_path / "threads.c", tmp_path / "threads"
    src.write_text(SHORT_THREADS)
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src), "-lpthread"], check=True)
    js = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "heapsight", "run", "--no-save", "--json", str(js),
                        "--", str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # THEN every thread that allocated is counted (each claimed a counter slot)
    assert json.loads(js.read_text())["heap"]["threads_seen"] == 1501
    assert "1,501 thread(s)" in " ".join(r.stderr.split())
