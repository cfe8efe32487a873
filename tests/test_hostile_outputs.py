"""Hostile output paths and input files, end to end through `python -m heapsight`: a device
or a FIFO is written in place, a FIFO nobody reads is refused at once, /dev/stdout comes
after the program's output and never replaces it, parallel runs share no temporary file
and never replace each other's records, a bad path is refused before the program runs,
records are private, an unwritable stderr keeps the program's exit code, and `heapsight
report` refuses a FIFO and a gzip bomb at once."""

from __future__ import annotations

import gzip
import json
import os
import socket
import stat
import subprocess
import sys
import threading

import pytest

from unit.test_record_load import DELETE, DOCS, edited, setp

HS = [sys.executable, "-m", "heapsight"]


def hs(*args, cwd, timeout=120):
    return subprocess.run([*HS, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def temporaries(d) -> list:
    return sorted(p.name for p in d.iterdir() if ".tmp" in p.name)


def test_json_to_dev_null_leaves_it_a_device(tmp_path):
    p = hs("run", "-q", "--no-save", "--json", "/dev/null", "--", "true", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert temporaries(tmp_path) == []


def test_record_into_a_fifo_stays_a_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    p = hs("run", "-q", "-o", str(fifo), "--", "true", cwd=tmp_path)
    reader.join(timeout=30)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got[0])["kind"] == "heapsight-run"   # no .gz suffix: plain JSON
    assert temporaries(tmp_path) == []


@pytest.mark.parametrize("option", ["-o", "--json", "--html"])
def test_a_fifo_nobody_reads_is_refused_before_the_program_runs(tmp_path, option):
    fifo, marker = tmp_path / "pipe", tmp_path / "ran"
    os.mkfifo(fifo)
    p = hs("run", "-q", option, str(fifo), "--", "touch", str(marker), cwd=tmp_path, timeout=30)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "is a FIFO with no reader" in lines[0], p.stderr
    assert not marker.exists() and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_report_on_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    p = hs("report", str(fifo), "-o", str(tmp_path / "page.html"), cwd=tmp_path, timeout=30)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"heapsight: error: {fifo}: is a FIFO (named pipe)"), p.stderr


# The program prints a line and exits 3; the JSON goes to /dev/stdout.
TO_STDOUT = ["run", "-q", "--no-save", "--json", "/dev/stdout", "--", "sh", "-c",
             "echo program output; exit 3"]


def test_json_to_dev_stdout_a_file_comes_after_the_programs_output(tmp_path):
    # GIVEN stdout redirected to a file the user made (0644)
    out = tmp_path / "out.txt"
    out.write_text("")
    os.chmod(out, 0o644)
    inode = os.stat(out).st_ino
    with open(out, "wb") as f:
        p = subprocess.run([*HS, *TO_STDOUT], stdout=f, stderr=subprocess.PIPE, text=True,
                           cwd=tmp_path, timeout=120)
    # THEN the program's line is kept, the JSON follows it, the file is the same one
    assert p.returncode == 3, p.stderr
    first, rest = out.read_text().split("\n", 1)
    assert first == "program output" and json.loads(rest)["exit_code"] == 3
    assert os.stat(out).st_ino == inode and stat.S_IMODE(os.stat(out).st_mode) == 0o644


def test_json_to_dev_stdout_a_pipe_is_streamed(tmp_path):
    p = subprocess.run([*HS, *TO_STDOUT], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert p.returncode == 3 and "Traceback" not in p.stderr, p.stderr
    first, rest = p.stdout.split("\n", 1)
    assert first == "program output" and json.loads(rest)["exit_code"] == 3


def test_the_file_stdout_goes_to_is_refused_by_its_name(tmp_path):
    # `heapsight run --json out.txt -- prog > out.txt` would replace the program's output
    out = tmp_path / "out.txt"
    with open(out, "wb") as f:
        p = subprocess.run([*HS, "run", "-q", "--no-save", "--json", str(out), "--", "echo", "x"],
                           stdout=f, stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and "is heapsight's stdout too" in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1


def test_two_runs_with_one_record_name_keep_both(tmp_path):
    # GIVEN two runs given the same -o, the second ending while the first is saved
    rec = tmp_path / "same.hsrun.json.gz"
    procs = [subprocess.Popen([*HS, "run", "-q", "-o", str(rec), "--", "sleep", str(t)],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for t in (0.3, 1.5)]
    errs = [pr.communicate(timeout=120)[1] for pr in procs]
    # THEN neither replaced the other: the later one is beside it, and says where
    assert [pr.returncode for pr in procs] == [0, 0], errs
    other = tmp_path / "same-1.hsrun.json.gz"
    assert "not replaced, not followed; written to" in errs[1] and str(other) in errs[1], errs
    durations = sorted(json.loads(gzip.open(f).read())["summary"]["duration_s"] for f in (rec, other))
    assert durations[0] < 1.0 < durations[1]
    assert temporaries(tmp_path) == []


@pytest.mark.parametrize("stderr", ["full", "closed", "pipe-closed"])
def test_an_unwritable_stderr_keeps_the_programs_exit_code(tmp_path, stderr):
    argv = [*HS, "run", "--no-save", "--", "sh", "-c", "exit 3"]
    if stderr == "full":
        with open("/dev/full", "wb") as full:
            p = subprocess.run(argv, stderr=full, stdout=subprocess.PIPE, cwd=tmp_path, timeout=120)
    elif stderr == "closed":
        p = subprocess.run(argv, stdout=subprocess.PIPE, cwd=tmp_path, timeout=120,
                           preexec_fn=lambda: os.close(2))
    else:
        r, w = os.pipe()
        os.close(r)   # nobody reads heapsight's stderr: writes fail with EPIPE
        p = subprocess.run(argv, stderr=w, stdout=subprocess.PIPE, cwd=tmp_path, timeout=120)
        os.close(w)
    # THEN heapsight exits with the program's code, and never writes its summary to stdout
    assert p.returncode == 3 and p.stdout == b"", p.stdout[-300:]


def test_parallel_runs_with_one_json_file_both_succeed(tmp_path):
    out = tmp_path / "same.json"
    procs = [subprocess.Popen([*HS, "run", "-q", "--no-save", "--json", str(out), "--", "true"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    for pr in procs:
        _, err = pr.communicate(timeout=120)
        assert pr.returncode == 0 and "Traceback" not in err, err
    assert json.loads(out.read_text())["command"] == ["true"]
    assert temporaries(tmp_path) == []


def bad_paths(tmp_path):
    (tmp_path / "afile").write_text("")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    os.symlink(tmp_path / "loop2", tmp_path / "loop1")
    os.symlink(tmp_path / "loop1", tmp_path / "loop2")
    return sock, [(str(tmp_path), "is a directory"),
                  (str(tmp_path / "missing" / "r.json"), "does not exist"),
                  (str(tmp_path / "afile" / "r.json"), "is not a directory"),
                  (str(tmp_path / "sock"), "is a socket"),
                  (str(tmp_path / "loop1"), "symbolic links"),
                  (str(tmp_path / ("r" * 300)), "too long"),
                  ("/proc/r.json", "cannot write in /proc")]


@pytest.mark.parametrize("option,named", [("--json", "--json"), ("-o", "--output"),
                                          ("--html", "--html")])
def test_a_bad_output_is_refused_before_the_program_runs(tmp_path, option, named):
    sock, cases = bad_paths(tmp_path)
    marker = tmp_path / "ran"
    with sock:
        for bad, why in cases:
            # WHEN the program would create a marker file THEN it never starts
            p = hs("run", "-q", option, bad, "--", "touch", str(marker), cwd=tmp_path)
            lines = p.stderr.strip().splitlines()
            assert p.returncode == 2 and len(lines) == 1, (bad, p.stderr)
            assert lines[0].startswith(f"heapsight: error: {named} {bad}") and why in lines[0], lines
            assert not marker.exists(), bad
    assert temporaries(tmp_path) == []


def test_a_record_is_private_and_a_long_name_fits(tmp_path):
    rec = tmp_path / ("r" * 240 + ".hsrun.json.gz")     # 255 bytes, the most a name may be
    p = hs("run", "-q", "-o", str(rec), "--", "true", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(os.stat(rec).st_mode) == 0o600
    assert temporaries(tmp_path) == []


def test_undecodable_arguments_go_through_json_and_the_page(tmp_path):
    rec, js, page = tmp_path / "r.hsrun.json.gz", tmp_path / "s.json", tmp_path / "p.html"
    p = subprocess.run([os.fsencode(sys.executable), b"-m", b"heapsight", b"run", b"-q",
                        b"-o", os.fsencode(rec), b"--json", os.fsencode(js), b"--", b"/bin/echo",
                        b"caf\xe9\xff"], capture_output=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    assert js.read_bytes().isascii()
    assert json.loads(js.read_text())["command"][1] == os.fsdecode(b"caf\xe9\xff")
    p = hs("report", str(rec), "-o", str(page), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "caf\\xe9\\xff" in page.read_bytes().decode("utf-8")


def test_a_gzip_bomb_is_refused_in_little_memory(tmp_path):
    # GIVEN 2 MB of gzip that inflates to 2 GiB of spaces (32 members of 64 MiB: quick to
    # make; tests/unit/test_record_load.py has a single-member one)
    bomb, page = tmp_path / "bomb.json.gz", tmp_path / "out.html"
    member = gzip.compress(b" " * (64 << 20), compresslevel=9)
    bomb.write_bytes(member * 32)
    assert bomb.stat().st_size < 3 << 20
    # WHEN report reads it (wait4: the memory of this one process)
    p = subprocess.Popen([*HS, "report", str(bomb), "-o", str(page)], cwd=tmp_path,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    # THEN one line, exit code 2, no page, and far less memory than the limit of 512 MiB
    lines = err.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"heapsight: error: {bomb}: inflates to more than 512 MiB"), lines
    assert not page.exists()
    assert usage.ru_maxrss < 300 * 1024, f"peak RSS {usage.ru_maxrss} KiB"


# One damage of each sort, through `python -m heapsight report` itself (every field's case
# is in tests/unit/test_record_load.py, through the CLI in-process).
DAMAGED = [("run", "summary.peak_rss_bytes", 10 ** 30, "summary.peak_rss_bytes"),
           ("run", "summary.final.rss_bytes", "lots", "summary.final.rss_bytes"),
           ("run", "timeline.anon", [1.0], "timeline: columns of uneven length"),
           ("run", "schema_version", "999", "schema_version"),
           ("run", "schema_version", 999, "schema_version: 999 was written by a newer heapsight"),
           ("run", "summary.peak.at_s", DELETE, "summary.peak.at_s: missing"),
           ("compare", "configs.0.stats.peak_rss.median", "1 MB", "configs[0].stats.peak_rss.median"),
           ("lab", "experiments.0.claims", {"a": 1}, "experiments[0].claims")]


@pytest.mark.parametrize("kind,field,value,expect", DAMAGED)
def test_report_refuses_a_damaged_file_in_one_line(tmp_path, kind, field, value, expect):
    bad, page = tmp_path / "bad.json.gz", tmp_path / "out.html"
    bad.write_bytes(gzip.compress(edited(DOCS[kind](), lambda d: setp(d, field, value)).encode()))
    p = hs("report", str(bad), "-o", str(page), cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"heapsight: error: {bad}: {expect}"), p.stderr
    assert not page.exists()


def test_report_refuses_nan_in_one_line(tmp_path):
    bad, page = tmp_path / "bad.json", tmp_path / "out.html"
    bad.write_text(json.dumps(DOCS["run"]()).replace('"peak_rss_bytes": 3145728',
                                                     '"peak_rss_bytes": NaN', 1))
    p = hs("report", str(bad), "-o", str(page), cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"heapsight: error: {bad}: summary.peak_rss_bytes: NaN"), p.stderr
    assert not page.exists()
