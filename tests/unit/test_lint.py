"""The code has no unused import, no undefined name and no dead assignment (pyflakes) in
the package, the tests and the bench scripts."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pyflakes_finds_nothing():
    bench = [str(p) for p in (ROOT / "bench").iterdir()
             if p.is_file() and p.read_text(errors="replace").startswith("#!/usr/bin/env python")]
    p = subprocess.run([sys.executable, "-m", "pyflakes", str(ROOT / "src"), str(ROOT / "tests"),
                        *bench], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
