"""What to do about memory a program held: for each pattern heapsight recognises, the
setting that lowers it and the change in the program's own code, and where that
knowledge comes from. A setting is put first only where the lab's `remedies` experiment
reproduces the pattern and checks the claim (heapsight lab remedies), or where `run
--verify` measured it on the program itself (verified()); the settings the lab shows not
to help are not offered first.

Measured when the rules were written (the program's own RSS after its work, bare): a C++
program whose 8 threads keep 1 in 500 strings (tests/data/advice/threads_cache.cc): glibc
141 MiB, MALLOC_ARENA_MAX=2 139, a fixed trim threshold 141, jemalloc returning pages at
once 10, malloc_trim(0) after the work 4; the lab's C version (blocks kept where they were
allocated): 126, 120, 126, 68, 24. 480k Python objects, 1 in 200 kept
(tests/data/advice/service.py): pymalloc 144 MiB, PYTHONMALLOC=malloc 167,
PYTHONMALLOC=malloc with jemalloc returning pages at once 73 (the lab's: 45),
PYTHONMALLOC=malloc and malloc_trim(0) after the drop 24."""

from __future__ import annotations

import os
import re
import shlex

from heapsight.dataclass import dataclass
from heapsight.allocators import ALLOCATORS, PRESET, library_for
from heapsight.fmt import human
from heapsight.moments import TITLE

LAB = "heapsight lab remedies"
# Below this much memory kept, another allocator's own start outweighs what it returns: a
# small churn that kept 2.6 MiB under glibc ended at 3.9 MiB bare, 6.0 MiB under jemalloc
# returning pages at once; the lab's patterns keep 120-140 MiB.
PATTERN_MIN_BYTES = 32 << 20


@dataclass(frozen=True)
class Pattern:
    name: str        # how heapsight calls it, in words
    preset: str      # the compare preset (allocators.PRESETS) that lowers it
    effect: str      # what the lab's claim says, in words
    code: str        # the change in the program's own code
    code_why: str
    not_first: tuple = ()  # settings the lab shows lowering it by less than 30%


PATTERNS = {
    "thread-arenas": Pattern(
        "threads keeping a few long-lived blocks across glibc's arenas", "jemalloc-eager",
        "the lab: lowers this pattern's RSS by 30% or more, at more time",
        "malloc_trim(0);",
        "in the program, after the work that freed it (#include <malloc.h>): glibc then "
        "returns the free pages of every arena",
        ("glibc-arena2", "glibc-trim128k", "glibc-mmap128k")),
    "pymalloc": Pattern(
        "pymalloc arenas pinned by the objects that survive", "python-malloc-jemalloc-eager",
        "the lab: lowers this pattern's RSS by 30% or more; PYTHONMALLOC=malloc alone does "
        "not",
        'ctypes.CDLL("libc.so.6").malloc_trim(0)',
        "in the script, after the drop, run with PYTHONMALLOC=malloc: glibc then returns the "
        "freed objects' pages",
        ("python-malloc",)),
}


def setting(preset: str) -> str:
    """A preset's environment as a shell prefix, its allocator's library preloaded (named
    even where it is not installed: missing() says how to install it)."""
    cfg = PRESET[preset]
    a = ALLOCATORS.get(cfg.allocator)
    lib = cfg.library or (a.library if a else None)
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in cfg.env.items())
    return " ".join(x for x in ((f"LD_PRELOAD={lib}" if lib else ""), env) if x)


def allocator_suggestions(allocator: str, cmd: str, lang: str = "c") -> tuple:
    """Against retention under another allocator than glibc: its setting that returns freed
    pages sooner (the allocator's documented setting, not a lab claim), the release call in
    the program's code (C: an interpreted program cannot call it as written), and the
    measurement of the setting on this program."""
    a = ALLOCATORS.get(allocator)
    if a is None or not a.returns_preset:
        return ()
    cfg = PRESET[a.returns_preset]
    return (f"{setting(a.returns_preset)} heapsight run -- {cmd}   # {cfg.about}"
            f"{missing(a.returns_preset)}",
            *((a.release_code,) if lang == "c" else ()),
            f"heapsight run --verify -- {cmd}   # measures the setting on this program at the "
            "moment that matters")


def missing(preset: str) -> str:
    """'; apt-get install P' when the preset's library is not installed here, else ''."""
    cfg = PRESET[preset]
    _, err = library_for(cfg)
    a = ALLOCATORS.get(cfg.allocator)
    return f"; apt-get install {a.package}" if err and a and a.package else ""


# the release in the program's own language, where the pattern's code change is C's
IN_LANGUAGE = {
    "python": ('ctypes.CDLL("libc.so.6").malloc_trim(0)',
               "in the script, after the work that freed it: glibc then returns the free "
               "pages of every arena"),
    "perl": ("heapsight attach PID --trim",
             "for the running service: calls malloc_trim(0) in it and measures what it gave "
             "back (Perl has no call of its own)"),
}


def language(command: list) -> str:
    """"python", "perl" or "c": which language the program's code change is written in."""
    name = os.path.basename(str(command[0])) if command else ""
    return next((lang for lang in ("python", "perl") if re.match(rf"^{lang}[0-9.]*$", name)), "c")


def suggestions(pattern: str, cmd: str, lang: str = "c") -> tuple:
    """The pattern's commands, the lab-backed setting first: the setting under heapsight,
    the code change (in the program's language), the measurement on this program, compare,
    then the settings the lab shows doing little for the pattern."""
    p = PATTERNS[pattern]
    first = (f"{setting(p.preset)} heapsight run -- {cmd}   # {PRESET[p.preset].about}: "
             f"{p.effect} ({LAB}{missing(p.preset)})")
    weaker = tuple(f"{setting(n)} heapsight run -- {cmd}   # {PRESET[n].about}: the lab: "
                   "less than 30% for this pattern" for n in p.not_first)
    code, why = (p.code, p.code_why) if pattern == "pymalloc" or lang == "c" else IN_LANGUAGE[lang]
    return (first,
            f"{code}   # {why}",
            f"heapsight run --verify -- {cmd}   # measures these settings on this program "
            "at the moment that matters",
            f"heapsight compare -- {cmd}   # every allocator and setting side by side") + weaker


# ---------------------------------------------------------------- the program's settings

def settings_in(env: dict) -> dict:
    """The allocator settings already in the program's environment: {name: value} for
    glibc's tunables (glibc.malloc.X, and the MALLOC_*_ environment variables), PYTHONMALLOC,
    MALLOC_CONF, TCMALLOC_* and MIMALLOC_*, and the allocator preloaded (LD_PRELOAD's
    allocator library)."""
    out = {}
    for item in (env.get("GLIBC_TUNABLES") or "").split(":"):
        k, _, v = item.partition("=")
        if k.startswith("glibc.malloc.") and v:
            out[k.removeprefix("glibc.malloc.")] = v
    for var, name in (("MALLOC_ARENA_MAX", "arena_max"), ("MALLOC_TRIM_THRESHOLD_", "trim_threshold"),
                      ("MALLOC_MMAP_THRESHOLD_", "mmap_threshold"), ("MALLOC_TOP_PAD_", "top_pad")):
        if env.get(var):
            out.setdefault(name, env[var])
    for var in ("PYTHONMALLOC", "MALLOC_CONF"):
        if env.get(var):
            out[var] = env[var]
    # the other allocators' own variables (tcmalloc's, mimalloc's): compared by value
    for var, value in env.items():
        if var.startswith(("TCMALLOC_", "MIMALLOC_")) and value:
            out[var] = value
    if re.search(r"lib(jemalloc|tcmalloc|mimalloc)", env.get("LD_PRELOAD") or ""):
        out["LD_PRELOAD"] = env["LD_PRELOAD"]
    return out


def dynamic_threshold_off(settings: dict) -> bool:
    """Whether glibc's dynamic mmap threshold is off: setting any of the mmap threshold,
    the trim threshold, the top pad or mmap_max fixes it (mallopt(3))."""
    return any(k in settings for k in ("mmap_threshold", "trim_threshold", "top_pad", "mmap_max"))


def applied(suggestion: str, settings: dict) -> bool:
    """Whether a suggested setting is already in the program's environment (settings:
    settings_in's): each setting it makes is there, a glibc tunable at any value, an
    allocator's library preloaded, PYTHONMALLOC and MALLOC_CONF alike."""
    wanted = settings_in(env_of(suggestion) or {})

    def has(k: str, v: str) -> bool:
        if k not in settings:
            return False
        if k == "LD_PRELOAD":
            return all(lib in settings[k] for lib in v.split(":") if lib)
        return settings[k] == v if k in ("PYTHONMALLOC", "MALLOC_CONF") or \
            k.startswith(("TCMALLOC_", "MIMALLOC_")) else True
    return bool(wanted) and all(has(k, v) for k, v in wanted.items())


# ---------------------------------------------------------------- measured: run --verify

def env_of(suggestion: str) -> dict | None:
    """The environment a suggested `... heapsight run -- CMD` sets, {} for none; None when
    the suggestion is not a setting (a code change, another command)."""
    head, sep, rest = suggestion.partition(" heapsight run ")
    if not sep or "--verify" in (" " + rest).split(" -- ", 1)[0].split():   # run's options
        return None
    try:
        words = shlex.split(head)
    except ValueError:
        return None
    env = {}
    for w in words:
        k, eq, v = w.partition("=")
        if not eq or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", k):
            return None
        env[k] = v
    return env or None


def annotate(suggestion: str, words: str) -> str:
    """The suggestion with its comment replaced by what was measured."""
    return suggestion.split("   # ", 1)[0] + f"   # {words}"


def effect(r: dict, moment: str) -> str:
    """A measured setting's change and cost: "-50% held RSS (46.0 MiB where the run without
    it held), +38% time"."""
    figure = (f"{human(r['rss_bytes'])} where the run without it held" if r.get("stretch")
              else human(r["rss_bytes"]))
    return (f"{r['change'] * 100:+.0f}% {TITLE.get(moment, moment)} RSS ({figure}), "
            f"{r['time_change'] * 100:+.0f}% time")
