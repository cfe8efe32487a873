"""`heapsight lab` as a command: choosing experiments and configurations, errors, saving."""

import os
import subprocess
import sys

from heapsight import lab, record


def hs_lab(*args, cwd=None, timeout=300, columns=None):
    env = dict(os.environ, COLUMNS=str(columns)) if columns else None
    return subprocess.run([sys.executable, "-m", "heapsight", "lab", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, env=env)


def wide(text: str, width: int) -> list:
    """Lines wider than width, but a command to copy (which stays whole, on its own line)."""
    return [x for x in text.splitlines()
            if len(x) > width and not x.lstrip().startswith("heapsight ")]


def test_list_names_every_experiment_and_its_write_up():
    p = hs_lab("--list")
    assert p.returncode == 0, p.stderr
    for name in lab.NAMES:
        mod = lab.experiment(name)
        # (wrapped to the terminal: compared with the line breaks taken out)
        assert name in p.stdout and mod.SOURCE in " ".join(p.stdout.split())


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


def test_two_experiments_are_run_saved_and_drawn(tmp_path):
    # GIVEN the two cheapest experiments, quick, glibc only, saved and drawn as a page
    # (tests/test_lab_stored.py draws the charts of all five from stored data)
    # (named in the folder it runs in: a long path has a line of its own beyond 80 columns)
    out, page = tmp_path / "lab.json.gz", tmp_path / "lab.html"
    p = hs_lab("release", "waste", "--quick", "--configs", "glibc", "-o", out.name,
               "--html", page.name, cwd=tmp_path, columns=80)
    assert p.returncode == 0, p.stderr[-3000:]
    # (at 80 columns, every line within them)
    assert wide(p.stderr, 80) == []
    # THEN the progress said what was running, in order,
    assert p.stderr.index("[1/2] release (quick)") < p.stderr.index("[2/2] waste (quick)")
    # the saved document is what `heapsight report` reads back,
    doc = record.load(str(out))
    assert doc["kind"] == "heapsight-lab" and doc["quick"] is True
    assert [e["name"] for e in doc["experiments"]] == ["release", "waste"]
    for exp in doc["experiments"]:
        mod = lab.experiment(exp["name"])
        assert exp["source"] == mod.SOURCE and exp["duration_s"] > 0
        assert exp["tables"] and exp["claims"] and exp["charts"]
        assert [c["name"] for c in exp["data"]["configs"]] == ["glibc"]
        # with claims that its own data gives again
        assert [c.to_dict() for c in mod.claims(exp["data"])] == exp["claims"]
        for claim in exp["claims"]:
            assert claim["verdict"] in ("holds", "fails", "depends")
            assert claim["evidence"] and claim["source"] == exp["source"]
        # and the page holds every chart
        html = page.read_text()
        for chart in exp["charts"]:
            assert f'data-chart="s1-{chart["id"]}"' in html, chart["id"]
    # and the terminal shows the same claims, and their tally
    n = sum(len(e["claims"]) for e in doc["experiments"])
    assert p.stderr.count("[HOLDS") + p.stderr.count("[FAILS") + p.stderr.count("[DEPENDS") == n
    assert "\nclaims: " in p.stderr and f"results saved to {out.name}" in p.stderr
    # and where the tables whole and the claims' evidence are: --verbose, and the page
    assert f"--verbose, or the page ({page.name})" in " ".join(p.stderr.split())


def test_verbose_prints_each_step_within_the_width_and_every_table(tmp_path):
    # GIVEN the cheapest experiment with --verbose, its stderr a file at 60 columns
    p = hs_lab("release", "--quick", "--configs", "glibc,glibc-mmap128k", "--no-save",
               "--verbose", cwd=tmp_path, columns=60)
    assert p.returncode == 0, p.stderr[-3000:]
    # THEN each step ran has its line (no terminal to rewrite one in place), each within the
    # width, as every other line
    # (a long one gives up its middle)
    steps = [x for x in p.stderr.splitlines() if x.startswith("heapsight lab: glibc")
             and x.endswith("up to 200 MiB")]
    assert len(steps) == 6 and wide(p.stderr, 60) == []
    assert any("..." in x for x in steps)
    # and every table is there, the shuffled order and virtual memory ones too
    assert "RSS kept after free, shuffled order" in p.stderr
    assert "virtual memory (VmSize) kept after free" in p.stderr
    # while without --verbose, no step line: the experiment's line says what runs
    p = hs_lab("release", "--quick", "--configs", "glibc", "--no-save", cwd=tmp_path, columns=60)
    assert "order, blocks up to" not in p.stderr and "[1/1] release (quick)" in p.stderr
    assert "virtual memory (VmSize)" not in p.stderr and wide(p.stderr, 60) == []
