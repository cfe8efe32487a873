"""attach.trim's words when the release cannot be made: the process ended before it
(nothing to release), or the call failed (its reason passed on)."""

import os

import pytest

from heapsight.live import attach, inject
from heapsight.errors import HeapsightError


def test_a_failure_of_the_call_is_passed_on(monkeypatch):
    # GIVEN a running process (this one) whose release call fails (the injector refused)
    def refused(pid, allocator):
        raise HeapsightError("ptrace refused", 3)
    monkeypatch.setattr(inject, "release", refused)
    with pytest.raises(HeapsightError, match="ptrace refused"):
        attach.trim(os.getpid(), "glibc")


def test_a_process_gone_before_the_release_has_nothing_to_release():
    with pytest.raises(HeapsightError, match="has ended before the release: nothing to release"):
        attach.trim(2 ** 22 + 12345, "glibc")
