"""The segment file the CLI makes is what the library checks for before it writes a byte:
a regular file of ours, mode 0600 exactly, the exact size, the creation magic."""

import os
import stat

import numpy as np

from heapsight import layout as L
from heapsight.live import segment as S


def test_the_segment_is_made_0600_whatever_the_umask():
    old = os.umask(0o277)  # would leave 0400: the library opens it read-write
    try:
        seg = S.Segment()
    finally:
        os.umask(old)
    try:
        st = os.lstat(seg.path)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_size == L.SEGMENT_BYTES
        head = np.frombuffer(open(seg.path, "rb").read(L.HEADER_DTYPE.itemsize), L.HEADER_DTYPE)[0]
        assert (int(head["magic"]), int(head["version"]), int(head["size_bytes"])) == \
            (L.CREATED, L.VERSION, L.SEGMENT_BYTES)
        assert int(head["creator_pid"]) == os.getpid() and int(head["owner_pid"]) == 0
    finally:
        seg.close()
    assert not os.path.exists(seg.path)


def test_a_process_keeps_its_own_segment_across_an_exec():
    # GIVEN HEAPSIGHT_SEGMENT=auto (heapsight env) in a shell that execs the program: the
    # shell, loading the library first, made /dev/shm/heapsight-PID-auto.seg for its pid
    import subprocess
    from heapsight import native
    check = ("import os; print(any(f'heapsight-{os.getpid()}-auto.seg' in l "
             "for l in open('/proc/self/maps')), os.getpid())")
    env = dict(os.environ, LD_PRELOAD=native.LIB, HEAPSIGHT_SEGMENT="auto")
    p = subprocess.run(["sh", "-c", f'exec /usr/bin/python3 -c "{check}"'], env=env,
                       capture_output=True, text=True, timeout=60)
    # THEN the program after the exec counts into that segment (not a private one)
    mapped, pid = p.stdout.split()
    assert p.returncode == 0 and mapped == "True", p.stderr
    # AND it is gone once the program ended
    assert not os.path.exists(f"/dev/shm/heapsight-{pid}-auto.seg")
