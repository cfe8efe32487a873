"""The priority of heapsight's helper thread (live/priority.py): lowered on the helper,
raised back from another thread once the program ended where this process may, kept at
LOW_KEPT where it may not; a lower() after the end does nothing."""

from __future__ import annotations

import os
import threading

from heapsight.live import priority


def _on_a_thread(fn):
    out = {}

    def run():
        out["tid"] = threading.get_native_id()
        fn()
        out["nice"] = priority.nice_of(out["tid"])
        out["go"].wait(10)
    out["go"] = threading.Event()
    t = threading.Thread(target=run)
    t.start()
    while "nice" not in out and t.is_alive():
        t.join(0.01)
    return t, out


def test_the_helper_runs_low_and_is_raised_back_where_it_may_be():
    helper = priority.Helper()
    t, out = _on_a_thread(helper.lower)
    try:
        back = priority.may_raise(helper.base)
        want = max(helper.base, priority.LOW if back else priority.LOW_KEPT)
        assert out["nice"] == want
        assert priority.nice_of(threading.get_native_id()) == helper.base   # not this one
        helper.restore()
        assert priority.nice_of(out["tid"]) == (helper.base if back else want)
    finally:
        out["go"].set()
        t.join()


def test_a_lower_after_the_end_does_nothing():
    helper = priority.Helper()
    helper.restore()
    t, out = _on_a_thread(helper.lower)
    out["go"].set()
    t.join()
    assert out["nice"] == helper.base


def test_may_raise_reads_the_capability_or_the_limit():
    # root with every capability (as here in CI) may; the answer is the kernel's for any
    # other: a thread's nice value set to 19 and back tells
    done = {}

    def probe():
        tid = threading.get_native_id()
        base = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, 19)
        try:
            os.setpriority(os.PRIO_PROCESS, tid, base)
            done["kernel"] = True
        except PermissionError:
            done["kernel"] = False
        done["ours"] = priority.may_raise(base)
    t = threading.Thread(target=probe)
    t.start()
    t.join()
    assert done["ours"] == done["kernel"]
