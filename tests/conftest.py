"""Shared helpers: run `python -m heapsight` in a subprocess on a bundled scenario program
and read back the JSON summary it wrote. And the one place that puts each test in a tier.

Tiers (markers registered in pyproject.toml; `make test-fast` runs unit and scenario):
  browser   a test that starts headless Chromium: the test function, or a fixture it uses
            that is defined under tests/, calls dump_dom( or screenshot( (heapsight.report.png)
            or passes the "--png" option to a command. Wins over the rules below.
  unit      pure functions, no process started: tests/unit/, tests/test_lab_stored.py and
            tests/test_reporters_stored.py.
  lab       the lab experiments: tests/test_lab_*.py (but test_lab_stored.py).
  system    tests that drive another system beside heapsight, or many runs of it: gdb
            (attach), the other allocators and runtimes, compare, the cross-checks against
            heaptrack, valgrind and go tool pprof, the hostile inputs and interrupts
            (SYSTEM_FILES). `make test` runs them; `make test-fast` leaves them out.
  scenario  everything else: tests that start heapsight or a scenario program.
Tier markers are not written in test files (collection stops if one is): a test that
needs another tier than its file's gets it by a rule here."""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from heapsight.native import BIN

# A shell runs a background job (`make test &`) with Ctrl-C ignored, and an ignored signal
# stays ignored across exec: the tests of Ctrl-C, here and in the heapsight processes they
# start, need it delivered. A handler (unlike "ignored") is reset to the default at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TIERS = ("unit", "scenario", "system", "lab", "browser")
TESTS_DIR = Path(__file__).resolve().parent
UNIT_FILES = {"test_lab_stored.py", "test_reporters_stored.py"}
SYSTEM_FILES = {"test_attach.py", "test_attach_safety.py", "test_attach_inject.py", "test_attach_watch.py", "test_compare.py",
                "test_hostile_commands.py", "test_hostile_outputs.py", "test_allocators.py",
                "test_runtime_owners.py", "test_crosscheck.py", "test_sites_crosscheck.py",
                "test_reach.py", "test_pprof.py", "test_diff.py", "test_terminal.py",
                "test_wheel.py", "test_interp_frames.py",
                # many runs each (the same figure checked over several runs or moments)
                "test_figures_every_moment.py", "test_run_hard_cases.py", "test_slot_reads.py",
                "test_advice.py"}
STARTS_CHROMIUM = re.compile(r"\b(?:dump_dom|screenshot)\(|[\"']--png[\"']")


@functools.lru_cache(maxsize=None)
def _starts_chromium(func) -> bool:
    """Whether a test or fixture function of tests/ drives Chromium (read from its source)."""
    try:
        path = inspect.getsourcefile(func)
        if path is None or TESTS_DIR not in Path(path).resolve().parents:
            return False
        return bool(STARTS_CHROMIUM.search(inspect.getsource(func)))
    except (OSError, TypeError):
        return False


def tier(item) -> str:
    """The one tier of a collected test, by the rules of this file's docstring."""
    funcs = [getattr(item, "function", None)]
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for name in getattr(item, "fixturenames", ()):
        funcs.extend(d.func for d in defs.get(name, ()))
    if any(f is not None and _starts_chromium(f) for f in funcs):
        return "browser"
    path = Path(item.path).resolve()
    if "unit" in path.relative_to(TESTS_DIR).parts[:-1] or path.name in UNIT_FILES:
        return "unit"
    if path.name.startswith("test_lab_"):
        return "lab"
    if path.name in SYSTEM_FILES:
        return "system"
    return "scenario"


@pytest.hookimpl(tryfirst=True)   # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        written = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
        if written:
            raise pytest.UsageError(
                f"{item.nodeid} is marked {', '.join(written)} in its file: tiers are given "
                "only by the rules in tests/conftest.py (add or change a rule there)")
        item.add_marker(getattr(pytest.mark, tier(item)))
    calls = [item for item in items if item.get_closest_marker("gdb_calls")]
    if calls:
        # heapsight refuses gdb's calls where gdb cannot put a thread's registers back after
        # one (gdbcall.restore_refusal; tests/test_attach_safety.py checks the refusal): the
        # tests that need a call cannot run there, and say why
        from heapsight.live import gdbcall
        why = gdbcall.restore_refusal()
        for item in calls:
            if why:
                item.add_marker(pytest.mark.skip(reason=f"gdb cannot call safely here: {why}"))


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str
    summary: dict | None

    def truth(self, prefix: str) -> dict:
        """The key=value line a scenario prints about itself."""
        for line in (self.stdout + "\n" + self.stderr).splitlines():
            if line.startswith(prefix + ":"):
                return {k: v for k, v in (kv.split("=", 1) for kv in line.split()[1:])}
        raise AssertionError(f"no '{prefix}:' line in output:\n{self.stdout}\n{self.stderr}")


def scenario(name: str) -> str:
    path = os.path.join(BIN, name)
    assert os.path.exists(path), f"{path} is missing: the build did not install the scenarios"
    return path


def compile_c(directory, name: str, source: str, *flags: str) -> str:
    """A C program built from source in directory (-O1, then flags: -g, -lpthread, ...);
    its path."""
    src, exe = Path(directory) / f"{name}.c", Path(directory) / name
    src.write_text(source)
    subprocess.run(["cc", "-O1", "-o", str(exe), str(src), *flags], check=True, timeout=120)
    return str(exe)


@pytest.fixture
def hs(tmp_path):
    """hs(*command, opts=[...]) -> Result, run with cwd=tmp_path and --json to a file."""
    def run(*command, opts=(), env=None, timeout=120):
        summary_path = tmp_path / f"summary-{len(list(tmp_path.iterdir()))}.json"
        argv = [sys.executable, "-m", "heapsight", "run", "--json", str(summary_path), *opts,
                "--", *command]
        p = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=timeout,
                           env={**os.environ, **(env or {})})
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
        return Result(p.returncode, p.stdout, p.stderr, summary)
    return run


def shm_segments() -> set:
    return {p.name for p in Path("/dev/shm").glob("heapsight-*.seg")}


@pytest.fixture(autouse=True, scope="session")
def _terminal_width_of_a_pipe():
    """readline, loaded in this process, puts COLUMNS (80) in the C environment that the
    processes the tests start inherit, behind os.environ's back; heapsight's output to a
    pipe is 100 columns wide unless COLUMNS says otherwise, and the tests that read it
    expect that (tests of the width set COLUMNS themselves). Session-wide, so that
    module-scoped fixtures that start heapsight see it too."""
    os.environ.pop("COLUMNS", None)
    os.unsetenv("COLUMNS")


@pytest.fixture(autouse=True, scope="session")
def _a_names_cache_of_the_tests_own(tmp_path_factory):
    """heapsight keeps the symbolizer's answers between runs under $XDG_CACHE_HOME: the
    tests' runs keep theirs in a directory of the session's (each xdist worker its own),
    never in the user's ~/.cache, and start from an empty one."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
