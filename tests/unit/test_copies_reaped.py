"""The copies heapsight's library makes children of heapsight (hs-heapmap) are reaped before
the run ends: a copy that ends while it is being waited for must not be left a zombie for
init to inherit (a bench saw one in the run's process group after heapsight had exited)."""

from __future__ import annotations

from heapsight.live import heapmaps


class _Segment:
    def get(self, name):
        return 0   # no copy of the program's own (a program heapsight started)


def test_a_copy_that_ends_between_two_looks_is_reaped(monkeypatch):
    # the copy is writing its map at the first look, has ended at the second, and is gone
    # once reaped: each look at /proc is one listing
    listings = iter([[(4242, b"R")], [(4242, b"Z")], [(4242, b"Z")], []])
    monkeypatch.setattr(heapmaps, "_copies", lambda: next(listings, []))
    reaped = []
    monkeypatch.setattr(heapmaps.os, "waitpid", lambda pid, flags: reaped.append(pid) or (pid, 0))
    monkeypatch.setattr(heapmaps.time, "sleep", lambda s: None)
    heapmaps.wait_copies(_Segment(), 1.0)
    assert reaped == [4242]


def test_a_copy_still_walking_is_waited_for_and_not_reaped(monkeypatch):
    monkeypatch.setattr(heapmaps, "_copies", lambda: [(4242, b"R"), (4243, b"Z")])
    reaped = []
    monkeypatch.setattr(heapmaps.os, "waitpid", lambda pid, flags: reaped.append(pid) or (pid, 0))
    assert heapmaps.copy_walking(_Segment()) is True
    assert reaped == [4243]


def test_a_copy_that_is_ending_is_not_waited_for_but_reaped_at_the_end(monkeypatch):
    # GIVEN a copy that wrote its map and is ending (a large program's frees its page tables
    # for tens of milliseconds: the kernel's PF_EXITING flag is set), and no other copy
    listings = iter([[(4242, b"E")], [(4242, b"E")], [(4242, b"Z")], []])
    monkeypatch.setattr(heapmaps, "_copies", lambda: next(listings, []))
    reaped = []
    monkeypatch.setattr(heapmaps.os, "waitpid", lambda pid, flags: reaped.append(pid) or (pid, 0))
    monkeypatch.setattr(heapmaps.time, "sleep", lambda s: None)
    # THEN the summary does not wait for it
    assert heapmaps.copy_walking(_Segment()) is False
    # AND heapsight's end waits for it to end, and reaps it
    heapmaps.reap_ending(1.0)
    assert reaped == [4242]


def test_a_copy_still_walking_at_the_end_is_left_to_end_by_itself(monkeypatch):
    monkeypatch.setattr(heapmaps, "_copies", lambda: [(4242, b"R")])
    monkeypatch.setattr(heapmaps.time, "monotonic", iter(range(0, 1000)).__next__)
    heapmaps.reap_ending(5.0)   # (returns at once: nothing ending to wait for)


def test_the_state_of_a_task_that_is_ending_is_told_by_its_flags():
    # /proc/PID/stat past the command: state, ppid, pgrp, session, tty, tpgid, flags
    assert heapmaps._state(b" R 1 1 1 0 -1 4194560 5 0") == b"R"
    assert heapmaps._state(b" R 1 1 1 0 -1 4194564 5 0") == b"E"   # PF_EXITING
    assert heapmaps._state(b" D 1 1 1 0 -1 4194564 5 0") == b"E"
    assert heapmaps._state(b" Z 1 1 1 0 -1 4194564 5 0") == b"Z"
    assert heapmaps._state(b"") == b"?"
