"""Starts the program with the signal state heapsight itself was started with, whatever
heapsight blocks or ignores for itself meanwhile (it blocks Ctrl-C, SIGTERM and SIGHUP to
take them with their origin, ignores a --snapshot-on signal, and Python ignores SIGPIPE).

posix_spawn sets the child's mask and dispositions before exec without running any Python
in the child (a preexec_fn does, which is unsafe once heapsight has threads: the
exporter's, numpy's BLAS), and it leaves the fds heapsight inherited to the program as a
bare start would (heapsight's own are all close-on-exec).
"""

from __future__ import annotations

import os
import signal

from heapsight import interrupts, limits


class Program:
    """The started program: pid and returncode, as much of subprocess.Popen as the sampler
    and the commands use."""

    def __init__(self, pid: int, args: list):
        self.pid, self.args = pid, args
        self.returncode = None

    def poll(self):
        """The exit code if the program has ended, else None. Does not reap it (the
        sampler's wait4 does, to read its resource usage), so its pid stays its own."""
        if self.returncode is not None:
            return self.returncode
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:   # reaped already, by someone else: its status is gone
            self.returncode = 0
            return 0
        if info is None:
            return None
        return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # an unreaped child keeps its pid even as a zombie: the signal cannot reach another
        if self.returncode is None:
            os.kill(self.pid, sig)


def _redirect(fd: int, target) -> list:
    if target is None:
        return []
    import subprocess   # (only for its DEVNULL: 4 ms before the program starts otherwise)
    if target == subprocess.DEVNULL:
        return [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0)]
    src = target if isinstance(target, int) else target.fileno()
    return [(os.POSIX_SPAWN_DUP2, src, fd)]


def start(path: str, argv: list, env: dict, stdout=None, stderr=None) -> Program:
    """Starts path with argv and env; stdout and stderr: None (heapsight's), DEVNULL, a
    file object or an fd. Raises OSError when it cannot (no such file, not executable)."""
    for f in (stdout, stderr):
        if hasattr(f, "flush"):
            f.flush()
    if signal.SIGCHLD in interrupts.START_IGNORED:
        # heapsight must wait for the program: an ignored SIGCHLD would reap it unseen
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # Every signal heapsight was not started ignoring starts at its default; the ignored
    # ones stay ignored (exec keeps SIG_IGN, and heapsight never handles them).
    to_default = interrupts.ALL - interrupts.START_IGNORED - {signal.SIGKILL, signal.SIGSTOP}
    # heapsight raised its own open-files limit: the program starts with the one it was
    # given, inherited through the spawn (set on it after the spawn, a program that asked
    # at once could see heapsight's: `sh -c 'ulimit -n'` read 64 once beside busy loops)
    with limits.given_to_children():
        pid = os.posix_spawn(path, argv, env,
                             file_actions=_redirect(1, stdout) + _redirect(2, stderr),
                             setsigmask=interrupts.START_MASK, setsigdef=to_default)
    return Program(pid, argv)
