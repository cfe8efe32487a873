"""What every lab experiment shares: running a lab program under an allocator, claims,
tables, and the chart descriptions the report draws.

An experiment is a module in heapsight.lab with:
  NAME, TITLE (one line), SOURCE (the write-up's title), ABOUT (a paragraph),
  CONFIGS (default configuration names, from heapsight compare's presets),
  collect(ctx) -> data        runs the programs; data is plain JSON (dicts, lists, numbers)
  tables(data) -> [Table]     what the terminal prints, computed from data only
  claims(data) -> [Claim]     each published claim with a verdict computed from data only
  charts(data) -> [dict]      chart descriptions for `heapsight report` (see CHARTS below)
tables, claims and charts never run anything, so a saved lab can be re-read and re-drawn.

CHARTS: each chart is a dict
  {"id": "release-glibc", "title": "...", "kind": "line" | "bar",
   "x": {"label": "block size", "unit": "bytes" | "count" | "s" | "%" | "" , "log": bool,
         "categories": [..] (bar charts: the group labels)},
   "y": {"label": "RSS after free", "unit": "bytes" | "%" | ..., "log": bool},
   "series": [{"name": "glibc", "x": [...], "y": [...], "lo": [...], "hi": [...]}],
   "note": "one sentence under the chart"}
  For bar charts series[i]["y"][j] is the bar of series i in category j; lo/hi optional.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from heapsight import native
from heapsight.allocators import PRESET, Config, library_for
from heapsight.errors import HeapsightError

HOLDS, FAILS, DEPENDS = "holds", "fails", "depends"


@dataclass(frozen=True)
class Claim:
    """A published claim and what this machine says about it."""
    text: str            # the claim, as the write-up made it (paraphrased, in quotes)
    source: str          # the write-up's title
    verdict: str         # HOLDS, FAILS or DEPENDS
    evidence: str        # the figures behind the verdict, in one or two sentences
    depends_on: str = ""  # for DEPENDS: on what (order, allocator, size...)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Table:
    title: str
    columns: list                 # header strings
    rows: list                    # lists of cells (already formatted strings or numbers)
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Context:
    """How an experiment should run: passed to collect()."""
    quick: bool = False
    configs: list | None = None   # Config objects chosen by --configs (None: the experiment's own)
    progress: object = None       # progress(message): one line to stderr
    timeout_s: float = 900.0

    def say(self, msg: str) -> None:
        if self.progress:
            self.progress(msg)

    def configs_for(self, default_names) -> list:
        """The configurations to run: --configs if given, else the experiment's defaults."""
        if self.configs is not None:
            return list(self.configs)
        return [PRESET[n] for n in default_names]


def config_env(cfg: Config) -> tuple:
    """(environment for a program under cfg, None) or (None, why it cannot run)."""
    lib, err = library_for(cfg)
    if err:
        return None, err
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(cfg.env)
    if lib:
        env["LD_PRELOAD"] = lib
    return env, None


def run_program(argv: list, cfg: Config, extra_env: dict | None = None,
                timeout_s: float = 900.0) -> list:
    """Runs a lab program under cfg's allocator; returns the JSON objects it printed, one
    per stdout line (other lines are ignored). Raises HeapsightError when it fails."""
    env, err = config_env(cfg)
    if err:
        raise HeapsightError(err)
    env.update(extra_env or {})
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise HeapsightError(f"{shlex.join(argv)} under {cfg.name} took more than {timeout_s:.0f} s") from e
    except OSError as e:
        raise HeapsightError(f"cannot start {argv[0]}: {e.strerror}") from e
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()[-5:]
        raise HeapsightError(f"{shlex.join(argv)} under {cfg.name} exited with {p.returncode}"
                             f" after {time.monotonic() - t0:.1f} s: " + " | ".join(tail))
    out = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def wrong_allocator(asked: str, answered) -> str | None:
    """Why a run does not count when another allocator answered than the one asked for
    (the preload did not take), else None. A user's library of unknown kind is not checked."""
    if asked == "unknown" or answered == asked:
        return None
    return f"asked for {asked}, but {answered} answered (the preload did not take)"


def lab_program(name: str) -> str:
    """A bundled lab program by name ('hs-lab-release', 'hs-lab-perl.pl'...)."""
    return str(native.program(name))


def say_stderr(msg: str) -> None:
    print(f"heapsight lab: {msg}", file=sys.stderr, flush=True)


def cores() -> int:
    return os.cpu_count() or 1


def rel(a: float, b: float) -> float:
    """a relative to b, as a fraction (0 when b is 0)."""
    return a / b if b else 0.0
