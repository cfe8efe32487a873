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
The helpers below are the experiments' one copy of each: running a program under a
configuration, reading the data's configuration entries back, binding claims to a write-up,
and sizes as the write-ups wrote them.

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
import time
from dataclasses import asdict

from heapsight.dataclass import dataclass
from heapsight import fmt, native
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
    figure: str = ""     # the figure that decides it, in a line or two: what the terminal
    #                      shows without --verbose ('' : the evidence is short enough)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Table:
    title: str
    columns: list                 # header strings
    rows: list                    # lists of cells (already formatted strings or numbers)
    note: str = ""
    # What the terminal shows without --verbose (the page and --verbose show every row of
    # every table): brief_rows, the indices of the rows it keeps (None: all); detail, the
    # table only with --verbose.
    brief_rows: list | None = None
    detail: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Context:
    """How an experiment should run: passed to collect()."""
    quick: bool = False
    configs: list | None = None   # Config objects chosen by --configs (None: the experiment's own)
    progress: object = None       # progress(message): the step now running, one line
    timeout_s: float = 900.0
    warning: object = None        # warning(message): what the user must see (a configuration
    #                               skipped, a run that failed); progress when not given

    def say(self, msg: str) -> None:
        if self.progress:
            self.progress(msg)

    def warn(self, msg: str) -> None:
        (self.warning or self.say)(msg)

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


def cores() -> int:
    return os.cpu_count() or 1


# --- the data's configuration entries --------------------------------------------------
# Every experiment's data holds a list "configs" of entries named by configuration. An
# entry that could not run says why in "error" (a string: release, perl) or "errors" (a
# list: waste, arenas); release also keeps an "error" per run under "runs".

def configs(data: dict) -> list:
    return data.get("configs", [])


def config(data: dict, name: str) -> dict | None:
    """The entry of one configuration by name, or None when it is not in data."""
    return next((c for c in configs(data) if c["name"] == name), None)


def entry_errors(entry: dict) -> list:
    """The errors one entry carries: (where, error) with where '' for the entry itself or
    the key of the run that failed."""
    errs = [("", entry["error"])] if entry.get("error") else []
    errs += [("", e) for e in entry.get("errors", [])]
    runs = entry.get("runs")
    for key, r in (runs.items() if isinstance(runs, dict) else ()):
        if isinstance(r, dict) and r.get("error"):
            errs.append((key, r["error"]))
    return errs


def errors_note(data: dict) -> str:
    """Every error the entries carry, in one line ('errors: glibc: ...; ...'), or ''."""
    errs = [f"{c['name']}{f' ({where})' if where else ''}: {e}"
            for c in configs(data) for where, e in entry_errors(c)]
    return ("errors: " + "; ".join(errs)) if errs else ""


def nothing_ran(data: dict, what: str) -> HeapsightError:
    """The error collect() raises when no configuration gave any result: each one's errors."""
    return HeapsightError(f"no {what} ran: " + "; ".join(
        f"{c['name']}: {', '.join(e for _, e in entry_errors(c)) or 'no output'}"
        for c in configs(data)))


def cannot_run(ctx: Context, cfg: Config, entry: dict) -> bool:
    """Whether cfg cannot run here (its allocator's library is missing); if so the entry
    says why (in "errors" when it keeps a list, else in "error") and so does the progress."""
    _, err = config_env(cfg)
    if err:
        if isinstance(entry.get("errors"), list):
            entry["errors"].append(err)
        else:
            entry["error"] = err
        ctx.warn(f"{cfg.name}: skipped: {err}")
    return bool(err)


# --- claims -----------------------------------------------------------------------------

def claim_for(source: str):
    """claim(text, verdict, evidence, depends_on="", figure="") -> Claim, bound to one
    write-up. depends_on is kept only for a DEPENDS verdict."""
    def claim(text: str, verdict: str, evidence: str, depends_on: str = "",
              figure: str = "") -> Claim:
        return Claim(text, source, verdict, evidence, depends_on if verdict == DEPENDS else "",
                     figure)
    return claim


def verdict_of(results) -> str:
    """HOLDS when every result holds, FAILS when none does, else DEPENDS (also when there
    is no result at all: nothing was measured)."""
    results = list(results)
    if results and all(results):
        return HOLDS
    if results and not any(results):
        return FAILS
    return DEPENDS


def verdict_split(held: list, failed: list) -> str:
    """verdict_of for the cases sorted into those where the claim held and those where not."""
    return verdict_of([True] * len(held) + [False] * len(failed))


# --- sizes the write-ups' way (heapsight.fmt has the IEC ones) ---------------------------

MIB = fmt.MiB


def mib(n: float) -> str:
    """Bytes in MiB with one decimal and the unit, always MiB so figures line up: 1,234.5 MiB."""
    return f"{in_mib(n)} MiB"


def in_mib(n: float) -> str:
    """Bytes in MiB with one decimal, for a cell whose column names the unit: 1,234.5."""
    return f"{n / MIB:,.1f}"


def size_label(n: int) -> str:
    """Block and target sizes in IEC units: 2 KiB, 20 KiB, 200 KiB, 2 MiB, 2 GiB (the
    write-ups' 2 KB ... 2 GB, which were powers of 1024)."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit:
            return f"{n / unit:g} {name}"
    return f"{n} B"
