"""The preload library's start-up: calls that arrive before it knows the real functions
(a free first, allocations from inside its own dlsym, another thread meanwhile) are
answered, keep their data, and start the library exactly once."""

import os
import subprocess

from conftest import scenario
from heapsight.native import BIN, LIB

SHIM = os.path.join(BIN, "libhs_bootshim.so")


def preload(*libs) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "HEAPSIGHT_SEGMENT")}
    env["LD_PRELOAD"] = ":".join(map(str, (LIB, *libs)))
    return env


def test_free_as_the_very_first_call():
    # a library constructor, run before the preload library's, frees a block glibc made
    p = subprocess.run([scenario("hs-free-first")], env=preload(), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "free-first: ok" in p.stdout


def test_allocations_during_start_up_are_answered_and_keep_their_data():
    # GIVEN a library whose code runs inside the preload library's dlsym (an IFUNC resolver)
    # and allocates through every entry point, reallocs, and starts a thread that allocates
    p = subprocess.run(["/bin/true"], env=preload(SHIM), capture_output=True, text=True,
                       timeout=30)
    # THEN nothing aborts or hangs, the realloc kept the data, alignments hold, calloc
    # zeroed, and the other thread got its blocks
    assert p.returncode == 0, p.stderr
    assert "bootshim: ran=1 realloc_kept=1 aligned_ok=1 calloc_zero=1 thread_ok=1" in p.stderr


def test_start_up_attaches_once_when_another_thread_allocates_meanwhile(hs):
    # the other thread must not start the library a second time: a second attach in the
    # same process used to look like an execve and zero the live segment
    r = hs(scenario("hs-leak"), "--mb", "5", env={"LD_PRELOAD": str(SHIM)})
    assert r.rc == 0, r.stderr
    assert "thread_ok=1" in r.stderr
    s = r.summary
    assert s["preload"] == "active" and s["execs"] == 0
    leaked = int(r.truth("leak")["leaked_bytes"])
    assert leaked <= s["heap"]["live_requested_bytes"] <= leaked + 256 * 1024


def test_a_program_with_a_small_stack_starts_attached(hs):
    # the segment's header was read into a 3 MB struct on the stack: a 1 MiB stack limit
    # (ulimit -s 1024) killed every program started under heapsight run with SIGSEGV
    r = hs("sh", "-c", f"ulimit -s 1024; exec {scenario('hs-leak')} --mb 5")
    assert r.rc == 0, r.stderr
    s = r.summary
    assert s["preload"] == "active" and s["execs"] == 1
    leaked = int(r.truth("leak")["leaked_bytes"])
    assert leaked <= s["heap"]["live_requested_bytes"] <= leaked + 256 * 1024
