"""A run that is over is never written again: a process that inherited HEAPSIGHT_SEGMENT
and starts after the program it was meant for has exited (a daemon it spawned, started
later) leaves the segment as the run left it, even while heapsight itself still lives."""

import hashlib
import os
import subprocess

from conftest import scenario
from heapsight import layout as L
from heapsight.live import segment as S
from heapsight.native import LIB


def test_a_finished_runs_segment_is_left_alone():
    seg = S.Segment()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(LD_PRELOAD=LIB, HEAPSIGHT_SEGMENT=seg.path)
    try:
        # GIVEN the run's program, ended through its exit handlers
        p = subprocess.run([scenario("hs-leak"), "--mb", "2"], env=env, capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        assert seg.get("state") == L.STATE_DONE
        owner = seg.get("owner_pid")
        before = hashlib.sha256(open(seg.path, "rb").read()).hexdigest()
        # WHEN another process starts with the same variable (this process, its creator,
        # is still alive)
        p = subprocess.run([scenario("hs-leak"), "--mb", "3"], env=env, capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        # THEN not a byte changed: not even its count of other processes
        assert hashlib.sha256(open(seg.path, "rb").read()).hexdigest() == before
        assert seg.get("owner_pid") == owner and seg.get("foreign_attaches") == 0
    finally:
        seg.close()
