"""From measurements to conclusions: the RSS breakdown at a moment, and the findings and
verdict for a run. How each figure is computed is written out in docs/numbers.md."""

from __future__ import annotations

import dataclasses
import math
import os
import re

import numpy as np

from heapsight import allocators, remedies
from heapsight.arrays import median
from heapsight.fmt import MiB, human, pct, shell_join, shell_quote
from heapsight.model import AllocStats, Breakdown, Finding, HeapFigures, Hold, Release

KiB = 1024


PART_FIELDS = ("rss_bytes", "live_bytes", "waste_bytes", "metadata_bytes", "retained_bytes",
               "non_heap_bytes", "file_bytes", "baseline_anon_bytes", "other_anon_bytes",
               "untouched_bytes")


# The words of the facts every format states: a run without the library's figures, and a
# release measured in the exit's copy (the program itself kept the memory), or counted there
# (native/src/heapmap.c: count_release).
NOT_ACTIVE = "the preload library was not active"
IN_THE_COPY = "measured in a copy of the program at its exit: the program kept its memory"
COUNTED_IN_THE_COPY = ("counted page by page in a copy of the program at its exit, by "
                       "malloc_trim's own rule, not run")
# glibc's thread heaps' free tops (the rule is in why_it_stayed, attach uses it too)
THREAD_TOPS = "the free top of the threads' heaps, which malloc_trim does not shrink"


def release_how(release: dict) -> str:
    """How a saved summary's release at exit was found: "" when the program made it."""
    if release.get("where") != "copy":
        return ""
    return COUNTED_IN_THE_COPY if release.get("counted_fast_chunks") else IN_THE_COPY


def live_waste(hist, live_usable: int, usable_total: int, req_total: int) -> tuple:
    """(bytes, ± one standard error): the live blocks' waste (usable - requested bytes).
    The sampled live blocks give its share of the live usable bytes: each class's estimated
    live blocks times the mean waste of its sampled allocations, over their estimated usable
    bytes (a ratio estimate; its variance, linearized: Σ v (waste - share·usable)² / usable
    total², v = (1 - p)/p² for each sampled block). While no sampled block is live (sampling
    off, or none taken yet), all allocations' waste share stands in (exact, but of every
    block ever allocated). Summed class by class in order, as native/src/readloop.c does, so
    both give the same bytes."""
    share = (usable_total - req_total) / usable_total if usable_total > req_total else 0.0
    # copies: the library writes the mapping's meanwhile
    k = ("alloc_w", "live_w", "waste_w", "live_u_w", "live_var", "live_var_u", "live_var_uu")
    alloc_w, live_w, waste_w, live_u_w, var0, var1, var2 = (np.array(hist[x], dtype=np.float64) for x in k)
    waste = live_u = 0.0
    means = {}
    if int(hist["live_samples"]) > 0:
        for c in np.flatnonzero(alloc_w > 0).tolist():
            a, n, u = float(alloc_w[c]), float(live_w[c]), float(live_u_w[c])
            if n > 0:
                means[c] = float(waste_w[c]) / a
                waste += n * means[c]
            if u > 0:
                live_u += u
        if live_u > 0:
            share = min(1.0, waste / live_u)
    if live_usable <= 0:
        return 0, 0
    error = 0.0
    if live_u > 0:
        var = sum(m * m * max(0.0, var0[c]) - 2 * share * m * var1[c] + share * share * max(0.0, var2[c])
                  for c, m in means.items())
        error = max(0.0, var) ** 0.5 * live_usable / live_u
    return int(math.floor(live_usable * share + 0.5)), int(round(error))


def split(rss, anon, baseline_anon, live_req, live_usable, live_blocks, allocator: str,
          alloc_mapped, own_metadata=math.nan, not_malloc=0.0) -> dict:
    """Split RSS into its parts, for one moment or a whole timeline at once (numbers or
    numpy arrays, element by element): {field of PART_FIELDS: value}. The one definition
    of the breakdown, used by the summary, the JSON and the charts (docs/numbers.md).

    Anonymous memory above the pre-main baseline is the heap's unless the allocator cannot
    account for it; file-backed memory is never the heap's. alloc_mapped (NaN: unknown)
    bounds what the allocator can hold: anonymous memory beyond it is not malloc's.
    own_metadata (NaN: unknown) is the allocator's own figure for its metadata, outside its
    mapped figure (jemalloc's stats.metadata, read at exit, bounded by the caller: summary's
    _exit_release): the metadata then; else its block headers. not_malloc: anonymous memory
    known not to be malloc's (CPython's objects in pymalloc's pools: objects_floor), never
    counted as retained whatever alloc_mapped allows (glibc's figure counts pages it gave
    back with madvise: after a malloc_trim(0) it bounds nothing)."""
    rss, anon = np.asarray(rss, dtype=float), np.asarray(anon, dtype=float)
    live_req, live_usable = np.asarray(live_req, dtype=float), np.asarray(live_usable, dtype=float)
    alloc_mapped = np.asarray(alloc_mapped, dtype=float)
    file_bytes = np.maximum(0, rss - anon)
    base = np.minimum(baseline_anon, anon)
    heap_anon = np.maximum(0, anon - baseline_anon)
    waste = np.maximum(0, live_usable - live_req)
    headers = allocators.header_bytes(allocator) * np.maximum(0, np.asarray(live_blocks, dtype=float))
    own = np.asarray(own_metadata, dtype=float)
    metadata = np.where(np.isnan(own), headers, np.nan_to_num(own))
    unexplained = heap_anon - live_req - waste - metadata
    held = np.maximum(0.0, alloc_mapped - live_usable - np.where(np.isnan(own), metadata, 0))
    retained = np.where(np.isnan(alloc_mapped), np.maximum(0, unexplained),
                        np.minimum(np.maximum(0, unexplained), np.nan_to_num(held, nan=0.0)))
    retained = np.minimum(retained, np.maximum(0, unexplained - np.asarray(not_malloc, dtype=float)))
    other_anon = np.maximum(0, unexplained - retained)
    untouched = np.maximum(0, -unexplained)
    return {"rss_bytes": rss, "live_bytes": live_req, "waste_bytes": waste,
            "metadata_bytes": metadata, "retained_bytes": retained,
            "non_heap_bytes": file_bytes + base + other_anon, "file_bytes": file_bytes,
            "baseline_anon_bytes": base, "other_anon_bytes": other_anon,
            "untouched_bytes": untouched}


def breakdown(at_s: float, rss: int, anon: int, baseline_anon: int, live_req: int,
              live_usable: int, live_blocks: int, allocator: str,
              alloc_mapped: float = math.nan, own_metadata: float = math.nan) -> Breakdown:
    """The split of one moment, as a Breakdown."""
    parts = split(rss, anon, baseline_anon, live_req, live_usable, live_blocks, allocator,
                  alloc_mapped, own_metadata)
    return Breakdown(round(at_s, 3), **{f: int(parts[f]) for f in PART_FIELDS})


def _readings_around(alloc_mapped, final_mapped: float = math.nan) -> tuple:
    """For each sample, the allocator's reading at or just before it and the one at or just
    after it (final_mapped, taken at exit, after the last sample); NaN where there is none."""
    m = np.asarray(alloc_mapped, dtype=float)
    n = len(m)
    prev_i = np.maximum.accumulate(np.where(~np.isnan(m), np.arange(n), -1))
    prev = np.where(prev_i >= 0, m[np.maximum(prev_i, 0)], np.nan)
    ext = np.append(m, final_mapped)
    later = np.where(~np.isnan(ext), np.arange(n + 1), n + 1)
    next_i = np.minimum.accumulate(later[::-1])[::-1][:n]
    return prev, np.where(next_i <= n, ext[np.minimum(next_i, n)], np.nan)


def mapped_bound(alloc_mapped, final_mapped: float = math.nan) -> np.ndarray:
    """For each sample, the most the allocator can have held from the OS at that moment:
    the larger of the statistics readings just before and just after it (the allocator's
    mapped memory only grows between releases, so the next reading bounds it; the one
    before covers a release in between). Readings are the non-NaN entries, taken at
    whatever rate the library managed (it slows down when a reading gets expensive), and
    final_mapped, taken at exit, is the reading after the last sample."""
    m = np.asarray(alloc_mapped, dtype=float)
    if len(m) == 0:
        return m
    prev, nxt = _readings_around(m, final_mapped)
    return np.fmax(prev, nxt)   # fmax: NaN only where neither reading exists


def mapped_tight(alloc_mapped, final_mapped: float = math.nan) -> np.ndarray:
    """For each sample, whether mapped_bound is its allocator's mapped memory itself: the
    readings just before and just after it agree, or one was taken there (nothing was given
    back or taken between them). After a big free the samples before the next reading are
    bounded by the reading with the freed block: not tight."""
    m = np.asarray(alloc_mapped, dtype=float)
    if len(m) == 0:
        return np.zeros(0, dtype=bool)
    prev, nxt = _readings_around(m, final_mapped)
    return ~np.isnan(m) | (prev == nxt)


def objects_floor(t, readings) -> np.ndarray | float:
    """Per sample, the least of CPython's objects in use that the readings of pymalloc's
    pools just before and just after it saw (Timeline.pools: t, objects' bytes, pools'
    bytes): memory malloc did not give. 0 before the first reading and after the last."""
    t = np.asarray(t, dtype=float)
    if not readings or len(t) == 0:
        return 0.0
    tr = np.array([r[0] for r in readings], dtype=float)
    objects = np.array([r[1] for r in readings], dtype=float)
    before, after = _pool_readings_around(tr, t)
    return np.where((t >= tr[0]) & (t <= tr[-1]),
                    np.minimum(objects[before], objects[after]), 0.0)


def _pool_readings_around(tr, t) -> tuple:
    """(the reading at or before each sample, the one after it), as indices into the
    readings' times tr (sorted), each clamped to the first and the last."""
    after = np.searchsorted(tr, t, side="right")
    return np.maximum(after - 1, 0), np.minimum(after, len(tr) - 1)


def resident_at_end(cols: dict, resident: float, end_s: float | None, n_alloc: int,
                    n_free: int, exit_anon: float):
    """Per sample, the allocator's resident memory at exit (summary.glibc_resident) where it
    is known to be that sample's too, NaN elsewhere: from the end on (the program's exit
    begun), the samples with no allocation or free between them and the exit (its counts:
    n_alloc, n_free) and no anonymous memory given back since (exit_anon, bytes, at least
    theirs: a malloc_trim in an exit handler would give some back). Their heaps are the
    exit's, page for page."""
    t = np.asarray(cols["t"], dtype=float)
    if resident is None or math.isnan(resident) or end_s is None or not len(t):
        return math.nan
    same = ((t >= end_s - 1e-9) & (np.asarray(cols["n_alloc"], dtype=float) == n_alloc)
            & (np.asarray(cols["n_free"], dtype=float) == n_free)
            & (np.asarray(cols["anon"], dtype=float) <= exit_anon + 64 * 1024))
    return np.where(same, float(resident), np.nan)


def timeline_split(cols: dict, baseline_anon: int, allocator: str | None,
                   final_mapped: float = math.nan, pools: list = (), resident=math.nan) -> dict:
    """Every sample of a timeline split (split() over the columns of a run record or a
    Timeline). allocator None: the library was not active, /proc figures only (each
    sample's anonymous memory is its own baseline). pools: the readings of pymalloc's pools
    (Timeline.pools): CPython's objects then are not malloc's (objects_floor). resident: per
    sample (NaN: unknown) the most the allocator held resident, a tighter bound than its
    mapped figure where known (summary.resident_at_end)."""
    rss = np.asarray(cols["rss"], dtype=float)
    anon = np.asarray(cols["anon"], dtype=float)
    anon = np.where(np.isnan(anon), rss, anon)
    if allocator is None:
        zero = np.zeros(len(rss))
        return split(rss, anon, anon, zero, zero, zero, "unknown", np.full(len(rss), np.nan))

    def counter(c):  # before the library attached: 0
        return np.nan_to_num(np.asarray(cols[c], dtype=float), nan=0.0)
    return split(rss, anon, baseline_anon, counter("live_req"), counter("live_usable"),
                 counter("n_alloc") - counter("n_free"), allocator,
                 np.fmin(mapped_bound(cols["alloc_mapped"], final_mapped), resident),
                 not_malloc=objects_floor(cols["t"], pools))


# The hold rule (docs/numbers.md): a sample holds when its RSS beyond its resident live
# bytes (retained + anonymous memory malloc did not give) is at least HOLD_SHARE of the
# peak RSS and HOLD_MIN_BYTES; a hold is a stretch of such samples lasting at least
# HOLD_MIN_S and HOLD_MIN_SHARE of the run. Gaps of a sample or two are bridged.
HOLD_SHARE = 0.25
HOLD_MIN_BYTES = 8 * MiB
HOLD_MIN_S = 0.2
HOLD_MIN_SHARE = 0.05
HOLD_GAP_S = 0.05


def pool_objects(t, other, readings: list, end_s: float | None = None,
                 known: bool = False) -> np.ndarray | None:
    """Per sample, the part of `other` (anonymous memory malloc did not give) that was
    CPython's objects in use, from the readings of pymalloc's pools (Timeline.pools: t,
    objects' bytes, pools' bytes) up to end_s (the teardown frees them). At a reading, what
    was not objects is `other` then less the objects (its pools' free space, the rest of its
    arenas, the other mappings). Between two readings it is taken as the larger of the two:
    a drop of objects counts from the reading before it, their reuse until the reading after
    it (at most one reading's interval too much held, never hidden); growth between them is
    objects (pymalloc maps an arena only for new objects). After the last reading it stays
    (a drop after it is not seen); before the first nothing is known to be objects. None
    without a reading. known: only what is known, for a figure shown as the objects: NaN
    before the first reading and after the last (the hold rule takes what comes after the
    last as objects, so as not to see a hold in every stretch after it; a figure of the
    objects must not claim it)."""
    rs = [r for r in readings if end_s is None or r[0] <= end_s]
    t = np.asarray(t, dtype=float)
    if not rs or len(t) == 0:
        return None
    other = np.nan_to_num(np.asarray(other, dtype=float))
    tr = np.array([r[0] for r in rs], dtype=float)
    objects_then = np.array([r[1] for r in rs], dtype=float)
    not_objects = np.maximum(0.0, np.interp(tr, t, other) - objects_then)
    before, after = _pool_readings_around(tr, t)
    around = np.maximum(not_objects[before], not_objects[after])
    objects = np.clip(other - around, 0.0, other)
    objects[t < tr[0]] = np.nan if known else 0.0
    if known:
        objects[t > tr[-1]] = np.nan
    return objects


def holds(t, parts: dict, duration_s: float, objects=None) -> list:
    """The stretches of the run that held much more memory than the live bytes, whatever
    happened at exit. t and parts (timeline_split's arrays) are the run's samples; objects
    (pool_objects), where known, the part of the anonymous memory malloc did not give that
    was CPython's objects in use: live bytes too, so never held."""
    t = np.asarray(t, dtype=float)
    if len(t) == 0:
        return []
    rss = np.asarray(parts["rss_bytes"], dtype=float)
    retained = np.asarray(parts["retained_bytes"], dtype=float)
    other = np.asarray(parts["other_anon_bytes"], dtype=float)
    objects = np.zeros(len(t)) if objects is None else np.asarray(objects, dtype=float)
    other = np.maximum(0.0, other - objects)
    held = retained + other
    peak = np.nanmax(rss) if np.isfinite(rss).any() else 0.0
    holding = np.nan_to_num(held) >= max(HOLD_MIN_BYTES, HOLD_SHARE * peak)
    out, i, n = [], 0, len(t)
    while i < n:
        if not holding[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and (holding[j + 1] or (
                j + 2 < n and holding[j + 2] and t[j + 2] - t[j] <= HOLD_GAP_S)):
            j += 1
        span = t[j] - t[i]
        if span >= max(HOLD_MIN_S, HOLD_MIN_SHARE * duration_s):
            sl = slice(i, j + 1)
            med_ret, med_other = median(retained[sl]), median(other[sl])
            out.append(Hold(round(float(t[i]), 3), round(float(t[j]), 3),
                            int(median(held[sl])), int(np.max(held[sl])),
                            int(median(np.asarray(parts["live_bytes"], dtype=float)[sl])),
                            int(med_ret), int(med_other),
                            "retained" if med_ret >= med_other else "non-heap",
                            int(median(objects[sl]))))
        i = j + 1
    return out


# Whose anonymous mappings these are, by the object that called mmap (mappings.c).
OWNERS = ((r"(^|/)(lib)?python3(\.\d+)?[^/]*$", "the CPython object allocator (pymalloc arenas)"),
          (r"(^|/)libjvm\.so", "the JVM (Java heap, metaspace, code cache)"),
          (r"(^|/)cc1(plus|obj)?$", "GCC's garbage-collected heap (ggc)"),
          (r"(^|/)(node|libnode\.so[^/]*)$", "Node.js (the V8 heap)"),
          *((a.own_heaps, f"{a.name}'s own heaps") for a in allocators.ALLOCATORS.values()
            if a.own_heaps),
          (r"(^|/)libperl", "Perl"))


def owner_of(path: str) -> str:
    """A person's name for the object that mapped memory."""
    for pattern, name in OWNERS:
        if re.search(pattern, path):
            return name
    return path.rsplit("/", 1)[-1] or "the program"


def hold_findings(found_holds: list, allocator: str, command: list, mapped_by: tuple = (),
                  arenas: int = 0) -> list:
    """A finding for each hold: what held the memory, from when to when. arenas: glibc's
    arena count (MALLOC_ARENA_MAX=2 is suggested only where there are more)."""
    cmd = shell_join(command)
    out = []
    for h in found_holds:
        when = f"from {h.start_s:.2f} s to {h.end_s:.2f} s"
        if h.cause == "retained":
            detail = (f"While the program ran, {human(h.held_bytes)} (up to {human(h.max_held_bytes)}) "
                      f"was held beyond its {human(h.live_bytes)} of live bytes {when}: memory it had "
                      f"freed and {allocator} kept. A release at that moment (malloc_trim for glibc) "
                      "would have given back the whole free pages among it.")
            sugg = ((remedies.suggestions("thread-arenas", cmd, remedies.language(command))
                     if arenas > 1 and h.held_bytes >= remedies.PATTERN_MIN_BYTES else
                     (f"{THREAD_TOPS_ENV} heapsight run -- {cmd}   # a fixed trim "
                      "threshold: the heap's top shrinks on free (--verify measures it)",
                      f"heapsight run --verify -- {cmd}   # measures the settings on this "
                      "program at the moment that matters"))
                    if allocator == "glibc" else ())
        else:
            whose, rule, how, _ = _whose_words(mapped_by, h.held_bytes, "resident_peak")
            if h.objects_bytes:   # pymalloc's pools were read: what is free there is known
                inside = (f"Its pools, read while it ran, held {human(h.objects_bytes)} of "
                          "objects in use beside this (live, left out of it): the rest is free "
                          "space pymalloc kept in its arenas, or other mappings.")
                how = None
            else:
                inside = "Whether it holds live objects or free space cannot be told from outside."
            detail = " ".join(x for x in (
                f"While the program ran, {human(h.held_bytes)} (up to {human(h.max_held_bytes)}) "
                f"of anonymous memory that did not come from malloc was resident {when}, beside "
                f"its {human(h.live_bytes)} of live malloc bytes.", whose,
                f"{rule[0].upper()}{rule[1:]}." if rule else None, inside,
                f"To find out: {how}." if how else None) if x)
            sugg = (remedies.suggestions("pymalloc", cmd)
                    if "pymalloc" in whose or interpreted(command) and "python" in cmd else ())
        what = "held beyond live bytes" if h.cause == "retained" else "outside malloc"
        # memory outside malloc whose content is not known (a runtime's own heap: live
        # objects or free space) is not said to be held: only that it was there
        word = "" if h.cause == "retained" or h.objects_bytes else "NON-HEAP WHILE RUNNING"
        out.append(Finding("hold", h.held_bytes, f"{human(h.held_bytes)} {what} {when}", detail,
                           sugg, word))
    return out


# What is known of memory a runtime maps itself, and how to see inside it: (owner's words
# in analysis.OWNERS, how it keeps memory, how to find out what is live in it, a command to
# try). Only what holds for that runtime: whether its memory is live objects or free space
# cannot be told from outside.
RUNTIME_RULES = (
    ("pymalloc", "pymalloc gives an arena back only when every object in it is gone",
     "PYTHONMALLOC=malloc sends CPython's objects to malloc, where heapsight sees what is "
     "live and what is free", "PYTHONMALLOC=malloc heapsight run -- {cmd}"),
    ("V8", "V8 grows its heap up to its limit and collects it as it goes",
     "node --trace-gc shows the heap's live size after each collection, and "
     "--max-old-space-size caps it", "node --trace-gc ..."),
    ("JVM", "the JVM reserves its heap up front and commits it as it grows",
     "jcmd PID GC.heap_info gives the Java heap's used and committed sizes, and -Xmx caps it",
     "jcmd PID GC.heap_info"),
    ("ggc", "GCC collects it only once it has grown by --param ggc-min-expand percent",
     "-fmem-report prints its use at the end of the compilation; --param ggc-min-heapsize "
     "and ggc-min-expand set when it collects", None),
)


def runtime_rule(owner: str) -> tuple | None:
    """(rule, how to find out, command) for a runtime's own memory, None for other owners."""
    return next((r[1:] for r in RUNTIME_RULES if r[0] in owner), None)


def runtime_loaded(paths) -> str:
    """Of the files a process maps (its executable among them), the first that is a runtime
    with a heap of its own (an owner with a RUNTIME_RULES entry), in owner_of's words; ""
    for none. From outside, that names who most likely mapped its anonymous memory."""
    for path in paths:
        owner = owner_of(path) if path.startswith("/") else ""
        if owner and runtime_rule(owner) is not None:
            return owner
    return ""


def owner_words(o: dict, when: str = "resident") -> str:
    """One object's memory mapped outside malloc: what of it was resident at a reading
    (when: "resident", the last; "resident_peak", near peak RSS), when measured, and what it
    mapped, which may be mostly reserved address space."""
    mapped = (f"{human(o['peak_bytes'])} mapped at most, {human(o['mapped_bytes'])} at exit, "
              f"in {o['mappings']:,} mappings")
    if o.get(f"{when}_bytes") is None:
        when = "resident"
    if o.get(f"{when}_bytes") is None:
        return f"{o['owner']}: {mapped}"
    res = o[f"{when}_bytes"]
    most = max(res, o.get("resident_peak_bytes") or 0)
    reserved = (", most of it address space reserved, never touched"
                if most < o["peak_bytes"] / 4 else "")
    also = ""
    if when == "resident" and (o.get("resident_peak_bytes") or 0) > max(2 * res, res + MiB):
        also = (f", {human(o['resident_peak_bytes'])} near peak RSS at "
                f"{o['resident_peak_at_s']:.2f} s")
    objects = o.get(f"{when}_objects_bytes")
    inside = "" if objects is None else f", {human(objects)} of it objects in use (its pools)"
    return (f"{o['owner']}: {human(res)} resident at {o[f'{when}_at_s']:.2f} s{inside}{also} "
            f"({mapped}{reserved})")


def _whose_words(mapped_by: tuple, held: int, when: str = "resident") -> tuple:
    """(sentence naming who mapped the memory, rule, how to find out, command) from the
    objects that mapped it, the largest first, with what was resident at a reading (when:
    "resident" for the exit's memory, "resident_peak" for memory held while it ran); a
    generic sentence when none accounts for half of it."""
    big = [o for o in mapped_by if o["peak_bytes"] >= MiB][:3]

    def resident(o):
        v = o.get(f"{when}_bytes", o.get("resident_bytes"))
        return o["peak_bytes"] if v is None else v
    accounted = sum(resident(o) for o in big)
    if not big or accounted < held / 2:
        return ("Thread stacks, the program's own mmap calls or a runtime's own allocator hold "
                "it (no object heapsight saw mapping memory accounts for it).", None, None, None)
    names = "; ".join(owner_words(o, when) for o in big)
    rule = runtime_rule(big[0]["owner"])
    return (f"Mapped outside malloc: {names}.",) + (rule or (None, None, None))


def _never_freed_findings(final, heap_total: int, reach: dict, live_over_time: tuple,
                          sites, cmd: str, killed: int = 0) -> list:
    """Blocks still allocated when the program ended. With the exit's heap map marked
    (glibc), exactly which the program lost and which it still pointed to; else a leak or
    data kept until exit on purpose, told apart by how live bytes grew. killed: the signal
    that ended it (0: none), before it could free anything."""
    grew = ""
    if len(live_over_time) >= 2:
        steps = ", ".join(f"{human(v)} at {t:.2f} s" for t, v in live_over_time)
        grew = f"Live bytes over the run: {steps}. "
    untouched = ""
    if final.untouched_bytes >= MiB:
        untouched = (f"{human(final.untouched_bytes)} of it was never touched (allocated but "
                     "never written: it takes no RSS, only address space). ")
    if reach.get("marked"):
        return reach_findings(reach, final, heap_total, grew, untouched, cmd, sites)
    if not (final.live_bytes >= MiB and final.live_bytes >= 0.5 * (heap_total or 1)):
        return []
    unknown = (f" Whether a pointer to it remains was not checked: {reach['why']}."
               if reach.get("why") else "")
    where, suggestions = where_allocated(sites, cmd)
    return [Finding(
        "never-freed", final.live_bytes,
        f"{human(final.live_bytes)} still allocated "
        + (f"when it was killed (signal {killed})" if killed else "at exit")
        + _untouched_words(final, final.live_bytes),
        (f"The program was killed (signal {killed}): these blocks were allocated and not "
         "freed when it was, its work cut short, so what it would have freed is among them. "
         if killed else "These blocks were allocated and not freed before the program ended. ")
        + untouched + grew
        + "That is a leak if it grows with the work (run it on a larger input: a leak grows "
        "with it, a working set levels off) or if the program lost every pointer to it; "
        "many programs (git, compilers) keep their data until exit on purpose. No allocator "
        "setting can give it back." + unknown + " " + where, suggestions)]


# What lets glibc's thread heaps shrink on free: fixed thresholds (compare's preset of that
# name), so the trim threshold stays at 128 KiB instead of rising with the mmap threshold.
THREAD_TOPS_PRESET = "glibc-trim128k"
THREAD_TOPS_ENV = " ".join(f"{k}={v}" for k, v in allocators.PRESET[THREAD_TOPS_PRESET].env.items())


def _retention_reasons(heap: HeapFigures, mapped: dict, tops: bool = True,
                       settings: dict | None = None) -> list:
    """Why freed memory stayed, in words, the reason that explains the most bytes first
    (those measured before those not); tops: with the threads' heap tops among them;
    settings: the allocator settings in the program's environment (remedies.settings_in)."""
    reasons = []
    if mapped.get("pinned"):   # measured in the exit's copy, under any allocator
        reasons.append((mapped["pinned"], f"{human(mapped['pinned'])} of heap pages hold "
                        "only a few live bytes each: no release can return them while "
                        "those blocks live"))
    if heap.allocator != "glibc":
        a = allocators.ALLOCATORS.get(heap.allocator)
        return [text for _, text in reasons] + ([a.keeps] if a and a.keeps else [])
    arenas, threads, n_large = heap.arenas, heap.threads_seen, heap.n_large_heap
    if tops and mapped.get("thread_tops"):
        reasons.append((mapped["thread_tops"], f"{human(mapped['thread_tops'])} is {THREAD_TOPS}"))
    if arenas > 1:
        in_threads = mapped.get("thread_arenas_free")
        reasons.append((in_threads, (f"{human(in_threads)} of free pages in " if in_threads
                                     else "") + f"{arenas} malloc arenas (glibc gives "
                        f"each thread that allocates its own, up to 8 per core; {threads} "
                        f"thread{'s' * (threads != 1)} seen)"))
    if n_large and remedies.dynamic_threshold_off(settings or {}):
        reasons.append((n_large * 128 * KiB,
                        f"{n_large} block{'s' * (n_large != 1)} of 128 KiB or more sat in the "
                        "heap, not in their own mmap, though the environment fixes the mmap "
                        "threshold (GLIBC_TUNABLES): realloc grows a block in place past it"))
    elif n_large:
        reasons.append((n_large * 128 * KiB,
                        f"{n_large} block{'s' * (n_large != 1)} of 128 KiB or "
                        f"more came from the heap instead of {'their' if n_large != 1 else 'its'} "
                        "own mmap: freeing an mmapped block raised the dynamic mmap "
                        "threshold"))
    reasons.append((None, "free chunks stay in the arenas' bins and tcache until "
                          "malloc_trim or a top-of-heap shrink"))
    reasons.sort(key=lambda r: (r[0] is None, -(r[0] or 0)))   # measured, largest first
    return [text for _, text in reasons]


def _retention_suggestions(heap: HeapFigures, command: list, cmd: str,
                           retained: int = 0) -> tuple:
    """What to try against retention, for this allocator and this kind of program, and
    this much retained (the lab's rule holds where it outweighs jemalloc's own start)."""
    if heap.allocator != "glibc":
        return remedies.allocator_suggestions(heap.allocator, cmd, remedies.language(command))
    if heap.arenas > 1 and retained >= remedies.PATTERN_MIN_BYTES:
        # the lab's pattern: MALLOC_ARENA_MAX and the thresholds do little
        return remedies.suggestions("thread-arenas", cmd, remedies.language(command))
    if interpreted(command):
        # a Perl or Python program cannot #include <malloc.h>: Python calls malloc_trim
        # through ctypes, and either is trimmed as a running service; the settings below
        # need no code and apply to a one-shot script as well (--verify measures them on it)
        out = []
        if remedies.language(command) == "python":
            code, why = remedies.IN_LANGUAGE["python"]
            out.append(f"{code}   # {why}")
        out.append("heapsight attach PID --trim   # for the running service: calls "
                   "malloc_trim(0) in it and measures what it gave back")
    else:
        # the change in its code, then heapsight's own call in a running one (no gdb: a
        # gdb that cannot restore a thread's registers here would corrupt it)
        p = remedies.PATTERNS["thread-arenas"]
        out = [f"{p.code}   # {p.code_why}",
               "heapsight attach PID --trim   # for the running program: calls "
               "malloc_trim(0) in it and measures what it gave back"]
    if heap.arenas > 2:   # two arenas or one: MALLOC_ARENA_MAX=2 changes nothing
        out.append(f"MALLOC_ARENA_MAX=2 heapsight run -- {cmd}")
    if heap.n_large_heap:
        out.append(f"GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072 heapsight run -- {cmd}")
    # (what it does; how to install it only where it is not)
    out.append(f"{remedies.setting('jemalloc-eager')} heapsight run -- {cmd}   "
               f"# {remedies.PRESET['jemalloc-eager'].about}{remedies.missing('jemalloc-eager')}")
    return tuple(out)


def _thread_tops_suggestions(suggestions: tuple, cmd: str) -> tuple:
    """Against free tops of thread heaps: the fixed thresholds, after the lab's rule where
    it applies (many threads keeping a few blocks each: it measured less than 30% from them
    there), first otherwise (tests/test_thread_tops.py: the tops given back); malloc_trim,
    which does not reach them, left out."""
    tunable = (f"{THREAD_TOPS_ENV} heapsight run -- {cmd}   # fixed thresholds: thread heaps "
               "shrink on free")
    if suggestions and suggestions[0].startswith("LD_PRELOAD="):   # the lab's rule
        return suggestions[:2] + (tunable + " (the lab: less than 30% where threads keep a "
                                  "few blocks; --verify measures it here)",) + suggestions[2:]
    return (tunable,
            f"heapsight compare --configs glibc,{THREAD_TOPS_PRESET},glibc-mmap128k -- {cmd}"
            "   # the settings side by side, with their time",
            *(x for x in suggestions if "malloc_trim" not in x and "mmap_threshold" not in x))


def _retention_finding(final, release: Release, heap: HeapFigures, mapped: dict,
                       command: list, cmd: str, settings: dict | None = None) -> Finding:
    """Freed memory the allocator keeps resident: retention when the release gave most of
    it back (or could not be measured), fragmentation when it could not."""
    allocator, retained = heap.allocator, final.retained_bytes
    given = release.gave_back_bytes
    gave = "gave back" if release.where == "program" else "would give back"
    mechanisms = _retention_reasons(heap, mapped, settings=settings)
    why = "Why it stayed: " + "; ".join(mechanisms) + "." if mechanisms else ""
    title = f"{human(retained)} freed by the program but kept by {allocator}"
    suggestions = _retention_suggestions(heap, command, cmd, retained)
    made = _made_by_allocator(heap, retained, release, why, suggestions, command, cmd)
    if made is not None:
        return made
    if release.measured and given >= 0.5 * retained:
        return Finding("retention", retained, title,
                       f"Not a leak: the program freed it, the allocator kept it resident. The "
                       f"release at exit ({release.call}) {gave} {human(given)} "
                       f"({pct(given, retained)} of it). " + why, suggestions)
    how = (f"the release at exit ({release.call}) {gave} only {human(given)}"
           if release.measured else f"no release could be measured ({release.why_not})")
    tops = mapped.get("thread_tops") or 0
    if release.measured and allocator == "glibc" and tops >= 0.5 * max(1, retained - given):
        # not fragmentation: free pages at the end of the threads' heaps, which glibc's
        # malloc_trim leaves (it trims only the main heap's top; a thread heap's top shrinks
        # on a free, past the trim threshold that rises with the dynamic mmap threshold)
        return Finding("retention", retained, title,
                       f"Freed memory the allocator still holds; {how}. Most of what stayed, "
                       f"{human(tops)}, is free space at the top of the threads' heaps: glibc's "
                       "malloc_trim shrinks only the main heap's top, and a thread heap's top "
                       + ("shrinks on a free only down to its highest live block: the fixed "
                          "trim threshold in the environment did not bring it back. "
                          if remedies.dynamic_threshold_off(settings or {}) else
                          "shrinks on a free only once it passes the trim threshold, which "
                          "glibc raises with the dynamic mmap threshold (to twice the largest "
                          "mmapped block freed). Fixed thresholds keep it at 128 KiB. ")
                       + "Besides: " + "; ".join(_retention_reasons(heap, mapped, tops=False, settings=settings))
                       + ".",
                       _thread_tops_suggestions(suggestions, cmd))
    # another allocator's release gave little back: fragmentation only where live blocks
    # keep the free space (the exit's heap map, in the allocator's 64 KiB units at most);
    # mimalloc's release is the exiting thread's, and what other threads freed stays whole
    interleaved = mapped.get("interleaved")
    if (release.measured and allocator != "glibc" and interleaved is not None
            and interleaved < 0.5 * max(1, retained - given)):
        return Finding("retention", retained, title,
                       f"Freed memory the allocator still holds; {how}, yet live blocks keep "
                       f"no more than {human(interleaved)} of it (the exit's heap map): not "
                       f"fragmentation, but free memory {allocator} kept. " + why, suggestions)
    if not release.measured:
        return Finding("retention", retained, title,
                       f"Freed memory the allocator still holds; {how}. " + why, suggestions)
    return Finding("fragmentation", retained, title,
                   f"Freed memory the allocator still holds; {how}. The free space is "
                   "interleaved with live blocks, so whole pages cannot be returned "
                   "(fragmentation): no release returns a page that holds a live block. What "
                   "helps is fewer such pages: the blocks that stay allocated apart from the "
                   "ones that go (before them, or copied anew once they are freed, then a "
                   "release). " + why,
                   _fragmentation_suggestions(suggestions, given, retained, cmd))


def _made_by_allocator(heap: HeapFigures, retained: int, release: Release, why: str,
                       suggestions: tuple, command: list, cmd: str) -> Finding | None:
    """Free memory the allocator holds beyond all the program ever freed (its counters:
    HeapFigures.freed_usable_bytes), at least half of it: the allocator made that free space
    itself, and "freed by the program" would be untrue. Under glibc almost always the
    padding it splits off to align a block (posix_memalign, aligned_alloc, memalign, C++'s
    aligned new): 20,000 blocks of 100 bytes aligned to 4096 read "FRAGMENTATION: 76.0 MiB
    freed by the program" where the program had freed nothing. None otherwise."""
    freed = heap.freed_usable_bytes
    # (only where the retained memory is known to be in glibc's heap pages: bounded by their
    # resident pages at exit; else another mapping read as retained could be it)
    if freed is None or heap.resident_at_exit_bytes is None or retained - freed < 0.5 * retained:
        return None
    allocator = heap.allocator
    given = release.gave_back_bytes
    how = (f"The release at exit ({release.call}) "
           f"{'gave' if release.where == 'program' else 'would give'} back {human(given)}. "
           if release.measured else f"No release could be measured ({release.why_not}). ")
    title = (f"{human(retained)} kept free by {allocator}, {human(retained - freed)} of it "
             "never freed by the program")
    cause = ("Most often that is the padding glibc splits off to align a block "
             "(posix_memalign, aligned_alloc, memalign, C++'s aligned new): a block aligned "
             "to 4096 bytes takes up to 4 KiB before it, free for smaller requests only, "
             "and its page stays with the block. One aligned slab carved into the blocks, "
             "or a smaller alignment, pays that once. ")
    code = (() if interpreted(command) else
            ("posix_memalign(&slab, 4096, n * size);   # one aligned slab, carved into the "
             "n blocks: the padding once, not per block",))
    return Finding("retention" if release.measured and given >= 0.5 * retained else "fragmentation",
                   retained, title,
                   f"The program freed {human(freed)} in all, less than the {human(retained)} "
                   f"free in the heap: the rest is free space {allocator} made, not memory the "
                   f"program gave back. " + cause + how + why,
                   code + (_fragmentation_suggestions(suggestions, given, retained, cmd)
                           if release.measured and given < 0.5 * retained else suggestions))


def _fragmentation_suggestions(suggestions: tuple, given: int, retained: int, cmd: str) -> tuple:
    """Against fragmentation: the release was measured and gave back little, so the
    suggestions that call it come last, with what it gave (a program that calls
    malloc_trim(0) itself reads it here too: its own release left this); the settings,
    whose effect on it no rule knows, measured first."""
    measured = f" (measured at exit: it gives back {human(given)} of the {human(retained)})"
    trims = tuple(x + measured for x in suggestions if "malloc_trim" in x)
    settings = tuple(x for x in suggestions if "malloc_trim" not in x)
    verify = ((f"heapsight run --verify -- {cmd}   # measures these settings on this program "
               "at the moment that matters",)
              if any(remedies.env_of(x) for x in settings) and remedies.LAB not in settings[0]
              else ())
    return verify + settings + trims


def _waste_finding(final, heap: HeapFigures) -> Finding:
    """Rounding of small requests up to the allocator's size classes."""
    usable = final.live_bytes + final.waste_bytes
    error = heap.live_waste_error_bytes
    within = f" (±{human(error)}, estimated from the sampled blocks)" if error else ""
    where = "Every block"
    if heap.size_classes:
        top = max(heap.size_classes, key=lambda c: c[2] * c[3])
        where = (f"Most of it is in blocks of {top[0]}+ usable bytes (about {top[2]:,} live), "
                 f"which waste {top[3]:.1f} bytes each on average: every block")
    return Finding(
        "waste", final.waste_bytes,
        f"{human(final.waste_bytes)} lost to rounding{within}: "
        f"{pct(final.waste_bytes, usable)} of the usable bytes of live blocks were not requested",
        f"{where} is rounded up to the allocator's "
        "size class (glibc: 24 usable bytes at least, in steps of 16) and carries a header. "
        "Allocate many small objects together (an array, a pool or arena allocator) "
        "instead of one malloc each.", ())


def non_heap_rest(final) -> int:
    """The anonymous memory malloc did not give less CPython's objects in use in it, where
    pymalloc's pools were read (Breakdown.objects_bytes): live bytes, not a finding."""
    return final.other_anon_bytes - (final.objects_bytes or 0)


def _non_heap_finding(final, mapped_by: tuple, cmd: str, pools_free: int = 0) -> Finding:
    """Anonymous memory malloc did not give, with the objects that mapped it named (less
    CPython's objects in use, and pools_free: pymalloc's free space after its teardown)."""
    rest = non_heap_rest(final) - pools_free
    whose, rule, how, command = _whose_words(mapped_by, final.other_anon_bytes)
    if final.objects_bytes is not None:
        after = (f" and {human(pools_free)} of free space in its pools after CPython's "
                 "teardown" if pools_free else "")
        inside = (f"Of it, {human(final.objects_bytes)} was CPython's objects in use{after} "
                  "(read from pymalloc's pools as the program exited), left out here: the "
                  "rest is thread stacks, the program's own mappings or free space pymalloc "
                  "keeps in its arenas; malloc settings will not change it.")
        how = command = None
    else:
        inside = ("Whether it holds live objects or free space cannot be told from outside; "
                  "malloc settings will not change it.")
    detail = " ".join(x for x in (
        whose, f"{rule[0].upper()}{rule[1:]}." if rule else None, inside,
        f"To find out: {how}." if how else None) if x)
    beside = (f", beside {human(final.objects_bytes)} of CPython's objects"
              if final.objects_bytes is not None else "")
    return Finding("non-heap", rest,
                   f"{human(rest)} of anonymous memory did not come from malloc{beside}",
                   detail, (command.format(cmd=cmd),) if command and "{cmd}" in command else ())


def retained_enough(retained: int, rss: int) -> bool:
    """Whether freed memory the allocator keeps is worth a finding: 1 MiB and a tenth of RSS."""
    return retained >= MiB and retained >= 0.1 * max(rss, 1)


# Retention at the end that had been there for less than a hold must last (HOLD_MIN_S) once
# its frees were over was freed in the program's last moments before its exit began, its own
# cleanup: jq freeing its 160 MiB document from 0.88 to 0.98 s and returning from main at
# 1.04 s, a C++ program's containers destroyed at the end of main. glibc kept it for those
# moments only, and no setting or call would give anyone that memory sooner. Not a finding; the healthy verdict
# says so. A program that goes on after such a free holds it, as a hold or at its end.
RETENTION_MIN_AGE_S = HOLD_MIN_S


# The retention at the end is there once the samples hold this share of it: the frees that
# made it are over (jq's took 0.1 s for 160 MiB, a larger document's would take longer).
RETENTION_SETTLED = 0.9


def retention_age(t, retained, end_i: int | None, at_end: int) -> float | None:
    """How long the retention at the end (at_end bytes) had been there when the exit began
    (row end_i): from the last sample before that held less than RETENTION_SETTLED of it
    (the frees that made it still going on), else from the first sample. None without an
    end row. A sample's retained figure is bounded by the readings of the allocator around
    it: after a big free it can read high early, which makes the age longer, never shorter;
    a dip while the program reuses some of it makes it shorter, and the hold rule then sees
    that stretch (a hold the retention finding no longer describes is reported)."""
    if end_i is None or at_end <= 0:
        return None
    t = np.asarray(t, dtype=float)[:end_i + 1]
    r = np.asarray(retained, dtype=float)[:end_i + 1]
    below = np.flatnonzero(np.nan_to_num(r, nan=np.inf) < RETENTION_SETTLED * at_end)
    return float(t[-1] - (t[below[-1]] if len(below) else t[0]))


def findings(command: list, final: Breakdown | None, release: Release,
             heap: HeapFigures, live_over_time: tuple = (), sites: dict | None = None,
             mapped: dict | None = None, mapped_by: tuple = (), settings: dict | None = None,
             teardown: int | None = None, pools_free: int = 0,
             retained_age_s: float | None = None, killed: int = 0) -> list:
    """Each finding names what holds the memory, how much, and what to try. Sorted by size.
    sites: the sampled call sites (sites.build), which name where never-freed bytes came from;
    mapped: what the exit's heap map measured (summary.exit_map_bytes: "pinned",
    "thread_arenas_free" bytes, "reach"), which puts bytes on the reasons memory stayed;
    mapped_by: the objects that mapped memory outside malloc (Summary.mapped_by).
    teardown: the bytes freed after the program's exit began (summary.freed_in_teardown):
    memory the allocator keeps is the program's when its work is done (moments.ABOUT), so
    retention is found only if it is there without them: a program that frees its data in
    its teardown (an atexit handler, static destructors, CPython finalizing) leaves
    retention at exit that it never held while it worked. pools_free: likewise the free
    space in pymalloc's pools at exit after CPython's teardown (it frees its objects and
    keeps each arena an object still lives in): left out of the non-heap memory.
    retained_age_s: how long that retention had been there when the exit began
    (retention_age): younger than RETENTION_MIN_AGE_S, it is the program's own cleanup.
    killed: the signal that ended the program (0: none)."""
    mapped = mapped or {}
    if final is None:
        return []
    cmd = shell_join(command)
    rss = max(final.rss_bytes, 1)
    heap_total = final.live_bytes + final.waste_bytes + final.metadata_bytes + final.retained_bytes
    out = _never_freed_findings(final, heap_total, mapped.get("reach") or {}, live_over_time,
                                sites, cmd, killed)
    if retained_enough(final.retained_bytes - (teardown or 0), rss) and not young(retained_age_s):
        out.append(_retention_finding(final, release, heap, mapped, command, cmd, settings))
    if final.waste_bytes >= MiB and final.waste_bytes >= 0.25 * (final.live_bytes + final.waste_bytes):
        out.append(_waste_finding(final, heap))
    rest = non_heap_rest(final) - pools_free
    if rest >= 4 * MiB and rest >= 0.1 * rss:
        out.append(_non_heap_finding(final, mapped_by, cmd, pools_free))
    out.sort(key=lambda f: -f.bytes)
    return out


def young(retained_age_s: float | None) -> bool:
    """Whether the retention at the end was freed in the program's last moments."""
    return retained_age_s is not None and retained_age_s < RETENTION_MIN_AGE_S


def known_first(sugg: tuple, cmd: str) -> tuple:
    """The suggestions with a setting first only where its effect is known: the lab's rule
    for the pattern ("(heapsight lab remedies)" in its words; run --verify reorders by what
    it measured afterwards). Otherwise the first suggestion that is no setting goes first,
    or, with none, the command that measures them (hs-churn's retention of 2.6 MiB: a
    fixed trim threshold changed nothing, 3.95 -> 3.96 MiB at its end)."""
    if not sugg or not remedies.env_of(sugg[0]) or remedies.LAB in sugg[0]:
        return sugg
    other = next((x for x in sugg if not remedies.env_of(x)), None)
    if other is None:
        return (f"heapsight run --verify -- {cmd}   # measures these settings on this program "
                "at the moment that matters",) + sugg
    return (other,) + tuple(x for x in sugg if x is not other)


def fit_to_run(found: list, settings: dict, follow: str, command: list = ()) -> list:
    """Each finding's commands as this run needs them: a setting the program's environment
    already has is not suggested again, a setting whose effect is not known is not first
    (known_first), and `heapsight run`/`compare` keep --follow."""
    out = []
    for f in found:
        sugg = tuple(x for x in f.suggestions if not remedies.applied(x, settings))
        sugg = known_first(sugg, shell_join(command))
        if follow:
            opt = f"--follow {shell_quote(follow)}"
            sugg = tuple(x if opt in x else x.replace("heapsight run -- ", f"heapsight run {opt} -- ")
                         .replace("heapsight run --verify -- ", f"heapsight run --verify {opt} -- ")
                         .replace("heapsight compare -- ", f"heapsight compare {opt} -- ")
                         for x in sugg)
        out.append(dataclasses.replace(f, suggestions=sugg))
    return out


# Fewer live samples than this and the estimate's error is large: a smaller mean is suggested.
FEW_SAMPLES = 30


def _sites_text(m: dict | None, what: str) -> str:
    if not m or not m.get("sites"):
        return ""
    top = "; ".join(f"{x['site']} {human(x['bytes'])} \u00b1{human(x['error_bytes'])}"
                    for x in m["sites"][:3])
    return f" Where {what} was allocated (estimated from {m['samples']:,} sampled blocks): {top}."


def _untouched_words(final, held: int) -> str:
    """For a headline about bytes still allocated: how much of them was never touched (no
    RSS, only address space), when that is a large part of them."""
    t = final.untouched_bytes
    if t < MiB or t < held / 4:
        return ""
    return f" ({human(t)} of it never touched: address space, not RSS)"


def reach_findings(reach: dict, final: Breakdown, heap_total: int, grew: str, untouched: str,
                   cmd: str, sites: dict | None = None) -> list:
    """The never-freed blocks as the exit's copy marked them (measure.reach_sites' keys):
    a LEAK for the lost ones (definitely, and indirectly: reachable only from lost blocks),
    kept until exit for the ones the program still pointed to."""
    out = []
    definite, indirect = reach["definitely_lost_bytes"], reach["indirectly_lost_bytes"]
    possible, kept = reach["possibly_lost_bytes"], reach["still_reachable_bytes"]
    lost = definite + indirect
    how = ("Checked in a copy of the program at its exit, as memcheck's leak check does: every "
           "block no pointer from the program's memory (its globals, stacks, thread-local "
           "storage) leads to, directly or through other blocks (usable bytes).")
    if lost >= MiB:
        largest = [b for b in reach.get("largest_lost", ()) if b.get("site")]
        big = ("" if not largest else " Its largest blocks: " + "; ".join(
            f"{human(b['usable_bytes'])} from {b['site']}" for b in largest[:3]) + ".")
        text = _sites_text(reach.get("lost_sites"), "it")
        out.append(Finding(
            "leak", lost, f"{human(lost)} lost: no pointer to it remains",
            f"Definitely lost: {human(definite)} in {reach['definitely_lost_blocks']:,} blocks; "
            f"indirectly lost (pointed to only from lost blocks): {human(indirect)} in "
            f"{reach['indirectly_lost_blocks']:,} blocks. " + how + text + big
            + ("" if text or big else " Where it was allocated: a run with sampling on "
               "(the default) names its call sites."),
            (f"valgrind --leak-check=full --show-leak-kinds=definite {cmd}   # every lost "
             "block's full stack, at 20-50x the run time",)))
    if final.live_bytes >= MiB and final.live_bytes >= 0.5 * (heap_total or 1) and kept + possible >= MiB:
        reachable = (f"the program still pointed to these blocks when it ended "
                     f"({reach['still_reachable_blocks']:,} blocks; many programs leave their data "
                     "to the exit on purpose). ")
        if possible >= MiB:
            # the larger part may be the one only inner pointers lead to (an allocator of the
            # program's own hands out the middle of its pools: mawk's 7.5 MiB of 7.7)
            title = (f"{human(kept + possible)} kept until exit, {human(possible)} of it "
                     "possibly lost" + _untouched_words(final, kept + possible))
            opening = (f"{human(possible)} in {reach['possibly_lost_blocks']:,} blocks is "
                       "possibly lost, as memcheck counts it: only pointers into their middle "
                       "remain (a leak, or a structure addressed by an inner field, such as a "
                       "pool the program carves up itself)."
                       + _sites_text(reach.get("possibly_lost_sites"), "that")
                       + f" The other {human(kept)} is not a leak: " + reachable)
        else:
            title = f"{human(kept)} kept until exit, still reachable" + _untouched_words(final, kept)
            opening = "Not a leak: " + reachable
        # the still reachable blocks' own sites (not every never-freed one: the lost blocks'
        # sites are the leak's); where the run sampled none, the never-freed moment's
        own = reach.get("reachable_sites")
        where = ((_sites_text(own, "it").strip(), ()) if own and own.get("sites")
                 else where_allocated(sites, cmd))
        out.append(Finding(
            "kept", kept + possible, title,
            opening + untouched + grew + "It matters if it grows with the work "
            "(run it on a larger input: kept data grows with it, a working set levels off)."
            " No allocator setting can give it back. " + where[0], where[1]))
    return out


def where_allocated(sites: dict | None, cmd: str) -> tuple:
    """The never-freed finding's last words and commands: its top call sites when the run
    sampled them, else the tools that find them."""
    never = next((m for m in (sites or {}).get("moments", ()) if m["name"] == "never freed"), None)
    if not never or not never["sites"]:
        return ("Where it was allocated, and whether it is reachable:",
                (f"heaptrack {cmd}", f"valgrind --leak-check=full --show-leak-kinds=definite {cmd}"))
    top = "; ".join(f"{s['site']} {human(s['bytes'])} \u00b1{human(s['error_bytes'])}"
                    for s in never["sites"][:3])
    more = len(never["sites"]) - 3
    text = (f"Where it was allocated (estimated from {never['samples']:,} sampled blocks): {top}"
            + (f"; and {more} more call site(s) (the run record and --json list them all)."
               if more > 0 else "."))
    finer = sites.get("sample_bytes", 0) // 8
    if never["samples"] >= FEW_SAMPLES or finer < 64:
        return text, ()
    size = f"{finer // 1024}K" if finer % 1024 == 0 else str(finer)
    return (text + " Few samples: a smaller sampling mean narrows the estimate.",
            (f"heapsight run --sample-bytes {size} -- {cmd}",))


INTERPRETERS = re.compile(r"^(perl|python)[0-9.]*$")


def interpreted(command: list) -> bool:
    """Whether the command is a Perl or Python interpreter (by its program's name)."""
    return bool(command) and INTERPRETERS.match(os.path.basename(str(command[0]))) is not None


def child_findings(children: list, peak_rss: int, command: list, follow: str = "",
                   waited_peak: int = 0) -> list:
    """A process the command started that held much more memory than the one measured
    (a shell's or a build tool's child): named, with the option that measures it.
    waited_peak: the most a descendant held by the kernel's count at the program's end
    (summary.descendants_peak), where the sampler's readings of them (a few a second) saw
    less: one that came and went between two readings (gcc's cc1 on a small file)."""
    top = children[0] if children else None
    read = top["peak_rss_bytes"] if top else 0
    if max(read, waited_peak) < max(16 * MiB, 2 * peak_rss) or (top and top["name"] == follow):
        return []
    measured = os.path.basename(str(command[0])) if command else "the command"
    # --follow picks the first process of a name: a child named as the command (git gc's
    # git pack-objects, a make run by make) cannot be picked by it (--follow git measured
    # the started git again)
    pickable = bool(top) and not _same_program(top["name"], follow or measured)
    if follow:   # the command's other processes, beside the one --follow measures
        return [Finding(
            "child", read,
            f"{top['name']} (pid {top['pid']}), another process of the command, peaked at "
            f"{human(read)}: the figures here are {follow}'s",
            f"heapsight measures one process: here the first process of {follow} (--follow "
            f"{follow}, peak RSS {human(peak_rss)}). Another process of the command, "
            f"{top['name']}, held much more memory" + _follow_how(follow, pickable),
            _follow_line(top, command, pickable))]
    if waited_peak > 1.1 * read:   # (within a tenth: the child read, at its high-water mark)
        seen = (f"; of those heapsight read while they ran, {top['name']} (pid {top['pid']}) "
                f"held the most, {human(read)} when read" if top else
                "; heapsight read none of them while they ran")
        return [Finding(
            "child", waited_peak,
            f"a process {measured} started peaked at {human(waited_peak)}: the figures here "
            f"are {measured}'s",
            f"heapsight measures one process: the one it started, here {measured} (peak RSS "
            f"{human(peak_rss)}). A process it started held {human(waited_peak)} at its most "
            f"(the kernel's count as {measured} ended: it came and went between heapsight's "
            f"readings of the processes it started{seen})" +
            (_follow_how(measured, pickable) if top else
             "; --follow measures one of them instead."),
            _follow_line(top, command, pickable) if top else ())]
    return [Finding(
        "child", top["peak_rss_bytes"],
        f"{top['name']} (pid {top['pid']}), started by {measured}, peaked at "
        f"{human(top['peak_rss_bytes'])}: the figures here are {measured}'s",
        f"heapsight measures one process: the one it started, here {measured} (peak RSS "
        f"{human(peak_rss)}). A process it started, {top['name']}, held much more memory" +
        _follow_how(measured, pickable),
        _follow_line(top, command, pickable))]


def _same_program(name: str, other: str) -> bool:
    """Whether two programs' names are one program's (python3 and python3.11: a version
    after the name, as the library's --follow matches them)."""
    a, b = sorted((name, other), key=len)
    return bool(a) and b.startswith(a) and all(c == "." or c.isdigit() for c in b[len(a):])


def _follow_how(measured: str, pickable: bool) -> str:
    """How that other process is measured: --follow, unless it has the name of the one
    measured (then --follow would pick that one again)."""
    if pickable:
        return "; --follow measures that one instead."
    return (f", but it has the name of the process measured here ({measured}), and --follow "
            "picks the first process of a name, so it cannot single this one out: running "
            "that process's own command under heapsight measures it.")


def _follow_line(top: dict, command: list, pickable: bool) -> tuple:
    return ((f"heapsight run --follow {shell_quote(top['name'])} -- {shell_join(command)}",)
            if pickable else ())


def verdict(found: list, final: Breakdown | None, preload_active: bool,
            teardown: int | None = None, inactive: str = NOT_ACTIVE, pools_free: int = 0,
            retained_age_s: float | None = None) -> str:
    """The headline: the first finding's, or healthy (teardown, pools_free, retained_age_s:
    as findings takes them; inactive: why the library's figures are not the program's, when
    they are not)."""
    if final is None:
        return "no samples: the program ended before the first measurement"
    if not preload_active:
        return (f"heap figures unavailable ({inactive}); RSS only: "
                f"final {human(final.rss_bytes)}")
    pools = (f"; pymalloc kept {human(pools_free)} free in its arenas after CPython's teardown "
             "freed its objects" if pools_free >= MiB else "")
    before = final.retained_bytes - (teardown or 0)
    if not found and young(retained_age_s) and retained_enough(before, final.rss_bytes):
        return (f"healthy: little memory left allocated or wasted; the {human(before)} "
                f"retained at the end was freed in the program's own cleanup, "
                f"{retained_age_s * 1000:.0f} ms before its exit began (kept for those ms "
                f"only){pools} (final RSS {human(final.rss_bytes)}, of which "
                f"{human(final.live_bytes)} live)")
    if not found and teardown and retained_enough(final.retained_bytes, final.rss_bytes):
        return (f"healthy: little memory left allocated or wasted; the "
                f"{human(final.retained_bytes)} retained at exit was freed in its exit handlers "
                f"or teardown{pools} (final RSS {human(final.rss_bytes)}, of which "
                f"{human(final.live_bytes)} live)")
    if not found:
        return (f"healthy: little memory left allocated, retained or wasted{pools} (final RSS "
                f"{human(final.rss_bytes)}, of which {human(final.live_bytes)} live)")
    words = {"hold": "HELD WHILE RUNNING", "never-freed": "NEVER FREED", "leak": "LEAK",
             "child": "IN A CHILD PROCESS",
             "kept": "KEPT UNTIL EXIT", "retention": "RETENTION", "fragmentation": "FRAGMENTATION",
             "waste": "SMALL-OBJECT WASTE", "non-heap": "NON-HEAP MEMORY"}
    top = found[0]
    rest = ", ".join((f.word or words[f.kind]).lower() for f in found[1:])
    return f"{top.word or words[top.kind]}: {top.title}" + (f" (also: {rest})" if rest else "")


def alloc_mapped_nan(stats: AllocStats | None) -> float:
    return math.nan if stats is None else float(stats.mapped_bytes)
