"""The wheel on its own: built from this tree, installed into a fresh virtual environment
with no checkout beside it, `heapsight demo` runs the example it ships and writes the run
and the page."""

import glob
import gzip
import json
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_runs_its_demo_without_a_checkout(tmp_path):
    # GIVEN a wheel built from this tree (in a build directory of its own)
    wheels = tmp_path / "wheels"
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation",
                        "--no-deps", "-w", str(wheels), f"--config-settings=build-dir={tmp_path / 'build'}",
                        str(ROOT)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    wheel, = glob.glob(str(wheels / "heapsight-*.whl"))
    # AND a fresh environment with only the wheel installed (its dependencies are taken
    # from this one's site-packages, where the editable install's finder is not run)
    env_dir = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    purelib = Path(subprocess.run([str(env_dir / "bin" / "python"), "-c",
                                   "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--target", str(purelib), wheel], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    (purelib / "zz-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    python = str(env_dir / "bin" / "python")
    where = subprocess.run([python, "-c", "import heapsight; print(heapsight.__file__)"],
                           capture_output=True, text=True, cwd=work, check=True).stdout
    assert where.startswith(str(purelib)), where
    # WHEN the demo runs there
    p = subprocess.run([python, "-m", "heapsight", "demo", "--mb", "32"], capture_output=True,
                       text=True, cwd=work, timeout=300)
    # THEN it explains the example's retention and writes the run and the page
    assert p.returncode == 0, p.stderr[-3000:]
    assert "RETENTION" in p.stderr
    doc = json.loads(gzip.open(work / "heapsight-demo.hsrun.json.gz", "rt").read())
    assert doc["summary"]["findings"][0]["kind"] == "retention"
    assert doc["summary"]["heap"]["peak_live_usable_bytes"] > 32 << 20
    assert "<html" in (work / "heapsight-demo.html").read_text()[:2000].lower()
