"""attach --watch without gdb: it ends with a summary of what it saw, and its record and
page say whether the process still runs (no exit code of a process heapsight did not
start), with the process's CPU over the watch."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time

HS = [sys.executable, "-m", "heapsight"]


def watch(pid: int, seconds: float, tmp_path):
    rec, page = tmp_path / "w.hsrun.json.gz", tmp_path / "w.html"
    r = subprocess.run([*HS, "attach", str(pid), "--watch", str(seconds), "--no-gdb",
                        "--interval", "0.2", "-o", str(rec), "--html", str(page)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with gzip.open(rec, "rt") as f:
        return r.stderr, json.load(f)["summary"], page.read_text()


def test_a_watch_of_a_process_that_runs_on_says_so(tmp_path):
    # GIVEN a process that spins for a while (CPU), then sleeps
    p = subprocess.Popen([sys.executable, "-c",
                          "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass\n"
                          "time.sleep(30)"])
    try:
        time.sleep(0.2)
        # WHEN it is watched for a second
        err, s, page = watch(p.pid, 1.0, tmp_path)
    finally:
        p.kill()
        p.wait()
    # THEN the watch ends with its summary, and the record and the page say it runs on
    text = " ".join(err.split())
    assert "watched 1." in text and "the process still runs" in text and "last verdict:" in text
    assert s["still_running"] is True
    assert "still running when the watch ended" in page and "exit code" not in page
    # AND the CPU is the process's over the watch (it spun through it: a loaded machine gave
    # it 0.48 s of the second once, and 0.18 s beside a full test suite's other worker)
    assert 0.05 <= s["cpu_user_s"] + s["cpu_sys_s"] <= 1.5, s


def test_a_watch_of_a_process_that_ends_says_so(tmp_path):
    p = subprocess.Popen(["sleep", "0.8"])
    time.sleep(0.2)
    err, s, page = watch(p.pid, 10.0, tmp_path)
    p.wait()
    assert "the process ended during the watch" in " ".join(err.split())
    assert s["still_running"] is False
    assert "ended during the watch" in page


def test_a_watch_reads_glibcs_figures_at_its_interval(tmp_path):
    # GIVEN a small glibc process (a copy of it costs about a millisecond's pause)
    p = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        rec = tmp_path / "w.hsrun.json.gz"
        # WHEN it is watched for 1.5 s every 0.3 s
        r = subprocess.run([*HS, "attach", str(p.pid), "--watch", "1.5", "--interval", "0.3",
                            "-o", str(rec)], capture_output=True, text=True, timeout=120)
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 0, r.stderr
    with gzip.open(rec, "rt") as f:
        doc = json.load(f)
    # THEN the allocator's figures were read at (nearly) every sample, each from a copy
    readings = doc["attach"]
    # of 5 (a loaded machine delays a copy: 2 beside a full test suite's other worker)
    assert len(readings) >= 2, len(readings)
    assert all(x["release_measured"] and x["copy_pause_ms"] < 1000 for x in readings)
