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
            "heapsight.live.gdbcall", "heapsight.live.readloop", "heapsight.live.launch",
            "heapsight.live.segment", "heapsight.live.heapmaps", "heapsight.live.procfs"} <= LIVE


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
                                    "heapsight.sites", "heapsight.timeline", "heapsight.layout",
                                    "heapsight.heapmap", "heapsight.profile", "heapsight.mappings",
                                    "heapsight.report.holders"])
def test_the_analysis_of_a_captured_run_needs_no_live_process(module):
    # a saved run is analysed again (capture.rederive), and drawn, with none of the code
    # that starts, samples or attaches to a process
    assert sorted(reaches(graph(), module) & LIVE) == []


# What reaches a process (the program's, or the segment it shares with heapsight): only
# live/ and the commands do, and lab/, which runs its experiments' programs. Elsewhere no
# module locks a file, maps memory, loads native code, signals or waits for a process,
# sleeps, or opens anything in another process's /proc or in /dev/shm. heapsight's own
# signals are its own (interrupts: its mask, its own end; the package's start, which blocks
# them while numpy starts its threads).
MAY_REACH = ("heapsight.live", "heapsight.commands", "heapsight.lab", "heapsight.cli",
             "heapsight.__main__")
OWN_SIGNALS = ("heapsight.interrupts", "heapsight")
REACHING_IMPORTS = {"mmap", "ctypes", "signal"}
REACHING_CALLS = {"time.sleep", "os.kill", "os.killpg", "os.fork", "os.waitpid", "os.wait4",
                  "os.waitid", "os.pread", "os.pwrite", "os.posix_fallocate", "fcntl.flock",
                  "fcntl.lockf"}
PROCESS_PATHS = ("/proc/", "/dev/shm")
OWN_PATHS = ("/proc/self/",)


def reaching(path: Path, module: str) -> list:
    """What in path reaches a process: (line, what)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for n in names:
                top = n.split(".")[0]
                if top in REACHING_IMPORTS and not (top == "signal" and module in OWN_SIGNALS):
                    found.append((node.lineno, f"import {n}"))
        elif isinstance(node, ast.Call):
            f = node.func
            name = (f"{f.value.id}.{f.attr}" if isinstance(f, ast.Attribute)
                    and isinstance(f.value, ast.Name) else getattr(f, "id", ""))
            if name in REACHING_CALLS and not (name == "os.kill" and module in OWN_SIGNALS):
                found.append((node.lineno, name))
            if name in ("open", "os.open", "io.open") and node.args:
                a = node.args[0]
                head = (a.value if isinstance(a, ast.Constant) else
                        a.values[0].value if isinstance(a, ast.JoinedStr) and a.values
                        and isinstance(a.values[0], ast.Constant) else "")
                if (isinstance(head, str) and head.startswith(PROCESS_PATHS)
                        and not head.startswith(OWN_PATHS)):
                    found.append((node.lineno, f"{name}({head}...)"))
    return found


def test_only_live_and_the_commands_reach_a_process():
    outside = {m: p for m, p in modules().items()
               if not any(m == r or m.startswith(r + ".") for r in MAY_REACH)}
    found = sorted(f"{p.relative_to(ROOT.parent)}:{line}: {what}"
                   for m, p in outside.items() for line, what in reaching(p, m))
    assert found == []


def test_the_reach_finder_finds_each_kind(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import mmap\nimport time, os\ntime.sleep(1)\nos.kill(1, 9)\n"
                 "open(f'/proc/{pid}/smaps')\nos.open('/dev/shm/x', 0)\nopen('data.txt')\n"
                 "open('/proc/self/status')\nfcntl.flock(fd, 2)\n")
    assert [w for _, w in reaching(p, "heapsight.x")] == [
        "import mmap", "time.sleep", "os.kill", "open(/proc/...)", "os.open(/dev/shm/x...)",
        "fcntl.flock"]
