"""perl: Perl scalars, arrays and hashes built inside a block: what leaving the block gives
back to the OS, where the 128 KiB line falls in characters, and what other allocators do."""

from __future__ import annotations

import re
import shutil
import subprocess

from heapsight import fmt
from heapsight.allocators import PRESET
from heapsight.errors import HeapsightError
from heapsight.lab import common
from heapsight.lab.common import DEPENDS, FAILS, HOLDS, Claim, Table, config, in_mib

NAME = "perl"
TITLE = "Perl scalars, arrays and hashes: what leaving a block gives back to the OS"
# seconds of its --quick run (between a quiet machine and one at a load of 4) and of its
# full run (at a load of 3 to 4) on 2 cores, from bench/lab-time: the lab's estimate at the
# start, and each experiment's share of the time left
QUICK_SECONDS = 21
FULL_SECONDS = 190
SOURCE = "free is not always a release"
ABOUT = ("Runs the write-up's test cases, each in a fresh perl process (the write-up ran them "
         "one after another in one process, where each case inherits the heap the previous "
         "ones left): the case's code, compiled by a string eval so its lexicals and folded "
         "constants belong to the case, builds a string, an array or hashes; VmRSS is read "
         "before, at the end of the block (everything alive) and after leaving it (everything "
         "freed). The code is the write-up's own, including its \"x\".100, which is a "
         "concatenation (the 4-character value \"x100\"), not a 100-character repetition; case "
         "11 has real 100-character random values. Case 12 is case 2 written as a plain "
         "block: Perl keeps a lexical scalar's string buffer for the block's next entry, so "
         "nothing is freed at all. Perl on Debian uses the system malloc (usemymalloc=n), so "
         "the allocators are swapped with LD_PRELOAD. Then, under glibc, a binary search with "
         "fresh processes locates the shortest string whose blocks go back on leaving the "
         "block: Perl asks malloc for the characters plus a NUL and a copy-on-write count "
         "byte, glibc adds its chunk header and rounds up, and glibc serves chunks of 128 KiB "
         "and more with mmap (its mmap threshold, not M_TRIM_THRESHOLD as the write-up says). "
         "That threshold is dynamic: freeing an mmapped block raises it to that block's size, "
         "so the same array built again comes from the heap; a repeated probe shows it.")
CONFIGS = ("glibc", "glibc-mmap128k", "jemalloc", "jemalloc-eager", "mimalloc")

CASES = tuple(range(1, 13))
WRITEUP_CASES = tuple(range(1, 12))   # case 12 is this lab's own
# Quick mode shrinks only the slow cases' loop counts (a string's or a chunk's size never
# changes); the fast ones run at full size because their outcome depends on their size:
# case 3's 20 M-char string at 0.2 stays below glibc's 32 MiB mmap-threshold ceiling and is
# kept, where the write-up's 100 M one is not, and case 10's heap layout changes with the
# number of chunks.
# Case 11 (40 M random characters at 0.2, two thirds of the lab's time) runs at 0.05: 25
# rounds of frozen chunks, 12 MiB, still far above the RSS noise; cases 7 and 8 (the shared
# keys) at 0.1: 100,000 keys, a saving of 16-22 % against the claim's 5 %.
QUICK_SCALE = {6: 0.2, 7: 0.1, 8: 0.1, 9: 0.2, 11: 0.05}
# Quick: the configurations after the first run only the cases a claim compares them on
# (2 and 6: what other allocators return; 7 and 8: shared keys; 10 and 11: chunks); the
# first (glibc) runs every case, for the write-up's table and the threshold's evidence.
QUICK_OTHER_CASES = (2, 6, 7, 8, 10, 11)   # = CLAIM_CASES

# Each case in a few words, for the table that compares the configurations (the per-
# configuration tables give the code).
SHORT = {1: "nothing", 2: "100 M, 100 at a time", 3: "100 M with x", 4: "1000 x 128 KiB - 14",
         5: "1000 x 128 KiB - 13", 6: "hash of 1 M keys", 7: "2 hashes, 1 M each",
         8: "2 hashes, same keys", 9: "2 hashes, 1000 x 1000", 10: "frozen, 4-char values",
         11: "frozen, random values", 12: "case 2, plain block"}
# The cases a claim compares the configurations on: the rows the terminal shows of that table.
CLAIM_CASES = (2, 6, 7, 8, 10, 11)

# The write-up's "allocated memory size" inside and after each block (MB, a 32-bit Perl of
# 2018), printed next to ours for comparison only: no verdict reads them.
WRITEUP_MB = {1: (9.90, 9.90), 2: (116.96, 116.96), 3: (200.65, 105.28), 4: (135.09, 135.09),
              5: (138.95, 9.91), 6: (108.93, 108.93), 7: (209.38, 209.51), 8: (167.23, 167.36),
              9: (209.38, 209.51), 10: (44.55, 42.57), 11: (229.71, 10.96)}

# "Gave back" / "kept": the share of what the block added (inside - before) that leaving it
# returned (inside - after). Perl's own small allocations (array slots, hash buckets, pad
# entries) stay in the heap in every case, so "gave back" cannot mean 100 %: at least 3/4
# back counts as given back, at most 1/4 as kept, in between as partly.
GAVE_BACK_FRAC = 0.75
KEPT_FRAC = 0.25
# Cases 8 vs 7: sharing the keys must save at least this share of case 7's growth to count
# (run-to-run noise of these RSS figures is well under 1 %).
SHARED_SAVING_MIN = 0.05
# Claim 5: another allocator returns (or keeps) more than glibc on a case when its RSS kept
# after the block differs from glibc's by more than this (a few MiB of Perl start-up and
# allocator bookkeeping differ between allocators anyway).
ALLOCATOR_NOISE = 4 * 1024 * 1024

KIB128 = 128 * 1024
PROBE_WINDOW = 64          # the search looks for the boundary in 128 KiB +- this many chars
PROBE_COUNT = 200          # strings per probe: about 25 MiB, far above RSS noise
WRITEUP_BOUNDARY = KIB128 - 13   # the write-up's case 5, its first length that went back
WRITEUP_PROBES = (KIB128 - 14, KIB128 - 13, KIB128)  # also shown in the probe table
REPEAT_LEN = 1_000_000     # the repeated probe: 1 M-char strings (far above 128 KiB, below
REPEAT_COUNT = 50          # glibc's 32 MiB threshold ceiling), 50 of them, built and freed
REPEAT_ROUNDS = 6          # this many times in one process
REPEAT_CONFIGS = ("glibc", "glibc-mmap128k")

# glibc on x86-64: a chunk is the request plus an 8-byte size header, rounded up to 16
# bytes (at least 32). The write-up's 32-bit glibc of the time: 4-byte header, 8 bytes.
GLIBC64 = (8, 16)
GLIBC32 = (4, 8)
PERL_EXTRA = 2   # Perl's string buffer: the characters, a NUL and the copy-on-write count

claim = common.claim_for(SOURCE)


def chunk_size(request: int, header_align=GLIBC64) -> int:
    header, align = header_align
    return max(2 * align, (request + header + align - 1) // align * align)


def predicted_boundary(header_align, threshold: int = KIB128) -> int:
    """Shortest string whose malloc chunk (characters + PERL_EXTRA, plus glibc's header and
    rounding) reaches the mmap threshold."""
    n = 1
    while chunk_size(n + PERL_EXTRA, header_align) < threshold:
        n += 1
    return n


# --- collecting -------------------------------------------------------------------------

def perl_facts(perl: str) -> dict:
    def var(name):
        p = subprocess.run([perl, f"-V:{name}"], capture_output=True, text=True, timeout=30)
        m = re.search(rf"{name}='([^']*)'", p.stdout)
        return m.group(1) if m else None
    return {"path": perl, "version": var("version"), "usemymalloc": var("usemymalloc"),
            "archname": var("archname")}


def check_answer(rec: dict, cfg) -> str | None:
    return common.wrong_allocator(cfg.allocator, rec.get("allocator"))


def mem3(rec: dict) -> dict:
    return {k: {"rss": rec[k]["rss"], "vm": rec[k]["vm"]} for k in ("before", "inside", "after")}


def run_case(ctx, perl: str, script: str, cfg, case: int) -> dict:
    scale = QUICK_SCALE.get(case, 1.0) if ctx.quick else 1.0
    ctx.say(f"{cfg.name}: case {case}" + (f" at scale {scale:g}" if scale != 1.0 else ""))
    argv = [perl, script, "--case", str(case), "--scale", f"{scale:g}"]
    try:
        out = common.run_program(argv, cfg, timeout_s=ctx.timeout_s)
    except HeapsightError as e:
        return {"error": e.message}
    rec = next((x for x in out if x.get("case") == case), None)
    if rec is None:
        return {"error": "the program printed no result"}
    err = check_answer(rec, cfg)
    if err:
        return {"error": err}
    return {"error": None, "title": rec["title"], "code": rec["code"], "scale": rec["scale"],
            "count": rec["count"], "facts": rec.get("facts") or {}, **mem3(rec)}


def probe(say, perl: str, script: str, cfg, length: int, count: int = PROBE_COUNT,
          rounds: int = 1, timeout_s: float = 300.0) -> list:
    """Runs the boundary probe in a fresh perl: count strings of length characters in an
    array inside a block, rounds times. One record per round (before/inside/after, Perl's
    buffer size svlen)."""
    say(f"{cfg.name}: probe, {count} strings of {length:,} characters"
        + (f", {rounds} rounds" if rounds > 1 else ""))
    argv = [perl, script, "--probe", str(length), "--count", str(count), "--rounds", str(rounds)]
    out = common.run_program(argv, cfg, timeout_s=timeout_s)
    recs = [x for x in out if "probe" in x]
    if len(recs) != rounds:
        raise HeapsightError(f"the probe of {length} characters printed {len(recs)} of "
                             f"{rounds} results")
    err = check_answer(recs[0], cfg)
    if err:
        raise HeapsightError(err)
    return [{"len": length, "count": count, "round": r.get("round", 1), "svlen": r["svlen"],
             **mem3(r)} for r in recs]


def locate_boundary(say, perl: str, script: str, cfg, count: int = PROBE_COUNT,
                    timeout_s: float = 300.0) -> dict:
    """Binary search, one fresh process per probe, for the shortest length in 128 KiB +-
    PROBE_WINDOW whose strings go back to the OS on leaving the block."""
    runs = {}

    def returned(n: int) -> bool:
        if n not in runs:
            runs[n] = probe(say, perl, script, cfg, n, count, timeout_s=timeout_s)[0]
        return gave_back(runs[n]) >= GAVE_BACK_FRAC

    lo, hi = KIB128 - PROBE_WINDOW, KIB128 + PROBE_WINDOW
    result = {"config": cfg.name, "count": count, "lo": lo, "hi": hi, "boundary": None,
              "error": None}
    if returned(lo) or not returned(hi):
        result["error"] = (f"no boundary in {lo:,}..{hi:,} characters: {lo:,} "
                           f"{'gave back' if returned(lo) else 'kept'}, {hi:,} "
                           f"{'gave back' if returned(hi) else 'kept'}")
    else:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if returned(mid):
                hi = mid
            else:
                lo = mid
        result["boundary"] = hi
        for n in (hi - 1, hi):   # both sides, measured (already, by the search)
            returned(n)
    for n in WRITEUP_PROBES:
        returned(n)
    result["runs"] = [runs[n] for n in sorted(runs)]
    return result


def collect(ctx) -> dict:
    perl = shutil.which("perl")
    if not perl:
        raise HeapsightError("perl is not installed (apt-get install perl)")
    script = common.lab_program("hs-lab-perl.pl")
    data = {"perl": perl_facts(perl), "quick": ctx.quick, "configs": [], "probe": None,
            "repeat": {"len": REPEAT_LEN, "count": REPEAT_COUNT, "rounds": REPEAT_ROUNDS,
                       "configs": {}}}
    ran = 0
    for i, cfg in enumerate(ctx.configs_for(CONFIGS)):
        entry = {"name": cfg.name, "allocator": cfg.allocator, "env": dict(cfg.env),
                 "error": None, "cases": {}}
        data["configs"].append(entry)
        if common.cannot_run(ctx, cfg, entry):
            continue
        for case in (QUICK_OTHER_CASES if ctx.quick and i else CASES):
            rec = run_case(ctx, perl, script, cfg, case)
            entry["cases"][str(case)] = rec
            if rec["error"]:
                ctx.warn(f"{cfg.name}: case {case} failed: {rec['error']}")
                if not entry["cases"].keys() - {str(case)} and "answered" in rec["error"]:
                    entry["error"] = rec["error"]
                    break
            else:
                ran += 1
    glibc = PRESET["glibc"]
    try:
        data["probe"] = locate_boundary(ctx.say, perl, script, glibc, timeout_s=ctx.timeout_s)
        ran += 1
    except HeapsightError as e:
        data["probe"] = {"config": glibc.name, "boundary": None, "error": e.message, "runs": []}
    for name in REPEAT_CONFIGS:
        try:
            data["repeat"]["configs"][name] = {
                "error": None,
                "rounds": probe(ctx.say, perl, script, PRESET[name], REPEAT_LEN, REPEAT_COUNT,
                                REPEAT_ROUNDS, ctx.timeout_s)}
            ran += 1
        except HeapsightError as e:
            data["repeat"]["configs"][name] = {"error": e.message, "rounds": []}
    if ran == 0:
        errors = [e["error"] for e in data["configs"] if e["error"]]
        raise HeapsightError("nothing ran: " + "; ".join(errors or [data["probe"]["error"]]))
    return data


# --- reading the data back --------------------------------------------------------------

def grew(r: dict) -> int:
    return r["inside"]["rss"] - r["before"]["rss"]


def kept(r: dict) -> int:
    """RSS still there after leaving the block, above the start of the case."""
    return max(0, r["after"]["rss"] - r["before"]["rss"])


def gave_back(r: dict) -> float:
    """Share of the block's growth that leaving it gave back (0..1)."""
    g = grew(r)
    if g <= 0:
        return 0.0
    return min(1.0, max(0.0, (r["inside"]["rss"] - r["after"]["rss"]) / g))


def outcome(r: dict) -> str:
    f = gave_back(r)
    return "gave back" if f >= GAVE_BACK_FRAC else "kept" if f <= KEPT_FRAC else "partly"


def ok_cases(entry: dict) -> dict:
    """case number -> record, for the cases that ran under this configuration."""
    if not entry or entry.get("error"):
        return {}
    return {int(k): v for k, v in entry.get("cases", {}).items() if not v.get("error")}


def baseline(data: dict) -> dict | None:
    """The glibc run to compare with: the preset 'glibc', else any glibc one without env."""
    e = config(data, "glibc")
    if e and ok_cases(e):
        return e
    return next((e for e in common.configs(data) if e["allocator"] == "glibc"
                 and not e["env"] and ok_cases(e)), None)


def case_title(data: dict, case: int) -> str:
    for e in common.configs(data):
        r = e.get("cases", {}).get(str(case))
        if r and r.get("title"):
            return r["title"]
    return f"case {case}"


def tables(data: dict) -> list:
    out = []
    perl = data.get("perl") or {}
    for e in common.configs(data):
        if e.get("error"):
            continue
        rows = []
        is_base = e is baseline(data)
        for case in CASES:
            r = e["cases"].get(str(case))
            if r is None:
                continue
            if r.get("error"):
                row = [case, case_title(data, case), "error", "", r["error"]]
            else:
                row = [case, r["title"] + (f" (x{r['scale']:g})" if r["scale"] != 1 else ""),
                       in_mib(r["inside"]["rss"]), in_mib(r["after"]["rss"]),
                       f"{fmt.share(gave_back(r))} ({outcome(r)})"]
            if is_base:
                w = WRITEUP_MB.get(case)
                row += [f"{w[0]:.2f}", f"{w[1]:.2f}"] if w else ["", ""]
            rows.append(row)
        cols = ["case", "code", "inside MB", "after MB", "given back on leaving"]
        if is_base:
            cols += ["write-up inside", "write-up after"]
        out.append(Table(
            f"{e['name']}: RSS at the end of the block (inside) and after leaving it",
            cols, rows,
            note=(f"perl {perl.get('version')}, usemymalloc={perl.get('usemymalloc')}; each "
                  "case in a fresh process; given back = (inside - after) / (inside - before)"
                  + ("; the write-up's figures are a 32-bit Perl's, all cases in one process"
                     if is_base else "")), detail=True))
    runs = [e for e in common.configs(data) if ok_cases(e)]
    if len(runs) > 1:
        rows, brief = [], []
        for case in CASES:
            if case in CLAIM_CASES:
                brief.append(len(rows))
            row = [case, SHORT[case]]
            for e in runs:
                r = ok_cases(e).get(case)
                row.append(f"{in_mib(kept(r))} {fmt.share(gave_back(r))}" if r else "-")
            rows.append(row)
        out.append(Table("RSS kept after leaving the block, MB above the case's start, and the "
                         "share given back", ["case", "code"] + [e["name"] for e in runs], rows,
                         note="the code of each case: the tables per configuration (--verbose, "
                              "the page)", brief_rows=brief))
    for e in common.configs(data):
        if e.get("error"):
            out.append(Table(f"{e['name']}: not run", ["error"], [[e["error"]]]))
    p = data.get("probe") or {}
    if p.get("runs"):
        rows, brief = [], []
        for r in p["runs"]:
            n = r["len"]
            if p.get("boundary") in (n, n + 1) or n in WRITEUP_PROBES:
                brief.append(len(rows))   # both sides of the line, and the write-up's lengths
            rows.append([f"{n:,}", f"128 KiB {'+' if n >= KIB128 else '-'} {abs(n - KIB128)}",
                         f"{r['svlen']:,}", f"{chunk_size(r['svlen']):,}",
                         in_mib(r["inside"]["rss"]),
                         in_mib(r["after"]["rss"]), f"{fmt.share(gave_back(r))} ({outcome(r)})"])
        L = p.get("boundary")
        note = (f"located boundary: {L:,} characters (128 KiB - {KIB128 - L})" if L
                else f"no boundary located: {p.get('error')}")
        out.append(Table(f"boundary probes under {p.get('config')}: {p.get('count')} strings of "
                         "LEN characters in an array, one fresh perl each",
                         ["LEN", "", "Perl buffer", "glibc chunk", "inside MB", "after MB",
                          "given back"], rows,
                         note=note + "; Perl buffer = SvLEN, what Perl asked malloc for; "
                                     "glibc chunk = that + 8-byte header, rounded to 16",
                         brief_rows=brief))
    elif p.get("error"):
        out.append(Table("boundary probes: not run", ["error"], [[p["error"]]]))
    rep = data.get("repeat") or {}
    got = {n: c["rounds"] for n, c in (rep.get("configs") or {}).items() if c.get("rounds")}
    if got:
        names = list(got)
        rows = []
        for i in range(max(len(v) for v in got.values())):
            row = [i + 1]
            for n in names:
                r = got[n][i] if i < len(got[n]) else None
                row.append(f"{in_mib(grew(r))} / {in_mib(kept(r))} ({outcome(r)})" if r else "-")
            rows.append(row)
        out.append(Table(f"the same array built and freed again: {rep['count']} strings of "
                         f"{rep['len']:,} characters per round, one process",
                         ["round"] + [f"{n}: grew / kept MB" for n in names], rows,
                         detail=True))   # the threshold claim's figure names the rounds kept
    return out


# --- claims -----------------------------------------------------------------------------

def _repeat_kept_rounds(data: dict, name: str) -> list | None:
    c = ((data.get("repeat") or {}).get("configs") or {}).get(name)
    if not c or not c.get("rounds"):
        return None
    return [r["round"] for r in c["rounds"] if outcome(r) != "gave back"]


def claim_threshold(data: dict) -> Claim:
    text = "blocks of 128 KiB and more go back to the OS, smaller ones stay"
    p = data.get("probe") or {}
    runs = {r["len"]: r for r in p.get("runs", [])}
    L = p.get("boundary")
    if not L or L not in runs or L - 1 not in runs:
        return claim(text, FAILS, "no boundary between kept and given back was found "
                     f"near 128 KiB: {p.get('error') or 'the probes did not run'}")
    below, at = runs[L - 1], runs[L]
    split = outcome(below) == "kept" and outcome(at) == "gave back"
    chunk_below, chunk_at = chunk_size(below["svlen"]), chunk_size(at["svlen"])
    on_line = chunk_below < KIB128 <= chunk_at
    ev = (f"Under glibc strings of {L - 1:,} characters stayed ({fmt.share(gave_back(below))} "
          "given "
          f"back), {L:,} went back ({fmt.share(gave_back(at))}): Perl asked for {below['svlen']:,} "
          f"and {at['svlen']:,} bytes, glibc chunks of {chunk_below:,} and {chunk_at:,}, so the "
          f"line is 128 KiB of malloc chunk, glibc's mmap threshold.")
    base = ok_cases(baseline(data) or {})
    if 4 in base and 5 in base:
        ev += (f" The write-up's cases 4 and 5 gave back {fmt.share(gave_back(base[4]))} and "
               f"{fmt.share(gave_back(base[5]))}.")
    small = [c for c in (6, 7, 8, 9, 10) if c in base]
    if small:
        ev += (" Small blocks (cases " + ", ".join(map(str, small)) + ": hashes, 18 KB frozen "
               "chunks) gave back "
               + ", ".join(fmt.share(gave_back(base[c])) for c in small) + ".")
    figure = (f"{L - 1:,} characters stayed, {L:,} went back: glibc chunks of "
              f"{chunk_below:,} and {chunk_at:,} bytes")
    if not (split and on_line):
        return claim(text, FAILS, ev, figure=figure)
    kept_rounds = _repeat_kept_rounds(data, "glibc")
    if kept_rounds:
        fixed = _repeat_kept_rounds(data, "glibc-mmap128k")
        rep = data["repeat"]
        ev += (f" But building the same array of {rep['count']} {rep['len']:,}-character strings "
               f"again in one process, round(s) {', '.join(map(str, kept_rounds))} kept it")
        ev += (" (with a fixed threshold, glibc-mmap128k, every round went back)." if fixed == []
               else ".")
        figure += (f"; but an array of {rep['len']:,}-character strings built again was kept "
                   f"in round(s) {', '.join(map(str, kept_rounds))}"
                   + (" (none with glibc-mmap128k)" if fixed == [] else ""))
        return claim(text, DEPENDS, ev,
                     depends_on="whether blocks that size were freed before: glibc raises its "
                                "mmap threshold to each freed mmapped block's size (up to 32 MiB)",
                     figure=figure)
    return claim(text, HOLDS, ev, figure=figure)


def claim_boundary(data: dict) -> Claim:
    text = "the boundary is at 128 KiB - 13 characters"
    p = data.get("probe") or {}
    L = p.get("boundary")
    if not L:
        return claim(text, FAILS, "no boundary was located: "
                     f"{p.get('error') or 'the probes did not run'}")
    runs = {r["len"]: r for r in p.get("runs", [])}
    ev = f"The located boundary is {L:,} characters (128 KiB - {KIB128 - L})"
    if WRITEUP_BOUNDARY - 1 in runs:
        ev += (f"; the write-up's kept {WRITEUP_BOUNDARY - 1:,} gave back "
               f"{fmt.share(gave_back(runs[WRITEUP_BOUNDARY - 1]))} here")
    ev += (f". Characters + NUL + Perl's copy-on-write byte + glibc's 8-byte header, rounded "
           f"to 16, reach 128 KiB at {predicted_boundary(GLIBC64):,}; with the 4-byte header "
           f"and 8-byte rounding of a 32-bit glibc, at {predicted_boundary(GLIBC32):,}.")
    return claim(text, HOLDS if L == WRITEUP_BOUNDARY else FAILS, ev,
                 figure=f"located at {L:,} characters (128 KiB - {KIB128 - L}); a 64-bit "
                        f"glibc's chunk arithmetic gives {predicted_boundary(GLIBC64):,}")


def claim_shared_keys(data: dict) -> Claim:
    text = "hash keys shared between two hashes take less memory"
    saved, lost, parts, short = [], [], [], []
    for e in common.configs(data):
        c = ok_cases(e)
        if 7 not in c or 8 not in c or grew(c[7]) <= 0 or c[7]["count"] != c[8]["count"]:
            continue
        saving = 1 - grew(c[8]) / grew(c[7])
        per_key = (grew(c[7]) - grew(c[8])) / max(1, c[8]["facts"].get("keys", c[8]["count"]))
        (saved if saving >= SHARED_SAVING_MIN else lost).append(e["name"])
        short.append(f"{e['name']} {fmt.share(saving)}")
        parts.append(f"{e['name']} {in_mib(grew(c[8]))} vs {in_mib(grew(c[7]))} MB "
                     f"({fmt.share(saving)} less, {per_key:.0f} B per key)")
    if not parts:
        return claim(text, FAILS, "cases 7 and 8 did not both run")
    ev = ("Two hashes with the same keys (case 8) against different keys (case 7), growth: "
          + "; ".join(parts) + ". Perl stores each key string once, in its shared string table.")
    return claim(text, common.verdict_split(saved, lost), ev, "allocator: saves under "
                 + ", ".join(saved) + "; not under " + ", ".join(lost),
                 figure=f"shared keys grew this much less (the claim: {SHARED_SAVING_MIN:.0%} "
                        "or more): " + ", ".join(short))


def claim_chunks(data: dict) -> Claim:
    text = ("serialising data in chunks larger than 128 KiB lets it go back; small "
            "compressible chunks stay")
    good, bad, parts = [], [], []
    for e in common.configs(data):
        c = ok_cases(e)
        if 10 not in c or 11 not in c:
            continue
        big, small = c[11], c[10]
        holds = outcome(big) == "gave back" and outcome(small) != "gave back"
        (good if holds else bad).append(e["name"])
        parts.append(f"{e['name']} {fmt.share(gave_back(big))} / {fmt.share(gave_back(small))}")
    if not parts:
        return claim(text, FAILS, "cases 10 and 11 did not both run")
    sizes = ""
    base = ok_cases(baseline(data) or {})
    if 10 in base and 11 in base:
        sizes = (f" Frozen chunks were {base[11]['facts'].get('last_length', 0):,} and "
                 f"{base[10]['facts'].get('last_length', 0):,} bytes: case 10's are small "
                 "because its values are the 4 characters \"x100\"; Storable does not compress.")
    figure = "given back on leaving, case 11 / case 10: " + "; ".join(parts)
    ev = ("Given back on leaving, case 11 (random values) / case 10: " + "; ".join(parts)
          + "." + sizes)
    return claim(text, common.verdict_split(good, bad), ev, "allocator: holds under "
                 + ", ".join(good) + "; not under " + ", ".join(bad), figure=figure)


def claim_allocators(data: dict) -> Claim:
    text = "other allocators return the memory the system malloc keeps"
    base = baseline(data)
    bc = ok_cases(base or {})
    others = [e for e in common.configs(data) if e["allocator"] != "glibc" and ok_cases(e)]
    if not bc or not others:
        return claim(text, DEPENDS, "this run had "
                     + ("no glibc run" if not bc else "no other allocator") + " to compare",
                     depends_on="allocator (not measured in this run)")
    better, worse, parts = [], [], []
    for e in others:
        c = ok_cases(e)
        more_back = more_kept = False
        bits = []
        for case in (2, 6):
            if case not in c or case not in bc:
                continue
            d = kept(c[case]) - kept(bc[case])
            more_back |= d < -ALLOCATOR_NOISE
            more_kept |= d > ALLOCATOR_NOISE
            bits.append(f"case {case} {in_mib(kept(c[case]))}")
        if more_back and not more_kept:
            better.append(e["name"])
        else:
            worse.append(e["name"])
        parts.append(f"{e['name']} " + ", ".join(bits))
    figure = ("RSS kept after the block, MB: glibc " + ", ".join(
        f"case {k} {in_mib(kept(bc[k]))}" for k in (2, 6) if k in bc) + "; " + "; ".join(parts))
    ev = (figure + f". An allocator counts as returning more when it keeps "
          f"{in_mib(ALLOCATOR_NOISE)} MB less than glibc on a case and no more on the other.")
    return claim(text, common.verdict_split(better, worse), ev, "allocator and its settings: "
                 "more back under " + ", ".join(better) + "; not under " + ", ".join(worse),
                 figure=figure)


def claims(data: dict) -> list:
    return [claim_threshold(data), claim_boundary(data), claim_shared_keys(data),
            claim_chunks(data), claim_allocators(data)]


# --- charts -----------------------------------------------------------------------------

def outcome_note(cases: dict) -> str:
    groups = {}
    for c in sorted(cases):
        groups.setdefault(outcome(cases[c]), []).append(str(c))
    return "; ".join(f"{k} on leaving: case{'s' if len(v) > 1 else ''} {', '.join(v)}"
                     for k, v in groups.items()) + "."


def charts(data: dict) -> list:
    out = []
    base = baseline(data)
    bc = ok_cases(base or {})
    cats = [str(c) for c in CASES]
    if bc:
        out.append({
            "id": "perl-glibc-cases", "title": f"{base['name']}: RSS inside the block and after "
                                               "leaving it, per case",
            "kind": "bar",
            "x": {"label": "case", "unit": "", "log": False, "categories": cats},
            "y": {"label": "RSS", "unit": "bytes", "log": False},
            "series": [{"name": k, "x": cats,
                        "y": [bc[c][k]["rss"] if c in bc else 0 for c in CASES]}
                       for k in ("before", "inside", "after")],
            "note": outcome_note(bc)})
    runs = [e for e in common.configs(data) if ok_cases(e)]
    if runs:
        out.append({
            "id": "perl-kept-per-config", "title": "RSS kept after leaving the block, per "
                                                   "case and configuration",
            "kind": "bar",
            "x": {"label": "case", "unit": "", "log": False, "categories": cats},
            "y": {"label": "RSS kept above the case's start", "unit": "bytes", "log": False},
            "series": [{"name": e["name"], "x": cats,
                        "y": [kept(ok_cases(e)[c]) if c in ok_cases(e) else 0 for c in CASES]}
                       for e in runs],
            "note": "Which allocator keeps what after the same Perl code frees it."})
    p = data.get("probe") or {}
    if p.get("runs"):
        rs = p["runs"]
        series = [{"name": f"{p['config']}: kept after the block", "x": [r["len"] for r in rs],
                   "y": [kept(r) for r in rs]}]
        if p.get("boundary"):
            top = max(grew(r) for r in rs)
            series.append({"name": f"located boundary {p['boundary']:,}",
                           "x": [p["boundary"], p["boundary"]], "y": [0, top]})
        out.append({
            "id": "perl-boundary", "title": "Boundary probe: RSS kept after the block vs "
                                            "string length",
            "kind": "line",
            "x": {"label": "string length", "unit": "count", "log": False},
            "y": {"label": "RSS kept after leaving the block", "unit": "bytes", "log": False},
            "series": series,
            "note": (f"{p['count']} strings per probe; from {p['boundary']:,} characters on, "
                     "their malloc chunks reach 128 KiB and are mmapped" if p.get("boundary")
                     else f"no boundary located: {p.get('error')}")})
    rep = data.get("repeat") or {}
    got = {n: c["rounds"] for n, c in (rep.get("configs") or {}).items() if c.get("rounds")}
    if got:
        out.append({
            "id": "perl-repeat", "title": "The same array built and freed again, one process",
            "kind": "line",
            "x": {"label": "round", "unit": "count", "log": False},
            "y": {"label": "RSS kept after the round", "unit": "bytes", "log": False},
            "series": [{"name": n, "x": [r["round"] for r in rs], "y": [kept(r) for r in rs]}
                       for n, rs in got.items()],
            "note": "; ".join(
                f"{n}: kept after round(s) " + ", ".join(str(r["round"]) for r in rs
                                                         if outcome(r) != "gave back")
                if any(outcome(r) != "gave back" for r in rs) else f"{n}: every round went back"
                for n, rs in got.items())})
    return out
