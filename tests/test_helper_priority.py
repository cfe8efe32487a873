"""While the program runs, what heapsight prepares for its end runs below the program's
priority (live/priority.py): the program, and heapsight's sampling thread, keep theirs.
Measured first: python3 building 250k dicts waited 7-43 ms on the run queue of a 2-core
machine beside heapsight's helper at the program's own priority (0.01 ms bare)."""

from __future__ import annotations

import json
import os
import sys

from heapsight.live import priority

# the program: a second in, heapsight's threads' nice values (its parent's) and its own
LOOK = r"""
import json, os, time
time.sleep(1.0)
def nice(path):
    return int(open(path, "rb").read().rpartition(b")")[2].split()[16])
parent = os.getppid()
tasks = {int(t): nice(f"/proc/{parent}/task/{t}/stat") for t in os.listdir(f"/proc/{parent}/task")}
print(json.dumps({"parent": parent, "tasks": tasks, "self": nice("/proc/self/stat")}))
"""


def test_heapsights_helper_runs_below_the_program_and_its_sampler_does_not(hs, tmp_path):
    r = hs(sys.executable, "-c", LOOK, opts=["-q", "-o", str(tmp_path / "r.hsrun")])
    assert r.rc == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    tasks = {int(t): n for t, n in seen["tasks"].items()}
    base = tasks.pop(seen["parent"])   # heapsight's main thread: the sampler
    assert seen["self"] == base == os.getpriority(os.PRIO_PROCESS, 0)
    low = max(base, priority.LOW if priority.may_raise(base) else priority.LOW_KEPT)
    # the helper (and the symbolizer's reader and writer it started) at the low value
    assert low in tasks.values(), tasks
    assert set(tasks.values()) <= {base, low}, tasks
