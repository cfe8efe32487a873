"""The release probe at exit never waits without bound: a program whose signal handler
calls exit() while its main thread is inside malloc (holding the arena lock) ends, and
the segment says whether the exit figures were measured or why not."""

import os
import subprocess

import pytest

from conftest import scenario
from heapsight import layout as L
from heapsight.live import segment as S
from heapsight.native import LIB


def run_attached(*command, timeout=20):
    """The program under the preload library with a segment this process made."""
    seg = S.Segment()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(LD_PRELOAD=LIB, HEAPSIGHT_SEGMENT=seg.path)
    try:
        p = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        return p, seg
    except subprocess.TimeoutExpired:
        seg.close()
        raise


def test_exit_from_a_signal_handler_inside_malloc_never_hangs():
    # GIVEN 20 runs of a program whose SIGALRM handler calls exit() while the main thread
    # churns through malloc and free (about half the time it is inside malloc then)
    statuses = []
    for _ in range(20):
        # WHEN it runs: before, the exit probe's mallinfo2 waited forever for the arena
        # lock the interrupted malloc held (TimeoutExpired here)
        p, seg = run_attached(scenario("hs-exit-signal"), "--after-ms", "20")
        try:
            assert p.returncode == 0, p.stderr
            assert seg.get("state") == L.STATE_DONE
            statuses.append(seg.get("exit_probe_status"))
        finally:
            seg.close()
    # THEN every run ended, measured or saying the allocator's lock was held
    assert set(statuses) <= {L.PROBE_DONE, L.PROBE_ALLOCATOR_LOCKED}, statuses
    assert L.PROBE_ALLOCATOR_LOCKED in statuses, "the locked case never came up: no test"


def test_a_plain_exit_is_measured_on_the_exiting_thread_with_no_thread_of_ours():
    p, seg = run_attached(scenario("hs-leak"), "--mb", "5")
    try:
        assert p.returncode == 0, p.stderr
        assert seg.get("exit_probe_status") == L.PROBE_DONE
        # glibc: no thread of heapsight's in the program; its figures are read from outside
        assert seg.get("library_threads") == 0 and seg.get("glibc_main_arena") != 0
        assert seg.get("exit_release_kind") == seg.get("allocator_id") == 1  # glibc: trimmed
        before, after = seg.alloc_stats("exit_stats_before"), seg.alloc_stats("exit_stats_after")
        # what glibc holds from the OS, read without its locks (in use: would need a walk)
        assert before.mapped_bytes >= 5 << 20 and after.mapped_bytes >= 5 << 20
        assert before.in_use_bytes is None and before.arenas == 1
        assert seg.get("helper_mallocs") == 0
    finally:
        seg.close()


@pytest.mark.parametrize("allocator", [None, "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"])
def test_no_statistics_while_it_runs_yet_the_exit_is_measured(allocator):
    # the library calls no allocator's statistics while the program runs (jemalloc's take
    # its locks: before, a thread of heapsight's read them 10 times a second), and reads
    # them at exit
    seg = S.Segment()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(LD_PRELOAD=":".join(x for x in (LIB, allocator) if x), HEAPSIGHT_SEGMENT=seg.path)
    try:
        p = subprocess.run([scenario("hs-leak"), "--mb", "5"], env=env, capture_output=True,
                           text=True, timeout=20)
        assert p.returncode == 0, p.stderr
        assert seg.get("exit_probe_status") == L.PROBE_DONE
        assert seg.alloc_stats("exit_stats_before").mapped_bytes >= 5 << 20
    finally:
        seg.close()
