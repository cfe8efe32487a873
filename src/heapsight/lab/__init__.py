"""The lab: re-runs five classic allocator experiments here and checks their claims, and
the remedies experiment, which checks the rules heapsight suggests remedies by.

Each experiment lives in its own module (see heapsight.lab.common for the interface).
"""

from __future__ import annotations

import importlib

NAMES = ("release", "waste", "arenas", "containers", "perl", "remedies")


def experiment(name: str):
    """The module of one experiment, by name."""
    if name not in NAMES:
        raise KeyError(name)
    return importlib.import_module(f"heapsight.lab.{name}")
