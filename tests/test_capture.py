"""The seam between capturing and analysing (capture.py): a run record keeps what the
analysis read, and a saved run is analysed again by today's code."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import scenario
from heapsight import capture, record
from heapsight.model import Summary

DATA = Path(__file__).resolve().parent / "data" / "captures"

HS = [sys.executable, "-m", "heapsight"]


def saved_run(tmp_path, *argv, opts=()):
    out = tmp_path / "r.hsrun.json.gz"
    r = subprocess.run([*HS, "run", "-q", "-o", str(out), *opts, "--", *argv],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return out


def plain(x):
    return json.loads(json.dumps(x))


@pytest.mark.parametrize("argv, opts", [
    ([scenario("hs-sites")], ()),                      # call sites, snapshots, heap maps, reach
    ([scenario("hs-retention")], ("--at", "0.1")),     # threads, arenas, a release, a hold
    (["sh", "-c", f"{scenario('hs-leak')} --mb 20; true"], ()),   # a child named
])
def test_a_saved_run_is_derived_again_equal_to_its_summary(tmp_path, argv, opts):
    # GIVEN a run saved with its capture
    doc = record.load(str(saved_run(tmp_path, *argv, opts=opts)))
    assert doc["capture"]["version"] == capture.VERSION
    # THEN its summary derived again from the capture, with no process and no symbolizer,
    # is the one saved, field for field
    assert plain(capture.rederive(doc).to_dict()) == plain(doc["summary"])


def test_report_shows_todays_analysis_of_an_old_record(tmp_path):
    # GIVEN a saved run whose summary an older heapsight wrote differently (its verdict)
    path = saved_run(tmp_path, scenario("hs-leak"), "--mb", "5")
    doc = json.loads(gzip.open(path, "rt").read())
    doc["summary"]["verdict"] = "an older analysis said this"
    old = tmp_path / "old.hsrun.json.gz"
    old.write_bytes(gzip.compress(json.dumps(doc).encode()))
    # THEN the page shows today's verdict, and --as-recorded the saved one
    for opts, shown, hidden in (((), "LEAK: ", "an older analysis"),
                                (("--as-recorded",), "an older analysis", "LEAK: ")):
        page = tmp_path / "p.html"
        r = subprocess.run([*HS, "report", *opts, "-o", str(page), str(old)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        html = page.read_text()
        assert shown in html and hidden not in html, opts


def test_a_record_without_a_capture_is_shown_as_saved(tmp_path):
    path = saved_run(tmp_path, "true")
    doc = record.load(str(path))
    del doc["capture"]
    assert capture.rederive(doc) is None


def test_a_saved_run_is_shown_again_in_the_terminal(tmp_path):
    rec, js = tmp_path / "r.hsrun.json.gz", tmp_path / "s.json"
    r = subprocess.run([*HS, "run", "-q", "-o", str(rec), "--json", str(js), "--",
                        scenario("hs-retention"), "--mb", "32"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    shown = subprocess.run([*HS, "report", "--terminal", str(rec)], capture_output=True,
                           text=True, timeout=120, env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"})
    assert shown.returncode == 0, shown.stderr
    # THEN the summary is the run's own: its verdict and the table of its moments
    verdict = json.loads(js.read_text())["verdict"]
    assert "VERDICT  " + verdict.split(":")[0] in shown.stdout
    assert "peak RSS" in shown.stdout and "exit" in shown.stdout
    assert not (tmp_path / "heapsight-report.html").exists()
    # AND a file that is no run record is refused before anything is shown
    bad = subprocess.run([*HS, "report", "--terminal", str(js)], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode != 0 and "error" in bad.stderr and not bad.stdout


def test_a_record_without_a_capture_or_as_recorded_is_shown_in_the_terminal_as_saved(tmp_path):
    # GIVEN a stored record of the first capture version, once without its capture
    stored = DATA / "retention-v1.hsrun.json.gz"
    doc = record.load(str(stored))
    bare = tmp_path / "bare.hsrun.json.gz"
    del doc["capture"]
    bare.write_bytes(gzip.compress(json.dumps(doc).encode()))
    env = {"COLUMNS": "80", "PATH": "/usr/bin:/bin"}
    for argv, said in (([str(bare)], True), (["--as-recorded", str(stored)], False)):
        r = subprocess.run([*HS, "report", "--terminal", *argv], capture_output=True, text=True,
                           timeout=120, env=env)
        # THEN its saved summary is drawn (the saved table: no named moments then), and a
        # record without a capture says so
        assert r.returncode == 0, r.stderr
        assert "VERDICT  RETENTION: 32.3 MiB" in r.stdout and "at peak live" in r.stdout
        assert ("shown as recorded (saved without a capture" in r.stderr) == said, r.stderr
    # AND a saved summary that lacks what the terminal draws is refused in one line
    del doc["summary"]["final"]["live_bytes"]
    bare.write_bytes(gzip.compress(json.dumps(doc).encode()))
    r = subprocess.run([*HS, "report", "--terminal", str(bare)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode != 0 and "Traceback" not in r.stderr and not r.stdout
    assert "its breakdown has no live_bytes" in r.stderr, r.stderr
    # AND without --as-recorded the stored record is analysed again (named moments)
    again = subprocess.run([*HS, "report", "--terminal", str(stored)], capture_output=True,
                           text=True, timeout=120, env=env)
    assert again.returncode == 0 and "peak RSS" in again.stdout and "end" in again.stdout


def test_a_summary_reads_back_from_its_json_form():
    # GIVEN each stored record analysed again by today's code
    for path in sorted(DATA.glob("*.hsrun.json.gz")):
        s = capture.rederive(record.load(str(path)))
        d = json.loads(json.dumps(s.to_dict()))
        # THEN its JSON form reads back to the same Summary, and writes the same JSON
        back = Summary.from_dict(d)
        assert back == s and json.loads(json.dumps(back.to_dict())) == d, path.name
        # AND a saved summary (older fields only) reads too, its absent fields defaulted
        old = Summary.from_dict(record.load(str(path))["summary"])
        assert old.verdict and old.command
