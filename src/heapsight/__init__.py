"""heapsight: why a process's memory did not go back to the OS after free()."""

import os as _os
import signal as _signal
import sys as _sys
from importlib import machinery as _machinery

from heapsight import interrupts as _interrupts  # first: it reads the state we started with

__version__ = "0.1.0"



_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


class _NumpyWithSignalsBlocked:
    """numpy's BLAS starts a worker thread when numpy is first imported. Started with every
    signal blocked, it never takes one: they stay the main thread's, which blocks Ctrl-C,
    SIGTERM and SIGHUP while it saves a run or waits for gdb (see interrupts.py) and takes
    them when it is ready, and takes a --snapshot-on signal itself. This finder wraps that
    first import, wherever it comes from, so that commands that need no numpy (--version,
    --help, env) do not pay for it."""

    def find_spec(self, name, path=None, target=None):
        if name != "numpy":
            return None
        _sys.meta_path.remove(self)
        spec = _machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Blocked(spec.loader)
        return spec


class _Blocked:
    """A loader that runs another's exec_module with every signal blocked."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        old = _signal.pthread_sigmask(_signal.SIG_BLOCK, _interrupts.ALL)
        # one BLAS thread, none beside it: OpenBLAS starts a thread per core that spins
        # waiting for work heapsight never gives it (7.6% of a node run's CPU on 2 cores,
        # beside the program); read once as the library loads, then out of the environment
        # the programs heapsight starts inherit
        own = [k for k in _BLAS_THREADS if k not in _os.environ]
        for k in own:
            _os.environ[k] = "1"
        try:
            self._loader.exec_module(module)
        finally:
            for k in own:
                _os.environ.pop(k, None)
            _signal.pthread_sigmask(_signal.SIG_SETMASK, old)

    def __getattr__(self, name):   # the rest (resources, get_data) is the real loader's
        return getattr(self._loader, name)


if "numpy" not in _sys.modules:
    _sys.meta_path.insert(0, _NumpyWithSignalsBlocked())
