"""Leftover segments of dead heapsight processes: ours are removed, anyone else's are left
as they are, and neither stops a run (before, another user's file raised PermissionError
out of every `heapsight run`)."""

import hashlib
import os
import subprocess
import sys

import pytest

from heapsight import segment as S

NOBODY = 65534
DEAD_PID = 4194304 + 1  # above any pid_max: no such process
pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root to make files owned by another user")


def leftover(tag: str, uid: int, pid: int = DEAD_PID) -> str:
    path = os.path.join(S._shm_dir(), f"heapsight-{pid}-{tag}.seg")
    with open(path, "wb") as f:
        f.write(os.urandom(4096))
    os.chown(path, uid, uid)
    return path


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_another_users_leftover_is_left_as_it_is():
    theirs = leftover("0000feedface", NOBODY)
    before = digest(theirs)
    try:
        S.remove_stale_segments()
        assert os.path.exists(theirs) and digest(theirs) == before
        assert os.stat(theirs).st_uid == NOBODY
    finally:
        os.unlink(theirs)


def test_a_leftover_we_cannot_remove_does_not_stop_a_user():
    # GIVEN a third user's leftover of a dead process in the sticky /dev/shm, and heapsight
    # run by nobody, who may not remove it (nor may root's clean-up, in tests running beside
    # this one: the file is not root's)
    roots = leftover("0000deadbeef", NOBODY - 1)
    before = digest(roots)
    try:
        p = subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             sys.executable, "-c", "from heapsight import segment as S; S.remove_stale_segments(); "
             "s = S.Segment(); s.close(); print('ok')"],
            capture_output=True, text=True, cwd="/", timeout=60)
        # THEN its clean-up passes over the file and its own segment is made
        assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
        assert digest(roots) == before
    finally:
        os.unlink(roots)


def test_our_own_leftover_of_a_dead_process_is_removed():
    ours = leftover("0000c0ffee00", os.geteuid())
    S.remove_stale_segments()
    assert not os.path.exists(ours)
