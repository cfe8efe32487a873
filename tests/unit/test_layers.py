"""The import structure of the package: commands on top, nothing imports them, no circle.
Read from the source (every import statement, at any depth), not from a running import."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "src" / "heapsight"


def modules() -> dict:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports_of(path: Path, known: dict, this: str) -> set:
    """The package's modules that path imports (a name from a package counts as the
    package unless it is a module of its own)."""
    found = set()
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != this:
                found.add(n)
    return found


@functools.lru_cache(maxsize=1)
def graph() -> dict:
    """Read once per session: every test here asks for it (and must not change it)."""
    mods = modules()
    return {m: imports_of(p, mods, m) for m, p in mods.items()}


def test_nothing_below_the_cli_imports_commands():
    g = graph()
    upward = sorted(f"{m} imports {d}" for m, deps in g.items() for d in deps
                    if d.startswith("heapsight.commands") and not m.startswith("heapsight.commands")
                    and m not in ("heapsight.cli", "heapsight.__main__"))
    assert upward == []


def test_commands_do_not_import_each_other():
    g = graph()
    sideways = sorted(f"{m} imports {d}" for m, deps in g.items() for d in deps
                      if m.startswith("heapsight.commands.") and d.startswith("heapsight.commands."))
    assert sideways == []


def find_cycle(g: dict) -> list | None:
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(g.get(m, ())):
            # a package's __init__ is imported by every module in it: not an edge back
            if m.startswith(d + "."):
                continue
            if state.get(d) == "open":
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(g):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_circle():
    assert find_cycle(graph()) is None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", ["heapsight.allocators", "heapsight.live.measure",
                                    "heapsight.fmt", "heapsight.live.comparison"])
def test_the_core_layer_exists(module):
    assert module in graph()


# What runs or talks to a live process (the heapsight.live package): the analysis of a
# captured run never needs it.
LIVE = {m for m in modules() if m == "heapsight.live" or m.startswith("heapsight.live.")}


def test_the_live_package_holds_what_talks_to_a_process():
    assert {"heapsight.live.measure", "heapsight.live.sampler", "heapsight.live.attach",
            "heapsight.live.gdbcall", "heapsight.live.readloop", "heapsight.live.launch"} <= LIVE


def reaches(g: dict, start: str) -> set:
    """What start imports, at any depth (the package itself apart: every module has it)."""
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        for d in g.get(m, ()):
            if d != "heapsight" and d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


@pytest.mark.parametrize("module", ["heapsight.summary", "heapsight.capture", "heapsight.analysis",
                                    "heapsight.diffing", "heapsight.ranking", "heapsight.report",
                                    "heapsight.reporters.terminal", "heapsight.reporters.csv",
                                    "heapsight.reporters.pprof", "heapsight.reporters.openmetrics",
                                    "heapsight.record", "heapsight.model", "heapsight.mapped",
                                    "heapsight.sites", "heapsight.timeline"])
def test_the_analysis_of_a_captured_run_needs_no_live_process(module):
    # a saved run is analysed again (capture.rederive), and drawn, with none of the code
    # that starts, samples or attaches to a process
    assert sorted(reaches(graph(), module) & LIVE) == []
