"""release: the size sweep. One block at a time, 2 KB up to 2 GB, malloc + touch + free,
in three orders: which freed blocks go back to the OS, and does the order matter?"""

from __future__ import annotations

import math

from heapsight import fmt
from heapsight.errors import HeapsightError
from heapsight.lab import common
from heapsight.lab.common import DEPENDS, FAILS, HOLDS, Table, config, errors_note, size_label

NAME = "release"
TITLE = "size sweep 2 KB .. 2 GB: which freed blocks go back to the OS, in which order"
# seconds of its --quick run (between a quiet machine and one at a load of 4) and of its
# full run (at a load of 3 to 4) on 2 cores, from bench/lab-time: the lab's estimate at the
# start, and each experiment's share of the time left
QUICK_SECONDS = 4
FULL_SECONDS = 40
SOURCE = ("malloc/free and returning memory to the OS: sbrk vs mmap (CentOS 7, glibc tunables, "
          "an mmap allocator, jemalloc)")
ABOUT = ("Allocates one block at a time (2 KB, 20 KB, 200 KB, 2 MB, 20 MB, 200 MB, 2 GB), "
         "writes every byte of it, frees it, and reads VmSize and VmRSS before, during and "
         "after, as the write-up did, in ascending, descending and shuffled order and under "
         "each allocator. A block counts as kept when its pages are still resident after the "
         "free. glibc serves blocks above its mmap threshold (128 KiB at start) with mmap and "
         "unmaps them on free, but raises the threshold to the size of each mmapped block it "
         "frees (up to 32 MiB), so the same 2 MB block is returned in ascending order and "
         "kept in descending order.")
CONFIGS = ("glibc", "glibc-mmap128k", "glibc-trim128k", "jemalloc", "tcmalloc", "mimalloc", "mmap")
ORDERS = ("shuffled", "ascending", "descending")
SEED = 1
QUICK_MAX_MB = 200    # quick: up to the 200 MB block
FULL_MAX_MB = 2048    # full: up to the 2 GB block, as the write-up

# A block is "returned" when less than this share of its pages is still resident after the
# free: room for the page an mmapped chunk's header adds and an allocator's bookkeeping.
RETURNED_BELOW = 0.10
# A block "stays" when more than half of its pages are still resident after the free: a
# real retention, not a page of rounding. Between the two: partly returned.
STAYS_ABOVE = 0.50
SMALL_MAX = 20 * 1024          # the write-up's "small" blocks: 2 KB and 20 KB
LARGE_MIN = 2 * 1024 * 1024    # its "large" ones: 2 MB and up
TUNABLE_MIN = 128 * 1024       # the tunables under test set 128 KiB: blocks from there up
GLIBC_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc never raises the threshold above this
JEMALLOC_OVERSIZE = 8 * 1024 * 1024  # jemalloc 5's opt.oversize_threshold default

claim = common.claim_for(SOURCE)


# --- collecting -------------------------------------------------------------------------

def collect(ctx) -> dict:
    max_mb = QUICK_MAX_MB if ctx.quick else FULL_MAX_MB
    prog = common.lab_program("hs-lab-release")
    data = {"max_mb": max_mb, "seed": SEED, "orders": list(ORDERS), "configs": []}
    ran = 0
    for cfg in ctx.configs_for(CONFIGS):
        entry = {"name": cfg.name, "allocator": cfg.allocator, "env": dict(cfg.env),
                 "about": cfg.about, "error": None, "runs": {}}
        data["configs"].append(entry)
        if common.cannot_run(ctx, cfg, entry):
            continue
        for order in ORDERS:
            ctx.say(f"{cfg.name}: {order} order, blocks up to {size_label(max_mb * 1024 * 1024)}")
            argv = [prog, "--order", order, "--max-mb", str(max_mb), "--seed", str(SEED)]
            try:
                lines = common.run_program(argv, cfg, timeout_s=ctx.timeout_s)
            except HeapsightError as e:
                entry["runs"][order] = {"error": e.message}
                continue
            entry["runs"][order] = parse_run(lines, cfg.allocator)
            if not entry["runs"][order]["error"]:
                ran += 1
    if ran == 0:
        raise common.nothing_ran(data, "configuration")
    return data


def parse_run(lines: list, allocator: str) -> dict:
    start = next((x for x in lines if x.get("event") == "start"), None)
    done = next((x for x in lines if x.get("event") == "done"), None)
    blocks = [x for x in lines if x.get("event") == "block"]
    run = {"error": None, "page": (start or {}).get("page", 4096),
           "answered": (start or {}).get("allocator"), "seconds": (done or {}).get("seconds"),
           "blocks": [{k: b[k] for k in ("index", "size", "vm_before", "rss_before", "vm_during",
                                         "rss_during", "vm_after", "rss_after", "mmapped_during")}
                      for b in blocks]}
    if start is None or done is None or len(blocks) != start.get("blocks"):
        run["error"] = "the program's output was incomplete"
    else:
        run["error"] = common.wrong_allocator(allocator, run["answered"])
    return run


# --- reading the data back --------------------------------------------------------------

def block_bytes(b: dict, page: int) -> int:
    """The block's size in whole pages: what writing every byte of it made resident."""
    return math.ceil(b["size"] / page) * page


def kept(b: dict, page: int, kind: str = "rss") -> int:
    """Bytes of the block still resident (kind 'rss') or still mapped ('vm') after the free:
    its pages minus what the free gave back (during - after), within [0, its pages].

    after - before alone would call a block returned when it landed in memory an earlier
    freed block had left resident (nothing new before, nothing given back after)."""
    whole = block_bytes(b, page)
    given_back = b[f"{kind}_during"] - b[f"{kind}_after"]
    return min(whole, max(0, whole - given_back))


def kept_share(b: dict, page: int, kind: str = "rss") -> float:
    return kept(b, page, kind) / block_bytes(b, page)


def outcome(b: dict, page: int, kind: str = "rss") -> str:
    share = kept_share(b, page, kind)
    if share < RETURNED_BELOW:
        return "returned"
    if share > STAYS_ABOVE:
        return "stays"
    return "partly"


def ok_runs(data: dict, name: str) -> dict:
    """{order: run} of one configuration's runs that worked (empty if it is not in data)."""
    cfg = config(data, name)
    if not cfg:
        return {}
    return {o: r for o, r in cfg.get("runs", {}).items() if not r.get("error")}


def by_size(run: dict) -> dict:
    return {b["size"]: b for b in run["blocks"]}


def order_of(data: dict, order: str) -> list:
    """The sizes in the order they were allocated (the same in every configuration)."""
    for c in common.configs(data):
        r = c.get("runs", {}).get(order)
        if r and not r.get("error"):
            return [b["size"] for b in r["blocks"]]
    return []


def all_sizes(data: dict) -> list:
    return sorted({s for o in data.get("orders", ORDERS) for s in order_of(data, o)})


def cell(data: dict, name: str, order: str, size: int, kind: str = "rss") -> str:
    cfg = config(data, name)
    if cfg is None:
        return "-"
    if cfg.get("error"):
        return "error"
    run = cfg.get("runs", {}).get(order)
    if run is None:
        return "-"
    if run.get("error"):
        return "error"
    b = by_size(run).get(size)
    if b is None:
        return "-"
    return fmt.kib(kept(b, run["page"], kind))


def fmt_pairs(pairs: list) -> str:
    return ", ".join(pairs) if pairs else "none"


# --- tables -----------------------------------------------------------------------------

def tables(data: dict) -> list:
    names = [c["name"] for c in common.configs(data)]
    out = []
    ran = [o for o in data.get("orders", ORDERS) if order_of(data, o)]
    for order in ran:
        rows = [[size_label(s)] + [cell(data, n, order, s) for n in names]
                for s in order_of(data, order)]
        note = "rows in allocation order"
        # the terminal shows the ascending and descending orders, which tell glibc's dynamic
        # threshold apart, and the shuffled one only when it ran alone (--verbose: all)
        detail = order == "shuffled" and len(ran) > 1
        if not out or (not detail and all(t.detail for t in out)):
            note = ("kept = the block's pages still resident after free (its size in pages minus "
                    "what free gave back, RSS during - after); " + note)
        if order == "shuffled":
            note += f" (seed {data.get('seed', SEED)})"
        out.append(Table(f"RSS kept after free, {order} order", ["block"] + names, rows, note,
                         detail=detail))
    vm_names = [n for n in ("glibc", "jemalloc") if config(data, n)]
    sizes = all_sizes(data)
    if vm_names and sizes:
        orders = [o for o in data.get("orders", ORDERS) if order_of(data, o)]
        cols = [f"{n} {o[:4]}" for n in vm_names for o in orders]
        rows = [[size_label(s)] + [cell(data, n, o, s, "vm") for n in vm_names for o in orders]
                for s in sizes]
        out.append(Table("virtual memory (VmSize) kept after free", ["block"] + cols, rows,
                         "kept = the block's pages still mapped after free (VmSize during - after); "
                         "shuf/asce/desc: the order; rows by size", detail=True))
    note = errors_note(data)
    if note and out:   # on the first table the terminal shows
        first = next((t for t in out if not t.detail), out[0])
        first.note = (first.note + "\n  " if first.note else "") + note
    return out


# --- claims -----------------------------------------------------------------------------

def claims(data: dict) -> list:
    out = []
    for fn in (claim_glibc_cutoff, claim_tunables, claim_jemalloc_virtual,
               claim_jemalloc_200k, claim_mmap_allocator, claim_small_stay):
        c = fn(data)
        if c is not None:
            out.append(c)
    return out


def share_text(b: dict, page: int, kind: str = "rss") -> str:
    return f"{size_label(b['size'])} kept {fmt.kib(kept(b, page, kind))}"


def claim_glibc_cutoff(data: dict):
    runs = ok_runs(data, "glibc")
    if not runs:
        return None
    text = "blocks above about 200 KB go back to the OS on free, smaller ones stay (glibc)"
    per_order, bad_small, bad_large, explained = {}, [], [], True
    short = []   # the figure: which blocks were not as claimed, briefly
    for order, run in runs.items():
        page = run["page"]
        ok = True
        biggest_unmapped = 0  # the largest block so far that glibc mmapped (and so unmapped)
        for b in run["blocks"]:
            res = outcome(b, page)
            if b["size"] <= SMALL_MAX and res != "stays":
                ok = False
                bad_small.append(f"{order}: {share_text(b, page)}")
                short.append(f"{order} {size_label(b['size'])} given back")
            if b["size"] >= LARGE_MIN and res != "returned":
                ok = False
                why = ""
                if b["size"] <= biggest_unmapped:
                    why = f" after a {size_label(biggest_unmapped)} block was mmapped and freed"
                else:
                    explained = False
                bad_large.append(f"{order}: {share_text(b, page)}{why}")
                short.append(f"{order} {size_label(b['size'])} kept")
            if b["mmapped_during"] >= b["size"] and b["size"] <= GLIBC_MMAP_THRESHOLD_MAX:
                biggest_unmapped = max(biggest_unmapped, b["size"])
        per_order[order] = ok
    held = [o for o, ok in per_order.items() if ok]
    mid = []
    for order, run in runs.items():
        for b in run["blocks"]:
            if SMALL_MAX < b["size"] < LARGE_MIN:
                mid.append(f"{order} {outcome(b, run['page'])}")
    evidence = (f"2 KB and 20 KB blocks that did not stay: {fmt_pairs(bad_small)}; blocks of "
                f"2 MB and up that were not returned: {fmt_pairs(bad_large)}. The 200 KB block: "
                f"{', '.join(mid) if mid else 'not run'}.")
    figure = ("not as claimed: " + ", ".join(short) + (
        " (after a larger mmapped block was freed)" if bad_large and explained else "")
        if short else "2 and 20 KiB blocks stayed, 2 MiB and up went back, in every order")
    if len(held) == len(per_order):
        return claim(text, HOLDS, f"in every order ({', '.join(per_order)}). " + evidence,
                     figure=figure)
    if not held:
        return claim(text, FAILS, "in no order. " + evidence, figure=figure)
    depends = ("allocation order (glibc's dynamic mmap threshold)" if explained and not bad_small
               else "allocation order")
    return claim(text, DEPENDS,
                 f"holds in {', '.join(held)} order; not in "
                 f"{', '.join(o for o in per_order if o not in held)}. " + evidence, depends,
                 figure=f"holds in {', '.join(held)} order; " + figure)


def claim_tunables(data: dict):
    base = ok_runs(data, "glibc")
    tuned = [c for c in common.configs(data) if c["allocator"] == "glibc"
             and any(k in c.get("env", {}).get("GLIBC_TUNABLES", "")
                     for k in ("mmap_threshold", "trim_threshold"))]
    tuned = [(c["name"], ok_runs(data, c["name"])) for c in tuned]
    tuned = [(n, r) for n, r in tuned if r]
    if not base or not tuned:
        return None
    text = "the GLIBC tunables mmap_threshold and trim_threshold change nothing"
    changed, compared = {}, 0
    for name, runs in tuned:
        for order, run in runs.items():
            if order not in base:
                continue
            ref = by_size(base[order])
            for b in run["blocks"]:
                r = ref.get(b["size"])
                if r is None or b["size"] < TUNABLE_MIN:
                    continue
                compared += 1
                if outcome(r, base[order]["page"]) != outcome(b, run["page"]):
                    changed.setdefault(name, []).append(
                        f"{order} {size_label(b['size'])} {fmt.kib(kept(r, base[order]['page']))}"
                        f" -> {fmt.kib(kept(b, run['page']))}")
    if not compared:
        return None
    if changed:
        n = sum(len(v) for v in changed.values())
        figure = (f"{n} of {compared} blocks of 128 KiB and up changed outcome, e.g. "
                  f"{next(iter(changed))}: {changed[next(iter(changed))][0]}")
        return claim(text, FAILS,
                     f"{n} of {compared} blocks of 128 KiB and up changed outcome (RSS kept after "
                     "free, default -> tuned): "
                     + "; ".join(f"{k}: {', '.join(v)}" for k, v in changed.items())
                     + ". Setting either tunable switches glibc's dynamic mmap threshold off.",
                     figure=figure)
    return claim(text, HOLDS,
                 f"none of {compared} blocks of 128 KiB and up changed outcome under "
                 f"{', '.join(n for n, _ in tuned)}.")


def claim_jemalloc_virtual(data: dict):
    runs = ok_runs(data, "jemalloc")
    if not runs:
        return None
    text = "with jemalloc, physical memory is returned on free but virtual memory is not"
    yes, no, figures = set(), set(), {}
    for order, run in runs.items():
        page = run["page"]
        for b in run["blocks"]:
            if b["size"] < LARGE_MIN:
                continue
            fits = outcome(b, page) == "returned" and outcome(b, page, "vm") == "stays"
            (yes if fits else no).add(b["size"])
            figures.setdefault(b["size"], []).append((kept(b, page), kept(b, page, "vm")))
    sizes = sorted(figures)
    if not sizes:
        return None
    detail = "; ".join(f"{size_label(s)}: RSS kept {span([f[0] for f in figures[s]])}, VM kept "
                       f"{span([f[1] for f in figures[s]])}" for s in sizes)
    detail += f" (after free, over {len(runs)} order(s))"
    figure = "KiB kept after free, RSS / VM: " + "; ".join(
        f"{size_label(s)} {span([f[0] for f in figures[s]], '')} / "
        f"{span([f[1] for f in figures[s]], '')}" for s in sizes)
    if not no:
        return claim(text, HOLDS, "for every block of 2 MB and up: " + detail + ".",
                     figure=figure)
    if not yes:
        return claim(text, FAILS, "for no block of 2 MB and up: " + detail + ".", figure=figure)
    fit_sizes = sorted(yes - no)
    why = ""
    if fit_sizes and all((s > JEMALLOC_OVERSIZE) == (s in fit_sizes) for s in sizes):
        why = (" jemalloc 5 serves blocks above its oversize_threshold (8 MiB) from a "
               "dedicated arena that purges at once; smaller ones wait for decay.")
    on = (f"block size (from {size_label(fit_sizes[0])} up)" if fit_sizes and
          all(s in fit_sizes for s in sizes if s >= fit_sizes[0]) else "block size and order")
    return claim(text, DEPENDS, detail + "." + why, on, figure=figure)


def span(values: list, unit: str = " KiB") -> str:
    lo, hi = min(values), max(values)
    lo, hi = f"{lo / 1024:,.0f}", f"{hi / 1024:,.0f}"
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def claim_jemalloc_200k(data: dict):
    runs = ok_runs(data, "jemalloc")
    if not runs:
        return None
    text = "with jemalloc a freed 200 KB block's physical memory goes back (a lower threshold than glibc's)"
    res = {}
    for order, run in runs.items():
        b = by_size(run).get(200 * 1024)
        if b:
            res[order] = (outcome(b, run["page"]), fmt.kib(kept(b, run["page"])))
    if not res:
        return None
    detail = "; ".join(f"{o}: kept {k} ({r})" for o, (r, k) in res.items())
    return claim(text, common.verdict_of(r == "returned" for r, _ in res.values()), detail + ".",
                 "allocation order")


def claim_mmap_allocator(data: dict):
    names = [c["name"] for c in common.configs(data) if c["allocator"] == "mmap"]
    runs = [(n, o, r) for n in names for o, r in ok_runs(data, n).items()]
    if not runs:
        return None
    text = "an allocator that mmaps every block and munmaps it on free returns everything"
    bad, total = [], 0
    for name, order, run in runs:
        page = run["page"]
        for b in run["blocks"]:
            total += 1
            if outcome(b, page) != "returned" or outcome(b, page, "vm") != "returned":
                bad.append(f"{name} {order}: {size_label(b['size'])} RSS kept "
                           f"{fmt.kib(kept(b, page))}, VM kept {fmt.kib(kept(b, page, 'vm'))}")
    if not bad:
        return claim(text, HOLDS,
                     f"all {total} blocks (2 KB up, every order) gave back their pages and "
                     "their address space on free.")
    verdict = FAILS if len(bad) == total else DEPENDS
    return claim(text, verdict, f"{len(bad)} of {total} blocks were not: " + "; ".join(bad)
                 + ".", "block size")


def claim_small_stay(data: dict):
    cfgs = [c for c in common.configs(data) if c["allocator"] != "mmap"]
    text = "small memory allocations generally do not get released to the OS on free"
    kept_by, freed_by = [], []
    for c in cfgs:
        runs = ok_runs(data, c["name"])
        blocks = [(o, b, r["page"]) for o, r in runs.items() for b in r["blocks"]
                  if b["size"] <= SMALL_MAX]
        if not blocks:
            continue
        out = [f"{c['name']} {o} {size_label(b['size'])}" for o, b, p in blocks
               if outcome(b, p) != "stays"]
        (freed_by if out else kept_by).append((c["name"], out))
    if not kept_by and not freed_by:
        return None
    mmap_note = ""
    if any(c["allocator"] == "mmap" for c in common.configs(data)):
        mmap_note = " (the per-allocation mmap baseline returns them by design and is left out)"
    evidence = (f"2 KB and 20 KB blocks stayed resident in every order under "
                f"{', '.join(n for n, _ in kept_by) or 'none'}"
                + (f"; not under {', '.join(n for n, _ in freed_by)} ("
                   + "; ".join(', '.join(x) for _, x in freed_by) + " returned)" if freed_by else "")
                + mmap_note + ".")
    return claim(text, common.verdict_split(kept_by, freed_by),
                 evidence, "allocator")


# --- charts -----------------------------------------------------------------------------

def series(data: dict, name: str, order: str, kind: str = "rss", label: str | None = None):
    run = ok_runs(data, name).get(order)
    if not run:
        return None
    blocks = sorted(run["blocks"], key=lambda b: b["size"])
    return {"name": label or name, "x": [b["size"] for b in blocks],
            "y": [round(100 * kept_share(b, run["page"], kind), 1) for b in blocks]}


def charts(data: dict) -> list:
    out = []
    x = {"label": "block size", "unit": "bytes", "log": True}
    y = {"label": "share of the block still resident after free", "unit": "%", "log": False}
    s = [series(data, c["name"], "shuffled") for c in common.configs(data)]
    s = [v for v in s if v]
    if s:
        out.append({"id": "release-shuffled", "title": "RSS kept after free, by allocator "
                    "(shuffled order)", "kind": "line", "x": x, "y": y, "series": s,
                    "note": "0% the free gave every page back, 100% every page stayed "
                            "resident; one block alive at a time."})
    s = [series(data, "glibc", o, label=f"glibc, {o}") for o in data.get("orders", ORDERS)]
    s = [v for v in s if v]
    if s:
        out.append({"id": "release-glibc-order", "title": "glibc: the same block, three orders",
                    "kind": "line", "x": x, "y": y, "series": s,
                    "note": "Freeing an mmapped block raises glibc's mmap threshold to its size, "
                            "so after the 20 MB block the 2 MB one comes from the heap and stays."})
    s = []
    for name in ("glibc", "jemalloc"):
        for kind, what in (("rss", "RSS"), ("vm", "VmSize")):
            v = series(data, name, "shuffled", kind, f"{name} {what}")
            if v:
                s.append(v)
    if s:
        out.append({"id": "release-virtual", "title": "physical vs virtual memory kept after "
                    "free: glibc and jemalloc (shuffled order)", "kind": "line", "x": x,
                    "y": {"label": "share of the block kept after free", "unit": "%", "log": False},
                    "series": s,
                    "note": "jemalloc gives the pages of large blocks back but keeps their "
                            "address space mapped for reuse; glibc unmaps what it mmapped."})
    return out
