"""output.py, the one writer: the up-front check of an output path, and a write that is
whole or not at all, never replaces a device, a FIFO, heapsight's own stdout or a file
another process made meanwhile, never shares a temporary file, makes private files and
keeps a replaced one's mode, finishes under Ctrl-C and refuses a FIFO nobody reads at
once; and non-UTF-8 arguments through JSON and the page."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import socket
import stat
import threading
import time

import pytest

from heapsight import output, record, report
from heapsight.errors import HeapsightError

from .test_record_load import run_doc


def leftovers(d) -> list:
    return sorted(p.name for p in d.iterdir() if ".tmp" in p.name)


def refused(path, *words, option="--json") -> str:
    with pytest.raises(HeapsightError) as e:
        output.check(str(path), option)
    msg = e.value.message
    assert e.value.exit_code == 2 and "\n" not in msg and msg.startswith(f"{option} {path}")
    for w in words:
        assert w in msg, (w, msg)
    return msg


# ------------------------------------------------------------------ check

def test_check_refuses_what_cannot_be_written(tmp_path):
    refused(tmp_path, "is a directory", "give a file name inside it")
    refused(tmp_path / "no" / "r.json", "does not exist", "create it")
    (tmp_path / "afile").write_text("x")
    refused(tmp_path / "afile" / "r.json", "is not a directory")
    refused("/proc/r.json", "cannot write in /proc")      # writable by no one, root included
    refused("/proc/version", "cannot write in /proc")


def test_check_refuses_a_socket(tmp_path):
    sock = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        refused(sock, "is a socket")


def test_check_refuses_a_symlink_loop(tmp_path):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    refused(tmp_path / "a", "symbolic links")


def test_check_refuses_a_name_too_long(tmp_path):
    refused(tmp_path / ("r" * 256), "too long")


def test_stdout_only_where_allowed():
    refused("-", "cannot go to stdout", option="--html")
    output.check("-", "--json", allow_stdout=True)


def test_check_accepts_devices_links_and_new_files(tmp_path):
    (tmp_path / "real.json").write_text("{}")
    os.symlink(tmp_path / "real.json", tmp_path / "link.json")
    os.symlink(tmp_path / "new.json", tmp_path / "dangling.json")
    for ok in ("/dev/null", tmp_path / "link.json", tmp_path / "dangling.json",
               tmp_path / "new.json", tmp_path / ("r" * 250)):
        output.check(str(ok), "--json")


def test_a_fifo_with_no_reader_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    refused(fifo, "is a FIFO with no reader", "start its reader first")
    with pytest.raises(HeapsightError, match="the FIFO has no reader") as e:
        output.write(str(fifo), b"{}")
    assert e.value.exit_code == 1 and time.monotonic() - started < 2
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_own_descriptors_are_written_through_never_replaced(tmp_path):
    # GIVEN heapsight's fd 1 on a file that holds the program's output (> out.txt)
    out = tmp_path / "out.txt"
    out.write_bytes(b"")
    os.chmod(out, 0o644)
    saved = os.dup(1)
    fd = os.open(out, os.O_WRONLY)
    os.dup2(fd, 1)
    os.close(fd)
    try:
        os.write(1, b"program output\n")
        inode = os.stat(out).st_ino
        # WHEN the JSON goes to /dev/stdout THEN it comes after the program's output, in
        # the same file (same inode, same mode)
        output.check("/dev/stdout", "--json")
        output.write_json("/dev/stdout", {"n": 1})
        # and the same file by its own name is refused: it would replace that output
        msg = refused(out, "is heapsight's stdout too", "/dev/stdout")
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    text = out.read_text()
    assert text.startswith("program output\n") and json.loads(text.split("\n", 1)[1]) == {"n": 1}
    assert os.stat(out).st_ino == inode and stat.S_IMODE(os.stat(out).st_mode) == 0o644, msg


def test_a_pipe_named_as_dev_fd_is_streamed(tmp_path):
    r, w = os.pipe()
    try:
        output.check(f"/dev/fd/{w}", "--json")
        output.write_json(f"/dev/fd/{w}", {"n": 2})
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as f:
        assert json.loads(f.read()) == {"n": 2}


def test_a_closed_or_read_only_descriptor_is_refused(tmp_path):
    r, w = os.pipe()
    os.close(w)
    try:
        refused(f"/dev/fd/{r}", "not open for writing")
        refused(f"/proc/self/fd/{w}", "not open for writing")
    finally:
        os.close(r)


def test_a_file_made_meanwhile_by_another_process_is_not_replaced(tmp_path):
    # GIVEN two runs given the same -o: both checked it while it did not exist
    path = tmp_path / "same.hsrun.json.gz"
    output.check(str(path), "--output")
    path.write_text("the other run's record")
    # WHEN this one writes THEN the other's stays, and this one goes beside it
    written = output.write(str(path), "{}", gzip=False)
    assert path.read_text() == "the other run's record"
    assert written == str(tmp_path / "same-1.hsrun.json.gz")
    assert (tmp_path / "same-1.hsrun.json.gz").read_text() == "{}" and leftovers(tmp_path) == []


def test_a_file_that_was_there_when_checked_is_replaced(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    output.check(str(path), "--json")
    assert output.write(str(path), "new") == str(path) and path.read_text() == "new"
    assert output.write(str(path), "newer") == str(path) and path.read_text() == "newer"


# ------------------------------------------------------------------ write

def test_dev_null_stays_a_device():
    output.write("/dev/null", b"x" * 100)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_fifo_is_written_into_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # its reader is there first (a FIFO with none is refused, never waited for)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        output.write_json(str(fifo), {"kind": "x"})
        got = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert json.loads(got) == {"kind": "x"} and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_device_that_refuses_the_write_is_one_line():
    with pytest.raises(HeapsightError, match="cannot write /dev/full: No space left") as e:
        output.write("/dev/full", b"{}")
    assert e.value.exit_code == 1 and stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_symlink_is_followed_and_kept(tmp_path):
    (tmp_path / "real.json").write_text("old")
    os.symlink("real.json", tmp_path / "link.json")
    output.write(str(tmp_path / "link.json"), "new")
    assert os.path.islink(tmp_path / "link.json") and (tmp_path / "real.json").read_text() == "new"


def test_new_files_are_private_and_a_replaced_one_keeps_its_mode(tmp_path):
    # records hold the whole command line: a new file is 0600; a file the user had is
    # theirs, and keeps the mode they gave it
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    old.write_text("{}")
    os.chmod(old, 0o644)
    for p, mode in ((new, 0o600), (old, 0o644)):
        output.write(str(p), "{}")
        assert stat.S_IMODE(os.stat(p).st_mode) == mode
    assert leftovers(tmp_path) == []


def test_a_long_file_name_is_written(tmp_path):
    path = tmp_path / ("r" * 250 + ".json")     # 255 bytes: its temporary must not be longer
    output.write(str(path), "{}")
    assert path.read_text() == "{}" and leftovers(tmp_path) == []


def test_parallel_writers_of_one_path_do_not_collide(tmp_path):
    path = tmp_path / "same.json"
    errors = []

    def writer(i):
        for _ in range(20):
            try:
                output.write_json(str(path), {"writer": i, "pad": "x" * 50000})
            except Exception as e:   # noqa: BLE001 - any failure is the test's finding
                errors.append(e)
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads(path.read_text())["writer"] in range(8) and leftovers(tmp_path) == []


def test_gzip_by_suffix_unless_told(tmp_path):
    output.save_doc(str(tmp_path / "a.json.gz"), {"n": 1})
    output.save_doc(str(tmp_path / "a.json"), {"n": 1})
    output.write(str(tmp_path / "b.gz"), "x", gzip=False)
    assert json.loads(gzip.decompress((tmp_path / "a.json.gz").read_bytes())) == {"n": 1}
    assert (tmp_path / "a.json").read_text() == '{"n":1}' and (tmp_path / "b.gz").read_text() == "x"


def test_nan_and_infinity_are_written_as_null(tmp_path):
    # JSON has no word for them (record.load refuses them): a long run is still saved
    doc = {"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": -float("inf")}}
    output.write_json(str(tmp_path / "a.json"), doc)
    output.save_doc(str(tmp_path / "b.json"), doc)
    for name in ("a.json", "b.json"):
        assert json.loads((tmp_path / name).read_text()) == {"a": None, "b": [1.5, None],
                                                              "c": {"d": None}}


def test_dash_is_stdout(capsysbinary):
    output.write_json("-", {"n": 1})
    assert json.loads(capsysbinary.readouterr().out) == {"n": 1}


def test_an_interrupt_while_writing_waits_for_the_file(tmp_path, monkeypatch):
    # GIVEN SIGINT arriving in the middle of a write
    path = tmp_path / "doc.json.gz"
    real = os.fsync

    def fsync_interrupted(fd):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        real(fd)
    monkeypatch.setattr(os, "fsync", fsync_interrupted)
    with pytest.raises(KeyboardInterrupt):
        output.save_doc(str(path), {"n": list(range(1000))})
    # THEN it took effect after the file was whole, with no temporary left
    assert json.loads(gzip.decompress(path.read_bytes()))["n"][-1] == 999
    assert leftovers(tmp_path) == []


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text("old")

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(HeapsightError, match="No space left") as e:
        output.write(str(path), "new")
    assert e.value.exit_code == 1
    assert path.read_text() == "old" and leftovers(tmp_path) == []


def test_the_old_names_still_write(tmp_path):
    record.write_json(str(tmp_path / "a.json"), {"n": 1})
    record.save_doc(str(tmp_path / "b.json.gz"), {"n": 1})
    assert json.loads((tmp_path / "a.json").read_text()) == {"n": 1}
    assert json.loads(gzip.decompress((tmp_path / "b.json.gz").read_bytes())) == {"n": 1}


# ------------------------------------------------------------------ non-UTF-8 text

def test_undecodable_arguments_round_trip_through_json(tmp_path):
    # a program's arguments can be any bytes: Python holds b"\xff" as "\udcff"
    doc = {"command": [os.fsdecode(b"caf\xe9\xff"), "\ud800"]}
    for name in ("a.json", "a.json.gz"):
        output.save_doc(str(tmp_path / name), doc)
    output.write_json(str(tmp_path / "b.json"), doc)
    assert (tmp_path / "b.json").read_bytes().isascii()
    for name in ("a.json", "b.json"):
        assert json.loads((tmp_path / name).read_text()) == doc
    assert json.loads(gzip.decompress((tmp_path / "a.json.gz").read_bytes())) == doc


def test_text_with_any_surrogate_is_written(tmp_path):
    # CSV and pages are text: escaped bytes go back as the bytes, other surrogates as \\u
    output.write(str(tmp_path / "t.csv"), "a\udcff,b\ud800\n")
    assert (tmp_path / "t.csv").read_bytes() == b"a\xff,b\\ud800\n"


def page_text(tmp_path, doc) -> str:
    path = tmp_path / "r.hsrun.json.gz"
    output.save_doc(str(path), doc)
    page = tmp_path / "p.html"
    report.write_html(str(page), [(str(path), record.load(str(path)))])
    return page.read_bytes().decode("utf-8")    # strict: the page is valid UTF-8


def test_a_run_with_undecodable_arguments_is_saved_loaded_and_drawn(tmp_path):
    doc = run_doc()
    doc["summary"]["command"] = ["/usr/bin/prog", "caf\udce9\udcff"]
    text = page_text(tmp_path, doc)
    assert "caf\\xe9\\xff" in text


def test_any_lone_surrogate_in_a_loaded_file_is_drawn(tmp_path):
    # json.loads turns "\ud800" into a lone surrogate that surrogateescape cannot encode
    doc = run_doc()
    doc["summary"]["command"] = ["/usr/bin/prog\ud800", "x\udc41"]
    text = page_text(tmp_path, doc)
    assert "prog\\ud800" in text and "x\\udc41" in text


def test_the_charts_data_stays_valid_json_with_undecodable_text(tmp_path):
    # the page's charts travel as JSON: "\xff" there would be a JSON syntax error
    doc = run_doc()
    doc["summary"]["snapshots"][0]["label"] = "s\udcff"
    text = page_text(tmp_path, doc)
    data = re.search(r'id="hs-data">(.*?)</script>', text, re.S).group(1)
    labels = [m["label"] for c in json.loads(data)["charts"] for m in c.get("markers", [])]
    assert "snapshot s\\xff" in labels
