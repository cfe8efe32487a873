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
