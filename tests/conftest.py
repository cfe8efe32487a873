"""Shared helpers: run `python -m heapsight` in a subprocess on a bundled scenario program
and read back the JSON summary it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from heapsight.native import BIN_DIR



@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str
    summary: dict | None

    def truth(self, prefix: str) -> dict:
        """The key=value line a scenario prints about itself."""
        for line in (self.stdout + "\n" + self.stderr).splitlines():
            if line.startswith(prefix + ":"):
                return {k: v for k, v in (kv.split("=", 1) for kv in line.split()[1:])}
        raise AssertionError(f"no '{prefix}:' line in output:\n{self.stdout}\n{self.stderr}")


def scenario(name: str) -> str:
    path = BIN_DIR / name
    assert path.exists(), f"{path} is missing: the build did not install the scenarios"
    return str(path)


@pytest.fixture
def hs(tmp_path):
    """hs(*command, opts=[...]) -> Result, run with cwd=tmp_path and --json to a file."""
    def run(*command, opts=(), env=None, timeout=120):
        summary_path = tmp_path / f"summary-{len(list(tmp_path.iterdir()))}.json"
        argv = [sys.executable, "-m", "heapsight", "run", "--json", str(summary_path), *opts,
                "--", *command]
        p = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=timeout,
                           env={**os.environ, **(env or {})})
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
        return Result(p.returncode, p.stdout, p.stderr, summary)
    return run


def shm_segments() -> set:
    return {p.name for p in Path("/dev/shm").glob("heapsight-*.seg")}
