"""run's options: a value that cannot work is refused in one line before the program
starts; a value that works but is not what it seems is said; text from the program reaches
the terminal escaped."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

HS = [sys.executable, "-m", "heapsight"]


def hs(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([*HS, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("option,value,says", [
    ("--openmetrics-port", "70000", "out of range"),
    ("--openmetrics-port", "http", "not a port number"),
    ("--every", "0", "above 0"),
    ("--every", "nan", "finite"),
    ("--every", "inf", "finite"),
    ("--at", "nan", "finite"),
    ("--at", "1,1e309", "finite"),
    ("--snapshot-on", "SEGV", "fault"),
    ("--snapshot-on", "BUS", "fault"),
    ("--snapshot-on", "CONT", "continues"),
])
def test_a_value_that_cannot_work_is_refused_in_one_line(option, value, says, tmp_path):
    # GIVEN a value that would fail later, or silently do nothing
    r = subprocess.run([*HS, "run", "--no-save", option, value, "--", "touch", "ran"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    # THEN heapsight refuses it at once: exit 2, the reason, no traceback, the program unrun
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "ran").exists()


def test_port_0_says_which_port_it_took():
    r = hs("run", "-q", "--no-save", "--openmetrics-port", "0", "--", "sleep", "0.2")
    assert r.returncode == 0, r.stderr
    m = re.search(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics", r.stderr)
    assert m and 0 < int(m.group(1)) < 65536, r.stderr


def test_the_exported_split_is_bounded_by_what_the_allocator_holds():
    # GIVEN a python3 script holding 200k small objects (pymalloc's arenas, mapped outside
    # malloc) for a while, its split served to Prometheus
    import urllib.request
    script = ("import time; a = [bytes(100) for _ in range(200000)]; print('built', flush=True); "
              "time.sleep(4)")
    p = subprocess.Popen([*HS, "run", "-q", "--no-save", "--openmetrics-port", "0", "--",
                          "/usr/bin/python3", "-c", script], stderr=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()
        m = re.search(r"serving metrics on (http://127\.0\.0\.1:\d+/metrics)", line)
        assert m, line
        assert p.stdout.readline().strip() == "built"
        time.sleep(1.0)   # (a few ticks after the objects are built, on a loaded machine too)
        text = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
    finally:
        p.wait(timeout=60)
    got = {k: float(v) for k, v in re.findall(r'heapsight_memory_bytes\{[^}]*kind="(\w+)"[^}]*\} (\S+)', text)}
    # THEN the objects' arenas are memory malloc did not give (non-heap), not retained: the
    # gauge read them as retained (31.0 MB) where glibc's own heap held a few MiB in all
    assert got["non_heap"] >= 20 * (1 << 20), got
    assert got["retained"] < 4 * (1 << 20), got


def test_every_faster_than_a_heap_map_says_so_and_maps_less(tmp_path):
    js = tmp_path / "s.json"
    r = hs("run", "--no-save", "--every", "0.005", "--json", str(js), "--", "sleep", "1.2")
    assert r.returncode == 0, r.stderr
    s = json.loads(js.read_text())
    snaps = [x for x in s["snapshots"] if x["label"].startswith("--every")]
    maps = [m for m in s["heapmaps"] if m["moment"].startswith("snapshot:")]
    # THEN it said once why the snapshots between have no map, and mapped at most every
    # 0.1 s (a map for each of the 200-odd snapshots before; fewer on a loaded machine)
    assert r.stderr.count("heap maps are taken at most every 0.1 s") == 1
    assert len(snaps) > 20 and len(maps) <= 1.2 / 0.1 + 2, (len(snaps), len(maps))


# 32 threads each ask for 20 snapshots as fast as they are answered
SNAPSHOTS = r"""
#include <pthread.h>
#include <stdio.h>
extern int heapsight_snapshot(const char *label) __attribute__((weak));
static int yes[32];
static void *ask(void *a) {
  int i = (int)(long)a;
  for (int k = 0; k < 20; k++) yes[i] += heapsight_snapshot ? heapsight_snapshot("many") : 0;
  return a;
}
int main(void) {
  pthread_t t[32];
  for (long i = 0; i < 32; i++) pthread_create(&t[i], 0, ask, (void *)i);
  int n = 0;
  for (int i = 0; i < 32; i++) { pthread_join(t[i], 0); n += yes[i]; }
  printf("%d\n", n);
  return 0;
}
"""


def test_calls_answered_together_are_counted(tmp_path):
    (tmp_path / "snaps.c").write_text(SNAPSHOTS)
    exe = tmp_path / "snaps"
    subprocess.run(["cc", "-O1", "-pthread", "-o", str(exe), str(tmp_path / "snaps.c")], check=True)
    js = tmp_path / "s.json"
    r = hs("run", "--no-save", "--no-heap-map", "--json", str(js), "--", str(exe))
    assert r.returncode == 0, r.stderr
    answered = int(r.stdout.split()[-1])
    labels = [x["label"] for x in json.loads(js.read_text())["snapshots"]]
    # THEN every call that returned 1 is in a snapshot: its own, or one that says it
    # answered it too (640 calls, 22 snapshots, and no word of the others before)
    counted = 0
    for label in labels:
        m = re.fullmatch(r"many(?: \(and (\d+) more calls? answered by this snapshot\))?", label)
        assert m, label
        counted += 1 + int(m.group(1) or 0)
    assert answered > 0 and counted == answered, (answered, counted, len(labels))


def test_escape_sequences_from_the_program_reach_the_terminal_escaped(tmp_path):
    # GIVEN a program name and a snapshot label with an escape sequence in them
    exe = tmp_path / "red\x1b[31mname"
    exe.symlink_to("/bin/sleep")
    # (run from its directory: a long temporary path would have the header cut before the
    # name, to fit 80 columns)
    r = subprocess.run([*HS, "run", "--no-save", "--snapshot-on", "USR1", "--at", "0.05", "--",
                        f"./{exe.name}", "0.2"], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # THEN no escape character reaches heapsight's terminal output: it is shown as \x1b
    assert "\x1b" not in r.stderr
    assert "red\\x1b[31mname" in r.stderr


def test_the_allocator_heaps_row_keeps_its_brackets():
    sleeper = subprocess.Popen(["sleep", "5"])
    try:
        for _ in range(250):   # in its sleep: past the loader (a static-looking process before)
            try:
                if open(f"/proc/{sleeper.pid}/syscall").read().split()[0] in ("230", "35"):
                    break
            except (OSError, IndexError):
                pass
            time.sleep(0.02)
        r = hs("attach", "--no-gdb", str(sleeper.pid))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert r.returncode == 0, r.stderr
    assert "allocator heaps ([heap], arenas)" in r.stderr, r.stderr


# heapsight run as `python -m heapsight`, saying at its exit which of these it imported
IMPORTS_SAID = ("import atexit, runpy, sys\n"
                "atexit.register(lambda: sys.stderr.write('\\nIMPORTED ' + ' '.join(sorted(\n"
                "    m for m in sys.modules if m in ('numpy', 'heapsight.analysis', "
                "'heapsight.summary'))) + '\\n'))\n"
                "sys.argv = ['heapsight'] + sys.argv[1:]\n"
                "runpy.run_module('heapsight', run_name='__main__')\n")


def _imported(stderr: str) -> set:
    return set(stderr.rsplit("IMPORTED", 1)[1].split()) if "IMPORTED" in stderr else {"?"}


def test_a_run_nothing_reads_makes_no_summary_and_passes_the_status_on(tmp_path):
    # GIVEN -q --no-save with no output, gate, --follow or --verify: only the exit status is
    # read (the analysis' imports, numpy's 60-100 ms of them, were most of `run -- true`)
    hs = [sys.executable, "-c", IMPORTS_SAID, "run", "-q", "--no-save"]
    p = subprocess.run([*hs, "--", "sh", "-c", "exit 3"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    # THEN the program's code is heapsight's, and neither numpy nor the analysis was imported
    assert p.returncode == 3, p.stderr[-2000:]
    assert _imported(p.stderr) == set(), p.stderr[-2000:]
    # a program killed by a signal kills heapsight with it, as with a summary
    p = subprocess.run([*HS, "run", "-q", "--no-save", "--", "sh", "-c", "kill -TERM $$"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == -signal.SIGTERM, p.stderr
    # and a gate reads the summary: it is made
    p = subprocess.run([*hs, "--fail-if-rss", "1G", "--", "sh", "-c", "exit 3"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 3, p.stderr[-2000:]
    assert _imported(p.stderr) == {"numpy", "heapsight.analysis", "heapsight.summary"}, p.stderr
