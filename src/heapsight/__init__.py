"""heapsight: why a process's memory did not go back to the OS after free()."""

import signal as _signal

from heapsight import interrupts as _interrupts  # first: it reads the state we started with

__version__ = "0.1.0"

# numpy's BLAS starts a worker thread when it is imported. Started with every signal
# blocked, it never takes one: they stay the main thread's, which blocks Ctrl-C, SIGTERM and
# SIGHUP while it saves a run or waits for gdb (see interrupts.py) and takes them when it
# is ready, and takes a --snapshot-on signal itself.
_old = _signal.pthread_sigmask(_signal.SIG_BLOCK, _interrupts.ALL)
try:
    import numpy as _numpy  # noqa: F401
finally:
    _signal.pthread_sigmask(_signal.SIG_SETMASK, _old)
