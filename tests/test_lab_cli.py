"""`heapsight lab` as a command: choosing experiments and configurations, errors, saving."""

import gzip
import json
import subprocess
import sys

from heapsight import lab


def hs_lab(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "heapsight", "lab", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def test_list_names_every_experiment_and_its_write_up():
    p = hs_lab("--list")
    assert p.returncode == 0, p.stderr
    for name in lab.NAMES:
        mod = lab.experiment(name)
        assert name in p.stdout and mod.SOURCE in p.stdout


def test_unknown_experiment_is_an_error_naming_the_known_ones(tmp_path):
    p = hs_lab("relase", cwd=tmp_path)
    assert p.returncode == 2
    assert "unknown experiment 'relase'" in p.stderr and "release" in p.stderr
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_unknown_configuration_is_an_error_before_any_work(tmp_path):
    p = hs_lab("waste", "--configs", "glibc,jemaloc", cwd=tmp_path, timeout=30)
    assert p.returncode == 2
    assert "unknown configuration 'jemaloc'" in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_saved_results_carry_tables_claims_and_charts(tmp_path):
    # GIVEN the smallest experiment run, saved
    out = tmp_path / "lab.json.gz"
    p = hs_lab("waste", "--quick", "--configs", "glibc", "-o", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    # THEN the saved document has what `heapsight report` reads back
    doc = json.loads(gzip.open(out, "rt").read())
    assert doc["kind"] == "heapsight-lab" and doc["quick"] is True
    (exp,) = doc["experiments"]
    assert exp["name"] == "waste" and exp["tables"] and exp["claims"] and exp["charts"]
    for claim in exp["claims"]:
        assert claim["verdict"] in ("holds", "fails", "depends")
        assert claim["evidence"] and claim["source"] == exp["source"]
    # and the terminal shows the same claims
    assert p.stderr.count("[HOLDS") + p.stderr.count("[FAILS") + p.stderr.count("[DEPENDS") \
        == len(exp["claims"])


def test_quick_lab_runs_all_five_within_five_minutes_and_draws_them(tmp_path):
    # GIVEN the whole quick lab, saved and drawn as a page
    out, page = tmp_path / "lab.json.gz", tmp_path / "lab.html"
    p = hs_lab("--quick", "-o", str(out), "--html", str(page), cwd=tmp_path, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(gzip.open(out, "rt").read())
    # THEN every experiment ran, within the five minutes the quick lab promises,
    assert [e["name"] for e in doc["experiments"]] == list(lab.NAMES)
    assert sum(e["duration_s"] for e in doc["experiments"]) < 300
    # each with claims and charts, and the page holds every chart
    html = page.read_text()
    for e in doc["experiments"]:
        assert e["claims"] and e["charts"], e["name"]
        for chart in e["charts"]:
            assert chart["id"] in html
    # and the progress said what was running
    assert "[5/5] perl" in p.stderr
