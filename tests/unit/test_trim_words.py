"""attach.trim's words when the process ends around the release: before it (nothing to
release) and while gdb attaches to make the call (not done in time), never "nothing to
release" for a program that was still running when the release began."""

import os

import pytest

from heapsight.live import attach, gdbcall
from heapsight.errors import HeapsightError


def test_a_process_that_ends_while_gdb_attaches_is_said_to_have_ended_in_time(monkeypatch):
    # GIVEN a running process (this one) that "ends" while gdb attaches
    def gone(pid, exprs, **kw):
        raise HeapsightError(f"process {pid} exited while gdb attached")
    monkeypatch.setattr(gdbcall, "call", gone)
    monkeypatch.setattr(attach, "_running", lambda pid: False)
    with pytest.raises(HeapsightError) as e:
        attach.trim(os.getpid(), "glibc")
    # THEN it says the release could not be done in time, not that there was nothing
    assert "while gdb was attaching" in e.value.message
    assert "could not be done in time" in e.value.message
    assert "nothing to release" not in e.value.message


def test_a_failure_of_a_process_that_still_runs_is_passed_on(monkeypatch):
    def refused(pid, exprs, **kw):
        raise HeapsightError("ptrace refused")
    monkeypatch.setattr(gdbcall, "call", refused)
    with pytest.raises(HeapsightError, match="ptrace refused"):
        attach.trim(os.getpid(), "glibc")   # this process runs: _running says so


def test_a_process_gone_before_the_release_has_nothing_to_release():
    with pytest.raises(HeapsightError, match="has ended before the release: nothing to release"):
        attach.trim(2 ** 22 + 12345, "glibc")
