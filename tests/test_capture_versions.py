"""A run record of every capture version heapsight has written is analysed again by
today's code, without falling back to the saved summary: one upgrader per past version
(capture.UPGRADES), and records of each version in tests/data/captures (v1: saved by the
heapsight of the commit before named moments, hs-leak --mb 5 and hs-retention --mb 32;
v2: today's). `diff` reads both runs as `report` does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from heapsight import capture, record

DATA = Path(__file__).resolve().parent / "data" / "captures"
HS = [sys.executable, "-m", "heapsight"]
VERSIONS = range(1, capture.VERSION + 1)


def stored(name: str, version: int) -> Path:
    return DATA / f"{name}-v{version}.hsrun.json.gz"


def test_every_version_has_a_stored_record_and_an_upgrader():
    for v in VERSIONS:
        for name in ("leak", "retention"):
            doc = record.load(str(stored(name, v)))
            assert doc["capture"]["version"] == v
    assert set(capture.UPGRADES) == set(range(1, capture.VERSION))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name,verdict,moment", (("leak", "LEAK: ", "exit"),
                                                  ("retention", "RETENTION: ", "end")))
def test_a_stored_record_is_analysed_again_by_todays_code(name, verdict, moment, version):
    doc = record.load(str(stored(name, version)))
    s = capture.rederive(doc)
    # THEN today's analysis, not the saved one: named moments, the verdict's moment
    assert s is not None and s.verdict.startswith(verdict), s.verdict
    assert [m.name for m in s.moments][:1] == ["peak"] and s.moments[-1].name == "exit"
    assert s.moment == moment
    assert s.heap is not None and s.heap.n_alloc == doc["summary"]["heap"]["n_alloc"]


def test_a_capture_of_a_newer_version_is_refused_with_why():
    doc = record.load(str(stored("leak", capture.VERSION)))
    doc["capture"]["version"] = capture.VERSION + 1
    with pytest.raises(capture.NewerCapture, match="upgrade heapsight"):
        capture.rederive(doc)


def test_diff_reads_old_and_new_records_as_report_does(tmp_path):
    a, b = stored("leak", 1), stored("leak", capture.VERSION)
    r = subprocess.run([*HS, "diff", "--json", "-", "-q", str(a), str(b)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for side, path in (("a", a), ("b", b)):
        today = capture.rederive(record.load(str(path)))
        assert d[side]["verdict"] == today.verdict
    # the v1 record's figures at the named moments exist on both sides
    names = [f["figure"] for f in d["figures"]]
    assert "end RSS" in names
