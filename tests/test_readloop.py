"""The sampler's fast tick in C (heapsight.live.readloop): the same figures as the Python reads,
at the rate asked, and it hands back at once on a signal, a snapshot request or the
program's exit."""

import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import scenario
from heapsight import native
from heapsight.live import procfs, readloop
from heapsight.live.segment import Segment


@pytest.fixture
def idle_program():
    """hs-idle holding 8 MiB for 3 s under the library, its segment attached."""
    seg = Segment()
    env = dict(os.environ, LD_PRELOAD=native.LIB, HEAPSIGHT_SEGMENT=seg.path)
    p = subprocess.Popen([scenario("hs-idle"), "--ms", "3000", "--mb", "8"], env=env,
                         stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 5
    while not (seg.attached() and seg.counters().live_usable_bytes >= 8 << 20):
        assert time.monotonic() < deadline, "the program never attached"
        time.sleep(0.01)
    statm = procfs.Statm(p.pid)
    yield p, seg, statm
    statm.close()
    p.kill()
    p.wait()
    seg.close()


def test_ticks_read_what_python_reads_at_the_rate_asked(idle_program):
    # GIVEN a program that holds 8 MiB and sleeps
    p, seg, statm = idle_program
    fast = readloop.FastReader(seg, time.monotonic_ns(), 0.001, set())
    # WHEN the C loop ticks at 1 kHz for 0.2 s
    now = time.monotonic_ns()
    rows, why, nxt = fast.loop(statm.fd, now, now + 200_000_000, 0)
    # THEN it returned at the deadline with ~200 rows (the machine may be slow: at least half)
    assert why == readloop.UNTIL
    assert 100 <= len(rows) <= 201
    col = {c: rows[:, i] for i, c in enumerate(readloop.COLUMNS)}
    # AND the counters are exactly the Python reader's (the program does not allocate now)
    c = seg.counters()
    assert set(col["live_usable"]) == {c.live_usable_bytes}
    assert set(col["live_req"]) == {c.live_requested_bytes}
    assert set(col["n_alloc"]) == {c.n_alloc}
    # AND RSS and anonymous RSS are statm's, less heapsight's private memory (its tables)
    st, private = statm.read(), seg.get("own_private_bytes")
    assert private > 0
    assert abs(col["rss"][-1] - (st["rss"] - private)) <= 64 << 10
    assert abs(col["anon"][-1] - (st["anon"] - private)) <= 64 << 10
    # AND the ticks are 1 ms apart, and the next one is due after the last
    gaps = (col["t"][1:] - col["t"][:-1])
    assert 0.0009 <= float(sorted(gaps)[len(gaps) // 2]) <= 0.002
    assert nxt > now


def test_a_pending_signal_returns_at_once_and_stays_pending(idle_program):
    p, seg, statm = idle_program
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        fast = readloop.FastReader(seg, time.monotonic_ns(), 0.001, {signal.SIGUSR2})
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR2)
        now = time.monotonic_ns()
        t0 = time.monotonic()
        rows, why, _ = fast.loop(statm.fd, now, now + 2_000_000_000, 0)
        assert why == readloop.SIGNAL
        assert time.monotonic() - t0 < 0.5
        # the Python side still takes it, with its siginfo
        info = signal.sigtimedwait({signal.SIGUSR2}, 0)
        assert info is not None and info.si_signo == signal.SIGUSR2
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def test_the_programs_exit_and_snapshot_requests_return(idle_program):
    p, seg, statm = idle_program
    fast = readloop.FastReader(seg, time.monotonic_ns(), 0.001, set())
    # a heapsight_snapshot() request newer than the last one taken returns at once
    asked = int(seg.header["snapshot_seq"])
    seg.header["snapshot_seq"] = asked + 1   # as the program's call would
    now = time.monotonic_ns()
    rows, why, _ = fast.loop(statm.fd, now, now + 2_000_000_000, asked)
    assert why == readloop.ASKED and len(rows) == 1
    seg.header["snapshot_seq"] = asked
    # the program's exit: statm of a zombie reads 0, the loop says it is gone
    p.send_signal(signal.SIGKILL)
    now = time.monotonic_ns()
    t0 = time.monotonic()
    rows, why, _ = fast.loop(statm.fd, now, now + 5_000_000_000, asked)
    assert why == readloop.GONE
    assert time.monotonic() - t0 < 1.0
