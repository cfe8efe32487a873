"""heapsight: why a process's memory did not go back to the OS after free()."""

import signal as _signal

__version__ = "0.1.0"

# numpy's BLAS starts a worker thread when it is imported. Started with Ctrl-C, SIGTERM and
# SIGHUP blocked, it never takes them: they stay the main thread's, which blocks them while
# it saves a run or waits for gdb (see interrupts.py) and takes them when it is ready.
_old = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP})
try:
    import numpy as _numpy  # noqa: F401
finally:
    _signal.pthread_sigmask(_signal.SIG_SETMASK, _old)
