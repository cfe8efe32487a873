"""containers: C++ vector, list and deque of N strings of length k, filled and destroyed
for k = 8, 16, ... in one process; RSS in scope and out of scope, with std::allocator and
with libstdc++'s __gnu_cxx::__pool_alloc. The program hs-lab-containers does one
(container, allocator, string kind) per run and counts what the container asked its
allocator for, so the claims can say what the pool actually pooled."""

from __future__ import annotations

import statistics

from heapsight import fmt
from heapsight.allocators import PRESET
from heapsight.errors import HeapsightError
from heapsight.lab import common
from heapsight.lab.common import DEPENDS, FAILS, HOLDS, MIB, Claim, Table, in_mib, mib

NAME = "containers"
TITLE = "C++ containers of strings: what stays resident after destruction, std::allocator vs __pool_alloc"
# seconds of its --quick run (between a quiet machine and one at a load of 4) and of its
# full run (at a load of 3 to 4) on 2 cores, from bench/lab-time: the lab's estimate at the
# start, and each experiment's share of the time left
QUICK_SECONDS = 11
FULL_SECONDS = 530
SOURCE = "STL and malloc's Pool Effect"
ABOUT = ("For each string length k in turn, in one process: a std::vector, std::list or "
         "std::deque is filled with N copies of a k-character string (one random character "
         "changed in each, or all '0'), RSS is read in scope, the container is destroyed and "
         "RSS is read again out of scope. Each container runs with std::allocator and with "
         "__gnu_cxx::__pool_alloc<std::string>. The pool serves only requests of at most 128 "
         "bytes and never gives them back; requests are element arrays (vector), 48-byte "
         "nodes (list) or 512-byte blocks (deque), so only a list's nodes are pooled, and each "
         "string's character buffer (k > 15) always comes from malloc through std::allocator. "
         "The program counts the requests by size and, under glibc, reads mallinfo2 after "
         "each destruction, which tells the pool's holdings from malloc's. A layout probe "
         "repeats std::allocator with 16 bytes malloc'd before the first fill, to see which "
         "figures depend only on where glibc's chunks fall. Full size: N = 1,000,000 and "
         "k = 8..800 in steps of 8, as in the write-up, all-zero strings for vector only; "
         "quick: N = 200,000, 14 values of k either side of 128. The whole matrix runs under "
         "the first configuration (glibc by default); the others run std::allocator with "
         "random strings (with --quick, the list only). jemalloc purges freed pages over its "
         "decay time (10 s by default), so a run shorter than that cannot show whether it "
         "gives a list's memory back.")
CONFIGS = ("glibc", "jemalloc", "mimalloc")

PROGRAM = "hs-lab-containers"
CONTAINERS = ("vector", "list", "deque")
ALLOCS = ("std", "pool")
STRINGS = ("random", "zero")
SEED = 1
SIZES = {  # quick -> (N, k values, containers also filled with all-zero strings, containers
    #                  run under the configurations after the first)
    # quick: all-zero strings for vector alone, as in the full run (malloc sees the same sizes
    # whatever the bytes, so every container answers alike), and the other configurations
    # fill only the list, the one container a claim compares them on
    True: (200_000, (8, 16, 24, 32, 64, 96, 112, 120, 128, 136, 160, 256, 512, 800),
           ("vector",), ("list",)),
    False: (1_000_000, tuple(range(8, 801, 8)), ("vector",), CONTAINERS),
}
# The layout probe: std::allocator again with one block of this size malloc'd before the
# first fill, which moves every later heap chunk by 32 bytes. Figures that change with it
# depend on where glibc's chunks happen to fall, not on the container or the allocator.
PROBE_PAD_BYTES = 16

# libstdc++'s __pool_alloc serves requests of at most this many bytes (its _S_max_bytes).
POOL_MAX_BYTES = 128
# glibc's fastbins hold chunks of at most 128 bytes (global_max_fast on 64-bit); a string
# buffer of k + 1 bytes gets a chunk of (k + 1 + 8) rounded up to 16, at least 32.
FASTBIN_MAX_CHUNK = 128

# Claim 1: a container "uses the pool" when a fill sends it at least 1 MiB of requests (the
# vector's and deque's few small requests add up to a few hundred bytes); the pool "keeps"
# them when what malloc still has allocated after destruction, beyond the std::allocator
# run, is at least 90% of those bytes (the pool rounds up, so it holds a little more).
POOLED_MIN_BYTES = 1 * MIB
KEPT_MIN_FRACTION = 0.9
# "Everything is still resident" at one k: out-of-scope RSS within 2% of in-scope RSS (a
# give-back is at least a few hundred KiB at these sizes, well above 2% of nothing).
KEPT_TOL = 0.02
# Claim 2: the write-up saw two lines that "almost overlap": out-of-scope RSS of std and
# pool within 25% of the larger one, at 90% of the k values or more.
OVERLAP_TOL = 0.25
OVERLAP_MIN_SHARE = 0.9
# Claim 3: "keeps growing": out-of-scope RSS rises with k at least half as fast as the
# strings themselves grow (N bytes per unit of k), and steadily: Spearman's rank correlation
# with k at least 0.9 (a few dips allowed, not a curve that falls back).
GROWTH_MIN_RATIO = 0.5
GROWTH_MIN_RHO = 0.9
# jemalloc 5's dirty_decay_ms default: freed pages are purged over this time, so a run
# shorter than it cannot show whether jemalloc gives the memory back (the full run's list
# under jemalloc takes minutes and does; the quick one well under a second).
JEMALLOC_DECAY_S = 10.0
# Claim 4: "more" memory: the mean out-of-scope RSS with all-zero strings exceeds the mean
# with random strings by more than 10% and 1 MiB (run-to-run noise here is well below both).
MORE_TOL = 0.10
MORE_MIN_BYTES = 1 * MIB
# Claim 5: the write-up's "around 30 MB" deque overhead at N = 1,000,000 (scaled to N);
# "around" is taken as within a factor of 2.
DEQUE_OVERHEAD_BYTES_PER_MILLION = 30 * 1000 * 1000
AROUND_FACTOR = 2.0

claim = common.claim_for(SOURCE)
# Tables show every k up to this many; beyond, a selection (all are in the data).
TABLE_MAX_ROWS = 24
# ... and the terminal, without --verbose, these of them: both sides of 128 and a few more.
BRIEF_KS = (8, 16, 32, 64, 112, 120, 128, 136, 256, 512, 800)


# ---------------------------------------------------------------- collect

def plan(main_cfg: str, other_cfgs: list, zero_containers=CONTAINERS,
         containers=CONTAINERS, other_containers=None) -> list:
    """(config, container, alloc, strings, pad) for every run: under the first configuration
    both allocators with random strings, all-zero strings for zero_containers, and the
    layout probe (std::allocator with the heap shifted by PROBE_PAD_BYTES); under the others
    std::allocator with random strings (the containers among other_containers, if given)."""
    runs = [(main_cfg, c, a, "random", 0) for c in containers for a in ALLOCS]
    runs += [(main_cfg, c, a, "zero", 0) for c in containers if c in zero_containers
             for a in ALLOCS]
    runs += [(main_cfg, c, "std", "random", PROBE_PAD_BYTES) for c in containers]
    runs += [(n, c, "std", "random", 0) for n in other_cfgs for c in containers
             if other_containers is None or c in other_containers]
    return runs


def measure(ctx: common.Context, n: int, ks, zero_containers=CONTAINERS,
            containers=CONTAINERS, other_containers=None) -> dict:
    """Runs the plan at N = n over the k values ks: collect() at chosen sizes."""
    cfgs = ctx.configs_for(CONFIGS)
    if not cfgs:
        raise HeapsightError("containers: no configuration to run")
    data = {"quick": bool(ctx.quick), "n": n, "ks": list(ks), "seed": SEED,
            "probe_pad": PROBE_PAD_BYTES, "main_config": cfgs[0].name,
            "configs": [{"name": c.name, "allocator": c.allocator, "about": c.about} for c in cfgs],
            "sizes": {}, "runs": []}
    program = common.lab_program(PROGRAM)
    by_name = {c.name: c for c in cfgs}
    todo = plan(cfgs[0].name, [c.name for c in cfgs[1:]], zero_containers, containers,
                other_containers)
    missing = {}
    for i, (cname, container, alloc, kind, pad) in enumerate(todo, 1):
        cfg = by_name[cname]
        run = {"config": cname, "allocator": cfg.allocator, "container": container,
               "alloc": alloc, "strings": kind, "pad": pad, "ok": False}
        data["runs"].append(run)
        if cname not in missing:
            missing[cname] = common.config_env(cfg)[1]
        if missing[cname]:
            run["error"] = missing[cname]
            continue
        ctx.say(f"containers [{i}/{len(todo)}]: {cname}, {container}<string> with "
                f"{name_alloc(alloc)}, {kind} strings"
                + (f", heap shifted by {pad} B" if pad else "")
                + f", N={n:,}, {len(ks)} values of k")
        argv = [program, "--container", container, "--alloc", alloc, "--n", str(n),
                "--k-list", ",".join(map(str, ks)), "--zero", "1" if kind == "zero" else "0",
                "--seed", str(SEED), "--pad", str(pad)]
        try:
            lines = common.run_program(argv, cfg, timeout_s=ctx.timeout_s)
        except HeapsightError as e:
            run["error"] = e.message
            continue
        base = next((x for x in lines if x.get("phase") == "baseline"), None)
        end = next((x for x in lines if x.get("phase") == "end"), None)
        points = [{k: v for k, v in x.items() if k != "phase"}
                  for x in lines if x.get("phase") == "k"]
        if base is None or end is None or [p["k"] for p in points] != list(ks):
            run["error"] = (f"incomplete output: {len(points)} of {len(ks)} values of k"
                            + ("" if base else ", no baseline") + ("" if end else ", no end line"))
            continue
        answered = end.get("allocator")
        wrong = common.wrong_allocator(cfg.allocator, answered)
        if wrong:
            run["error"] = wrong
            continue
        if answered != "glibc":  # mallinfo2 then describes glibc's idle heap, not the run
            points = [{k: v for k, v in p.items() if not k.startswith("heap_")} for p in points]
        data["sizes"] = {k: base[k] for k in ("string_object_bytes", "sso_capacity",
                                              "list_node_bytes", "deque_block_bytes",
                                              "pool_max_bytes") if k in base}
        run.update(ok=True, answered=answered, baseline_rss=base["rss"], points=points,
                   seconds=round(end.get("seconds", 0.0), 2))
    if not any(r["ok"] for r in data["runs"]):
        errs = sorted({r.get("error", "no output") for r in data["runs"]})
        raise HeapsightError("no containers run succeeded: " + "; ".join(errs))
    return data


def collect(ctx: common.Context) -> dict:
    n, ks, zero, others = SIZES[bool(ctx.quick)]
    return measure(ctx, n, ks, zero_containers=zero, other_containers=others)


# ---------------------------------------------------------------- reading the data

def find(data: dict, container: str, alloc: str, strings: str = "random",
         config: str | None = None, pad: int = 0) -> dict | None:
    """The successful run of one cell of the matrix (main configuration by default)."""
    config = config or data.get("main_config")
    for r in data.get("runs", []):
        if (r.get("ok") and r["config"] == config and r["container"] == container
                and r["alloc"] == alloc and r["strings"] == strings and r.get("pad", 0) == pad):
            return r
    return None


def series(run: dict | None, key: str) -> list:
    return [p[key] for p in run["points"]] if run else []


def malloc_held(p: dict) -> int | None:
    """Bytes glibc still has allocated (heap in use + mmapped chunks); None elsewhere."""
    if "heap_in_use" not in p:
        return None
    return p["heap_in_use"] + p.get("heap_mmapped", 0)


def kept_through(run: dict | None) -> int | None:
    """The largest k up to which (every k included) out-of-scope RSS stayed within KEPT_TOL
    of in-scope RSS, i.e. nothing was given back; None when the first k gave memory back."""
    last = None
    for p in (run or {}).get("points", []):
        if p["rss_out"] < (1 - KEPT_TOL) * p["rss_in"]:
            break
        last = p["k"]
    return last


def fastbin_max_k() -> int:
    """The longest string whose buffer (k + 1 bytes) still fits a glibc fastbin chunk."""
    k = 1
    while max(32, (k + 1 + 8 + 15) // 16 * 16) <= FASTBIN_MAX_CHUNK:
        k += 1
    return k - 1


def slope(xs: list, ys: list) -> float:
    """The least-squares slope of ys on xs (0 when undefined)."""
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0


def ranks(v: list) -> list:
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for t in range(i, j + 1):
            r[order[t]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(xs: list, ys: list) -> float:
    """Spearman's rank correlation (0 when undefined)."""
    if len(xs) < 3:
        return 0.0
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else 0.0


def table_ks(ks: list) -> list:
    """Every k when few; else k <= 32, multiples of 64, both sides of 128, and the last."""
    if len(ks) <= TABLE_MAX_ROWS:
        return list(ks)
    keep = {k for k in ks if k <= 32 or k % 64 == 0 or 104 <= k <= 144}
    keep.add(ks[-1])
    return [k for k in ks if k in keep]


def name_alloc(alloc: str) -> str:
    return "__pool_alloc" if alloc == "pool" else "std::allocator"


# ---------------------------------------------------------------- tables

def tables(data: dict) -> list:
    out = []
    ks = data.get("ks", [])
    shown = table_ks(ks)
    main = data.get("main_config")
    more = (f"; {len(shown)} of {len(ks)} values of k shown, all are in the saved data"
            if len(shown) < len(ks) else "")
    for c in CONTAINERS:
        cells = {(a, s): find(data, c, a, s) for a in ALLOCS for s in STRINGS}
        errs = [f"{name_alloc(r['alloc'])}/{r['strings']}"
                + (f"/shifted {r['pad']} B" if r.get("pad") else "") + f": {r['error']}"
                for r in data.get("runs", [])
                if r["config"] == main and r["container"] == c and not r.get("ok")]
        if not any(cells.values()) and not errs:
            continue
        cols = ["k", "std in", "std out", "pool in", "pool out"]
        with_zero = any(cells[(a, "zero")] for a in ALLOCS)
        if with_zero:
            cols += ["zero: std out", "pool out"]
        rows = []
        for k in shown:
            row = [k]
            for key in [(a, "random", f) for a in ALLOCS for f in ("rss_in", "rss_out")] + \
                       ([(a, "zero", "rss_out") for a in ALLOCS] if with_zero else []):
                run = cells[key[:2]]
                p = next((q for q in run["points"] if q["k"] == k), None) if run else None
                row.append(in_mib(p[key[2]]) if p else "-")
            rows.append(row)
        out.append(Table(
            title=f"{c}<string>, N = {data.get('n', 0):,}, under {main}: RSS in scope and out of "
                  "scope (MiB), random strings unless marked zero",
            columns=cols, rows=rows,
            note=("run failed: " + "; ".join(errs) + ". " if errs else "")
                 + f"RSS before the first fill: {mib(_baseline(cells))}{more}",
            # on the terminal only when a run failed: the pool table and the claims' figures
            # say what they show (--verbose: all)
            detail=not errs))
    out.append(_pool_table(data))
    probe = _probe_table(data)
    if probe:
        out.append(probe)
    others = [c["name"] for c in data.get("configs", [])[1:]]
    if others:
        out.append(_mallocs_table(data, shown, [main] + others))
    return out


def _baseline(cells: dict) -> int:
    return next((r["baseline_rss"] for r in cells.values() if r), 0)


def _pool_table(data: dict) -> Table:
    sizes = data.get("sizes", {})
    unit = {"vector": f"array of {sizes.get('string_object_bytes', 32)}-byte strings",
            "list": f"{sizes.get('list_node_bytes', 48)}-byte nodes",
            "deque": f"{sizes.get('deque_block_bytes', 512)}-byte blocks + map"}
    rows = []
    for c in CONTAINERS:
        std, pool = find(data, c, "std"), find(data, c, "pool")
        if not pool:
            rows.append([c, unit[c], "-", "-", "-", "-", "-", "-"])
            continue
        small = max(series(pool, "pool_small_bytes"))
        large = max(series(pool, "pool_large_bytes"))
        held_pool = [malloc_held(p) for p in pool["points"]]
        held_std = [malloc_held(p) for p in std["points"]] if std else []
        held = (in_mib(min(held_pool)) if None not in held_pool else "-",
                in_mib(min(held_std)) if held_std and None not in held_std else "-")
        rows.append([c, unit[c], in_mib(small), in_mib(large), held[1], held[0],
                     _through(kept_through(std)), _through(kept_through(pool))])
    return Table(
        title="what the pool sees, per fill (MiB), and what stays allocated in malloc after "
              "destruction (least over k; glibc's mallinfo2)",
        columns=["container", "allocation unit", f"<= {POOL_MAX_BYTES} B (pooled)",
                 f"> {POOL_MAX_BYTES} B (to new)", "held: std", "held: pool",
                 "all kept through k: std", "pool"],
        rows=rows,
        note=f"string buffers (k > {sizes.get('sso_capacity', 15)}) always come from malloc; "
             f"'all kept through k': out-of-scope RSS within {KEPT_TOL:.0%} of in-scope at "
             "every k up to that one")


def _through(k: int | None) -> str:
    return "-" if k is None else str(k)


def _probe_table(data: dict) -> Table | None:
    rows = []
    for c in CONTAINERS:
        std = find(data, c, "std")
        probe = find(data, c, "std", pad=data.get("probe_pad", -1))
        shift = layout_shift(data, c)
        if not shift:
            continue
        rows.append([c, in_mib(statistics.fmean(series(std, "rss_out"))),
                     in_mib(statistics.fmean(series(probe, "rss_out"))), f"{shift['share']:.0%}",
                     in_mib(shift["max_move"]), "yes" if shift["stable"] else "NO"])
    if not rows:
        return None
    return Table(
        title=f"layout probe: std::allocator with {data.get('probe_pad')} bytes malloc'd before "
              "the first fill (every later chunk moves by a few bytes), out of scope (MiB)",
        columns=["container", "mean", "mean, shifted", f"k within {OVERLAP_TOL:.0%}",
                 "largest move", "stable"],
        rows=rows,
        note=f"stable: within {OVERLAP_TOL:.0%} at {OVERLAP_MIN_SHARE:.0%} of k or more; an "
             "unstable container's out-of-scope RSS says more about the heap layout than about "
             "the allocator",
        # on the terminal when a container moved: the overlap claim's figure says which
        detail=all(r[-1] == "yes" for r in rows))


def _mallocs_table(data: dict, shown: list, cfg_names: list) -> Table:
    cols, runs = ["k"], []
    planned = {(r["container"], r["config"]) for r in data.get("runs", [])
               if r["alloc"] == "std" and r["strings"] == "random" and not r.get("pad")}
    for c in CONTAINERS:
        for n in cfg_names:
            if (c, n) in planned:   # (--quick fills only the list under the others)
                cols.append(f"{c} {n}")
                runs.append(find(data, c, "std", "random", n))
    rows = []
    for k in shown:
        row = [k]
        for r in runs:
            p = next((q for q in r["points"] if q["k"] == k), None) if r else None
            row.append(in_mib(p["rss_out"]) if p else "-")
        rows.append(row)
    errs = sorted({f"{r['config']}: {r['error']}" for r in data.get("runs", [])
                   if not r.get("ok") and r["config"] in cfg_names[1:]})
    return Table(title="out-of-scope RSS (MiB) with std::allocator, by malloc", columns=cols,
                 rows=rows, note="; ".join(errs),
                 brief_rows=[i for i, k in enumerate(shown) if k in BRIEF_KS])


# ---------------------------------------------------------------- claims

def claims(data: dict) -> list:
    return [_claim_pool_keeps(data), _claim_overlap(data), _claim_list_grows(data),
            _claim_zero(data), _claim_deque(data)]


def _claim_pool_keeps(data: dict) -> Claim:
    text = "the pool allocator keeps the memory of objects of at most 128 bytes after the container is destroyed"
    results, parts, passthrough, unmeasured, short = {}, [], [], [], []
    for c in CONTAINERS:
        std, pool = find(data, c, "std"), find(data, c, "pool")
        if not pool:
            continue
        pooled = max(series(pool, "pool_small_bytes"))
        biggest = max(series(pool, "max_request"))
        if pooled < POOLED_MIN_BYTES:
            passthrough.append(f"{c} ({fmt.human(pooled)} of small requests per fill, largest "
                               f"request {fmt.human(biggest)})")
            continue
        hp = [malloc_held(p) for p in pool["points"]]
        hs = [malloc_held(p) for p in std["points"]] if std else [None]
        if None in hp or None in hs:
            # RSS alone cannot tell the pool's holdings from what malloc itself keeps
            unmeasured.append(c)
            continue
        kept = min(a - b for a, b in zip(hp, hs))
        results[c] = kept >= KEPT_MIN_FRACTION * pooled
        short.append(f"{c}: pooled {mib(pooled)} per fill, malloc still held {mib(kept)} more "
                     "than with std::allocator after every destruction")
        parts.append(f"{c}: the pool served {mib(pooled)} per fill in requests of at most "
                     f"{biggest} B, and after every destruction malloc still had at least "
                     f"{mib(kept)} more allocated than with std::allocator")
    tail = ""
    if passthrough:
        tail += (" " + ", ".join(passthrough) + ": the pool hands everything on to operator new, "
                 "so it keeps nothing there.")
    if not results:
        if unmeasured:
            return claim(text, DEPENDS,
                         f"{', '.join(unmeasured)} sent the pool its small requests, but without "
                         "glibc's mallinfo2 (or with a run missing) the pool's holdings cannot be "
                         "told from what malloc keeps." + tail,
                         "malloc statistics, which only glibc gives here")
        return claim(text, DEPENDS,
                     "No run sent the pool requests of at most 128 bytes (only a list's nodes do)."
                     + tail, "a container whose nodes are pooled (list), which did not run")
    ev = "; ".join(parts) + "." + tail
    ev += f" String buffers never go through the pool. {_k_threshold_note(data)}"
    figure = "; ".join(short) + (f"; nothing pooled for {', '.join(p.split(' (')[0] for p in passthrough)}"
                                 if passthrough else "")
    return claim(text, common.verdict_of(results.values()), ev.strip(), "container",
                 figure=figure)


def _k_threshold_note(data: dict) -> str:
    """Where along k memory stops being kept, and whether the pool's requests change there."""
    fk = fastbin_max_k()
    bits, same = [], []
    for c in CONTAINERS:
        pool = find(data, c, "pool")
        if not pool:
            continue
        for a, run in (("std", find(data, c, "std")), ("pool", pool)):
            t = kept_through(run)
            if run and t is not None and t < run["points"][-1]["k"]:
                bits.append(f"{c}/{a} through k={t}")
        small = series(pool, "pool_small_bytes")
        if small and min(small) == max(small) and small[0] >= POOLED_MIN_BYTES:
            same.append(f"{c}: {mib(small[0])} at every k")
    if not bits:
        return ""
    return ("Out-of-scope RSS equals in-scope RSS (all kept) " + ", ".join(bits) + "; the pool's "
            "share does not change with k (" + ("; ".join(same) or "nothing pooled") + "). "
            f"glibc keeps the freed buffers of strings up to k = {fk} in fastbins (chunks of at "
            "most 128 bytes) that are not merged, so a limit near k = 128 is malloc's, not the pool's.")


def overlap_share(a: dict, b: dict) -> float:
    """The share of k at which two runs' out-of-scope RSS lie within OVERLAP_TOL."""
    close = [abs(x - y) <= OVERLAP_TOL * max(x, y)
             for x, y in zip(series(a, "rss_out"), series(b, "rss_out"))]
    return sum(close) / len(close) if close else 0.0


def layout_shift(data: dict, container: str) -> dict | None:
    """What the layout probe did to std::allocator's out-of-scope RSS: the share of k still
    within OVERLAP_TOL, and the largest move; None without a probe run."""
    std, probe = find(data, container, "std"), find(data, container, "std", pad=data.get("probe_pad", -1))
    if not (std and probe):
        return None
    moves = [abs(x - y) for x, y in zip(series(std, "rss_out"), series(probe, "rss_out"))]
    return {"share": overlap_share(std, probe), "max_move": max(moves),
            "stable": overlap_share(std, probe) >= OVERLAP_MIN_SHARE}


def _claim_overlap(data: dict) -> Claim:
    text = "std::allocator keeps about as much memory after destruction as the pool allocator (their out-of-scope lines overlap)"
    results, parts, short = {}, [], []
    for c in CONTAINERS:
        std, pool = find(data, c, "std"), find(data, c, "pool")
        if not (std and pool):
            continue
        share = overlap_share(std, pool)
        short.append(f"{c} {share:.0%}")
        shift = layout_shift(data, c)
        part = (f"{c}: within {OVERLAP_TOL:.0%} at {share:.0%} of k (mean out of scope std "
                f"{mib(statistics.fmean(series(std, 'rss_out')))}, pool "
                f"{mib(statistics.fmean(series(pool, 'rss_out')))})")
        if shift and not shift["stable"]:
            # two std::allocator runs a few bytes apart already disagree: std vs pool
            # cannot be told apart from where glibc's chunks happened to fall
            results[c] = None
            part += (f", but std::allocator alone with the heap shifted by "
                     f"{data['probe_pad']} B agrees with itself at only {shift['share']:.0%} "
                     f"of k and moves by up to {mib(shift['max_move'])}")
        else:
            results[c] = share >= OVERLAP_MIN_SHARE
        parts.append(part)
    if not results:
        return claim(text, DEPENDS, "No container ran with both allocators.",
                     "runs missing from this data")
    decided = {c: v for c, v in results.items() if v is not None}
    layout = [c for c, v in results.items() if v is None]
    verdict = DEPENDS if layout else common.verdict_of(decided.values())
    dep = "container: " + ", ".join(
        [f"{'holds' if v else 'fails'} for {c}" for c, v in decided.items()]
        + [f"heap layout for {c}" for c in layout])
    figure = (f"std and pool within {OVERLAP_TOL:.0%} at this share of k (the claim: "
              f"{OVERLAP_MIN_SHARE:.0%}): " + ", ".join(short)
              + (f"; the heap shifted by {data.get('probe_pad')} B moves "
                 + ", ".join(layout) + " more than that" if layout else ""))
    return claim(text, verdict, "; ".join(parts) + ".", dep, figure=figure)


def _growth(run: dict, n: int) -> tuple:
    """(out-of-scope growth per unit of k relative to N bytes, Spearman's rho with k)."""
    ks, outs = series(run, "k"), series(run, "rss_out")
    return (slope(ks, outs) / n if n else 0.0), spearman(ks, outs)


def _claim_list_grows(data: dict) -> Claim:
    text = "with the default allocator a list's RSS keeps growing: memory is never given back"
    n = data.get("n", 0)
    results, parts, short = {}, [], []
    for cfg in data.get("configs", []):
        run = find(data, "list", "std", "random", cfg["name"])
        if not run:
            continue
        ratio, rho = _growth(run, n)
        grows = ratio >= GROWTH_MIN_RATIO and rho >= GROWTH_MIN_RHO
        outs = series(run, "rss_out")
        short.append(f"{cfg['name']} {ratio:.2f} x N, rho {rho:.2f}")
        parts.append(f"{cfg['name']}: out of scope {mib(outs[0])} at k={run['points'][0]['k']} "
                     f"to {mib(outs[-1])} at k={run['points'][-1]['k']}, slope "
                     f"{ratio:.2f} x N bytes per unit of k, rho {rho:.2f}")
        decay = purges_later(cfg["name"], run)
        if grows and decay:
            # it kept everything, but gives back only once its decay time has passed
            grows = None
            parts[-1] += (f", in {run.get('seconds', 0):.1f} s: shorter than jemalloc's "
                          f"{decay:g} s decay, after which it purges what was freed")
            short[-1] += f" in {run.get('seconds', 0):.1f} s"
        results[cfg["name"]] = grows
    contrast = []
    pool = find(data, "list", "pool")
    if pool:
        ratio, rho = _growth(pool, n)
        contrast.append(f"list with __pool_alloc {ratio:.2f} x N (rho {rho:.2f}, ending at "
                        f"{mib(series(pool, 'rss_out')[-1])})")
    for c in ("vector", "deque"):
        run = find(data, c, "std")
        if run:
            ratio, rho = _growth(run, n)
            contrast.append(f"{c} with std::allocator {ratio:.2f} x N (rho {rho:.2f})")
    if contrast:
        parts.append(f"for contrast under {data.get('main_config')}: " + ", ".join(contrast))
    if not results:
        return claim(text, DEPENDS, "No list ran with std::allocator.",
                     "runs missing from this data")
    dep = "malloc: " + ", ".join(
        f"{'grows' if v else 'does not grow' if v is not None else 'undecided in a short run'}"
        f" under {c}" for c, v in results.items())
    decided = [v for v in results.values() if v is not None]
    verdict = DEPENDS if None in results.values() else common.verdict_of(decided)
    return claim(text, verdict,
                 "; ".join(parts) + f". Growing means a slope of at least {GROWTH_MIN_RATIO} x N "
                 f"and Spearman's rho >= {GROWTH_MIN_RHO} over k.", dep,
                 figure=f"list out of scope, slope over k (the claim: at least "
                        f"{GROWTH_MIN_RATIO} x N, rho {GROWTH_MIN_RHO}): " + "; ".join(short))


def purges_later(config: str, run: dict) -> float:
    """jemalloc's decay time in seconds when a run under config was shorter than it (jemalloc
    then had no time to purge what was freed), else 0. The decay is jemalloc's default,
    JEMALLOC_DECAY_S, unless the configuration (a preset) sets its own."""
    if run.get("allocator") != "jemalloc" or "seconds" not in run:
        return 0.0
    preset = PRESET.get(config)
    if preset and "decay_ms" in preset.env.get("MALLOC_CONF", ""):
        return 0.0
    return JEMALLOC_DECAY_S if run["seconds"] < JEMALLOC_DECAY_S else 0.0


def _claim_zero(data: dict) -> Claim:
    text = "all-zero strings make the program hold more memory than random ones"
    results, parts = {}, []
    for c in CONTAINERS:
        for a in ALLOCS:
            rnd, zero = find(data, c, a, "random"), find(data, c, a, "zero")
            if not (rnd and zero):
                continue
            mr, mz = statistics.fmean(series(rnd, "rss_out")), statistics.fmean(series(zero, "rss_out"))
            results[f"{c}/{a}"] = mz > mr * (1 + MORE_TOL) and mz - mr > MORE_MIN_BYTES
            parts.append(f"{c}/{a} {mib(mz)} vs {mib(mr)}")
    if not results:
        return claim(text, DEPENDS, "No all-zero run is in this data.",
                     "runs missing from this data")
    dep = "container and allocator: more for " + ", ".join(c for c, v in results.items() if v)
    more = [c for c, v in results.items() if v]
    figure = (f"all-zero strings held more (over {MORE_TOL:.0%}) in {len(more)} of "
              f"{len(results)} runs" + (": " + ", ".join(more) if more else "")
              + "; mean out of scope " + "; ".join(parts[:2]) + (", ..." if len(parts) > 2 else ""))
    return claim(text, common.verdict_of(results.values()),
                 "Mean out-of-scope RSS over k, all-zero vs random: " + "; ".join(parts)
                 + f". More means over {MORE_TOL:.0%} and {mib(MORE_MIN_BYTES)} above; malloc "
                 "never looks at the bytes stored, only at the sizes asked for.", dep,
                 figure=figure)


def _claim_deque(data: dict) -> Claim:
    text = "compared with vector, deque has around 30 MB overhead in RSS"
    n = data.get("n", 0)
    expect = DEQUE_OVERHEAD_BYTES_PER_MILLION * n / 1_000_000
    vec, deq = find(data, "vector", "std"), find(data, "deque", "std")
    if not (vec and deq):
        return claim(text, DEPENDS, "vector or deque with std::allocator did not run.",
                     "runs missing from this data")
    d_in = statistics.median(a - b for a, b in zip(series(deq, "rss_in"), series(vec, "rss_in")))
    d_out = statistics.median(a - b for a, b in zip(series(deq, "rss_out"), series(vec, "rss_out")))
    ok = expect / AROUND_FACTOR <= d_in <= expect * AROUND_FACTOR
    sizes = data.get("sizes", {})
    return claim(text, HOLDS if ok else FAILS,
                 figure=f"in scope, deque - vector = {mib(d_in)}, median over k (the claim: "
                        f"{mib(expect)} at N = {n:,}, within a factor of {AROUND_FACTOR:g})",
                 evidence=f"In scope, deque - vector = {mib(d_in)} (median over k) against the "
                 f"write-up's 30 MB at N = 1,000,000 ({mib(expect)}"
                 + (f" scaled to N = {n:,}" if n != 1_000_000 else "")
                 + f"; accepted within a factor of {AROUND_FACTOR:g}): the vector's array of "
                 f"{sizes.get('string_object_bytes', 32)}-byte strings and the deque's "
                 f"{sizes.get('deque_block_bytes', 512)}-byte blocks hold the same string objects. "
                 f"Out of scope the median difference is {mib(d_out)}"
                 + _probe_note(data, ("deque", "vector")) + ".")


def _probe_note(data: dict, which) -> str:
    moved = [(c, layout_shift(data, c)) for c in which]
    moved = [f"{c} by up to {mib(s['max_move'])}" for c, s in moved if s and not s["stable"]]
    if not moved:
        return ""
    return (f"; shifting the heap by {data.get('probe_pad')} B moves that of " + ", ".join(moved)
            + ", so it is where glibc's chunks fall rather than a cost of the container")


# ---------------------------------------------------------------- charts

def charts(data: dict) -> list:
    out = []
    main = data.get("main_config")
    for c in CONTAINERS:
        ser = []
        for a in ALLOCS:
            run = find(data, c, a)
            if not run:
                continue
            for key, label in (("rss_in", "in scope"), ("rss_out", "out of scope")):
                ser.append({"name": f"{name_alloc(a)}, {label}", "x": series(run, "k"),
                            "y": series(run, key)})
        probe = find(data, c, "std", pad=data.get("probe_pad", -1))
        if ser and probe:
            ser.append({"name": f"std::allocator, out of scope, heap shifted by "
                                f"{data.get('probe_pad')} B", "x": series(probe, "k"),
                        "y": series(probe, "rss_out")})
        if ser:
            out.append({
                "id": f"containers-{c}", "title": f"{c}<string>: RSS in and out of scope under {main}",
                "kind": "line",
                "x": {"label": "string length k", "unit": "bytes", "log": False},
                "y": {"label": "RSS", "unit": "bytes", "log": False},
                "series": ser,
                "note": f"N = {data.get('n', 0):,} strings per fill, k increasing in one process; "
                        "in scope = filled, out of scope = after destruction; the shifted line "
                        "is std::allocator again with a few bytes malloc'd first."})
    ser = []
    for c in CONTAINERS:
        for a in ALLOCS:
            run = find(data, c, a)
            if run:
                ser.append({"name": f"{c}, {name_alloc(a)}", "x": series(run, "k"),
                            "y": series(run, "rss_out")})
    if ser:
        out.append({
            "id": "containers-out-of-scope", "title": f"out-of-scope RSS, every container and allocator, under {main}",
            "kind": "line",
            "x": {"label": "string length k", "unit": "bytes", "log": False},
            "y": {"label": "RSS after destruction", "unit": "bytes", "log": False},
            "series": ser,
            "note": "Where std and pool lines lie on each other, the memory is kept by malloc, "
                    "not by the pool."})
    return out
