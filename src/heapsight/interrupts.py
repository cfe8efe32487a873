"""Interrupts while heapsight measures: Ctrl-C, SIGTERM and SIGHUP are meant for the
program, and heapsight stays to save what it measured.

While the program runs these signals are blocked in heapsight and taken synchronously by
the sampler (sigtimedwait), so each comes with its origin: one the terminal sent (the
program, in the same foreground process group, got it too) is not sent again; one sent
to heapsight alone (kill PID) is forwarded. Either way the run is marked interrupted.

The program starts with the signal mask and the ignored signals heapsight was started
with (START_MASK, START_IGNORED, read when heapsight is imported, before anything blocks
or ignores a signal): see live/launch.py.
"""

from __future__ import annotations

import contextlib
import os
import signal

WATCHED = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
SI_KERNEL = 0x80   # si_code of a signal the kernel raised: the terminal's ^C, ^\, hang-up

# Python ignores these for itself before any of its code runs, so whether heapsight's
# parent left them ignored is not known: the program gets them at their default, as
# subprocess gives them.
PYTHON_IGNORES = frozenset({signal.SIGPIPE, signal.SIGXFSZ})
# heapsight/__init__.py imports this module first: this is the state heapsight started with.
START_MASK = frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, ()))
START_IGNORED = frozenset(s for s in signal.valid_signals()
                          if s not in PYTHON_IGNORES and signal.getsignal(s) == signal.SIG_IGN)
ALL = frozenset(signal.valid_signals())


def _internal_default() -> tuple:
    """Which of glibc's two internal signals (32, 33: SIGCANCEL and SIGSETXID, which
    Python cannot name) heapsight started with not ignored: /proc/self/status's SigIgn
    bits 31 and 32."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigIgn:"):
                    ign = int(line.split()[1], 16)
                    return tuple(s for s in (32, 33) if not ign & (1 << (s - 1)))
    except (OSError, ValueError, IndexError):
        pass
    return ()


# glibc's posix_spawn leaves those two ignored in the program it starts (live/launch.py);
# the ones heapsight had at their default, the library puts back (preload.c)
START_INTERNAL_DEFAULT = _internal_default()
# Signals a supervisor sends a service (reopen logs, dump state, a timer) that kill a
# process at their default: sent to heapsight, they must not end the measurement. The
# command catches them first thing (hold_passed_on), and while the program runs the sampler
# takes them and passes each on to it, without marking the run interrupted. One that came
# before the program started is dropped.
PASSED_ON = frozenset({signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM})


def _not_for_heapsight(signo, frame) -> None:
    """PASSED_ON's handler while no program runs: nothing to pass it on to."""


def hold_passed_on() -> None:
    """Catches PASSED_ON in the heapsight command with a handler that does nothing: not a
    blocked mask or an ignored disposition, which every process heapsight starts (gdb, the
    lab's programs) would inherit; a handled signal is back at its default after exec. While
    the program runs they are blocked and taken by the sampler, which passes them on."""
    for sig in PASSED_ON - START_IGNORED:   # an ignored one stays so, for the program too
        signal.signal(sig, _not_for_heapsight)


@contextlib.contextmanager
def deferred(signals=WATCHED):
    """Holds signals until the block ends (then a pending one is delivered): what must be
    finished whole, such as saving a measured run, is."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def drain(signals=WATCHED) -> list:
    """Takes the pending (blocked) signals among signals, without waiting."""
    got = []
    while signals & signal.sigpending():
        info = signal.sigtimedwait(signals, 0)
        if info is None:
            break
        got.append(info)
    return got


def program_received(info, child_pid: int) -> bool:
    """Did the program get this signal already? A terminal-generated signal goes to the
    whole foreground process group, which holds the program unless it left it."""
    if info.si_code != SI_KERNEL:
        return False
    try:
        return os.getpgid(child_pid) == os.getpgrp()
    except OSError:
        return False


# The signal the program died of, when `heapsight run` ends by dying of it too (die_as).
program_signal = 0


def die_as(signo: int) -> None:
    """Ends heapsight by the signal the program died of, so that its parent sees what it
    sees bare (a death by signal, not an exit code 128+N: a supervisor's restart rules and
    a shell's "Segmentation fault" tell the two apart). No core of heapsight's is written,
    and its exit handlers run first, as at an exit: llvm-symbolizer, left to find its pipe
    gone while it answered, aborted and wrote a core into the user's directory.
    Returns only for a signal whose default does not end a process."""
    import atexit
    import resource
    import sys
    atexit._run_exitfuncs()
    atexit._clear()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (OSError, ValueError):
        pass
    if signo not in (signal.SIGKILL, signal.SIGSTOP):   # theirs cannot be changed
        try:
            signal.signal(signo, signal.SIG_DFL)
        except (OSError, ValueError):
            return
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signo})
    os.kill(os.getpid(), signo)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signo})   # delivered synchronously: not here
