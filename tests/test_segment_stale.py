"""Leftover segments of dead heapsight processes: ours are removed, anyone else's are left
as they are, and neither stops a run (before, another user's file raised PermissionError
out of every `heapsight run`)."""

import hashlib
import os
import subprocess
import sys
import time

import pytest

from heapsight.live import segment as S

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


def closed_to_others() -> str:
    """The first directory above the package (and its interpreter) that another user cannot
    pass through (a checkout under mktemp -d is 0700), or "" when nobody can reach both."""
    for start in (os.path.dirname(S.__file__), os.path.dirname(sys.executable)):
        d = os.path.realpath(start)
        while d != "/":
            if not os.stat(d).st_mode & 0o001:
                return d
            d = os.path.dirname(d)
    return ""


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
    closed = closed_to_others()
    if closed:
        pytest.skip(f"{closed} is closed to other users (mode "
                    f"{os.stat(closed).st_mode & 0o777:o}), so heapsight cannot run as nobody "
                    "from this checkout: clone it where others can read it to run this test")
    roots = leftover("0000deadbeef", NOBODY - 1)
    before = digest(roots)
    try:
        p = subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             sys.executable, "-c", "from heapsight.live import segment as S; S.remove_stale_segments(); "
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


def dead_runs_segment(tmp_path) -> str:
    """The segment of a heapsight process killed with -9 mid-run, with a heap map beside it."""
    code = ("from heapsight.live import segment as S; import sys, time; s = S.Segment(); "
            "open(s.path + '.map.1', 'wb').write(b'x'); print(s.path, flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    path = p.stdout.readline().strip()
    p.kill()
    p.wait()
    assert os.path.exists(path) and os.path.exists(path + ".map.1")
    return path


def test_a_live_runs_segment_survives_a_heapsight_in_another_pid_namespace(tmp_path):
    # GIVEN a live run's segment with a heap map beside it (this process made it: the pid in
    # its name is invisible from a new PID namespace), and a killed run's leftover
    live = S.Segment()
    open(live.path + ".map.1", "wb").write(b"map")
    dead = dead_runs_segment(tmp_path)
    try:
        # WHEN heapsight runs a program inside `unshare -p -f --mount-proc`
        p = subprocess.run(["unshare", "-p", "-f", "--mount-proc", sys.executable, "-m", "heapsight",
                            "run", "-q", "--no-heap-map", "--json", str(tmp_path / "s.json"), "--", "true"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert p.returncode == 0, p.stderr
        # THEN the live run keeps its segment and map; the dead one's are gone
        assert os.path.exists(live.path) and os.path.exists(live.path + ".map.1")
        assert not os.path.exists(dead) and not os.path.exists(dead + ".map.1")
    finally:
        for f in (live.path + ".map.1", dead, dead + ".map.1"):
            if os.path.exists(f):
                os.unlink(f)
        live.close()


def test_a_killed_processs_own_segment_is_removed_and_a_live_ones_kept():
    # GIVEN two processes started with `heapsight env`'s line (each makes its own segment,
    # heapsight-PID-auto.seg), one of them killed with SIGKILL (no exit handler ran: its
    # segment stayed forever, 13 MiB each)
    from heapsight.live import segment as S
    from heapsight.native import LIB
    env = dict(os.environ, LD_PRELOAD=LIB, HEAPSIGHT_SEGMENT="auto")
    procs = [subprocess.Popen(["sleep", "30"], env=env) for _ in range(2)]
    paths = [os.path.join(S._shm_dir(), f"heapsight-{p.pid}-auto.seg") for p in procs]
    def mapped(p, path):   # made and mapped: the library's start-up is over (it may map
        try:               # the file again meanwhile, and the test takes away its grace)
            with open(f"/proc/{p.pid}/maps") as f:
                return path in f.read()
        except OSError:
            return False
    try:
        deadline = time.monotonic() + 20
        while not all(mapped(p, x) for p, x in zip(procs, paths)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(mapped(p, x) for p, x in zip(procs, paths))
        procs[0].kill()
        procs[0].wait()
        for x in paths:   # older than the grace a starting process is given
            os.utime(x, (time.time() - 60, time.time() - 60))
        # WHEN heapsight next cleans up (every new segment does)
        S.remove_stale_segments()
        # THEN the dead one's is gone, the live one's stays
        assert not os.path.exists(paths[0])
        assert os.path.exists(paths[1])
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for x in paths:
            if os.path.exists(x):
                os.unlink(x)
