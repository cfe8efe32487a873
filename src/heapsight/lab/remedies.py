"""remedies: two patterns that keep memory resident after free(), each run under the settings
a remedy could suggest, and which of them lower the RSS kept. A remedy rule ("for this
pattern, this setting lowers the memory; these do not") may be stated only where a claim
here checks it.

  threads   8 threads allocate in waves and keep 1 block in 500 in a shared cache
            (the program hs-lab-remedies, lab/remedies.c)
  pymalloc  CPython objects of which every 200th survives the drop of the others
            (the script hs-lab-remedies-pymalloc.py, lab/remedies_pymalloc.py)

Each run is bare (no heapsight preload): the program reads its own RSS from
/proc/self/statm after the work, and again after malloc_trim(0) when asked to call it.
The thresholds and the claims' ids are for the rules to import:
    from heapsight.lab.remedies import LOWERS, DOES_NOT_LOWER, CLAIM_IDS
"""

from __future__ import annotations

import statistics
import sys

from heapsight.allocators import PRESET
from heapsight.errors import HeapsightError
from heapsight.lab import common
from heapsight.lab.common import DEPENDS, FAILS, HOLDS, Claim, Table, in_mib, mib

# A remedy "lowers the RSS kept" when it takes at least this share off the default's.
LOWERS = 0.30
# A setting "does not lower it" when it takes less than this share off (or adds to it).
DOES_NOT_LOWER = 0.10

# The claims by a stable id (the rules refer to them so), in the order claims() gives them.
CLAIM_IDS = {
    "threads-jemalloc-eager":
        f"threads keeping a few long-lived blocks: jemalloc returning freed pages at once "
        f"lowers the RSS kept by {LOWERS:.0%} or more",
    "threads-malloc-trim":
        f"threads keeping a few long-lived blocks: malloc_trim(0) after the work lowers the "
        f"RSS kept by {LOWERS:.0%} or more",
    "threads-glibc-tunables":
        f"threads keeping a few long-lived blocks: MALLOC_ARENA_MAX=2, a fixed trim threshold "
        f"and a fixed mmap threshold each lower the RSS kept by less than {LOWERS:.0%}",
    "pymalloc-python-malloc":
        f"pymalloc arenas pinned by survivors: PYTHONMALLOC=malloc alone does not lower the "
        f"RSS kept (by {DOES_NOT_LOWER:.0%} or more)",
    "pymalloc-jemalloc-eager":
        f"pymalloc arenas pinned by survivors: PYTHONMALLOC=malloc with jemalloc returning "
        f"freed pages at once lowers the RSS kept by {LOWERS:.0%} or more",
    "pymalloc-malloc-trim":
        f"pymalloc arenas pinned by survivors: PYTHONMALLOC=malloc and malloc_trim(0) after "
        f"the drop lower the RSS kept by {LOWERS:.0%} or more",
}

NAME = "remedies"
TITLE = "which settings lower the RSS two retention patterns keep after free(), and which do not"
# seconds of its --quick run (between a quiet machine and one at a load of 4) and of its
# full run (at a load of 3 to 4) on 2 cores, from bench/lab-time: the lab's estimate at the
# start, and each experiment's share of the time left
QUICK_SECONDS = 10
FULL_SECONDS = 24
SOURCE = "heapsight's remedy rules"
ABOUT = ("Two patterns that keep memory resident after free(), each run bare (no heapsight "
         "preload) under the settings a remedy could suggest, each setting as its environment "
         "and its allocator library in LD_PRELOAD. threads: 8 threads each allocate 6 waves of "
         "60,000 blocks of 100-400 bytes, write them, and at the end of each wave free all but "
         "1 in 500, which go to a cache shared by all threads behind a mutex; once the threads "
         "are joined the program reads its RSS (and, in the malloc_trim row, calls "
         "malloc_trim(0) and reads it again). pymalloc: python3 builds 480,000 objects of a "
         "class with __slots__ (an int, a short str, a 2-item list), keeps every 200th in a "
         "list and drops the rest, then reads its RSS (and, in the malloc_trim row, calls "
         "malloc_trim(0) through ctypes and reads it again). RSS kept = the process's RSS at "
         "that moment, from /proc/self/statm; wall time = the work (and the trim). Each row is "
         "the median of 3 runs (1 with --quick), each in a fresh process.")

REPEATS = {True: 1, False: 3}   # quick, full

THREADS_PROGRAM = "hs-lab-remedies"
PYMALLOC_SCRIPT = "hs-lab-remedies-pymalloc.py"
THREADS_ARGS = {"threads": 8, "waves": 6, "per-wave": 60_000, "min": 100, "max": 400,
                "keep-every": 500}
PYMALLOC_ARGS = {"objects": 480_000, "keep-every": 200}

# Each pattern's rows: (configuration, whether malloc_trim(0) is called after the work).
# The first row is the default every other row is compared with.
THREADS_ROWS = (("glibc", False), ("glibc-arena2", False), ("glibc-trim128k", False),
                ("glibc-mmap128k", False), ("jemalloc-eager", False), ("glibc", True))
PYMALLOC_ROWS = (("glibc", False), ("python-malloc", False),
                 ("python-malloc-jemalloc-eager", False), ("python-malloc", True))
CONFIGS = tuple(dict.fromkeys(n for n, _ in THREADS_ROWS + PYMALLOC_ROWS))

PATTERNS = {
    "threads": "threads keeping a few long-lived blocks",
    "pymalloc": "pymalloc arenas pinned by survivors",
}

# What a row sets, in words short enough for an 80-column table (the note names the presets).
LABELS = {
    ("threads", "glibc", False): "glibc (default)",
    ("threads", "glibc-arena2", False): "MALLOC_ARENA_MAX=2",
    ("threads", "glibc-trim128k", False): "trim_threshold=128 KiB",
    ("threads", "glibc-mmap128k", False): "mmap_threshold=128 KiB",
    ("threads", "jemalloc-eager", False): "jemalloc, decay 0",
    ("threads", "glibc", True): "glibc + malloc_trim(0)",
    ("pymalloc", "glibc", False): "pymalloc (python3 default)",
    ("pymalloc", "python-malloc", False): "PYTHONMALLOC=malloc",
    ("pymalloc", "python-malloc-jemalloc-eager", False): "PYTHONMALLOC=malloc + jemalloc, decay 0",
    ("pymalloc", "python-malloc", True): "PYTHONMALLOC=malloc + malloc_trim(0)",
}


def row_id(pattern: str, config: str, trim: bool) -> str:
    return f"{pattern}/{config}" + ("+trim" if trim else "")


def rows_for(ctx: common.Context, pattern: str) -> list:
    """(Config, trim) of each row of one pattern: the experiment's own rows, or with
    --configs each chosen configuration, plus malloc_trim(0) on the first glibc one (for
    pymalloc, the first glibc one with PYTHONMALLOC=malloc)."""
    if ctx.configs is None:
        return [(PRESET[n], t) for n, t in (THREADS_ROWS if pattern == "threads" else PYMALLOC_ROWS)]
    # a configuration made for CPython programs only does not apply to the C program
    cfgs = [c for c in ctx.configs if pattern == "pymalloc" or c.runtime is None]
    rows = [(c, False) for c in cfgs]
    trimmable = [c for c in cfgs if c.allocator == "glibc" and not c.library
                 and (pattern == "threads" or c.env.get("PYTHONMALLOC") == "malloc")]
    if trimmable:
        rows.append((trimmable[0], True))
    return rows


def argv_for(pattern: str, trim: bool) -> list:
    if pattern == "threads":
        argv = [common.lab_program(THREADS_PROGRAM)]
        args = THREADS_ARGS
    else:
        argv = [sys.executable, common.lab_program(PYMALLOC_SCRIPT)]
        args = PYMALLOC_ARGS
    for k, v in args.items():
        argv += [f"--{k}", str(v)]
    return argv + ["--trim", "1" if trim else "0"]


# ---------------------------------------------------------------- collect

def collect(ctx: common.Context) -> dict:
    quick = bool(ctx.quick)
    repeats = REPEATS[quick]
    data = {"quick": quick, "cores": common.cores(), "repeats": repeats,
            "python": sys.version.split()[0],
            "patterns": [{"id": "threads", "title": PATTERNS["threads"],
                          "args": dict(THREADS_ARGS)},
                         {"id": "pymalloc", "title": PATTERNS["pymalloc"],
                          "args": dict(PYMALLOC_ARGS)}],
            "configs": []}
    plan = []   # (entry, Config, argv) of every row that can run
    for pattern in PATTERNS:
        for cfg, trim in rows_for(ctx, pattern):
            entry = {"name": row_id(pattern, cfg.name, trim), "pattern": pattern,
                     "config": cfg.name, "allocator": cfg.allocator, "env": dict(cfg.env),
                     "trim": trim,
                     "label": LABELS.get((pattern, cfg.name, trim),
                                         cfg.name + (" + malloc_trim(0)" if trim else "")),
                     "errors": [], "runs": []}
            data["configs"].append(entry)
            if not common.cannot_run(ctx, cfg, entry):
                plan.append((entry, cfg, argv_for(pattern, trim)))
    # the repeats go round the rows, so that a slow moment of the machine falls on all alike
    for rep in range(repeats):
        for entry, cfg, argv in plan:
            if entry["errors"]:
                continue
            ctx.say(f"remedies: {entry['pattern']}: {entry['label']}"
                    + (f", run {rep + 1} of {repeats}" if repeats > 1 else ""))
            try:
                lines = common.run_program(argv, cfg, timeout_s=ctx.timeout_s)
            except HeapsightError as e:
                entry["errors"].append(e.message)
                continue
            rec = next((x for x in lines if x.get("event") == "result"), None)
            if rec is None:
                entry["errors"].append("the program printed no result")
                continue
            wrong = common.wrong_allocator(cfg.allocator, rec.get("allocator"))
            if wrong:
                entry["errors"].append(wrong)
                continue
            entry["runs"].append({k: v for k, v in rec.items() if k != "event"})
    if not any(e["runs"] for e in data["configs"]):
        raise common.nothing_ran(data, "remedies row")
    return data


# ---------------------------------------------------------------- derived figures

def rows(data: dict, pattern: str) -> list:
    return [e for e in common.configs(data) if e.get("pattern") == pattern]


def row(data: dict, pattern: str, config: str, trim: bool = False) -> dict | None:
    """One row by its configuration, when it ran without error."""
    e = common.config(data, row_id(pattern, config, trim))
    return e if e and e.get("runs") and not e.get("errors") else None


def baseline(data: dict, pattern: str) -> dict | None:
    """The row every other is compared with: the default (glibc, no trim)."""
    return row(data, pattern, "glibc")


def kept(entry: dict) -> float:
    """The median RSS kept: after the work, or after the trim in a malloc_trim row."""
    return statistics.median(r["rss_trim"] if entry.get("trim") else r["rss_after"]
                             for r in entry["runs"])


def kept_range(entry: dict) -> tuple:
    vals = [r["rss_trim"] if entry.get("trim") else r["rss_after"] for r in entry["runs"]]
    return min(vals), max(vals)


def wall(entry: dict) -> float:
    """The median seconds of the work (and of the trim, in a malloc_trim row)."""
    return statistics.median(r["work_s"] + r.get("trim_s", 0) for r in entry["runs"])


def lowered(base: dict, other: dict) -> float:
    """The share of the default's RSS kept that a row takes off (negative: it adds)."""
    b = kept(base)
    return (b - kept(other)) / b if b else 0.0


def change(new: float, old: float) -> str:
    """'-46%', '+12%', or '0%' when it rounds to nothing."""
    if not old:
        return "n/a"
    share = (new - old) / old
    return "0%" if abs(share) < 0.005 else f"{share:+.0%}"


def errors_of(data: dict, pattern: str) -> str:
    errs = [f"{e['label']}: {'; '.join(dict.fromkeys(e['errors']))}"
            for e in rows(data, pattern) if e.get("errors")]
    return ("errors: " + "; ".join(errs)) if errs else ""


# ---------------------------------------------------------------- tables

def pattern_table(data: dict, pattern: str) -> Table:
    base = baseline(data, pattern)
    columns = ["setting", "RSS kept (MiB)", "change", "wall time (s)", "change"]
    out = []
    for e in rows(data, pattern):
        if not e.get("runs") or e.get("errors"):
            err = "; ".join(dict.fromkeys(e.get("errors") or ["no run"]))
            out.append([e["label"], f"error: {err}", "n/a", "n/a", "n/a"])
            continue
        same = base is None or e is base
        out.append([e["label"], in_mib(kept(e)),
                    "(default)" if e is base else "n/a" if same else change(kept(e), kept(base)),
                    f"{wall(e):.2f}",
                    "(default)" if e is base else "n/a" if same else change(wall(e), wall(base))])
    args = next((p["args"] for p in data.get("patterns", []) if p["id"] == pattern), {})
    if pattern == "threads":
        what = (f"{args.get('threads')} threads x {args.get('waves')} waves x "
                f"{args.get('per-wave'):,} blocks of {args.get('min')}-{args.get('max')} bytes, "
                f"1 in {args.get('keep-every')} kept in a shared cache")
    else:
        what = (f"python {data.get('python', '?')}: {args.get('objects'):,} objects, every "
                f"{args.get('keep-every')}th kept")
    note = (f"{what}. RSS kept: the process's RSS once the work is done (after malloc_trim(0) "
            f"in its row), median of {data.get('repeats', '?')} run(s); change: against the "
            "default row. Wall time: the work (and the trim). The rows' presets (heapsight "
            "compare --list): " + ", ".join(e["config"] + (" + trim" if e.get("trim") else "")
                                            for e in rows(data, pattern)) + ".")
    if errors_of(data, pattern):
        note += " " + errors_of(data, pattern)
    return Table(f"{PATTERNS[pattern]}: RSS kept and wall time per configuration",
                 columns, out, note)


def tables(data: dict) -> list:
    return [pattern_table(data, p) for p in PATTERNS if rows(data, p)]


# ---------------------------------------------------------------- claims

claim = common.claim_for(SOURCE)


def missing(cid: str, data: dict, pattern: str, needed: list) -> Claim:
    """The DEPENDS verdict of a claim whose rows did not run."""
    names = ", ".join(needed)
    return claim(CLAIM_IDS[cid], DEPENDS,
                 (f"not measured: {names} did not run here. " + errors_of(data, pattern)).strip(),
                 f"a run of {names}")


def versus(base: dict, e: dict) -> str:
    """'jemalloc, ...: 67.8 MiB, 46% less than the default's 125.6 MiB'."""
    share = lowered(base, e)
    how = ("the same" if abs(share) < 0.005 else f"{share:.0%} less" if share > 0
           else f"{-share:.0%} more")
    return f"{e['label']}: {mib(kept(e))}, {how}"


def one_remedy(data: dict, cid: str, pattern: str, config: str, trim: bool, at_least: bool,
               share: float, why: str) -> Claim:
    """A claim that one row lowers the default's RSS kept by share or more (at_least), or by
    less than share (not at_least)."""
    base, e = baseline(data, pattern), row(data, pattern, config, trim)
    if base is None or e is None:
        need = [LABELS[(pattern, "glibc", False)]] * (base is None) \
            + [LABELS.get((pattern, config, trim), config)] * (e is None)
        return missing(cid, data, pattern, need)
    got = lowered(base, e)
    ok = got >= share if at_least else got < share
    claimed = f"(the claim: {'at least' if at_least else 'less than'} {share:.0%} less)"
    evidence = (f"{base['label']} kept {mib(kept(base))}; {versus(base, e)} {claimed}. "
                f"{medians(base, e)} {why}")
    figure = f"{versus(base, e)} than the default's {mib(kept(base))} {claimed}"
    return claim(CLAIM_IDS[cid], HOLDS if ok else FAILS, evidence, figure=figure)


def medians(*entries) -> str:
    n = sorted({len(e["runs"]) for e in entries})
    return (f"Medians of {n[0]} run(s) each." if len(n) == 1
            else f"Medians of {' to '.join(map(str, (n[0], n[-1])))} runs.")


def survivors(data: dict, pattern: str) -> str:
    base = baseline(data, pattern)
    if base is None:
        return ""
    r = base["runs"][0]
    if pattern == "threads":
        return (f"{r['kept_blocks']:,} blocks ({mib(r['kept_bytes'])}) survive the waves, "
                f"about one every {r['keep_every']} among the freed ones")
    return f"{r['kept_objects']:,} objects survive, one every {r['keep_every']}"


def claim_threads_jemalloc(data: dict) -> Claim:
    return one_remedy(
        data, "threads-jemalloc-eager", "threads", "jemalloc-eager", False, True, LOWERS,
        f"{survivors(data, 'threads')}. jemalloc with dirty and muzzy decay 0 purges each slab "
        "that empties at once; only the slabs a survivor sits in stay resident.")


def claim_threads_trim(data: dict) -> Claim:
    return one_remedy(
        data, "threads-malloc-trim", "threads", "glibc", True, True, LOWERS,
        f"{survivors(data, 'threads')}. glibc's free() gives back only the top of a heap, "
        "which a survivor above the freed chunks holds in place; malloc_trim(0) also "
        "madvises the whole free pages inside every arena, leaving the pages survivors are "
        "on.")


def claim_threads_tunables(data: dict) -> Claim:
    cid, pattern = "threads-glibc-tunables", "threads"
    names = ("glibc-arena2", "glibc-trim128k", "glibc-mmap128k")
    base = baseline(data, pattern)
    got = {n: row(data, pattern, n) for n in names}
    absent = [LABELS[(pattern, n, False)] for n in names if got[n] is None]
    if base is None:
        return missing(cid, data, pattern, [LABELS[(pattern, "glibc", False)]] + absent)
    ran = {n: e for n, e in got.items() if e is not None}
    if not ran:
        return missing(cid, data, pattern, absent)
    below = [e for e in ran.values() if lowered(base, e) < LOWERS]
    above = [e for e in ran.values() if lowered(base, e) >= LOWERS]
    figure = (f"{base['label']} kept {mib(kept(base))}; "
              + "; ".join(versus(base, e) for e in ran.values())
              + f" (the claim: each less than {LOWERS:.0%} less)")
    evidence = (f"{figure}. {medians(base, *ran.values())} "
                f"{survivors(data, pattern)}. The blocks are far below any mmap threshold, "
                "and a survivor above the freed chunks keeps every heap top from being "
                "trimmed, whatever the threshold; two arenas instead of one per thread only put "
                "more threads' survivors among the same freed chunks.")
    if absent:
        evidence += " Not measured: " + ", ".join(absent) + ". " + errors_of(data, pattern)
        verdict = DEPENDS if not above else FAILS
        on = "the settings not measured: " + ", ".join(absent)
    else:
        verdict = common.verdict_split(below, above)
        on = "the setting: " + ", ".join(e["label"] for e in above) + f" lowered it by " \
             f"{LOWERS:.0%} or more"
    return claim(CLAIM_IDS[cid], verdict, evidence.strip(), on, figure=figure)


def claim_pymalloc_python_malloc(data: dict) -> Claim:
    return one_remedy(
        data, "pymalloc-python-malloc", "pymalloc", "python-malloc", False, False,
        DOES_NOT_LOWER,
        f"{survivors(data, 'pymalloc')}. pymalloc gives an arena (1 MiB on 64-bit CPython "
        "3.10 and later) back only when all its pools are empty, and survivors leave one in "
        "every arena; under PYTHONMALLOC=malloc glibc keeps the freed chunks around the "
        "survivors instead, each object with its 8-byte header and 16-byte rounding.")


def claim_pymalloc_jemalloc(data: dict) -> Claim:
    return one_remedy(
        data, "pymalloc-jemalloc-eager", "pymalloc", "python-malloc-jemalloc-eager", False,
        True, LOWERS,
        f"{survivors(data, 'pymalloc')}. With the objects in jemalloc's slabs (a few pages "
        "each) instead of 1 MiB arenas, each slab that empties is purged at once.")


def claim_pymalloc_trim(data: dict) -> Claim:
    return one_remedy(
        data, "pymalloc-malloc-trim", "pymalloc", "python-malloc", True, True, LOWERS,
        f"{survivors(data, 'pymalloc')}. malloc_trim(0) madvises the whole free pages "
        "between the survivors' chunks; under pymalloc (the default) it could not reach the "
        "arenas, which pymalloc maps itself.")


CLAIMS = {"threads-jemalloc-eager": claim_threads_jemalloc,
          "threads-malloc-trim": claim_threads_trim,
          "threads-glibc-tunables": claim_threads_tunables,
          "pymalloc-python-malloc": claim_pymalloc_python_malloc,
          "pymalloc-jemalloc-eager": claim_pymalloc_jemalloc,
          "pymalloc-malloc-trim": claim_pymalloc_trim}
assert list(CLAIMS) == list(CLAIM_IDS)


def claims(data: dict) -> list:
    return [judge(data) for judge in CLAIMS.values()]


def claim_by_id(data: dict, cid: str) -> Claim:
    """One claim, judged on data, by its id in CLAIM_IDS."""
    return CLAIMS[cid](data)


# ---------------------------------------------------------------- charts

def charts(data: dict) -> list:
    out = []
    for pattern in PATTERNS:
        ran = [e for e in rows(data, pattern) if e.get("runs") and not e.get("errors")]
        if not ran:
            continue
        lo_hi = [kept_range(e) for e in ran]
        base = baseline(data, pattern)
        best = min(ran, key=kept)
        note = (f"{best['label']} kept the least: {mib(kept(best))}"
                + (f", against {mib(kept(base))} by default." if base and best is not base
                   else "."))
        out.append({"id": f"remedies-{pattern}", "title": f"{PATTERNS[pattern]}: RSS kept",
                    "kind": "bar",
                    "x": {"label": "configuration", "unit": "", "log": False,
                          "categories": [e["label"] for e in ran]},
                    "y": {"label": "RSS kept after the work", "unit": "bytes", "log": False},
                    "series": [{"name": "RSS kept (median)", "y": [kept(e) for e in ran],
                                "lo": [a for a, _ in lo_hi], "hi": [b for _, b in lo_hi]}],
                    "note": note})
    return out
