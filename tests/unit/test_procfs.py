"""procfs: the figures read from /proc/PID/status and smaps_rollup, parsed from canned
text as the kernel writes it (6.x layout), and the open-once, re-read-at-0 files."""

import os

from heapsight.live import procfs
from heapsight.live.procfs import ROLLUP_KEYS, STATUS_KEYS, ProcFile, Statm, _parse

STATUS = b"""Name:\tserver
Umask:\t0022
State:\tS (sleeping)
Tgid:\t4242
Pid:\t4242
PPid:\t1
VmPeak:\t  912340 kB
VmSize:\t  901224 kB
VmLck:\t       0 kB
VmHWM:\t  524288 kB
VmRSS:\t  262144 kB
RssAnon:\t  200000 kB
RssFile:\t   61000 kB
RssShmem:\t    1144 kB
VmData:\t  700000 kB
VmSwap:\t       0 kB
HugetlbPages:\t       0 kB
Threads:\t17
SigQ:\t0/96365
voluntary_ctxt_switches:\t12
"""

# smaps_rollup opens with the address range, and has Pss_* and SwapPss lines whose names
# begin like the keys wanted: only the exact names count.
ROLLUP = b"""5635801b9000-7ffee8436000 ---p 00000000 00:00 0                          [rollup]
Rss:                1712 kB
Pss:                 325 kB
Pss_Dirty:           112 kB
Pss_Anon:            111 kB
Pss_File:            213 kB
Pss_Shmem:             0 kB
Shared_Clean:       1560 kB
Shared_Dirty:          0 kB
Private_Clean:        40 kB
Private_Dirty:       110 kB
Referenced:         1712 kB
Anonymous:           109 kB
LazyFree:              0 kB
AnonHugePages:         0 kB
Swap:                 64 kB
SwapPss:              32 kB
Locked:                0 kB
"""

# After exit, before the parent waits: no memory lines at all.
ZOMBIE_STATUS = b"""Name:\tserver
State:\tZ (zombie)
Tgid:\t4242
Pid:\t4242
PPid:\t1
Threads:\t1
SigQ:\t0/96365
"""


def test_status_gives_bytes_and_a_thread_count():
    assert _parse(STATUS, STATUS_KEYS) == {
        "vsize": 901224 * 1024, "hwm": 524288 * 1024, "rss": 262144 * 1024,
        "anon": 200000 * 1024, "file": 61000 * 1024, "shmem": 1144 * 1024,
        "threads": 17,                     # a count, not kB
    }


def test_rollup_takes_exact_names_only():
    assert _parse(ROLLUP, ROLLUP_KEYS) == {
        "rss": 1712 * 1024, "pss": 325 * 1024,              # not Pss_Anon, Pss_Dirty...
        "private_dirty": 110 * 1024, "anon": 109 * 1024,
        "swap": 64 * 1024,                                    # not SwapPss
    }


def test_lines_must_start_with_the_key():
    # a key in the middle of a line, or without its colon, is not a figure
    text = b"Name:\tVmRSS: 5 kB\nxVmRSS:\t7 kB\nVmRSS 9 kB\nThreads:\t3\n"
    assert _parse(text, STATUS_KEYS) == {"threads": 3}


def test_zombie_status_has_no_memory_figures():
    out = _parse(ZOMBIE_STATUS, STATUS_KEYS)
    assert out == {"threads": 1}
    assert "rss" not in out and "anon" not in out


def test_nothing_known_parses_to_empty():
    assert _parse(b"", STATUS_KEYS) == {} and _parse(b"garbage\n\x00\xff", ROLLUP_KEYS) == {}


def test_procfile_rereads_the_same_open_file_from_the_start(tmp_path):
    # GIVEN a file kept open by ProcFile; the kernel regenerates /proc files, here we rewrite
    f = tmp_path / "status"
    f.write_bytes(STATUS)
    pf = ProcFile(str(f), STATUS_KEYS)
    try:
        assert pf.read()["rss"] == 262144 * 1024
        f.write_bytes(STATUS.replace(b"262144", b"131072"))   # same inode, new content
        assert pf.read()["rss"] == 131072 * 1024
        f.write_bytes(b"Name:\tx\n")                           # no figure at all: None
        assert pf.read() is None
    finally:
        pf.close()
    assert pf.fd is None and pf.read() is None
    pf.close()   # twice is harmless


def test_procfile_of_a_process_that_is_gone_reads_none():
    pf = procfs.status(2 ** 22 + 1)    # above pid_max's limit: never a process
    assert pf.fd is None and pf.read() is None


def test_this_process_reads_plausible_figures():
    # /proc of the test process itself: no process is started
    pid = os.getpid()
    st, roll, statm = procfs.status(pid), procfs.smaps_rollup(pid), Statm(pid)
    try:
        s, r, m = st.read(), roll.read(), statm.read()
    finally:
        for f in (st, roll, statm):
            f.close()
    # (not hwm <= vsize: the peak RSS may exceed the address space left after a large free)
    assert s["threads"] >= 1 and 0 < s["anon"] <= s["rss"] <= s["hwm"] and s["rss"] <= s["vsize"]
    assert 0 < r["pss"] <= r["rss"]
    assert m["rss"] % Statm.PAGE == 0 and 0 < m["anon"] <= m["rss"]
