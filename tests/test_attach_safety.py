"""attach touches nothing but the process it reads: no file of its own in a directory
another user can write, the same answer for a process with a private /tmp, and a refusal
that names the real reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

HS = [sys.executable, "-m", "heapsight"]


def hs(*args, env=None):
    return subprocess.run([*HS, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def sleeping(pid: int) -> bool:
    """In its sleep (clock_nanosleep, nanosleep): started, past the loader, which maps glibc
    before its malloc can answer (under load malloc_info failed in that window)."""
    try:
        call = open(f"/proc/{pid}/syscall").read().split()[0]
        return "sleep" in open(f"/proc/{pid}/cmdline").read() and call in ("230", "35")
    except (OSError, IndexError):
        return False


def wait_started(p: subprocess.Popen) -> None:
    for _ in range(250):
        if sleeping(p.pid):
            return
        time.sleep(0.02)


@pytest.mark.gdb_calls
def test_attach_writes_no_file_anywhere(tmp_path):
    # GIVEN a process to read, a temporary directory heapsight would use, and another user
    # who plants a symlink to a file of root's in any directory heapsight makes there
    target = subprocess.Popen(["sleep", "30"])
    wait_started(target)
    tmp, victim = tmp_path / "tmp", tmp_path / "root-only"
    tmp.mkdir()
    victim.write_text("secret\n")
    victim.chmod(0o600)
    planted, done = [], threading.Event()

    def attacker():
        while not done.is_set():
            for d in tmp.iterdir():
                link = d / "malloc_info.xml"
                if d.is_dir() and not os.path.lexists(link):
                    try:
                        link.symlink_to(victim)
                        planted.append(str(link))
                    except OSError:
                        pass
            time.sleep(0.001)

    spy = threading.Thread(target=attacker)
    spy.start()
    before = set(os.listdir("/tmp"))
    try:
        r = hs("attach", str(target.pid), env={"TMPDIR": str(tmp)})
    finally:
        done.set()
        spy.join()
    try:
        # THEN malloc_info's answer came through a memfd of the process: no directory was
        # made for the link (a 1733 one was, and a root attach wrote through the link)
        assert r.returncode == 0, r.stderr
        assert "in use" in r.stderr
        assert planted == [] and victim.read_text() == "secret\n"
        assert list(tmp.iterdir()) == []
        assert not [x for x in set(os.listdir("/tmp")) - before if "heapsight" in x]
        # and the process keeps no descriptor of it
        assert not [f for f in os.listdir(f"/proc/{target.pid}/fd")
                    if "memfd" in os.readlink(f"/proc/{target.pid}/fd/{f}")]
    finally:
        target.kill()
        target.wait()


needs_unshare = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                   reason="a private /tmp needs root and unshare")


@pytest.mark.gdb_calls
@needs_unshare
def test_a_process_with_a_private_tmp_is_read_and_trimmed():
    # GIVEN a process in a mount namespace of its own with its own /tmp (systemd PrivateTmp)
    target = subprocess.Popen(["unshare", "-m", "sh", "-c",
                               "mount -t tmpfs none /tmp && exec sleep 30"])
    try:
        for _ in range(100):
            kids = open(f"/proc/{target.pid}/task/{target.pid}/children").read().split()
            pid = int(kids[0]) if kids else target.pid
            if sleeping(pid):
                break
            time.sleep(0.05)
        # THEN its allocator's figures are read (it failed: "a static binary, or another
        # allocator"), and --trim releases and measures
        r = hs("attach", str(pid))
        assert r.returncode == 0, r.stderr
        assert "in use" in r.stderr and "static binary" not in r.stderr
        t = hs("attach", "--trim", str(pid))
        assert t.returncode == 0, t.stderr
        assert "malloc_trim(0) gave back" in t.stderr
    finally:
        target.kill()
        target.wait()


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_a_process_already_traced_is_refused_with_its_tracer_named():
    target = subprocess.Popen(["sleep", "30"])
    wait_started(target)
    tracer = subprocess.Popen(["strace", "-p", str(target.pid), "-o", os.devnull],
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if f"TracerPid:\t{tracer.pid}" in open(f"/proc/{target.pid}/status").read():
                break
            time.sleep(0.02)
        r = hs("attach", str(target.pid))
        assert r.returncode == 3, r.stderr
        assert f"already traced by process {tracer.pid} (strace)" in r.stderr
        assert "another user" not in r.stderr
        # the /proc figures alone need no tracer
        assert hs("attach", "--no-gdb", str(target.pid)).returncode == 0
    finally:
        tracer.kill()
        target.kill()
        tracer.wait()
        target.wait()


@pytest.mark.gdb_calls
def test_attach_says_how_long_it_stopped_the_process():
    target = subprocess.Popen(["sleep", "30"])
    wait_started(target)
    try:
        r = hs("attach", str(target.pid))
        assert r.returncode == 0, r.stderr
        assert "gdb stopped the process for at most" in r.stderr
    finally:
        target.kill()
        target.wait()


def test_a_release_call_leaves_the_programs_sleep_untouched():
    # GIVEN a program asleep in nanosleep (coreutils' sleep: it fails with "cannot read
    # realtime clock" when a call into it leaves its interrupted sleep corrupted, as gdb 13
    # does on a kernel whose extended CPU state it cannot write back)
    # (8 s: attach must reach its release while the program still sleeps)
    sleeper = subprocess.Popen(["sleep", "8"], stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        # WHEN heapsight attaches to give its memory back (a call of malloc_trim, made by
        # heapsight's injector on the sleeping thread: no gdb)
        r = subprocess.run([*HS, "attach", str(sleeper.pid), "--trim"], capture_output=True,
                           text=True, timeout=120)
        err = sleeper.communicate(timeout=30)[1]
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
    # THEN the call was made, and the program sleeps its sleep out untouched
    assert r.returncode == 0, r.stderr
    assert "release: malloc_trim(0) gave back" in r.stderr
    assert sleeper.returncode == 0, err


def test_attach_answers_without_gdb_where_it_cannot_call():
    # glibc's figures come from a copy of the process (no call into it); another
    # allocator's need gdb's calls, and where gdb cannot undo them attach still explains
    # the process from /proc, saying why it has no allocator figures
    from heapsight.live import gdbcall
    glibc = subprocess.Popen(["sleep", "30"])
    je = subprocess.Popen(["sleep", "30"], env={**os.environ,
                                                "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"})
    try:
        time.sleep(0.3)
        r = subprocess.run([*HS, "attach", str(glibc.pid)], capture_output=True, text=True,
                           timeout=120)
        rj = subprocess.run([*HS, "attach", str(je.pid)], capture_output=True, text=True,
                            timeout=120)
    finally:
        for p in (glibc, je):
            p.kill()
            p.wait()
    assert r.returncode == 0 and rj.returncode == 0, r.stderr + rj.stderr
    text = " ".join((r.stdout + r.stderr).split())
    assert "glibc's figures from a copy of the process" in text and "in use (live" in text
    assert "VERDICT" in text
    text = " ".join((rj.stdout + rj.stderr).split())
    if gdbcall.restore_refusal():
        assert "/proc figures only:" in text, text
