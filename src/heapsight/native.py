"""Where the native parts live: the preload library and the bundled programs."""

from pathlib import Path

import heapsight
from heapsight.errors import HeapsightError


def _package_dir() -> Path:
    """The directory that holds the built parts (_lib, _bin): the package's own in a
    wheel install; in an editable install the Python files stay in src/ and the built
    parts are in site-packages, both on the package's __path__."""
    dirs = [Path(d).resolve() for d in heapsight.__path__]
    return next((d for d in dirs if (d / "_lib").is_dir()), dirs[0])


PACKAGE_DIR = _package_dir()
LIB_PATH = PACKAGE_DIR / "_lib" / "libheapsight.so"
BIN_DIR = PACKAGE_DIR / "_bin"


def preload_library() -> Path:
    if not LIB_PATH.exists():
        raise HeapsightError(
            f"the preload library is missing ({LIB_PATH}); reinstall heapsight "
            "(`make` in the source tree, or `pip install .`)", 3)
    return LIB_PATH


def program(name: str) -> Path:
    """A bundled program (scenario or helper) by its name, e.g. 'hs-retention'."""
    path = BIN_DIR / name
    if not path.exists():
        raise HeapsightError(f"bundled program {name} is missing from {BIN_DIR}; reinstall heapsight", 3)
    return path
