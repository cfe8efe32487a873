"""output.py, the one writer: the up-front check of an output path, and a write that is
whole or not at all, never replaces a device or a FIFO, never shares a temporary file,
makes private files, finishes under Ctrl-C but does not hang on a FIFO nobody reads; and
non-UTF-8 arguments through JSON and the page."""

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

from heapsight import interrupts, output, record, report
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


def test_check_accepts_devices_fifos_links_and_new_files(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "real.json").write_text("{}")
    os.symlink(tmp_path / "real.json", tmp_path / "link.json")
    os.symlink(tmp_path / "new.json", tmp_path / "dangling.json")
    for ok in ("/dev/null", tmp_path / "fifo", tmp_path / "link.json", tmp_path / "dangling.json",
               tmp_path / "new.json", tmp_path / ("r" * 250)):
        output.check(str(ok), "--json")
    assert leftovers(tmp_path) == [] and not (tmp_path / "new.json").exists()


# ------------------------------------------------------------------ write

def test_dev_null_stays_a_device():
    output.write("/dev/null", b"x" * 100)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_fifo_is_written_into_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    output.write_json(str(fifo), {"kind": "x"})
    reader.join(timeout=10)
    assert json.loads(got[0]) == {"kind": "x"} and stat.S_ISFIFO(os.stat(fifo).st_mode)


def ctrl_c_at_a_fifo_nobody_reads(tmp_path) -> tuple:
    """A FIFO with no reader (opening it for writing waits for one) and Ctrl-C to the main
    thread 0.3 s later: (fifo, ended). If Ctrl-C is held back a reader comes after 3 s
    (set ended when done), so a test fails rather than hangs."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    main = threading.main_thread().ident
    ended = threading.Event()

    def interrupt_then_unblock():
        time.sleep(0.3)
        signal.pthread_kill(main, signal.SIGINT)
        if not ended.wait(3):
            with open(fifo, "rb") as f:
                f.read()
    threading.Thread(target=interrupt_then_unblock, daemon=True).start()
    return fifo, ended


def test_ctrl_c_is_not_held_back_by_a_fifo_nobody_reads(tmp_path):
    fifo, ended = ctrl_c_at_a_fifo_nobody_reads(tmp_path)
    started = time.monotonic()
    # WHEN Ctrl-C comes THEN it ends the wait at once
    with pytest.raises(KeyboardInterrupt):
        output.write(str(fifo), b"{}")
    ended.set()
    assert time.monotonic() - started < 2


def test_a_device_that_refuses_the_write_is_one_line():
    with pytest.raises(HeapsightError, match="cannot write /dev/full: No space left") as e:
        output.write("/dev/full", b"{}")
    assert e.value.exit_code == 1 and stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_fifo_nobody_reads_gives_up_at_ctrl_c_even_while_interrupts_wait(tmp_path):
    # GIVEN a caller that defers interrupts while it saves (as run does after the program)
    fifo, ended = ctrl_c_at_a_fifo_nobody_reads(tmp_path)
    started = time.monotonic()
    # WHEN Ctrl-C comes THEN the wait ends with a one-line error, and the interrupt acts
    # once the caller lets it
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred():
            with pytest.raises(HeapsightError, match="interrupted while waiting for the FIFO"):
                output.write(str(fifo), b"{}")
    ended.set()
    assert time.monotonic() - started < 2 and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_symlink_is_followed_and_kept(tmp_path):
    (tmp_path / "real.json").write_text("old")
    os.symlink("real.json", tmp_path / "link.json")
    output.write(str(tmp_path / "link.json"), "new")
    assert os.path.islink(tmp_path / "link.json") and (tmp_path / "real.json").read_text() == "new"


def test_files_are_private_new_or_replaced(tmp_path):
    # records hold the whole command line; a file that is replaced becomes 0600 too
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    old.write_text("{}")
    os.chmod(old, 0o644)
    for p in (new, old):
        output.write(str(p), "{}")
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
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
