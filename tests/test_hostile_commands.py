"""run, compare and lab against what users and terminals do to them: interrupts, odd
options, odd arguments. Each case ends in a clear outcome, never a lost run or a
traceback. (Outputs and damaged records: test_hostile_outputs.py and tests/unit/.)"""

from __future__ import annotations

import gzip
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

from conftest import scenario

HS = [sys.executable, "-m", "heapsight"]

# A program that counts the SIGINTs it receives and prints the count half a second after
# the first. It takes them synchronously in a busy loop, so each delivery is counted the
# moment it arrives (a handler that runs later would see two close signals as one).
COUNT_SIGINTS = r"""
import signal, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
print("ready", flush=True)
n, first, t = 0, None, time.time()
while time.time() - t < 10 and not (first and time.time() - first > 0.5):
    if signal.sigtimedwait({signal.SIGINT}, 0):
        n += 1
        first = first or time.time()
print(f"sigints={n}", flush=True)
"""


def read_until(fd: int, marker: bytes, timeout: float = 20.0) -> bytes:
    buf, end = b"", time.time() + timeout
    while marker not in buf and time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
    return buf


def test_ctrl_c_at_a_terminal_reaches_the_program_once(tmp_path):
    # GIVEN heapsight running a program in the foreground of a terminal
    argv = [*HS, "run", "--no-save", "-q", "--", sys.executable, "-c", COUNT_SIGINTS]
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(tmp_path)
        os.execv(argv[0], argv)
    try:
        assert b"ready" in read_until(fd, b"ready")
        # WHEN the user types Ctrl-C (the terminal signals the whole foreground group)
        os.write(fd, b"\x03")
        out = read_until(fd, b"sigints=")
        out += read_until(fd, b"\n", timeout=2)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    # THEN the program saw one SIGINT, not the terminal's and a forwarded copy
    assert b"sigints=1" in out, out
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_signal_sent_to_heapsight_alone_is_forwarded(tmp_path):
    p = subprocess.Popen([*HS, "run", "--no-save", "-q", "--", sys.executable, "-c", COUNT_SIGINTS],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                         start_new_session=True)
    assert p.stdout.readline().strip() == b"ready"
    p.send_signal(signal.SIGINT)   # kill(heapsight's pid): the program did not get it
    out, err = p.communicate(timeout=20)
    assert b"sigints=1" in out, err
    assert p.returncode == 0


def test_hz_below_one_is_refused_before_the_program_runs(tmp_path):
    marker = tmp_path / "ran"
    p = subprocess.run([*HS, "run", "--hz", "0.2", "--", "touch", str(marker)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert p.returncode == 2
    assert "--hz 0.2 is out of range" in p.stderr and "Traceback" not in p.stderr
    assert not marker.exists()


def test_a_slow_sample_rate_does_not_keep_heapsight_after_the_program_ends(tmp_path):
    # At 1 Hz the sampler sleeps a second between samples; the program's exit wakes it.
    out = tmp_path / "s.json"
    p = subprocess.run([*HS, "run", "--hz", "1", "--no-save", "-q", "--json", str(out), "--",
                        scenario("hs-idle"), "--ms", "100"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["duration_s"] < 0.6


def test_non_utf8_arguments_round_trip_through_the_record(tmp_path):
    # GIVEN an argument that is not UTF-8 (any byte string a shell can pass)
    raw = b"caf\xe9-\xff"
    rec = tmp_path / "r.hsrun.json.gz"
    p = subprocess.run([os.fsencode(sys.executable), b"-m", b"heapsight", b"run", b"-q",
                        b"-o", os.fsencode(rec), b"--", b"/bin/echo", raw],
                       capture_output=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    # THEN the saved record gives the same bytes back
    doc = json.loads(gzip.open(rec, "rt", encoding="utf-8").read())
    assert os.fsencode(doc["summary"]["command"][1]) == raw


def test_compare_refuses_a_file_that_is_no_allocator_before_any_run(tmp_path):
    p = subprocess.run([*HS, "compare", "--no-save", "--configs", "glibc", "--config",
                        "z:/etc/passwd", "--", scenario("hs-leak"), "--mb", "1"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 2
    assert "/etc/passwd is not a shared library" in p.stderr
    assert "[1/" not in p.stderr  # nothing ran
    assert list(tmp_path.iterdir()) == []


def interrupt_when(argv: list, cwd, seen: str, after_s: float) -> tuple:
    """Starts heapsight, sends it SIGINT after_s seconds after stderr shows seen:
    (exit code, stderr)."""
    p = subprocess.Popen([*HS, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, cwd=cwd, start_new_session=True)
    lines = []
    for line in p.stderr:
        lines.append(line)
        if seen in line:
            time.sleep(after_s)
            p.send_signal(signal.SIGINT)
            break
    err = "".join(lines) + p.stderr.read()
    return p.wait(timeout=60), err


def test_ctrl_c_stops_compare_keeps_what_finished_and_exits_130(tmp_path):
    # GIVEN a comparison of 2 configurations x 3 runs of a program that takes 1.5 s
    # WHEN Ctrl-C comes during the second run
    out = tmp_path / "cmp.json.gz"
    rc, err = interrupt_when(["compare", "--repeat", "3", "--configs", "glibc,glibc-arena2",
                              "-o", str(out), "--", scenario("hs-idle"), "--ms", "1500"],
                             tmp_path, "[2/6]", 0.5)
    # THEN it stops there, says so, keeps the finished run, and exits 130
    assert rc == 130, err
    assert "[3/6]" not in err and "interrupted" in err
    doc = json.loads(gzip.open(out, "rt").read())
    assert doc["interrupted"] is True
    assert [(r["config"], r["repeat"]) for r in doc["runs"]] == [("glibc", 0)]
    rows = {r["name"]: r for r in doc["configs"]}
    assert rows["glibc"]["ok"] and len(rows["glibc"]["runs"]) == 1
    assert not rows["glibc-arena2"]["ok"] and "interrupted" in rows["glibc-arena2"]["error"]


def test_ctrl_c_stops_lab_keeps_what_finished_and_exits_130(tmp_path):
    out = tmp_path / "lab.json.gz"
    rc, err = interrupt_when(["lab", "waste", "arenas", "--quick", "--configs", "glibc",
                              "-o", str(out)], tmp_path, "[2/2] arenas", 0.3)
    assert rc == 130, err
    assert "Traceback" not in err and "interrupted" in err
    doc = json.loads(gzip.open(out, "rt").read())
    assert doc["interrupted"] is True
    assert [e["name"] for e in doc["experiments"]] == ["waste"]


def test_everything_after_the_program_name_belongs_to_the_program(tmp_path):
    # `heapsight run ls -la` as with time(1): no '--' needed, -la is ls's
    for argv in (["run", "-q", "--no-save", "ls", "-la", str(tmp_path)],
                 ["run", "-q", "--no-save", "--", "ls", "-la", str(tmp_path)]):
        p = subprocess.run([*HS, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert p.returncode == 0, p.stderr
        assert "total" in p.stdout  # ls -l's first line
    p = subprocess.run([*HS, "run"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and "no program given" in p.stderr
    p = subprocess.run([*HS, "-V"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("heapsight ")


def test_an_output_never_overwrites_another_output_or_an_input(tmp_path):
    p = subprocess.run([*HS, "run", "-q", "-o", "a.json", "--json", "a.json", "--", "true"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and "also given to" in p.stderr
    rec = tmp_path / "r.hsrun.json.gz"
    assert subprocess.run([*HS, "run", "-q", "-o", str(rec), "--", "true"], cwd=tmp_path,
                          capture_output=True, timeout=60).returncode == 0
    before = rec.read_bytes()
    p = subprocess.run([*HS, "report", str(rec), "-o", str(rec)], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and "one of the files to read" in p.stderr
    assert rec.read_bytes() == before


def test_compare_and_lab_check_their_outputs_before_any_run(tmp_path):
    p = subprocess.run([*HS, "compare", "--json", str(tmp_path / "no" / "c.json"), "--", "true"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and "does not exist" in p.stderr and "[1/" not in p.stderr
    p = subprocess.run([*HS, "lab", "waste", "--quick", "-o", str(tmp_path)], capture_output=True,
                       text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and "is a directory" in p.stderr and "[1/1]" not in p.stderr


def test_a_program_path_with_an_escape_sequence_never_reaches_the_terminal_raw(tmp_path):
    # GIVEN a leaking program whose file name holds an escape sequence (ESC [31m), without
    # symbols, so that call sites are named by its file
    exe = tmp_path / "le\x1b[31mak"
    exe.write_bytes(open(scenario("hs-leak"), "rb").read())
    exe.chmod(0o755)
    subprocess.run(["strip", str(exe)], check=True)
    # WHEN heapsight explains it
    p = subprocess.run([*HS, "run", "--no-save", "--", str(exe), "--mb", "5"],
                       capture_output=True, timeout=120, cwd=tmp_path)
    err = p.stderr.decode(errors="replace")
    # THEN no ESC byte is written (the header, the sites, the commands to try show it as
    # \x1b), and the commands to try still run in bash ($'...' quoting)
    assert p.returncode == 0, err
    assert b"\x1b" not in p.stderr, err
    assert "le\\x1b[31mak" in err
    assert "$'" + str(tmp_path) + "/le\\x1b[31mak'" in err, err
    # a path that does not exist is not suggested as ./path
    q = subprocess.run([*HS, "run", "--", "/no/such/program"], capture_output=True, text=True)
    assert q.returncode != 0 and "./" not in q.stderr and "check the path" in q.stderr, q.stderr
