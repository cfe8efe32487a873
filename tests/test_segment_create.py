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


FREES = r"""
#include <stdlib.h>
#include <string.h>
/* 20 MB of 1000-byte blocks, 99 of 100 freed before it ends: a release would give back */
int main(void) {
  enum { N = 20000 };
  static char *b[N];
  for (int i = 0; i < N; i++) { b[i] = malloc(1000); memset(b[i], 1, 1000); }
  for (int i = 0; i < N; i++) if (i % 100) free(b[i]);
  return 0;
}
"""


def test_a_process_with_its_own_segment_makes_no_release_at_exit(tmp_path):
    # GIVEN a program under `heapsight env` (HEAPSIGHT_SEGMENT=auto) that ends with free
    # memory in its heap: its segment goes as it ends, so no one reads a release's figure
    import shutil
    import subprocess
    from conftest import compile_c
    from heapsight import native
    assert shutil.which("strace"), "strace is installed by scripts/install-deps"
    exe = compile_c(tmp_path, "frees", FREES)

    def madvises(**extra) -> int:
        env = {k: v for k, v in os.environ.items() if k != "HEAPSIGHT_RELEASE_AT_EXIT"}
        env.update(LD_PRELOAD=native.LIB, HEAPSIGHT_SEGMENT="auto", **extra)
        out = tmp_path / "strace.txt"
        p = subprocess.run(["strace", "-f", "-e", "trace=madvise", "-o", str(out), exe],
                           env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return out.read_text().count("MADV_DONTNEED")
    # THEN it makes no release at its exit (malloc_trim gave back 200 pages by madvise,
    # at the program's cost: perl emptying a 1.5M-entry hash spent 0.5-0.8 s in it)
    assert madvises() == 0
    # unless asked to
    assert madvises(HEAPSIGHT_RELEASE_AT_EXIT="1") > 0
