"""Where the native parts live: the preload library and the bundled programs (paths as
strings: pathlib costs every start 3 ms)."""

import os

import heapsight
from heapsight.errors import HeapsightError


def _package_dir() -> str:
    """The directory that holds the built parts (_lib, _bin): the package's own in a
    wheel install; in an editable install the Python files stay in src/ and the built
    parts are in site-packages, both on the package's __path__."""
    dirs = [os.path.realpath(d) for d in heapsight.__path__]
    return next((d for d in dirs if os.path.isdir(os.path.join(d, "_lib"))), dirs[0])


PACKAGE = _package_dir()
LIB = os.path.join(PACKAGE, "_lib", "libheapsight.so")
BIN = os.path.join(PACKAGE, "_bin")


def lib_path(name: str) -> str:
    """A library built with the package, e.g. 'libhsread.so'."""
    return os.path.join(PACKAGE, "_lib", name)


def preload_library() -> str:
    if not os.path.exists(LIB):
        raise HeapsightError(
            f"the preload library is missing ({LIB}); reinstall heapsight "
            "(`make` in the source tree, or `pip install .`)", 3)
    return LIB


def program(name: str) -> str:
    """A bundled program (scenario or helper) by its name, e.g. 'hs-retention'."""
    path = os.path.join(BIN, name)
    if not os.path.exists(path):
        raise HeapsightError(f"bundled program {name} is missing from {BIN}; reinstall heapsight", 3)
    return path
