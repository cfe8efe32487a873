"""docs/ci.md's job, run as written: its gate step (between the `ci-steps` markers) on a
program that loses 5 MiB fails with 90; on one that keeps 50 MiB reachable until exit it
passes, with the record and the page left for the artifact step. The GitLab job carries
the same command."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from conftest import scenario

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "ci.md")


def gate_step() -> str:
    text = open(DOC).read()
    steps = text.split("# ci-steps: begin", 1)[1].split("# ci-steps: end", 1)[0]
    script = steps.split("run: |", 1)[1]
    return "\n".join(line.strip() for line in script.strip().splitlines())


def run_step(tmp_path, program: list) -> subprocess.CompletedProcess:
    script = gate_step().replace("./build/unit_tests", shlex.join(program))
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    return subprocess.run(["sh", "-ec", script], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=180)


def test_the_documented_gate_step_fails_a_leak_and_passes_data_kept_until_exit(tmp_path):
    assert "heapsight run" in gate_step() and "./build/unit_tests" in gate_step()
    leak_dir = tmp_path / "leak"
    leak_dir.mkdir()
    leak = run_step(leak_dir, [scenario("hs-leak"), "--mb", "5"])
    assert leak.returncode == 90, leak.stderr[-2000:]
    assert "gate failed: lost at exit" in leak.stderr
    kept_dir = tmp_path / "kept"
    kept_dir.mkdir()
    kept = run_step(kept_dir, [scenario("hs-reach"), "--kept", "51200", "--lost", "0",
                               "--list", "0"])
    assert kept.returncode == 0, kept.stderr[-2000:]
    # what the artifact step keeps
    assert (kept_dir / "memory.hsrun.json.gz").stat().st_size > 0
    assert "<html" in (kept_dir / "memory.html").read_text()[:2000].lower()


def test_the_gitlab_job_runs_the_same_command():
    text = open(DOC).read()
    gitlab = text.split("GitLab CI", 1)[1]
    command = re.search(r"- (heapsight run .*?)\n  artifacts", gitlab, re.S).group(1)
    assert " ".join(command.split()) == " ".join(gate_step().replace("\\\n", " ").split())
