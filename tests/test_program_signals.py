"""Signals: the program starts with the signal mask and dispositions heapsight was started
with (under run and compare), a SIGTERM for the program ends it when it comes, and a
signal that comes while or after the run is saved never loses the run."""

from __future__ import annotations

import glob
import gzip
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time

import pytest

HS = [sys.executable, "-m", "heapsight"]

# Prints its blocked and ignored signals as /proc says, and each signal's disposition as
# sigaction says (glibc refuses sigaction on the two signals it keeps for itself).
SIGSTATE = r"""
#include <signal.h>
#include <stdio.h>
#include <string.h>
int main(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "SigBlk:", 7) || !strncmp(line, "SigIgn:", 7)) fputs(line, stdout);
  for (int s = 1; s < NSIG; s++) {
    struct sigaction sa;
    if (sigaction(s, NULL, &sa) != 0) { printf("%d reserved\n", s); continue; }
    printf("%d %s\n", s, sa.sa_handler == SIG_IGN ? "ignored" :
                         sa.sa_handler == SIG_DFL ? "default" : "handled");
  }
  return 0;
}
"""

# glibc's two internal signals (32, 33): posix_spawn leaves them ignored in a new process
# (glibc's spawni.c), where glibc installs its own handlers when it needs them; sigaction
# cannot see or change them (the program prints "reserved" for both either way).
GLIBC_INTERNAL_BITS = (1 << 31) | (1 << 32)


@pytest.fixture(scope="module")
def sigstate(tmp_path_factory):
    d = tmp_path_factory.mktemp("sigstate")
    (d / "sigstate.c").write_text(SIGSTATE)
    subprocess.run(["cc", "-O1", "-o", str(d / "sigstate"), str(d / "sigstate.c")], check=True)
    return str(d / "sigstate")


def _parent(ignore=(), block=()):
    """A parent state as a shell or a service manager leaves it, in the started process."""
    def setup():
        for s in ignore:
            signal.signal(s, signal.SIG_IGN)
        if block:
            signal.pthread_sigmask(signal.SIG_BLOCK, set(block))
    return setup


PARENT_STATES = {
    "default": {},
    "background-job": {"ignore": (signal.SIGINT, signal.SIGQUIT)},
    "nohup": {"ignore": (signal.SIGHUP,)},
    "usr1-term-blocked": {"block": (signal.SIGUSR1, signal.SIGTERM)},
    "usr1-ignored": {"ignore": (signal.SIGUSR1,)},
}

WAYS = {
    "run": ["run", "-q", "--no-save", "--"],
    # heapsight ignores and blocks USR1 for itself; the program must not inherit either
    "run --snapshot-on": ["run", "-q", "--no-save", "--snapshot-on", "USR1", "--"],
    "compare": ["compare", "--configs", "glibc", "--repeat", "1", "--show-output", "--no-save",
                "--"],
}


def _state(out: bytes) -> list:
    lines = out.decode().splitlines()
    for i, ln in enumerate(lines):
        if ln.startswith(("SigBlk:", "SigIgn:")):
            key, bits = ln.split()
            lines[i] = f"{key} {int(bits, 16) & ~GLIBC_INTERNAL_BITS:016x}"
    return lines


@pytest.mark.parametrize("way", sorted(WAYS))
@pytest.mark.parametrize("state", sorted(PARENT_STATES))
def test_the_program_starts_with_heapsights_own_signal_state(sigstate, tmp_path, state, way):
    pre = _parent(**PARENT_STATES[state])
    run = lambda argv: subprocess.run(argv, capture_output=True, cwd=tmp_path, timeout=120,
                                      preexec_fn=pre, stdin=subprocess.DEVNULL)
    bare = run([sigstate])
    under = run([*HS, *WAYS[way], sigstate])
    assert under.returncode == 0, under.stderr.decode(errors="replace")
    assert len(_state(bare.stdout)) == 2 + signal.NSIG - 1
    assert _state(under.stdout) == _state(bare.stdout)


def test_sigterm_for_the_program_ends_it_when_it_comes(tmp_path):
    # GIVEN `timeout -s TERM 2 heapsight run -- sleep 5`: timeout signals heapsight alone
    rec = tmp_path / "r.hsrun.json.gz"
    t0 = time.monotonic()
    p = subprocess.run(["timeout", "-s", "TERM", "2", *HS, "run", "-q", "-o", str(rec), "--",
                        "sleep", "5"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    took = time.monotonic() - t0
    # THEN heapsight passes it on, the program ends then, and the run is saved as interrupted
    assert p.returncode == 124, p.stderr   # timeout's code: the command was timed out
    assert took < 3.5, f"took {took:.1f} s: the program did not get SIGTERM"
    summary = json.loads(gzip.open(rec).read())["summary"]
    assert summary["interrupted"] is True
    assert (summary["exit_signal"], summary["exit_code"]) == (signal.SIGTERM, 128 + signal.SIGTERM)


def _segments_of(pid: int) -> list:
    return glob.glob(f"/dev/shm/heapsight-{pid}-*.seg")


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_after_the_program_ended_never_loses_the_run(tmp_path, sig):
    # GIVEN a program that exits at once with code 7, and signals sent to heapsight over
    # and over from the moment the program has started until heapsight has ended
    rec, started = tmp_path / "r.hsrun.json.gz", tmp_path / "started"
    p = subprocess.Popen([*HS, "run", "-q", "--snapshot-on", "USR1", "-o", str(rec), "--",
                          "sh", "-c", f"touch {started}; exit 7"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    sent = []

    def pester():
        while not started.exists() and p.poll() is None:
            time.sleep(0.001)
        while p.poll() is None:
            try:
                os.kill(p.pid, sig)
                sent.append(1)
            except ProcessLookupError:
                break
            time.sleep(0.002)
    t = threading.Thread(target=pester)
    t.start()
    _, err = p.communicate(timeout=120)
    t.join()
    # THEN the run is saved, the segment is gone and, for the snapshot signal, heapsight
    # exits with the program's code; SIGTERM and SIGHUP, which are for the program, end
    # heapsight once the run is saved (they may come too late for the program)
    assert sent, "no signal was sent"
    assert "Traceback" not in err, err
    assert json.loads(gzip.open(rec).read())["summary"]["exit_code"] in (7, 128 + sig)
    assert _segments_of(p.pid) == []
    if sig == signal.SIGUSR1:
        assert p.returncode == 7, (p.returncode, err)
    else:
        assert p.returncode in (7, 128 + sig, -sig), (p.returncode, err)


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT, signal.SIGKILL])
def test_a_death_by_signal_reaches_heapsights_parent_as_a_death_by_signal(tmp_path, sig):
    # GIVEN a program that dies of a signal: its parent sees returncode -N bare (a shell
    # 128+N; systemd's Restart=on-abnormal restarts on it, not on an exit code 128+N)
    rec = tmp_path / "r.hsrun.json.gz"
    argv = ["sh", "-c", f"ulimit -c 0; kill -{int(sig)} $$"]   # (its own core: not here)
    bare = subprocess.run(argv, capture_output=True, timeout=60)
    # WHEN it runs under heapsight, which may write cores (their limit raised)
    def cores_on():
        hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
        resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    under = subprocess.run([*HS, "run", "-o", str(rec), "--", *argv], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path, preexec_fn=cores_on)
    # THEN heapsight's parent sees the same death, once the run is saved and explained
    assert bare.returncode == under.returncode == -sig, (bare.returncode, under.returncode)
    assert "VERDICT" in under.stderr and "Traceback" not in under.stderr, under.stderr
    assert json.loads(gzip.open(rec).read())["summary"]["exit_signal"] == sig
    assert not list(tmp_path.glob("core*"))   # heapsight and its helpers wrote no core


def test_a_low_open_files_limit_is_the_programs_and_not_heapsights(tmp_path):
    # GIVEN an inherited soft limit of 6 open files (a traceback before: heapsight could
    # not open its own files, and the program never started)
    def limited(soft, hard):
        return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    p = subprocess.run([*HS, "run", "--no-save", "--", "sh", "-c", "ulimit -n"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       preexec_fn=limited(6, 4096))
    # THEN heapsight runs, and the program has the limit it was given
    assert p.returncode == 0, p.stderr
    assert p.stdout == "6\n" and "VERDICT" in p.stderr, (p.stdout, p.stderr)
    # and a hard limit too low for heapsight is said in one line, with the fix
    p = subprocess.run([*HS, "run", "--no-save", "--", "true"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, preexec_fn=limited(10, 10))
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("heapsight: error: the open-files limit is 10") and "ulimit -n" in p.stderr
