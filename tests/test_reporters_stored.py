"""The reporters tested without a process: each stored run record (tests/data/captures) is
analysed again by today's code and drawn by each reporter, and what they print is compared
with the output stored beside them (tests/data/expected). A change to a reporter, or to
the analysis under it, shows here as a diff of what a user would see.

When a change is meant, write the new expected output and read its diff before committing:
    HEAPSIGHT_UPDATE_EXPECTED=1 .venv/bin/python -m pytest tests/test_reporters_stored.py
    git diff tests/data/expected"""

from __future__ import annotations

import difflib
import gzip
import io
import json
import os
from pathlib import Path

import pytest

from heapsight import capture, record
from heapsight.commands import diff as diff_cmd
from heapsight.diffing import diff
from heapsight.reporters import pprof, terminal

DATA = Path(__file__).resolve().parent / "data"
CAPTURES, EXPECTED = DATA / "captures", DATA / "expected"
RECORDS = ("leak-v1", "leak-v2", "leak-v3", "leak-v4", "leak-v5", "retention-v1",
           "retention-v2", "retention-v3", "retention-v4", "retention-v5")
UPDATE = os.environ.get("HEAPSIGHT_UPDATE_EXPECTED") == "1"


def stored(name: str) -> str:
    return str(CAPTURES / f"{name}.hsrun.json.gz")


def check(name: str, got: str) -> None:
    """got against tests/data/expected/NAME (written instead when updating)."""
    path = EXPECTED / name
    if UPDATE:
        EXPECTED.mkdir(exist_ok=True)
        path.write_text(got)
        return
    assert path.exists(), f"{path} is missing: HEAPSIGHT_UPDATE_EXPECTED=1 writes it"
    want = path.read_text()
    if got != want:
        d = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                         f"expected/{name}", "today", n=2))
        pytest.fail(f"{name} differs from what is stored:\n{d}")


@pytest.fixture
def width_80(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.mark.parametrize("name", RECORDS)
def test_the_terminal_summary_of_a_stored_run(name, width_80):
    summary = capture.rederive(record.load(stored(name)))
    out = io.StringIO()
    terminal.render_run(summary, out, saved_to=f"{name}.hsrun.json.gz")
    check(f"{name}.terminal.txt", out.getvalue())


@pytest.mark.parametrize("name", ("leak-v4", "retention-v4", "leak-v5", "retention-v5"))
def test_the_pprof_profile_of_a_stored_run(name):
    from google.protobuf import text_format
    summary = capture.rederive(record.load(stored(name))).to_dict()
    parts = []
    for at in pprof.moment_names(summary):
        prof = pprof._profile_class().FromString(gzip.decompress(pprof.encode(summary, at)))
        parts.append(f"# --pprof-at {at}\n{text_format.MessageToString(prof)}")
    check(f"{name}.pprof.txt", "\n".join(parts))


def test_the_diff_of_two_stored_runs(monkeypatch, width_80):
    # the diff command's own text, of two records of different capture versions
    monkeypatch.setattr(diff_cmd.shutil, "get_terminal_size", lambda *_: os.terminal_size((80, 24)))
    a, b = (capture.reanalysed(p, record.load(p)) for p in (stored("leak-v1"), stored("leak-v2")))
    d = diff(a["summary"], b["summary"])
    out = io.StringIO()
    diff_cmd.render(d, "leak-v1.hsrun.json.gz", "leak-v2.hsrun.json.gz", out)
    check("leak-v1.leak-v2.diff.txt", out.getvalue())
    check("leak-v1.leak-v2.diff.json", json.dumps(d, indent=1, sort_keys=True) + "\n")


def test_a_changed_reporter_shows_as_a_diff(tmp_path, monkeypatch):
    # GIVEN a stored expectation and output that differs from it in one line
    monkeypatch.setattr(__import__(__name__), "EXPECTED", tmp_path)
    monkeypatch.setattr(__import__(__name__), "UPDATE", False)
    (tmp_path / "x.txt").write_text("a\nb\nc\n")
    check("x.txt", "a\nb\nc\n")
    # THEN the failure shows the line as it was and as it is
    with pytest.raises(pytest.fail.Exception, match=r"(?s)-b\n\+B"):
        check("x.txt", "a\nB\nc\n")
