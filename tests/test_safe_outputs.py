"""Outputs never destroy anything, and report reads damaged files with one line, not a
traceback: special files written in place, unique temporary names, 0600 records, nothing
half-written, interrupts that do not lose a finished run, bombs refused."""

from __future__ import annotations

import gzip
import json
import os
import signal
import stat
import subprocess
import sys
import threading

import pytest

from conftest import scenario
from heapsight import output, record
from heapsight.errors import HeapsightError

HS = [sys.executable, "-m", "heapsight"]


def hs(*args, cwd, timeout=120):
    return subprocess.run([*HS, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def leftovers(d) -> list:
    return [p.name for p in d.iterdir() if ".tmp" in p.name or p.name.startswith(".")]


# ------------------------------------------------------------------ writing

def test_json_to_dev_null_leaves_dev_null_a_device(tmp_path):
    p = hs("run", "-q", "--no-save", "--json", "/dev/null", "--", "true", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    p = hs("run", "-q", "-o", str(fifo), "--", "true", cwd=tmp_path)
    reader.join(timeout=30)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got[0])["kind"] == "heapsight-run"


def test_parallel_runs_writing_the_same_file_do_not_collide(tmp_path):
    out = tmp_path / "same.json"
    procs = [subprocess.Popen([*HS, "run", "-q", "--no-save", "--json", str(out), "--",
                               scenario("hs-leak"), "--mb", "1"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)]
    for pr in procs:
        _, err = pr.communicate(timeout=120)
        assert pr.returncode == 0, err
    assert json.loads(out.read_text())["heap"]["allocator"] == "glibc"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("option", ["--json", "-o", "--html"])
def test_a_bad_output_path_is_refused_before_the_program_runs(tmp_path, option):
    marker = tmp_path / "ran"
    for bad, why in ((str(tmp_path), "is a directory"),
                     (str(tmp_path / "no" / "x"), "does not exist")):
        p = hs("run", "-q", option, bad, "--", "touch", str(marker), cwd=tmp_path)
        assert p.returncode == 2 and why in p.stderr and "Traceback" not in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
        assert not marker.exists()


def test_compare_and_lab_check_their_outputs_before_any_run(tmp_path):
    p = hs("compare", "--json", str(tmp_path / "no" / "c.json"), "--", "true", cwd=tmp_path)
    assert p.returncode == 2 and "does not exist" in p.stderr and "[1/" not in p.stderr
    p = hs("lab", "waste", "--quick", "-o", str(tmp_path), cwd=tmp_path)
    assert p.returncode == 2 and "is a directory" in p.stderr and "[1/1]" not in p.stderr


def test_records_are_private(tmp_path):
    rec = tmp_path / "r.hsrun.json.gz"
    p = hs("run", "-q", "-o", str(rec), "--", "true", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(os.stat(rec).st_mode) == 0o600


def test_an_interrupt_while_saving_neither_loses_the_run_nor_leaves_a_temp(tmp_path, monkeypatch):
    # GIVEN a save in progress WHEN SIGINT arrives in the middle of it
    path = tmp_path / "doc.json.gz"
    real = os.fsync

    def slow_fsync(fd):   # Ctrl-C reaches the (single-threaded) CLI's main thread
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        real(fd)
    monkeypatch.setattr(os, "fsync", slow_fsync)
    with pytest.raises(KeyboardInterrupt):
        output.save_doc(str(path), {"kind": "x", "n": list(range(1000))})
    # THEN the file was finished first, and no temporary file is left
    assert json.loads(gzip.open(path).read())["n"][-1] == 999
    assert leftovers(tmp_path) == []


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    def boom(*a):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(HeapsightError, match="No space left"):
        output.write(str(tmp_path / "x.json"), "{}")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ reading

def good_run(tmp_path) -> dict:
    rec = tmp_path / "good.hsrun.json.gz"
    p = hs("run", "-q", "-o", str(rec), "--", scenario("hs-leak"), "--mb", "1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    return json.loads(gzip.open(rec).read())


def damaged_cases(doc: dict):
    def edit(fn):
        d = json.loads(json.dumps(doc))
        fn(d)
        return json.dumps(d)
    yield "huge int", edit(lambda d: d["summary"].update(peak_rss_bytes=10 ** 30)), "peak_rss_bytes"
    yield "string for number", edit(lambda d: d["summary"]["final"].update(rss_bytes="lots")), "final.rss_bytes"
    yield "uneven timeline", edit(lambda d: d["timeline"]["rss"].pop()), "uneven"
    yield "schema as string", edit(lambda d: d.update(schema_version="999")), "schema_version"
    yield "newer schema", edit(lambda d: d.update(schema_version=999)), "newer heapsight"
    yield "NaN", json.dumps(doc).replace('"peak_rss_bytes": ', '"peak_rss_bytes": NaN, "x": ', 1), "NaN"
    yield "list for dict", edit(lambda d: d.update(summary=[1, 2])), "summary"
    yield "wrong kind", edit(lambda d: d.update(kind="other")), "kind"
    yield "not JSON", "{not json", "not valid JSON"


def test_report_names_the_file_and_the_field_of_a_damaged_record(tmp_path):
    doc = good_run(tmp_path)
    for name, text, expect in list(damaged_cases(doc))[1::3]:
        bad = tmp_path / f"bad-{name.replace(' ', '-')}.json"
        bad.write_text(text)
        page = tmp_path / "out.html"
        p = hs("report", str(bad), "-o", str(page), cwd=tmp_path)
        assert p.returncode == 2, (name, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and str(bad) in lines[0] and expect in lines[0], (name, lines)
        assert "Traceback" not in p.stderr and not page.exists()


def test_non_utf8_arguments_are_drawn_in_the_page(tmp_path):
    rec, page = tmp_path / "r.hsrun.json.gz", tmp_path / "p.html"
    p = subprocess.run([os.fsencode(sys.executable), b"-m", b"heapsight", b"run", b"-q",
                        b"-o", os.fsencode(rec), b"--html", os.fsencode(page), b"--",
                        b"/bin/echo", b"caf\xe9\xff"], capture_output=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "caf\\xe9\\xff" in page.read_text(encoding="utf-8")   # valid UTF-8, bytes shown
    p2 = hs("report", str(rec), "-o", str(tmp_path / "again.html"), cwd=tmp_path)
    assert p2.returncode == 0, p2.stderr
