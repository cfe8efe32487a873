"""arenas: threaded workers that allocate a big block, hold it, free it, ten times; then what
the allocator kept (RSS, glibc's arenas from malloc_info), and what a release (malloc_trim(0)
under glibc, each allocator's own purge otherwise) gives back. The program hs-lab-arenas runs
one worker mix per process."""

from __future__ import annotations

import re

from heapsight import fmt, mappings
from heapsight.errors import HeapsightError
from heapsight.lab import common
from heapsight.lab.common import DEPENDS, MIB, Claim, Table, configs, errors_note, in_mib, mib

NAME = "arenas"
TITLE = "per-thread arenas: what threads leave behind after freeing, and what malloc_trim returns"
# seconds of its --quick run (between a quiet machine and one at a load of 4) and of its
# full run (at a load of 3 to 4) on 2 cores, from bench/lab-time: the lab's estimate at the
# start, and each experiment's share of the time left
QUICK_SECONDS = 13
FULL_SECONDS = 180
SOURCE = "C++ Memory Arenas and Their Implications"
ABOUT = ("Worker threads start together; each allocates its block (30 or 100 MiB), writes every "
         "byte, holds it 100 ms and frees it, ten times (twice with --quick, where the "
         "allocators other than glibc run only the 4 x 30 and 4 x 100 MiB mixes). When all have "
         "been joined the program reads its RSS and glibc's arenas (malloc_info: how many, and "
         "the memory each got from the system), calls the allocator's release (malloc_trim(0) "
         "under glibc) and reads them again. Two variants change where the freed memory lies: "
         "the same bytes as 4 KiB blocks, and 'pinned', where each round a worker also leaves "
         "a 1 KiB block allocated above its big one. Retained = RSS after the workers - RSS "
         "before they started.")
CONFIGS = ("glibc", "glibc-arena1", "glibc-arena2", "jemalloc", "tcmalloc", "mimalloc")

PROGRAM = "hs-lab-arenas"
SIZE_A, SIZE_B = 30, 100   # MiB per worker of each kind, as in the write-up
SMALL_KB = 4               # block size of the many-small-blocks variant
PIN_KB = 1                 # the block a pinned worker leaves allocated each round

# (id, 30 MiB workers, 100 MiB workers, variant); variant: "" one block, "small", "pinned"
FULL_CASES = (("1x30", 1, 0, ""), ("1x100", 0, 1, ""), ("4x30", 4, 0, ""), ("4x100", 0, 4, ""),
              ("4x30+4x100", 4, 4, ""), ("16x30", 16, 0, ""), ("32x30", 32, 0, ""),
              ("64x30", 64, 0, ""), ("4x30/small", 4, 0, "small"), ("32x30/small", 32, 0, "small"),
              ("4x30/pinned", 4, 0, "pinned"), ("32x30/pinned", 32, 0, "pinned"))
QUICK_CASES = (("1x30", 1, 0, ""), ("1x100", 0, 1, ""), ("4x30", 4, 0, ""), ("4x100", 0, 4, ""),
               ("32x30", 32, 0, ""), ("4x30/small", 4, 0, "small"),
               ("4x30/pinned", 4, 0, "pinned"))
# Quick: the allocators other than glibc, which no claim's verdict reads (only the 100 vs
# 30 MiB claim's evidence cites them), run these two mixes.
QUICK_OTHER_CASES = ("4x30", "4x100")
# Two rounds show what ten do: the first 30 MiB block is mmapped and its free raises the
# threshold, the second comes from the arena and stays.
ROUNDS = {True: 2, False: 10}   # quick, full
HOLD_MS = 100

# glibc 2.36 constants the evidence explains the figures with.
MMAP_THRESHOLD_MAX = 32 * MIB   # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: the dynamic threshold's cap
HEAP_MAX = mappings.HEAP_MAX    # HEAP_MAX_SIZE: one thread-arena heap

# A worker "keeps its memory" when what stays resident is at least 80% of its blocks: a freed
# block is either kept whole or given back whole, so the figures are near 0% or near 100%,
# and 80% leaves room for page rounding and the pages the runtime itself touches.
KEEP_FRACTION = 0.8
# ... and "leaves ~nothing" below 10% of what it allocated.
GONE_FRACTION = 0.1
# malloc_trim "returns more than the main arena" when, beyond the main arena's whole size, it
# gives back more than half of what was kept outside the main arena.
TRIM_MAJORITY = 0.5
# A run tests malloc_trim only if at least this much stayed outside the main arena
# (half of one 30 MiB block): with less there is nothing to tell apart from noise.
MIN_OUTSIDE_MAIN = 15 * MIB
# With arena_max=N the retained memory is "bounded" when it stays under N arenas of one full
# heap each (a thread arena's heap is at most HEAP_MAX; the main arena's top is trimmed at free
# beyond trim_threshold, at most 2 x 32 MiB = HEAP_MAX as well) plus 8 MiB for the runtime.
BOUND_SLACK = 8 * MIB


def cases_for(quick: bool) -> tuple:
    return QUICK_CASES if quick else FULL_CASES


def case_dict(cid: str, w30: int, w100: int, variant: str) -> dict:
    parts = []
    if w30:
        parts.append(f"{w30} x {SIZE_A} MiB")
    if w100:
        parts.append(f"{w100} x {SIZE_B} MiB")
    label = " + ".join(parts)
    if variant == "small":
        label += f" in {SMALL_KB} KiB blocks"
    elif variant == "pinned":
        label += f", {PIN_KB} KiB left/round"
    return {"id": cid, "w30": w30, "w100": w100, "variant": variant, "label": label,
            "threads": w30 + w100}


# ---------------------------------------------------------------- collect

def collect(ctx: common.Context) -> dict:
    quick = bool(ctx.quick)
    rounds = ROUNDS[quick]
    cases = [case_dict(*c) for c in cases_for(quick)]
    data = {"quick": quick, "cores": common.cores(), "cap": 8 * common.cores(),
            "rounds": rounds, "hold_ms": HOLD_MS, "mb_a": SIZE_A, "mb_b": SIZE_B,
            "small_kb": SMALL_KB, "pin_kb": PIN_KB, "cases": cases, "configs": []}
    program = common.lab_program(PROGRAM)
    for cfg in ctx.configs_for(CONFIGS):
        entry = {"name": cfg.name, "allocator": cfg.allocator, "env": dict(cfg.env),
                 "arena_max": arena_max_of(cfg.env), "errors": [], "runs": {}}
        data["configs"].append(entry)
        if common.cannot_run(ctx, cfg, entry):
            continue
        for case in cases:
            if quick_skips(data, entry, case):
                continue
            ctx.say(f"arenas: {cfg.name}, {case['label']}, {rounds} rounds")
            argv = [program, "--w30", str(case["w30"]), "--w100", str(case["w100"]),
                    "--mb-a", str(SIZE_A), "--mb-b", str(SIZE_B), "--rounds", str(rounds),
                    "--hold-ms", str(HOLD_MS),
                    "--small", "1" if case["variant"] == "small" else "0",
                    "--small-kb", str(SMALL_KB),
                    "--pin-kb", str(PIN_KB if case["variant"] == "pinned" else 0)]
            try:
                lines = common.run_program(argv, cfg, timeout_s=ctx.timeout_s)
            except HeapsightError as e:
                entry["errors"].append(f"{case['id']}: {e.message}")
                continue
            summary = next((x for x in lines if x.get("event") == "summary"), None)
            if summary is None:
                entry["errors"].append(f"{case['id']}: no summary line")
                continue
            wrong = common.wrong_allocator(cfg.allocator, summary.get("allocator"))
            if wrong:
                entry["errors"].append(wrong)
                break
            run = {k: v for k, v in summary.items() if k != "event"}
            for phase in ("after_workers", "after_release"):
                run[f"arena_list_{phase}"] = [[x["system"], x["free"]] for x in lines
                                              if x.get("event") == "arena"
                                              and x.get("phase") == phase]
            entry["runs"][case["id"]] = run
    if not any(c["runs"] for c in data["configs"]):
        raise common.nothing_ran(data, "arenas case")
    return data


def quick_skips(data: dict, cfg: dict, case: dict) -> bool:
    """Whether --quick leaves this case out under this configuration (QUICK_OTHER_CASES)."""
    return (bool(data.get("quick")) and cfg.get("allocator") != "glibc"
            and case["id"] not in QUICK_OTHER_CASES)


def arena_max_of(env: dict) -> int:
    """The arena limit a configuration sets (0: glibc's default, 8 x cores)."""
    m = re.search(r"glibc\.malloc\.arena_max=(\d+)", env.get("GLIBC_TUNABLES", ""))
    if m:
        return int(m.group(1))
    v = env.get("MALLOC_ARENA_MAX", "")
    return int(v) if v.isdigit() else 0


# ---------------------------------------------------------------- derived figures

def cases(data: dict) -> list:
    return data.get("cases", [])


def glibc_default(data: dict) -> dict | None:
    """The configuration the write-up's claims are about: glibc with no tunables."""
    return next((c for c in configs(data) if c.get("allocator") == "glibc"
                 and not c.get("env") and c.get("runs")), None)


def glibc_configs(data: dict) -> list:
    return [c for c in configs(data) if c.get("allocator") == "glibc" and c.get("runs")]


def run_of(cfg: dict | None, cid: str) -> dict | None:
    return (cfg or {}).get("runs", {}).get(cid)


def allocated(run: dict) -> int:
    """What one round of all the workers allocated, in bytes."""
    return (run["w30"] * run["mb_a"] + run["w100"] * run["mb_b"]) * MIB


def retained(run: dict) -> int:
    return max(0, run["rss_after"] - run["rss_base"])


def given_back(run: dict) -> int:
    return max(0, run["rss_after"] - run["rss_release"])


def outside_main(run: dict) -> int:
    """Retained memory beyond everything the main arena got from the system."""
    return max(0, retained(run) - run.get("arena_main", 0))


def arena_cap(data: dict) -> int:
    """glibc's default arena limit where the data was measured: 8 x cores."""
    return data.get("cap", 8 * common.cores())


def arena_limit(data: dict, cfg: dict) -> int:
    cap = arena_cap(data)
    am = cfg.get("arena_max", 0)
    return min(am, cap) if am else cap


def plain_30(data: dict) -> list:
    """Case ids of one-block mixes of 30 MiB workers only, by thread count."""
    cs = [c for c in cases(data) if not c["variant"] and c["w30"] and not c["w100"]]
    return [c["id"] for c in sorted(cs, key=lambda c: c["threads"])]


# ---------------------------------------------------------------- tables

CASE_NOTE = (f"case: workers x MiB each (4x30+4x100: both kinds at once); /small: the same "
             f"bytes in {SMALL_KB} KiB blocks; /pinned: each round a worker leaves a {PIN_KB} KiB "
             "block allocated above its big one.")


def matrix_table(data: dict) -> Table:
    cfgs = configs(data)
    columns = ["case"] + [c["name"] for c in cfgs]
    rows, skipped = [], False
    for case in cases(data):
        row = [case["id"]]
        for cfg in cfgs:
            r = run_of(cfg, case["id"])
            after = max(0, r["rss_release"] - r["rss_base"]) if r else 0
            left_out = quick_skips(data, cfg, case)
            skipped |= left_out
            row.append(f"{in_mib(retained(r))} -> {in_mib(after)}" if r
                       else "-" if left_out else "n/a")
        rows.append(row)
    note = (f"MiB retained after the workers ended -> after the release (glibc: malloc_trim(0); "
            f"jemalloc: arena purge; tcmalloc: ReleaseFreeMemory; mimalloc: mi_collect), both "
            f"over the RSS before the workers started. {data.get('rounds', '?')} rounds of "
            f"{data.get('hold_ms', '?')} ms per worker. " + CASE_NOTE
            + (" -: not run with --quick." if skipped else ""))
    if errors_note(data):
        note += " " + errors_note(data)
    return Table("Retained memory after the workers, then after the release, per configuration",
                 columns, rows, note)


def glibc_table(data: dict, cfg: dict) -> Table:
    columns = ["case", "peak RSS", "RSS after workers", "arenas", "largest arena",
               "arenas total", "RSS after trim", "change"]
    rows = []
    for case in cases(data):
        r = run_of(cfg, case["id"])
        if r is None:
            rows.append([case["id"]] + ["n/a"] * 7)
            continue
        change = round((r["rss_release"] - r["rss_after"]) / MIB, 1)
        rows.append([case["id"], mib(r["rss_peak"]), mib(r["rss_after"]),
                     r["arenas"], mib(r["arena_largest"]), mib(r["arena_system"]),
                     mib(r["rss_release"]), f"{change:+,.1f} MiB" if change else "0.0 MiB"])
    limit = arena_limit(data, cfg)
    note = (f"arenas, largest arena and arenas total: malloc_info's heaps and their "
            f"<system type=\"current\"> after the workers (memory each arena got from the "
            f"system; malloc_trim does not change it). Arena limit here: {limit} "
            + ("(8 x cores)." if limit == data.get("cap") else "(arena_max).")
            + f" RSS before the workers: {mib(next(iter(cfg['runs'].values()))['rss_base'])}.")
    # the default glibc's on the terminal; the tuned ones' with --verbose
    return Table(f"{cfg['name']}: RSS and arenas after the workers, then after malloc_trim(0)",
                 columns, rows, note,
                 detail=cfg is not (glibc_default(data) or glibc_configs(data)[0]))


def tables(data: dict) -> list:
    return [matrix_table(data)] + [glibc_table(data, c) for c in glibc_configs(data)]


# ---------------------------------------------------------------- claims

claim = common.claim_for(SOURCE)


def missing(text: str, data: dict, what: str) -> Claim:
    return claim(text, DEPENDS, (f"no {what} ran here. " + errors_note(data)).strip(),
                 f"a {what} run")


def claim_own_arena(data: dict) -> Claim:
    text = "each worker gets its own arena, and the arena keeps the worker's freed memory"
    g = glibc_default(data)
    if g is None:
        return missing(text, data, "glibc (default settings)")
    cap = arena_cap(data)
    checked, parts, kinds_bad, bad = [], [], set(), []
    for case in cases(data):
        r = run_of(g, case["id"])
        if r is None or case["w100"] or case["threads"] > cap or case["variant"] == "pinned":
            continue
        want = min(case["threads"] + 1, cap)
        kept = retained(r) >= KEEP_FRACTION * allocated(r)
        ok = r["arenas"] == want and kept
        checked.append(ok)
        if not ok:
            kinds_bad.add(case["variant"] or "one block")
            bad.append(f"{case['id']} {r['arenas']} arenas (expected {want}), kept "
                       f"{in_mib(retained(r))} of {mib(allocated(r))}")
        parts.append(f"{case['id']}: {r['arenas']} arenas (expected {want}), kept "
                     f"{mib(retained(r))} of {mib(allocated(r))}")
    if not checked:
        return claim(text, DEPENDS, f"no 30 MiB mix with at most {cap} workers ran under glibc.",
                     "a run with at most 8 x cores workers")
    evidence = ("glibc: " + "; ".join(parts) + f". Kept = at least {KEEP_FRACTION:.0%} of one "
                "round's blocks still resident.")
    if "small" in kinds_bad and "one block" not in kinds_bad:
        evidence += (f" {SMALL_KB} KiB blocks never raise the mmap threshold, so trim_threshold "
                     "stays 128 KiB and free() shrinks the thread heap's top at once; one 30 MiB "
                     "block raises the threshold to 30 MiB and trim_threshold to twice that, so "
                     "a 30 MiB top stays.")
    figure = (f"glibc: as claimed in {checked.count(True)} of {len(checked)} mixes"
              + ("; not " + "; ".join(bad) if bad else ""))
    return claim(text, common.verdict_of(checked), evidence,
                 "the block size: kept for one 30 MiB block per round, given back at free for "
                 f"{SMALL_KB} KiB blocks", figure=figure)


def claim_trim_main_only(data: dict) -> Claim:
    text = "malloc_trim(0) returns only the main arena's unused memory to the OS"
    gl = glibc_configs(data)
    if not gl:
        return missing(text, data, "glibc configuration")
    held, failed = [], []  # (config name, case, run)
    for cfg in gl:
        for case in cases(data):
            r = run_of(cfg, case["id"])
            if r is None or outside_main(r) < MIN_OUTSIDE_MAIN:
                continue
            beyond_main = max(0, given_back(r) - r.get("arena_main", 0))
            ok = beyond_main <= TRIM_MAJORITY * outside_main(r)
            (held if ok else failed).append((cfg["name"], case, r))
    if not held and not failed:
        return claim(text, DEPENDS, "no glibc run kept memory outside the main arena. "
                     + errors_note(data), "memory kept in thread arenas")

    def example(group: list) -> str:
        # the default configuration's run with the most memory outside the main arena
        name, case, r = max(group, key=lambda x: (x[0] == "glibc", outside_main(x[2])))
        return (f"{name} {case['id']}: {mib(outside_main(r))} kept beyond the main arena's "
                f"{mib(r.get('arena_main', 0))}, {mib(given_back(r))} given back")

    total = len(held) + len(failed)
    parts = []
    if held:
        parts.append(f"in {len(held)} of {total} runs trim gave back no more than the main arena "
                     f"(e.g. {example(held)})")
    if failed:
        parts.append(f"in {len(failed)} it gave back most of the thread arenas' memory too "
                     f"(e.g. {example(failed)}; all: "
                     + ", ".join(f"{n} {c['id']}" for n, c, _ in failed) + ")")
    evidence = ("; ".join(parts) + f". 'Only the main arena' = at most {TRIM_MAJORITY:.0%} of "
                "what was kept outside it given back. glibc 2.36's malloc_trim madvises the free "
                "chunks in the bins of every arena but shrinks only the main arena's top: a "
                "freed block that merged into a thread heap's top stays; one below a live "
                "block is given back.")
    if all(c["variant"] == "pinned" for _, c, _ in failed) and \
            not any(c["variant"] == "pinned" for _, c, _ in held):
        on = ("where the freed memory lies: the top of a thread heap stays, a free chunk "
              "below a live block is given back")
    else:
        on = "the run (more than the main arena in " + \
            ", ".join(f"{n} {c['id']}" for n, c, _ in failed) + ")"
    figure = (f"trim gave back no more than the main arena in {len(held)} of {total} runs"
              + (", most of the thread arenas too in " + ", ".join(
                  f"{n} {c['id']}" for n, c, _ in failed) if failed else ""))
    return claim(text, common.verdict_split(held, failed), evidence, on, figure=figure)


def claim_cap(data: dict) -> Claim:
    cap = arena_cap(data)
    text = "the number of arenas is capped at 8 x cores"
    gl = glibc_configs(data)
    if not gl:
        return missing(text, data, "glibc configuration")
    results, parts, short = [], [], []
    for cfg in gl:
        limit = arena_limit(data, cfg)
        runs = [(cid, r) for cid, r in cfg["runs"].items()]
        top_cid, top = max(runs, key=lambda x: (x[1]["arenas"], x[1]["threads"]))
        results += [r["arenas"] <= limit for _, r in runs]
        parts.append(f"{cfg['name']}: at most {top['arenas']} arena(s) (limit {limit}; "
                     f"{top['threads']} threads in {top_cid})")
        short.append(f"{cfg['name']} {top['arenas']} (limit {limit}, {top['threads']} threads)")
    evidence = f"{data.get('cores')} cores, 8 x cores = {cap}. " + "; ".join(parts) + "."
    g = glibc_default(data)
    beyond = [(cid, r) for cid, r in (g or {}).get("runs", {}).items()
              if r["threads"] + 1 > cap and not r["small"] and not r["pin_kb"]]
    for cid, r in sorted(beyond, key=lambda x: x[1]["threads"]):
        evidence += (f" {cid}: {r['threads']} workers shared {r['arenas']} arenas, the largest "
                     f"got {mib(r['arena_largest'])} from the system, "
                     f"{mib(retained(r))} kept of {mib(allocated(r))} per round.")
    if not beyond:
        evidence += f" No default-glibc mix here had more than {cap - 1} workers."
    return claim(text, common.verdict_of(results), evidence, "the configuration",
                 figure="most arenas: " + ", ".join(short))


def claim_100_vs_30(data: dict) -> Claim:
    text = "blocks of 100 MB behave differently from blocks of 30 MB: they leave no arena memory"
    gl = glibc_configs(data)
    if not gl:
        return missing(text, data, "glibc configuration")
    results, parts, bad, shared, short = [], [], [], False, []
    for cfg in gl:
        for case in cases(data):
            if case["variant"] or not case["w30"] or case["w100"]:
                continue
            pair = next((c for c in cases(data) if not c["variant"] and not c["w30"]
                         and c["w100"] == case["w30"]), None)
            a, b = run_of(cfg, case["id"]), run_of(cfg, pair["id"]) if pair else None
            if not a or not b:
                continue
            ok = (retained(a) >= KEEP_FRACTION * a["mb_a"] * MIB
                  and retained(b) < GONE_FRACTION * b["mb_b"] * MIB)
            results.append(ok)
            if not ok:
                bad.append(f"{cfg['name']} {case['id']}")
                shared |= a["arenas"] < a["threads"] + 1
            if not ok or cfg is gl[0]:
                short.append(f"{cfg['name']} {case['id']} {in_mib(retained(a))}, "
                             f"{pair['id']} {in_mib(retained(b))}")
            parts.append(f"{cfg['name']}: {case['id']} kept {mib(retained(a))}, "
                         f"{pair['id']} kept {mib(retained(b))}")
    if not results:
        return claim(text, DEPENDS, "no glibc run had both a 30 MiB and a 100 MiB mix. "
                     + errors_note(data), "runs of both sizes")
    others = []
    for cfg in configs(data):
        if cfg.get("allocator") == "glibc" or not cfg.get("runs"):
            continue
        pairs = [(c["id"], run_of(cfg, c["id"])) for c in cases(data) if not c["variant"]]
        pairs = [f"{cid} {in_mib(retained(r))}" for cid, r in pairs
                 if r and cid in ("4x30", "4x100")]
        if pairs:
            others.append(f"{cfg['name']} " + ", ".join(pairs))
    evidence = ("; ".join(parts) + f". Different = the 30 MiB mix keeps at least "
                f"{KEEP_FRACTION:.0%} of one block and the 100 MiB mix under {GONE_FRACTION:.0%} "
                f"of one. glibc's dynamic mmap threshold (128 KiB at start) rises "
                f"to the size of a freed mmapped block, but only up to "
                f"{MMAP_THRESHOLD_MAX // MIB} MiB: a 100 MiB block is mmapped every round and "
                f"munmapped at free; a 30 MiB block is mmapped once, its free lifts the threshold "
                f"to 30 MiB, and from then on it comes from the arena, which keeps it.")
    if shared:
        evidence += (" Where several 30 MiB blocks share one arena their free space merges "
                     "into a top above trim_threshold (2 x 30 MiB) and free() trims it.")
    if others:
        evidence += " Other allocators (MiB kept): " + "; ".join(others) + "."
    return claim(text, common.verdict_of(results), evidence,
                 "the configuration and mix: not under " + ", ".join(bad) if bad else "",
                 figure="MiB kept: " + "; ".join(short))


def claim_arena_max(data: dict) -> Claim:
    text = "limiting the arenas (MALLOC_ARENA_MAX) bounds the memory kept after the workers"
    tuned = [c for c in glibc_configs(data) if c.get("arena_max")]
    if not tuned:
        return missing(text, data,
                       "glibc configuration with arena_max (glibc-arena1, glibc-arena2)")
    g = glibc_default(data)
    results, parts, bad_variants, over = [], [], set(), []
    for cfg in tuned:
        bound = cfg["arena_max"] * HEAP_MAX + BOUND_SLACK
        worst = {}  # variant kind -> (case id, run) keeping the most
        for case in cases(data):
            r = run_of(cfg, case["id"])
            if r is None:
                continue
            kind = "pinned" if case["variant"] == "pinned" else "not pinned"
            results.append(retained(r) <= bound)
            if retained(r) > bound:
                bad_variants.add(kind)
                over.append(f"{cfg['name']} {case['id']} {in_mib(retained(r))} (bound "
                            f"{in_mib(bound)})")
            if kind not in worst or retained(r) > retained(worst[kind][1]):
                worst[kind] = (case["id"], r)
        if worst:
            items = []
            for kind in ("not pinned", "pinned"):
                if kind in worst:
                    cid, r = worst[kind]
                    base = run_of(g, cid)
                    items.append(f"{kind} at most {mib(retained(r))} ({cid}"
                                 + (f"; default glibc {mib(retained(base))}" if base else "") + ")")
            parts.append(f"{cfg['name']} (bound {mib(bound)}): " + ", ".join(items))
    if g:
        big = max(g["runs"].items(), key=lambda x: retained(x[1]))
        parts.append(f"default glibc: up to {mib(retained(big[1]))} ({big[0]})")
    evidence = ("; ".join(parts) + f". Bound = arena_max x {HEAP_MAX // MIB} MiB (one thread "
                "heap, or the main arena's top below trim_threshold) + "
                f"{BOUND_SLACK // MIB} MiB.")
    if "pinned" in bad_variants:
        evidence += (" A live block above the freed memory stops free() from trimming, so "
                     "when the workers pin their arenas every block stays, however few "
                     "the arenas.")
    figure = (f"{results.count(True)} of {len(results)} runs within the bound"
              + ("; MiB kept over it: " + ", ".join(over) if over else ""))
    return claim(text, common.verdict_of(results), evidence,
                 "whether live blocks sit above the freed memory (runs over the bound: "
                 + ", ".join(sorted(bad_variants)) + ")", figure=figure)


def claims(data: dict) -> list:
    return [claim_own_arena(data), claim_trim_main_only(data), claim_cap(data),
            claim_100_vs_30(data), claim_arena_max(data)]


# ---------------------------------------------------------------- charts

def retained_note(data: dict) -> str:
    g = glibc_default(data)
    a, b = run_of(g, "4x30") or run_of(g, "1x30"), run_of(g, "4x100") or run_of(g, "1x100")
    if not a or not b:
        return "RSS after the workers over RSS before them."
    return (f"glibc: {a['w30']} x 30 MiB workers left {mib(retained(a))}, {b['w100']} x 100 MiB "
            f"left {mib(retained(b))}; blocks above the {MMAP_THRESHOLD_MAX // MIB} MiB cap of the "
            "dynamic mmap threshold are mmapped and unmapped at free.")


def trim_note(data: dict, g: dict, cs: list) -> str:
    def share(pinned: bool) -> str:
        rs = [run_of(g, c["id"]) for c in cs if (c["variant"] == "pinned") == pinned]
        return fmt.pct(sum(given_back(r) for r in rs), sum(retained(r) for r in rs))
    return (f"malloc_trim(0) gave back {share(False)} of what the unpinned cases kept and "
            f"{share(True)} of what the pinned ones kept (free chunks below a live block).")


def count_note(data: dict, series: list, cap: int) -> str:
    most = max((max(s["y"]) for s in series), default=0)
    threads = max((max(s["x"]) for s in series), default=0)
    return (f"Up to {threads} worker threads made at most {most} arenas (the main one included); "
            f"the line is 8 x cores = {cap}.")


def charts(data: dict) -> list:
    out = []
    plain = [c for c in cases(data) if not c["variant"]]
    series = []
    for cfg in configs(data):
        if not cfg.get("runs"):
            continue
        ys = [retained(run_of(cfg, c["id"])) if run_of(cfg, c["id"]) else None for c in plain]
        series.append({"name": cfg["name"], "y": ys})
    if series and plain:
        out.append({"id": "arenas-retained", "title": "Memory kept after the workers ended",
                    "kind": "bar",
                    "x": {"label": "workers x MiB", "unit": "", "log": False,
                          "categories": [c["id"] for c in plain]},
                    "y": {"label": "RSS after workers - before", "unit": "bytes", "log": False},
                    "series": series,
                    "note": retained_note(data)})
    g = glibc_default(data)
    if g:
        cs = [c for c in cases(data) if run_of(g, c["id"])]
        out.append({"id": "arenas-trim", "title": "glibc: kept after the workers, and after "
                                                  "malloc_trim(0)",
                    "kind": "bar",
                    "x": {"label": "case", "unit": "", "log": False,
                          "categories": [c["id"] for c in cs]},
                    "y": {"label": "RSS over the start", "unit": "bytes", "log": False},
                    "series": [{"name": "after workers",
                                "y": [retained(run_of(g, c["id"])) for c in cs]},
                               {"name": "after malloc_trim(0)",
                                "y": [max(0, run_of(g, c["id"])["rss_release"]
                                          - run_of(g, c["id"])["rss_base"]) for c in cs]}],
                    "note": trim_note(data, g, cs)})
    ids = plain_30(data)
    arena_series = []
    for cfg in glibc_configs(data):
        pts = [(run_of(cfg, i)["threads"], run_of(cfg, i)["arenas"]) for i in ids if run_of(cfg, i)]
        if pts:
            arena_series.append({"name": cfg["name"], "x": [p[0] for p in pts],
                                 "y": [p[1] for p in pts]})
    if arena_series:
        xs = sorted({x for s in arena_series for x in s["x"]})
        cap = arena_cap(data)
        arena_series.append({"name": f"8 x cores = {cap}", "x": xs, "y": [cap] * len(xs)})
        out.append({"id": "arenas-count", "title": "glibc arenas by worker threads",
                    "kind": "line",
                    "x": {"label": "worker threads", "unit": "count", "log": True},
                    "y": {"label": "arenas (malloc_info)", "unit": "count", "log": False},
                    "series": arena_series,
                    "note": count_note(data, arena_series[:-1], cap)})
    return out
