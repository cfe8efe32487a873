"""A run record of every capture version heapsight has written is analysed again by
today's code, without falling back to the saved summary: one upgrader per past version
(capture.UPGRADES), and records of each version in tests/data/captures (v1: saved by the
heapsight of the commit before named moments, hs-leak --mb 5 and hs-retention --mb 32;
v2 to v10: saved before the next version, v11: today's). `diff` reads both runs as `report`
does. And today's capture has the shape of the newest stored record: a capture that changes
shape without a new version (and an upgrader) fails here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import scenario
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
    # the moments in their order in time: the exit (its split's time rounded to the ms) never
    # before the end it follows (v5's leak record read "end 0.1062 s, exit 0.106 s")
    at = {m.name: m.at_s for m in s.moments}
    assert "end" not in at or at["end"] <= at["exit"], at
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


def shape(v, path: str = "") -> set:
    """The paths of a capture's keys: a value's key path, an array's with its dtype, a list
    of objects by their keys; a null or empty value is its path with "?" (a run may leave
    one empty that another fills: it matches any path under it)."""
    if isinstance(v, dict):
        if set(v) == {"dtype", "shape", "data"}:
            return {f"{path}: array {v['dtype']}"}
        return set().union(*(shape(x, f"{path}.{k}") for k, x in v.items())) if v else {path + "?"}
    if isinstance(v, list):
        if not v:
            return {path + "?"}
        inner = set().union(*(shape(x, path + "[]") for x in v if isinstance(x, (dict, list))))
        return inner or {path}
    return {path + "?"} if v is None else {path}


def unmatched(a: set, b: set) -> list:
    """The paths of a that b has not: neither the same, nor under an empty value of b's, nor
    (for an empty value of a's) the start of one of b's."""
    empty = [q[:-1] for q in b if q.endswith("?")]
    out = []
    for p in a - b:
        if p.endswith("?"):
            if not any(q == p[:-1] or q.startswith(p[:-1] + ".") or q.startswith(p[:-1] + "[")
                       or q.startswith(p[:-1] + ":") for q in b):
                out.append(p)
        elif not any(p == e or p.startswith(e + ".") or p.startswith(e + "[")
                     or p.startswith(e + ":") for e in empty):
            out.append(p)
    return sorted(out)


def test_todays_capture_has_the_shape_of_its_version(tmp_path):
    # GIVEN the stored record of today's version, and a run of the same program now
    rec = tmp_path / "now.hsrun.json.gz"
    r = subprocess.run([*HS, "run", "-q", "-o", str(rec), "--", scenario("hs-leak"), "--mb", "5"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    now = record.load(str(rec))["capture"]
    kept = record.load(str(stored("leak", capture.VERSION)))["capture"]
    # THEN the two have the same keys everywhere: a key added, removed or renamed is a new
    # capture version (capture.VERSION, an upgrader, a stored record of it)
    assert now["version"] == capture.VERSION
    a, b = shape(now), shape(kept)
    added, gone = unmatched(a, b), unmatched(b, a)
    assert (added, gone) == ([], []), (
        f"the capture changed shape at version {capture.VERSION} (added {added}, gone {gone}): "
        "raise capture.VERSION, add its upgrader and store its records (tests/data/captures)")


def test_the_shape_check_sees_a_key_added_or_gone():
    a = shape({"a": {"b": 1, "c": [{"d": 2}, {"e": 3}]}})
    assert a == {".a.b", ".a.c[].d", ".a.c[].e"}
    # a key added, or gone, or renamed, is seen; so is an array's type
    assert unmatched(shape({"a": {"b": 1, "f": 2}}), shape({"a": {"b": 1}})) == [".a.f"]
    assert unmatched(shape({"a": {"b": 1}}), shape({"a": {"b": 1, "f": None}})) == []
    assert unmatched(shape({"a": {"g": None}}), shape({"a": {"b": 1}})) == [".a.g?"]
    assert shape({"x": {"dtype": "<u8", "shape": [2], "data": ""}}) == {".x: array <u8"}
    # a null or an empty value matches whatever another run put there
    full, empty = shape({"k": [{"m": 1}], "n": 2}), shape({"k": None, "n": 2})
    assert unmatched(full, empty) == [] and unmatched(empty, full) == []
    assert unmatched(shape({"k": []}), shape({"k": [1]})) == []


def test_a_capture_reads_no_header_field_it_does_not_keep():
    doc = record.load(str(stored("leak", capture.VERSION)))
    seg = capture.Reading(doc["capture"]["segment"])
    assert set(doc["capture"]["segment"]["header"]) == set(capture.HEADER_FIELDS)
    with pytest.raises(ValueError, match="HEADER_FIELDS"):
        seg.get("heapmap_copy_pid")
