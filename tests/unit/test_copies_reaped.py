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


def test_the_exit_copy_written_is_not_waited_for_but_reaped_at_the_end(monkeypatch):
    # GIVEN the exit's copy, its map written, still ending (a large program's takes tens of
    # milliseconds to free its page tables), and no other copy
    listings = iter([[(4242, b"R")], [(4242, b"R")], [(4242, b"Z")], []])
    monkeypatch.setattr(heapmaps, "_copies", lambda: next(listings, []))
    reaped = []
    monkeypatch.setattr(heapmaps.os, "waitpid", lambda pid, flags: reaped.append(pid) or (pid, 0))
    monkeypatch.setattr(heapmaps.time, "sleep", lambda s: None)
    # THEN the summary does not wait for it
    assert heapmaps.copy_walking(_Segment(), written=4242) is False
    # AND heapsight's end waits for it to end, and reaps it
    heapmaps.reap_ending(1.0)
    assert reaped == [4242]
