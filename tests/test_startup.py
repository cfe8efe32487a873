"""heapsight's own process: numpy's worker threads never take a signal, and a command
that needs no numpy does not load it."""

from __future__ import annotations

import json
import subprocess
import sys

# the threads of a process that imported heapsight, then numpy (as any command does)
THREADS = r"""
import json, os, heapsight
import numpy
out = {}
for t in sorted(os.listdir("/proc/self/task")):
    status = open(f"/proc/self/task/{t}/status").read()
    out[t] = [ln.split()[1] for ln in status.splitlines() if ln.startswith("SigBlk:")][0]
print(json.dumps({"main": str(os.getpid()), "threads": out}))
"""


def threads_after_numpy(env: dict | None = None) -> tuple:
    import os
    r = subprocess.run([sys.executable, "-c", THREADS], capture_output=True, text=True,
                       check=True, timeout=60, env={**os.environ, **(env or {})})
    seen = json.loads(r.stdout)
    return seen, {t: m for t, m in seen["threads"].items() if t != seen["main"]}


def test_numpy_starts_no_blas_thread_beside_the_program():
    # GIVEN heapsight imported first, and numpy after it: one BLAS thread, the main one (a
    # worker per core spun beside the program it measures)
    import os
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    r = subprocess.run([sys.executable, "-c", THREADS + "print(os.environ.get("
                        "'OPENBLAS_NUM_THREADS'))"], capture_output=True, text=True,
                       check=True, timeout=60, env=env)
    seen = json.loads(r.stdout.splitlines()[0])
    assert list(seen["threads"]) == [seen["main"]], seen
    # and the setting is out of the environment the programs it starts inherit
    assert r.stdout.splitlines()[1] == "None"


def test_numpys_threads_start_with_every_signal_blocked():
    # GIVEN heapsight imported first, and numpy after it, asked for BLAS threads
    seen, others = threads_after_numpy({"OPENBLAS_NUM_THREADS": "2"})
    assert others, "numpy started no thread here: nothing to check"
    # THEN the main thread blocks nothing, and every thread numpy started blocks all but
    # the two signals that cannot be blocked (KILL, STOP) and glibc's internal ones
    assert int(seen["threads"][seen["main"]], 16) == 0
    for t, mask in others.items():
        assert int(mask, 16) | (1 << 8) | (1 << 18) | (3 << 31) == (1 << 64) - 1, (t, mask)


def test_version_answers_without_loading_the_commands():
    code = ("import sys\nfrom heapsight import cli\nrc = cli.main(['--version'])\n"
            "print(rc, 'numpy' in sys.modules, 'heapsight.live.measure' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       timeout=60)
    version, answer = r.stdout.splitlines()
    assert version.startswith("heapsight ") and answer == "0 False False", r.stdout


def test_help_and_one_commands_help_load_only_what_they_show():
    # GIVEN `heapsight --help` and `heapsight diff --help`
    code = ("import sys\nfrom heapsight import cli\n"
            "try:\n    cli.main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
            "mods = sorted(m for m in sys.modules if m.startswith('heapsight.commands.'))\n"
            "print('RESULT', rc, 'numpy' in sys.modules, 'rich' in sys.modules, ','.join(mods))")

    def loaded(*argv):
        r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                           timeout=60)
        line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT"))
        return line.split(" ", 4)[1:], r.stdout

    (rc, numpy, rich, mods), out = loaded("--help")
    # THEN the top-level help lists every command, and imports none of them, nor numpy
    assert rc == "0" and numpy == rich == "False" and mods == "", (rc, numpy, rich, mods)
    for name in ("run", "attach", "compare", "lab", "report", "diff", "env"):
        assert f"\n    {name} " in out, name
    # and a command's help imports that command alone
    (rc, numpy, rich, mods), out = loaded("diff", "--help")
    assert rc == "0" and mods == "heapsight.commands.diff", mods
    assert "--fail-if-grew" in out


def test_a_run_nothing_shows_names_nothing_and_keeps_no_capture():
    # GIVEN a run whose summary nothing shows or saves (run -q --no-save with no other
    # output: keep=False), and the same run kept
    import subprocess as sp
    from conftest import scenario
    from heapsight.live import measure
    argv = [scenario("hs-leak"), "--mb", "2"]
    quiet = dict(stdout=sp.DEVNULL, warn=False)
    s0, tl0 = measure.measure(argv, measure.Options(keep=False, **quiet))
    s1, tl1 = measure.measure(argv, measure.Options(**quiet))
    # THEN the first started no symbolizer (80 ms for llvm-symbolizer) and took no capture;
    # its figures are the same run's
    assert s0.sites["symbolizer"] == "none" and tl0.capture is None
    assert s1.sites["symbolizer"] != "none" and tl1.capture is not None
    # (the exact ones: the live requested bytes are estimated from each run's own samples)
    assert (s0.heap.live_usable_bytes, s0.heap.n_alloc, s0.heap.requested_total_bytes) == (
        s1.heap.live_usable_bytes, s1.heap.n_alloc, s1.heap.requested_total_bytes)
