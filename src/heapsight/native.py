"""Where the native parts live: the preload library and the bundled programs."""

from pathlib import Path

from heapsight.errors import HeapsightError

PACKAGE_DIR = Path(__file__).resolve().parent
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
