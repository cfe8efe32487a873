"""Where a run's time goes (`heapsight run --verbose`), and the work moved out of the way
of the user: the names of the call sites asked for while the program runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

from conftest import scenario
from heapsight import symbolize
from heapsight.live import measure


def test_the_names_are_asked_for_while_the_program_runs(monkeypatch):
    # GIVEN a program that allocates, then holds its memory for 0.8 s
    sent = []
    real = symbolize.prefetch

    def spy(lookups, tool=None):
        sent.append((time.monotonic(), list(lookups)))
        real(lookups, tool)
    monkeypatch.setattr(symbolize, "prefetch", spy)
    t0 = time.monotonic()
    # WHEN it is measured
    s, _ = measure.measure([scenario("hs-retention"), "--mb", "32", "--threads", "2",
                            "--hold-ms", "800"],
                           measure.Options(stdout=subprocess.DEVNULL, warn=False))
    # THEN addresses went to the symbolizer before the program ended (t0 is before its
    # start: a time under its duration from t0 is inside the run) ...
    during = {k for t, keys in sent if t - t0 < s.duration_s for k in keys}
    assert during, f"nothing sent during the {s.duration_s:.2f} s run ({len(sent)} sends)"
    # ... and among them the frame of the top call site at the peak, as the summary names it
    peak = next(m for m in s.sites["moments"] if m["name"] == "peak")
    frame = s.sites["frames"][peak["sites"][0]["frame"]]
    assert (frame["object"], int(frame["address"], 16)) in during, (frame, len(during))
    assert frame["function"] == "worker", frame


def test_verbose_says_where_the_time_went_and_it_adds_up():
    # GIVEN a run of a program that holds for 0.5 s, timed from outside
    argv = [sys.executable, "-m", "heapsight", "run", "-v", "--no-save", "--",
            scenario("hs-retention"), "--mb", "16", "--hold-ms", "500"]
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    # THEN it prints each phase, from heapsight's start to its terminal summary
    m = re.search(r"where the time went \(([0-9.]+) s in all\):\n((?:\s+[0-9.]+ ms .*\n)+)",
                  r.stderr)
    assert m, r.stderr[-2000:]
    total = float(m.group(1))
    rows = [(float(ms), name.strip()) for ms, name in
            re.findall(r"^\s+([0-9.]+) ms  (.*)$", m.group(2), re.M)]
    names = [n for _, n in rows]
    assert names[0].startswith("start-up") and "the program's run, sampled" in names
    # (and, when the symbolizer was waited for, how long: none is started when every name
    # was kept by an earlier run, symbolize's names cache)
    assert [n for n in names if not n.startswith("of which")][-1] == "the terminal summary", names
    assert {n for n in names if n.startswith("of which")} <= {"of which waiting for the symbolizer"}
    assert names[-1] in ("the terminal summary", "of which waiting for the symbolizer"), names
    # the phases add up to the total, which is the command's own time (less its exit,
    # from the kernel's start time of the process: at most a clock tick early)
    phases_s = sum(ms for ms, n in rows if not n.startswith("of which")) / 1000
    assert abs(phases_s - total) < 0.002 * len(rows), (phases_s, total)
    assert 0.5 * wall <= total <= wall + 0.02, (total, wall)
    # the program's run is the phase that held for 0.5 s
    run_s = dict((n, ms) for ms, n in rows)["the program's run, sampled"] / 1000
    assert 0.5 <= run_s <= wall, (run_s, wall)


START_CHECK = r"""
import json, sys
from heapsight.live import launch, measure
real = launch.start
seen = []
def start(*a, **k):
    seen.append(sorted(m for m in measure.END_MODULES if m in sys.modules))
    return real(*a, **k)
launch.start = start
s, _ = measure.measure(sys.argv[1:], measure.Options(stdout=sys.stderr, warn=False))
print(json.dumps({"at_start": seen, "after": sorted(m for m in measure.END_MODULES
                                                   if m in sys.modules),
                  "peak": s.heap.peak_live_usable_bytes if s.heap else None}))
"""


def test_the_program_starts_before_numpy_and_the_analysis_are_imported():
    # GIVEN a fresh heapsight process (nothing imported yet)
    # WHEN it measures a program that holds 32 MiB
    p = subprocess.run([sys.executable, "-c", START_CHECK, scenario("hs-retention"), "--mb",
                        "32", "--threads", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    # THEN the program started with none of the modules the end needs imported (numpy and
    # the analysis: 100-200 ms, imported while it ran) ...
    assert got["at_start"] == [[]], got
    # ... and the end had them all, and measured the program whole
    assert got["after"] == sorted(measure.END_MODULES), got
    assert got["peak"] >= 32 << 20, got


def test_the_modules_the_program_starts_with_are_light():
    # the command line and everything the program's start goes through import no numpy
    # (a module that did would make every run wait for it again)
    p = subprocess.run([sys.executable, "-c",
                        "import sys, heapsight.cli, heapsight.commands.run, heapsight.live.measure;"
                        "print(sorted(m for m in ('numpy', 'heapsight.analysis', "
                        "'heapsight.summary', 'heapsight.capture', 'heapsight.model') "
                        "if m in sys.modules))"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", p.stdout
