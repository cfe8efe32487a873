"""Verdicts that read the whole run: stretches that held much more than the live bytes are
reported with their time span, size and cause, whatever happens at exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from heapsight import analysis
from heapsight.fmt import human

MiB = 1 << 20
PYTHON = "/usr/bin/python3"   # Debian's CPython 3.11 (pymalloc)
# builds 400k dicts, keeps every 500th, works for 0.8 s, then exits (freeing everything)
HOLDER = ("import time\nl = [{'a': i} for i in range(400000)]\nkeep = l[::500]\ndel l\n"
          "t = time.time()\nwhile time.time() - t < 0.8:\n    sum(range(1000))\n")


def run_python(tmp_path, env=None):
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "--no-save", "--json",
                        str(out), "--", PYTHON, "-c", HOLDER], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120, env={**os.environ, **(env or {})})
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text())


def test_a_python_program_that_holds_pymalloc_arenas_while_it_works(tmp_path):
    s = run_python(tmp_path)
    # exit is tidy (Python frees everything at shutdown); the run was not
    assert s["final"]["rss_bytes"] < 40 * MiB
    (hold,) = s["holds"]
    assert hold["cause"] == "non-heap" and hold["held_bytes"] > 40 * MiB
    assert hold["end_s"] - hold["start_s"] >= 0.6
    # (held: pymalloc's pools were read, and what it kept was free space in them)
    assert s["verdict"].startswith("HELD WHILE RUNNING")
    assert hold["objects_bytes"] > 0 and hold["objects_bytes"] < hold["held_bytes"] / 20
    top = s["findings"][0]
    assert top["kind"] == "hold" and "pymalloc" in top["detail"]
    assert f"held {human(hold['objects_bytes'])} of objects in use" in top["detail"], top
    assert any(x.startswith("PYTHONMALLOC=malloc heapsight run") for x in top["suggestions"])


def test_with_pythonmalloc_malloc_the_hold_is_the_allocators(tmp_path):
    s = run_python(tmp_path, env={"PYTHONMALLOC": "malloc"})
    causes = [h["cause"] for h in s["holds"]]
    assert causes == ["retained"], s["holds"]
    assert s["holds"][0]["retained_bytes"] > 40 * MiB


# four threads build and drop 20 MB of bytearrays in rounds (keeping every 100th), then
# the process idles for 1 s with the thread arenas trimmed: the idle end is the longest
# steady stretch, the rounds are the hold
ROUNDS = ("import threading, time\n"
          "def work():\n"
          "    keep = []\n"
          "    for r in range(6):\n"
          "        blk = [bytearray(1000) for _ in range(20000)]\n"
          "        keep.append(blk[::100])\n"
          "        del blk\n"
          "        time.sleep(0.05)\n"
          "ts = [threading.Thread(target=work) for _ in range(4)]\n"
          "for t in ts: t.start()\n"
          "for t in ts: t.join()\n"
          "time.sleep(1.0)\n")


def test_the_verdicts_moment_is_its_hold_where_the_process_sat_longer_elsewhere(hs):
    r = hs(PYTHON, "-c", ROUNDS, opts=["-q", "--no-save"])
    assert r.rc == 0, r.stderr
    s = r.summary
    assert s["verdict"].startswith("HELD WHILE RUNNING"), s["verdict"]
    hold = max(s["holds"], key=lambda h: h["held_bytes"])
    assert hold["cause"] == "retained" and hold["held_bytes"] > 40 * MiB, hold
    (held,) = [m for m in s["moments"] if m["name"] == "held"]
    # THEN the column the verdict is about is the hold's stretch, and holds what it says
    # (it was the idle end: 14 MiB RSS, 1 MiB retained, beside a 69 MiB hold)
    assert s["moment"] == "held"
    assert abs(held["start_s"] - hold["start_s"]) < 0.002, (held, hold)   # (a hold's: to the ms)
    assert abs(held["end_s"] - hold["end_s"]) < 0.002, (held, hold)
    assert held["breakdown"]["retained_bytes"] >= hold["held_bytes"] / 2, (held, hold)
    assert "largest hold" in held["how"]


def parts_of(held_mib, live_mib=1.0):
    held = np.asarray(held_mib, dtype=float) * MiB
    zero = np.zeros_like(held)
    return {"rss_bytes": held + live_mib * MiB, "retained_bytes": held, "other_anon_bytes": zero,
            "live_bytes": zero + live_mib * MiB}


def test_the_hold_rule():
    t = np.arange(100) / 100.0   # 1 s at 100 Hz
    # 100 MiB held for 0.5 s in the middle, with a one-sample dip: one hold, bridged
    held = [0] * 25 + [100] * 50 + [0] * 25
    held[40] = 0
    (h,) = analysis.holds(t, parts_of(held), 1.0)
    assert (h.start_s, h.end_s, h.cause) == (0.25, 0.74, "retained")
    assert h.held_bytes == 100 * MiB
    # too short (0.1 s < 0.2 s) or too small (under 8 MiB): none
    assert analysis.holds(t, parts_of([0] * 45 + [100] * 10 + [0] * 45), 1.0) == []
    assert analysis.holds(t, parts_of([6] * 100, live_mib=0.1), 1.0) == []
    # small against the peak (a quarter of peak RSS at least): none
    assert analysis.holds(t, parts_of([20] * 100, live_mib=200), 1.0) == []
