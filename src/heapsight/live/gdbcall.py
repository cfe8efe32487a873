"""Calling into a running process through gdb, in batch, with a time limit.

gdb attaches (the process stops for the duration: tens of milliseconds), evaluates the
expressions, and detaches; the process then goes on as before. Interrupts wait until gdb
has detached, so the process is never left stopped. What the calls leave behind is said
where they are made: gdb places each string argument in the process's memory with its
malloc and never frees it (a few dozen bytes a call), and malloc_info's FILE is opened and
closed again.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

from heapsight import interrupts
from heapsight.errors import HeapsightError

VALUE = re.compile(r"^\$(\d+) = (.*)$")
last_seconds = 0.0   # how long the last call's gdb ran: the most the process was stopped
EXIT_REFUSED = 3


def gdb() -> str:
    path = shutil.which("gdb")
    if path is None:
        raise HeapsightError("gdb is not installed; heapsight attach calls into the process "
                             "through it: apt-get install gdb (or use --no-gdb for the /proc "
                             "figures alone)", EXIT_REFUSED)
    return path


# What gdb prints when it cannot put a thread's registers back after a call it made in
# the process (gdb 13 on a kernel whose extended state it does not know, such as AMX's):
# the call's return then corrupts the thread (an interrupted nanosleep returns error 516)
BROKEN_RESTORE = ("Couldn't write extended state", "Couldn't write registers",
                  "Couldn't write floating point status")
_restore_checked: str | None = None


def restore_refusal() -> str:
    """Why gdb's calls cannot be made safely here ("" when they can), found once per
    heapsight process by a call into a throwaway process of heapsight's own: a gdb that
    cannot restore a thread's registers after a call would corrupt the program's."""
    global _restore_checked
    if _restore_checked is not None:
        return _restore_checked
    probe = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL,
                             preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, ()))
    try:
        p = subprocess.run([gdb(), "-p", str(probe.pid), "-batch", "-nx", "-q",
                            "-ex", "set confirm off", "-ex", "set unwindonsignal on",
                            "-ex", "print (int)getpid()"],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                           start_new_session=True,
                           preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, ()))
        text = p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        text = ""
    finally:
        probe.kill()
        probe.wait()
    bad = next((b for b in BROKEN_RESTORE if b in text), None)
    version = subprocess.run([gdb(), "--version"], capture_output=True, text=True).stdout
    version = version.splitlines()[0] if version else "gdb"
    _restore_checked = "" if bad is None else (
        f"{version} cannot restore a thread's registers after a call on this machine "
        f"(\"{bad}\": a CPU state it does not know, such as AMX's, on kernel "
        f"{os.uname().release}); a call would corrupt the process, so heapsight makes none. "
        "A newer gdb (14 or later) can; meanwhile attach gives the /proc figures, and its "
        "--trim and --leaks need no gdb")
    return _restore_checked


def refusal(pid: int, text: str) -> str | None:
    """Why gdb could not attach, with the fix, or None."""
    if "No such process" in text or "does not exist" in text:
        return f"process {pid} ended (or never existed)"
    if "Operation not permitted" in text or "ptrace" in text and "denied" in text:
        try:
            scope = open("/proc/sys/kernel/yama/ptrace_scope").read().strip()
        except OSError:
            scope = None
        if scope and scope != "0":
            return (f"cannot attach to {pid}: kernel.yama.ptrace_scope is {scope}; run as root, "
                    "give heapsight CAP_SYS_PTRACE, or lower it: sysctl kernel.yama.ptrace_scope=0")
        return (f"cannot attach to {pid}: not permitted (another user's process, or one in "
                "another PID namespace or container); run heapsight as that user or as root, "
                "in the same container")
    return None


# the most read of a descriptor of the process's (it could write without end meanwhile)
READ_FD_MAX = 64 << 20
CAPTURE_BEGIN, CAPTURE_END = "@@heapsight-capture-begin", "@@heapsight-capture-end"


def call(pid: int, exprs: list, timeout_s: float = 30.0, read_fd: tuple | None = None,
         then: tuple = ()) -> list:
    """Evaluates each of exprs in the process (gdb `print`) and returns their values as
    text, in order (None for one that failed); then, with read_fd (an expression's index
    whose value is a descriptor of the process), the file that descriptor is open on, read
    through /proc/PID/fd while the process is still stopped, as one more text at the end;
    then the expressions of then. Raises HeapsightError when gdb cannot attach."""
    unsafe = restore_refusal()
    if unsafe:
        raise HeapsightError(unsafe, EXIT_REFUSED)
    argv = [gdb(), "-p", str(pid), "-batch", "-nx", "-q",
            "-ex", "set confirm off", "-ex", "set unwindonsignal on",
            "-ex", "set print elements 0"]
    for i, e in enumerate(exprs):   # a marker before each: a failed one prints no value
        argv += ["-ex", f"echo @@{i}\\n", "-ex", f"print {e}"]
    if read_fd is not None:   # gdb's own shell reads it: the process writes no file anywhere
        argv += ["-ex", f"echo {CAPTURE_BEGIN}\\n",
                 "-ex", f'eval "shell head -c {READ_FD_MAX} /proc/{pid}/fd/%d", ${read_fd + 1}',
                 "-ex", f"echo \\n{CAPTURE_END}\\n"]
    for i, e in enumerate(then, len(exprs)):
        argv += ["-ex", f"echo @@{i}\\n", "-ex", f"print {e}"]
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "HEAPSIGHT_SEGMENT")}
    global last_seconds
    t0 = time.monotonic()
    with interrupts.deferred():   # gdb detaches before heapsight goes away
        try:
            # gdb needs SIGCHLD to see the process stop: it starts with no signal blocked
            # (heapsight blocks some while it samples), in a session of its own so that a
            # Ctrl-C at the terminal does not reach it in the middle of a call
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env,
                               stdin=subprocess.DEVNULL, start_new_session=True,
                               preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, ()))
        except subprocess.TimeoutExpired as e:
            raise HeapsightError(f"gdb did not finish within {timeout_s:.0f} s on process {pid}; "
                                 "it was stopped and the process detached", 1) from e
    # gdb's whole run: the process was stopped for part of it (from the attach to the detach)
    last_seconds = time.monotonic() - t0
    out = p.stdout + "\n" + p.stderr
    why = refusal(pid, out)
    if why and not VALUE.search(p.stdout):
        raise HeapsightError(why, EXIT_REFUSED)
    stdout, captured = p.stdout, None
    if read_fd is not None and CAPTURE_BEGIN in stdout and CAPTURE_END in stdout:
        head, rest = stdout.split(CAPTURE_BEGIN + "\n", 1)
        captured, tail = rest.rsplit("\n" + CAPTURE_END, 1)
        stdout = head + tail
    got, current = [None] * (len(exprs) + len(then)), None
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("@@") and line[2:].isdigit():
            current = int(line[2:])
            continue
        m = VALUE.match(line)
        if m and current is not None and got[current] is None:
            got[current] = m.group(2)
    errors = [line for line in p.stderr.splitlines() if line and not line.startswith(("[", "warning"))]
    if exprs and all(v is None for v in got):
        raise HeapsightError(f"gdb could not call into process {pid}: "
                             + (errors[-1] if errors else "no output"), 1)
    return got[:len(exprs)] + ([captured] if read_fd is not None else []) + got[len(exprs):]


def number(v: str | None) -> int | None:
    if v is None:
        return None
    try:
        return int(v.split()[0], 0)
    except (ValueError, IndexError):
        return None
