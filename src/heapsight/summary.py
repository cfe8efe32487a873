"""The analysis of one captured run: the RSS split at every sample, the peak and the exit,
the heap figures, the call sites, the heap maps with their pinners and reachability, the
findings and the verdict, as a Summary. summarize() reads only what the capture holds: the
segment's figures (a capture.Reading, of this run or of a saved one),
the timeline, the sampled allocations, the heap maps and a symbolizer; live/measure.py feeds it
a live run, capture.rederive a saved one."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import sys

import numpy as np

from heapsight.dataclass import dataclass
from heapsight import allocators, analysis, heapmap, mapped, moments, profile, sites, symbolize
from heapsight.arrays import isin, median
from heapsight.fmt import printable
from heapsight.model import HeapFigures, Release, Snapshot, Summary
from heapsight.timeline import Timeline
from heapsight.layout import (EXIT_BEGUN_HOW, EXIT_BEGUN_PY_FINALIZING, FLUSH_TOTAL_BYTES,
                              STATE_DONE)


def exit_map_bytes(hmaps) -> dict:
    """From the exit's heap map (heap_maps' entries): the bytes of pinned pages, of free
    resident pages in glibc's thread arenas (arena 1 and up), of their top chunks'
    resident pages (malloc_trim leaves those), and the free bytes a live block keeps
    (heapmap.interleaved: None when not known); {} without one."""
    for m in hmaps:
        if m["moment"] == heapmap.EXIT and m["status"] == "mapped":
            page = m["page_bytes"]
            return {"pinned": sum(a["pinned_pages"] for a in m["arenas"]) * page,
                    "thread_arenas_free": sum(a["free_resident_pages"] for a in m["arenas"]
                                              if a["arena"] != 0) * page,
                    "thread_tops": sum(a.get("top_resident_pages", 0) for a in m["arenas"]
                                       if a["arena"] != 0) * page,
                    # (None in a record made before it was measured, or a heap not walked)
                    "interleaved": (sum(a["interleaved_bytes"] for a in m["arenas"])
                                    if m["arenas"] and all("interleaved_bytes" in a
                                                           and a.get("walked", True)
                                                           for a in m["arenas"]) else None),
                    "reach": m.get("reach")}
        if m["moment"] == heapmap.EXIT:
            return {"reach": m.get("reach")}
    return {}


def snapshots(tl: Timeline, cols: dict, parts: dict, releases: dict) -> list:
    """Each snapshot the sampler took (before the program's end): its sample's split, the
    allocator's latest reading at or before it, and the release measured there, if any."""
    t = np.asarray(cols["t"], dtype=float)
    out = []
    for label, at in tl.snapshots:
        hit = np.flatnonzero(t == at)
        if not len(hit):
            continue   # taken after the program's end (in the exit probe): not the program's
        i = int(hit[0])
        if any(math.isnan(parts[f][i]) for f in analysis.PART_FIELDS):
            continue   # its /proc read found the program gone (a signal as it ended)
        reading = {}
        for col in ("alloc_in_use", "alloc_free", "alloc_mapped"):
            seen = np.flatnonzero(~np.isnan(np.asarray(cols[col], dtype=float)[:i + 1]))
            reading[col] = int(cols[col][seen[-1]]) if len(seen) else None
        out.append(Snapshot(label, round(at, 3),
                            analysis.Breakdown(round(at, 3), **{f: int(parts[f][i])
                                                                for f in analysis.PART_FIELDS}),
                            reading["alloc_in_use"], reading["alloc_free"], reading["alloc_mapped"],
                            releases.get((label, at))))
    return out


def last_kinds(tl: Timeline, end_s: float) -> dict:
    """The classification of the program's mappings as it entered its exit (read then), or
    else the last taken before its end."""
    if tl.kinds_exit is not None:
        t, kinds = tl.kinds_exit
        return {"at_s": round(t, 3), **kinds}
    before = [(t, k) for t, k in tl.kinds if t <= end_s]
    if not before:
        return {}
    t, kinds = before[-1]
    return {"at_s": round(t, 3), **kinds}


def glibc_kinds(kinds: dict, allocator: str | None) -> dict:
    """The kinds of mapping as read, but that under another allocator than glibc no mapping
    is glibc's thread arena (its layout, a 64 MiB-aligned start with the rest reserved
    after it, is also mimalloc's and jemalloc's): those are other anonymous memory."""
    if not kinds or allocator in (None, "glibc") or not kinds.get("arena"):
        return kinds
    out = dict(kinds)
    out["anon"] = out.get("anon", 0) + out.pop("arena")
    out["arena"] = 0
    return out


def peak_kinds(tl: Timeline) -> dict:
    """The classification read when RSS was highest (within 0.2 s of it: it is read on the
    sampler's Python ticks), {} without one."""
    if tl.kinds_peak is None:
        return {}
    t, kinds, _ = tl.kinds_peak
    return {"at_s": round(t, 3), **kinds}


def owners_resident(owners: tuple, prof, tl: Timeline, end_s: float) -> tuple:
    """The objects that mapped memory outside malloc, each with the resident part of what
    it had mapped at the last reading of the mappings ("resident_bytes", "resident_at_s":
    what it uses at the end, beside what it reserved) and at the reading near peak RSS
    ("resident_peak_bytes", "resident_peak_at_s": a runtime may unmap its heap as it
    exits). Unchanged without the mappings' records (sampling off) or a reading."""
    # the reading last_kinds shows
    last = tl.vmas_exit or next((r for r in reversed(tl.vmas) if r[0] <= end_s), None)
    if not owners or prof is None or not len(prof.maps) or last is None:
        return owners
    out = [dict(o) for o in owners]
    for key, reading in (("resident", last), ("resident_peak", tl.vmas_peak)):
        if reading is None:
            continue
        t, vmas = reading
        ranges = mapped.live_ranges(prof, tl.start_ns + int(t * 1e9))
        by_owner: dict = {}
        for path, b in mapped.resident_by_object(ranges, vmas).items():
            who = analysis.owner_of(path)
            by_owner[who] = by_owner.get(who, 0) + b
        # pymalloc's pools read with those mappings (Sampler._read_mappings): its objects
        objects = next((r[1] for r in tl.pools if r[0] == t), None)
        for o in out:
            o[f"{key}_bytes"], o[f"{key}_at_s"] = by_owner.get(o["owner"], 0), round(t, 3)
            if objects is not None and "pymalloc" in o["owner"]:
                o[f"{key}_objects_bytes"] = int(objects)
    return tuple(out)


def live_over_time(cols: dict, final) -> tuple:
    """Live bytes at a quarter, half and three quarters of the run, and at exit: how what
    was never freed grew (a leak grows with the work; a working set levels off)."""
    t = np.asarray(cols["t"], dtype=float)
    live = np.asarray(cols["live_req"], dtype=float)
    ok = np.flatnonzero(~np.isnan(live))
    if final is None or len(ok) < 4:
        return ()
    end = final.at_s
    out = []
    for q in (0.25, 0.5, 0.75):
        i = ok[np.searchsorted(t[ok], q * end, side="left").clip(0, len(ok) - 1)]
        out.append((float(t[i]), int(live[i])))
    return tuple(out) + ((end, final.live_bytes),)


def _num(v, default=0):
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _since(tl: Timeline, ns: int | None) -> float:
    """A CLOCK_MONOTONIC time (the library's events) in the run's seconds."""
    return max(0.0, (ns - tl.start_ns) / 1e9) if tl.start_ns and ns else 0.0


# Samples within this share of the most live bytes count as at the peak (a few frees of
# small blocks while a large one is written must not move the moment off it).
PEAK_LIVE_SLACK = 0.001


def peak_live_row(live, rss, valid, t=None, peak_s=None, peak_bytes=0) -> int:
    """The row of the peak moment: among the valid rows whose live bytes are within
    PEAK_LIVE_SLACK (or a page) of the most, the one with the highest RSS (the first of
    equals).

    When no reading saw the library's exact peak (peak_bytes at peak_s: it fell between two
    readings; one short by less than the threads may hold back, FLUSH_TOTAL_BYTES, saw
    it), a reading after it counts what was freed since as retained, so it is off by
    twice its shortfall, and the best reading before it by its shortfall once: the one off
    by less is the peak's."""
    most = live[valid].max()
    near = valid[live[valid] >= most - max(most * PEAK_LIVE_SLACK, 4096)]
    best = int(near[np.argmax(rss[near])])
    short = peak_bytes - live[best]
    if peak_s is None or t[best] <= peak_s or short <= FLUSH_TOTAL_BYTES + most * PEAK_LIVE_SLACK:
        return best
    before = valid[t[valid] <= peak_s]
    if not len(before) or live[before].max() <= 0:
        return best
    earlier = peak_live_row(live, rss, before)
    return earlier if peak_bytes - live[earlier] < 2 * short else best


def call_sites(prof, tl: Timeline, cols: dict, heap: HeapFigures, peak_ns: int,
               end_ns: int | None, symbolizer=symbolize.symbolize) -> dict | None:
    """The sampled call sites at the peak, at exit, of the bytes never freed and at each
    snapshot (sites.py), with the exact live usable bytes of each moment beside the
    estimate. Times are the timeline's (seconds from its first sample, like snapshots)."""
    if prof is None or heap is None:
        return None
    start = tl.start_ns
    since = functools.partial(_since, tl)
    end_s = since(end_ns) if end_ns else tl.duration_s
    moments = [sites.Moment("peak", peak_ns, since(peak_ns), heap.peak_live_usable_bytes),
               sites.Moment("exit", None, end_s, heap.live_usable_bytes),
               sites.Moment("never freed", None, end_s, heap.live_usable_bytes),
               sites.Moment(sites.ALLOCATED, sites.ALL, end_s, heap.requested_total_bytes)]
    t = np.asarray(cols["t"], dtype=float)
    live = np.asarray(cols["live_usable"], dtype=float)
    for label, at in tl.snapshots:
        hit = np.flatnonzero(t == at)
        if len(hit) and not math.isnan(live[hit[0]]):   # as snapshots(): the program's own
            moments.append(sites.Moment(f"snapshot: {label}", start + int(at * 1e9), at,
                                        int(live[hit[0]])))
    try:
        return sites.build(prof, moments, profile.unwinder(prof), symbolizer=symbolizer)
    except (OSError, ValueError, IndexError, KeyError) as e:   # never fails the run
        print(f"heapsight: call sites not estimated: {e}", file=sys.stderr)
        return None


def mapped_sites(prof, tl: Timeline, end_ns: int | None,
                 symbolizer=symbolize.symbolize, allocator: str = "") -> dict | None:
    """The stacks of the anonymous memory the program mapped itself (every mmap outside
    malloc is recorded: exact, not estimated), at the moment the most was mapped and at
    exit, in the shape of call_sites'; None without any. An allocator that maps its heaps
    with mmap (jemalloc, tcmalloc, mimalloc) is left out: those mappings hold the live and
    retained bytes of the split, already named by the call sites that allocated them."""
    mp = prof.mapped() if prof is not None else None
    if mp is None:
        return None
    own = allocators.own_heaps_of(allocator)
    if own:
        keep = np.array([not re.search(own, c) for c in mapped.caller_modules(prof, mp.allocs)],
                        dtype=bool)
        if not keep.any():
            return None
        mp = dataclasses.replace(mp, allocs=mp.allocs[keep])
    since = functools.partial(_since, tl)
    rows = mp.allocs
    # the mapped total over time: +size at each map, -size at each unmap; its maximum
    freed = rows["free_ns"] != profile.NEVER
    times = np.concatenate([rows["time_ns"], rows["free_ns"][freed]]).astype(np.int64)
    steps = np.concatenate([rows["size"], -rows["size"][freed].astype(np.int64)]).astype(np.int64)
    order = np.lexsort((steps, times))   # at one time, unmaps first
    total = np.cumsum(steps[order])
    k = int(np.argmax(total))
    peak_ns, peak_bytes = int(times[order][k]), int(total[k])
    exit_bytes = int(rows["size"][~freed].sum())
    moments = [sites.Moment("peak mapped", peak_ns, since(peak_ns), peak_bytes),
               sites.Moment("exit", None, since(end_ns) if end_ns else tl.duration_s, exit_bytes)]
    try:
        return sites.build(mp, moments, profile.unwinder(mp), symbolizer=symbolizer,
                           skip_unnamed=True)
    except (OSError, ValueError, IndexError, KeyError) as e:   # never fails the run
        print(f"heapsight: the mappings' stacks not read: {e}", file=sys.stderr)
        return None


def check_classes(hmaps: tuple, live_blocks: int) -> None:
    """The invariant of the leak check at exit: every block live at exit is in exactly one
    of the four classes, so their blocks add up to the blocks the hooks counted live. Where
    they do not, the exit map's reach says by how many (classes_minus_counted: more in the
    classes are blocks the hooks never saw allocated, the loader's before heapsight's hooks
    were ready; fewer, blocks the copy did not find)."""
    for m in hmaps:
        r = m.get("reach") or {}
        if m["moment"] != "exit" or not r.get("marked"):
            continue
        held = sum(r[f"{c}_blocks"] for c in heapmap.REACH_CLASSES)
        r["live_blocks_counted"] = live_blocks
        r["classes_minus_counted"] = held - live_blocks


def heap_maps(maps: list, prof, sampled_sites: dict | None, start_ns: int) -> tuple:
    """The summary's "heapmaps": each map (heapmap.to_json) with its pinners, the call
    sites whose live sampled blocks at the map's moment keep otherwise-free pages resident."""
    out = []
    for name, hm in maps:
        entry = heapmap.to_json(hm, name, start_ns)
        pins = []
        if prof is not None and sampled_sites is not None and hm.status == "mapped":
            pins = heapmap.pinners(hm, sites.live_blocks(prof, hm.time_ns))
            for p in pins:
                p["site"] = sites.site_of_stack(sampled_sites, p["stack"])
        entry["pinners"] = pins
        if hm.reach is not None and hm.reach.marked:
            entry["reach"].update(reach_sites(hm, prof, sampled_sites))
        out.append(entry)
    return tuple(out)


LOST = (heapmap.REACH_CLASSES.index("definitely_lost"), heapmap.REACH_CLASSES.index("indirectly_lost"))
POSSIBLY = heapmap.REACH_CLASSES.index("possibly_lost")
REACHABLE = heapmap.REACH_CLASSES.index("still_reachable")


def reach_sites(hm, prof, sampled_sites) -> dict:
    """Who lost it: the sampled blocks live at the map's moment, by the class the copy gave
    them, per call site (lost: definitely and indirectly; possibly lost; still reachable),
    and the largest lost blocks, with their call site where a sample fell in them. Each
    finding names its own class's sites."""
    out = {}
    r = hm.reach
    sampled = None
    if prof is not None and sampled_sites is not None:
        sampled = sites.live_blocks(prof, hm.time_ns)
        cls = r.classes_of(sampled["addr"])
        out["lost_sites"] = sites.by_site(sampled_sites, sampled[isin(cls, LOST)])
        out["possibly_lost_sites"] = sites.by_site(sampled_sites, sampled[cls == POSSIBLY])
        out["reachable_sites"] = sites.by_site(sampled_sites, sampled[cls == REACHABLE])
    lost = r.unreached[isin(r.unreached["state"].astype(np.int64), LOST)]
    largest = lost[np.argsort(-lost["usable"].astype(np.int64), kind="stable")[:5]]
    rows = []
    for b in largest:
        row = {"address": hex(int(b["addr"])), "usable_bytes": int(b["usable"]),
               "class": heapmap.REACH_CLASSES[int(b["state"])], "site": None}
        if sampled is not None:
            hit = np.flatnonzero(sampled["addr"] == b["addr"])
            if len(hit):
                row["site"] = sites.site_of_stack(sampled_sites, int(sampled["stack"][hit[0]]))
        rows.append(row)
    out["largest_lost"] = rows
    return out


def _attachment(segment, tl: Timeline, started_pid: int) -> tuple:
    """(attached, lost_at): whether the library's figures are the program's, and the
    (time, image) of an exec that lost them. An execve into an image that does not load the
    library (a static binary, or one whose environment was cleared) leaves the old image's
    counters in the segment: the figures are then /proc's alone, from the exec on."""
    attached = segment is not None and segment.attached()
    # (the images are the started process's: a descendant that owns the figures, the
    # program a wrapper started, attached in its own image)
    if not (attached and tl.images and segment.get("owner_pid") == started_pid):
        return attached, None
    last_exe = tl.images[-1][1]
    attached_s = (segment.get("start_ns") - tl.start_ns) / 1e9 if tl.start_ns else 0.0
    image = segment.image()
    # the last exec happened after the library attached: its image does not load it
    exec_after_attach = (len(tl.images) > 1 and len(tl.image_before_s) == len(tl.images)
                         and tl.image_before_s[-1] > attached_s + 0.02)
    # (an image the library attached in after an exec the sampler did not see, the
    # program being that short, is newer than the sampler's last: no loss)
    unseen_exec = segment.get("execs") > len(tl.images) - 1
    if (image and not last_exe.endswith(image) and not unseen_exec) or exec_after_attach:
        return False, tl.images[-1]
    return True, None


def _program_time(segment, tl: Timeline, done: bool) -> tuple:
    """(duration_s, probe_s): the program's own time ends where the library's exit probe
    begins; samples after it show heapsight's release, not the program: they are cut from
    the timeline and their time reported apart."""
    if done and tl.start_ns:
        end_s = max(0.0, (segment.get("exit_ns") - tl.start_ns) / 1e9)
        if end_s < tl.duration_s:
            probe_s = tl.duration_s - end_s
            tl.cut_after(end_s)
            return end_s, probe_s
    return tl.duration_s, 0.0


@dataclass
class _Rows:
    """The timeline's rows that have a reading, and which of them are the peaks."""
    cols: dict
    parts: dict
    rss: np.ndarray
    live: np.ndarray
    valid: np.ndarray
    peak_i: int | None        # the peak of live bytes (of RSS without heap figures)
    peak_rss_i: int | None
    # CPython's objects in use in pymalloc's pools at each row, where known
    # (analysis.pool_objects, known=True); None: no reading of them
    objects: np.ndarray | None = None

    @classmethod
    def of(cls, cols: dict, parts: dict, attached: bool, peak_s=None,
           peak_bytes: int = 0) -> "_Rows":
        """peak_s, peak_bytes: the library's exact peak of live bytes, when it has one."""
        rss = np.asarray(cols["rss"], dtype=float)
        valid = np.flatnonzero(~np.isnan(rss))
        live = np.nan_to_num(np.asarray(cols["live_usable"], dtype=float), nan=0.0)
        # The peak moment: of the samples at the most live bytes, the one with the highest
        # RSS (a program that mallocs a block, then writes it, holds the same live bytes
        # while its RSS grows: the first of them would show the block as never touched);
        # without heap figures, the highest RSS.
        peak_rss_i = int(valid[np.argmax(rss[valid])]) if len(valid) else None
        if len(valid) and attached and live[valid].max() > 0:
            peak_i = peak_live_row(live, rss, valid, np.asarray(cols["t"], dtype=float),
                                   peak_s, peak_bytes)
        else:
            peak_i = peak_rss_i
        return cls(cols, parts, rss, live, valid, peak_i, peak_rss_i)

    def breakdown(self, i: int | None):
        if i is None:
            return None
        objects = (None if self.objects is None or math.isnan(self.objects[i])
                   else int(self.objects[i]))
        return analysis.Breakdown(round(float(self.cols["t"][i]), 3),
                                  **{f: int(self.parts[f][i]) for f in analysis.PART_FIELDS},
                                  objects_bytes=objects)

    @property
    def last(self) -> int | None:
        return int(self.valid[-1]) if len(self.valid) else None


def _exit_release(segment, c, rc: int, maps, allocator: str, baseline: int, mapped_before,
                  release_wanted: bool, done: bool, final, exit_s: float, own_metadata: float,
                  resident: float = math.nan):
    """(release, final): what the release at exit gave back (measured in the program or
    in the exit map's copy), or why there was none; and the split at exit, from the exit
    probe's own readings when it ran."""
    call = allocators.release_call(allocator)
    why_not = segment.exit_probe_why_not() if done else ""
    if why_not:   # exit handlers ran, but the allocator could not be asked (locked)
        return Release(False, call, why_not), final
    if not done:
        how = (f"killed by signal {-rc}" if rc < 0 else "it called _exit() or exec'd away")
        return Release(False, call, f"the program ended without running exit handlers ({how}); "
                       "figures are from the last sample"), final
    rss_b, anon_b = segment.get("exit_rss_before"), segment.get("exit_anon_before")
    release = _release_at_exit(segment, maps, call, allocator, release_wanted, rss_b, anon_b)
    if not math.isnan(own_metadata):
        # at most what the heap's pages hold beside the live blocks (the allocator's figure
        # may count pages not resident: jemalloc's is a bound), and what its release gave
        # back was retained memory, never metadata
        room = anon_b - baseline - c.live_usable_bytes - release.gave_back_bytes
        own_metadata = min(own_metadata, max(0, room))
    final = analysis.breakdown(
        round(exit_s, 3), rss_b, anon_b,
        baseline, c.live_requested_bytes, c.live_usable_bytes, c.live_blocks, allocator,
        float(np.fmin(mapped_before, resident)),
        own_metadata)
    return release, final


def glibc_resident(exit_map, segment) -> float:
    """glibc's memory resident at exit: its heaps' pages resident in the exit's copy (forked
    at that moment, the same pages) and its mmapped chunks, all live; NaN when the map has
    no complete answer. glibc's own figure counts the pages it got from the OS, resident or
    not: after a malloc_trim(0) of the program's own, whose pages inside free chunks go back
    while the heap keeps its size, it bounded nothing, and a python3 script's exit read
    "retained 3.0 MiB" where its heap held 1.1 MiB resident (pymalloc's arenas read as
    glibc's)."""
    if exit_map is None or exit_map.status != "mapped" or exit_map.allocator != "glibc" \
            or not exit_map.heaps:
        return math.nan
    page = exit_map.page_bytes
    stats = segment.alloc_stats("exit_stats_before")
    # (every heap found: their pages are glibc's system_mem, page for page)
    if stats is None or sum(h.pages for h in exit_map.heaps) * page < stats.mapped_bytes - stats.mmapped_bytes:
        return math.nan
    pages = sum(int(np.count_nonzero(h.flags & heapmap.BEFORE)) for h in exit_map.heaps)
    return float(pages * page + stats.mmapped_bytes)


def _release_at_exit(segment, maps, call: str, allocator: str, release_wanted: bool,
                     rss_b: int, anon_b: int) -> Release:
    """The release at exit of a program whose exit probe ran: measured in the program, or
    in the exit map's copy, or why not."""
    exit_map = dict(maps).get(heapmap.EXIT)
    if segment.get("exit_release_kind"):
        return Release(True, call, "", rss_b, segment.get("exit_rss_after"), anon_b,
                       segment.get("exit_anon_after"), segment.get("release_ns") / 1e9,
                       where="program")
    if call == "none":
        return Release(False, call, f"no release call known for {allocator}")
    if not release_wanted or not segment.get("heapmap_at_exit"):
        return Release(False, call, "release at exit was turned off (--no-release)")
    if exit_map is not None and exit_map.anon_before:
        # measured in the exit map's copy, at the program's exit (mapped or not: the copy
        # releases before it walks, and writes the figures of its release either way): what
        # the copy's anonymous memory dropped by is what the program's would have
        gave = exit_map.release_measured_bytes
        return Release(True, call, "", rss_b, max(0, rss_b - gave), anon_b,
                       max(0, anon_b - gave), exit_map.release_ns / 1e9, where="copy",
                       counted_fast_chunks=exit_map.counted_fast_chunks)
    why = (exit_map.status.removeprefix("not mapped: ") if exit_map is not None
           else "its copy of the program wrote no map")
    return Release(False, call, f"not measured at exit: {why}")


def _heap_figures(segment, tl: Timeline, c, rows: _Rows, stats_before, allocator: str,
                  mapped_before, done: bool) -> tuple:
    """(HeapFigures, peak_ns): the library's counters, with the peak of live bytes placed
    in time and never below what a sample or the exit saw."""
    peak_usable = segment.get("peak_usable_bytes")
    # seconds from the run's start, like every other time (the library attaches later:
    # after the loader, or after the program's execs)
    origin = tl.start_ns or segment.get("start_ns")
    peak_at = max(0.0, (segment.get("peak_ns") - origin) / 1e9) if peak_usable else 0.0
    peak_ns = segment.get("peak_ns")
    valid, live = rows.valid, rows.live
    # the library's peak lags by what threads hold back (1 MiB in all at most): never
    # below a sample that saw more
    sampled = int(live[valid].max()) if len(valid) else 0
    if sampled > peak_usable:
        peak_usable = sampled
        peak_at = float(rows.cols["t"][valid[np.argmax(live[valid])]])
        peak_ns = tl.start_ns + int(peak_at * 1e9)
    # a peak is never below the live bytes at exit (the library's lags by what threads
    # hold back): if they are the most, the peak is at exit
    if c.live_usable_bytes > peak_usable:
        peak_usable = c.live_usable_bytes
        peak_ns = segment.get("exit_ns") or tl.start_ns + int(tl.duration_s * 1e9)
        peak_at = max(0.0, (peak_ns - origin) / 1e9)
    # Requested bytes at the peak: the exact usable peak times the requested/usable ratio
    # of the live blocks at the sample with the most live bytes, never below the
    # requested bytes live at exit.
    peak_requested = min(peak_usable, max(int(peak_usable * tl.peak_req_ratio),
                                          c.live_requested_bytes))
    arenas = int(_num(tl.last("arenas"), 0))
    if stats_before is not None:
        arenas = max(arenas, stats_before.arenas)
    heap = HeapFigures(allocator, c.n_alloc, c.n_free, c.live_blocks, c.live_requested_bytes,
                       c.live_usable_bytes, peak_usable, peak_requested, round(peak_at, 3),
                       c.requested_total_bytes, c.n_mmapped, c.n_large_heap, arenas,
                       _threads(segment, tl), tuple(segment.size_classes()),
                       segment.get("helper_mallocs"),
                       None if math.isnan(mapped_before) or not done else int(mapped_before),
                       c.waste_error_bytes, _metadata_figure(allocator, stats_before, done),
                       allocators.kept_parts(allocator, stats_before) if done else (),
                       segment.allocator_version(),
                       allocators.version_note(allocator, segment.allocator_version()))
    return heap, peak_ns


def _metadata_figure(allocator: str, stats_before, done: bool) -> str:
    """The allocator's own name for the exit's metadata, when the split took its figure."""
    value, name = allocators.own_metadata(allocator, stats_before)
    return f"{allocator}'s {name}" if done and not math.isnan(value) else ""


def _threads(segment, tl: Timeline) -> int:
    """The program's threads: the most /proc saw at once, less the library's own, and never
    fewer than the threads that allocated (each claimed a counter slot: short-lived ones
    the samples of /proc miss)."""
    threads = int(max((x for x in tl.columns["threads"] if not math.isnan(x)), default=1))
    own = segment.get("library_threads")
    # every thread that allocated claimed a slot, or found them all taken (more than 255
    # alive at once: counted in slot_overflows)
    allocated = int(segment.get("slot_claims")) + int(segment.get("slot_overflows"))
    return max(1, threads - own, allocated)


def descendants_peak(tl: Timeline, follow: str = "", started_none: bool = False) -> int:
    """The most RSS one of the program's descendants held, by the kernel's count (wait4's
    ru_maxrss for the program: its own peak or that of a descendant it waited for, whichever
    was more), when that is a descendant's: more than the program's own peak (its VmHWM as
    last read, with heapsight's own pages and a twentieth to spare); 0 when not, when not
    read, when the process measured is not the one started (--follow: the count is then
    the followed one's too), or when the program started no process (started_none: the
    count is its own; a program that grew after the last reading and ended by _exit, with
    no reading at its exit, was said to have a child that peaked there)."""
    maxrss, hwm = int(getattr(tl, "child_maxrss", 0) or 0), _num(tl.last("hwm"), 0)
    if follow or not maxrss or not hwm or started_none:
        return 0
    spare = max(1 << 20, hwm / 20) + tl.own_rss_bytes
    return maxrss if maxrss > hwm + spare else 0


def _children(tl: Timeline) -> list:
    """The processes the program started that ran beside it, the largest peak first."""
    return sorted(({"pid": pid, "name": name, "peak_rss_bytes": peak}
                   for pid, (name, peak) in tl.children.items()),
                  key=lambda ch: -ch["peak_rss_bytes"])


def _preload_note(segment, tl: Timeline, linkage: str, attached: bool, lost_at, owner: int,
                  started_pid: int, follow: str, children: list, bypassed: str = "",
                  elsewhere: str = "") -> tuple:
    """(preload, note): whether the library's figures are the program's, and whose they
    are, in words (bypassed: the object whose malloc answered every call of the program's,
    none reaching the hooks; elsewhere: one that defines malloc, some calls reaching them)."""
    if linkage == "static":
        preload, note = "static", "statically linked: /proc figures only"
    elif bypassed:
        preload, note = "bypassed", (
            f"its malloc is its own: {printable(bypassed)} defines malloc, and the program's "
            "calls reach it before heapsight's hooks, which counted none of them (an allocator "
            "built into the program, as Chromium's PartitionAlloc): /proc figures only")
    elif lost_at is not None:
        preload, note = "not-attached", (f"it exec'd into {lost_at[1]} at {lost_at[0]:.2f} s, "
                                         "which does not load the preload library (a static "
                                         "binary, or its environment was cleared): /proc "
                                         "figures only, for the whole run")
    elif segment is None:
        preload, note = "not-attached", ("no room for heapsight's stats segment in /dev/shm "
                                         "(or the temporary directory): the program ran "
                                         "without the preload library, /proc figures only")
    elif not attached and follow:
        preload, note = "not-attached", (f"no process of {follow} ran under the preload "
                                         f"library (--follow {follow}): /proc figures of the "
                                         "process started only")
    elif not attached:
        preload, note = "not-attached", ("the preload library never started in the program "
                                         "(setuid, or it clears LD_PRELOAD): /proc figures only")
    elif owner != started_pid:
        preload, note = "active", (f"figures are for pid {owner}, a process started by pid "
                                   f"{started_pid}")
    else:
        preload, note = "active", f"figures are for pid {owner}"
    if elsewhere and not bypassed:
        note += (f"; {printable(os.path.basename(elsewhere))} defines malloc itself: the heap "
                 "figures count the calls that reached heapsight's hooks")
    forks = segment.get("forks") if attached else 0
    if forks:
        note += f"; its {forks} forked child process(es) are not counted"
    if len(tl.images) > 1 and (not attached or owner == started_pid):
        note += "; images: " + ", then ".join(f"{os.path.basename(exe)} from {t:.2f} s"
                                               for t, exe in tl.images)
    if children:
        top = ", ".join(f"{ch['name']} {ch['peak_rss_bytes'] / (1 << 20):.1f} MiB"
                        for ch in children[:3])
        whose = ("other process(es) of the command" if attached and owner != started_pid
                 else "process(es) it started (fork, vfork, posix_spawn)")
        note += (f"; {len(children)} {whose} ran beside it, not counted in these figures; "
                 f"largest peaks as read (VmHWM): {top}")
        same = [ch for ch in children if follow and ch["name"] == follow]
        if same and attached and owner != started_pid:
            note += (f"; --follow measures the first process of {follow}: {len(same)} more "
                     f"ran (largest peak as read: {same[0]['peak_rss_bytes'] / (1 << 20):.1f} MiB)")
    if tl.outlived:
        names = ", ".join(f"{name} (pid {pid})" for pid, name in tl.outlived[:3])
        note += (f"; {len(tl.outlived)} process(es) it started still ran when it ended, not "
                 f"measured, heapsight's library in them: {names} (a daemon is measured in "
                 "the foreground, by its option to stay there, or by heapsight attach PID)")
    return preload, note


def _peak_rss(hwm: int, rows: _Rows, final) -> tuple:
    """(bytes, at_s): the kernel's high-water mark, and never below any reading taken (the
    exit reading comes after the last status read; a short program may have no VmHWM yet)."""
    cols, i = rows.cols, rows.peak_rss_i
    readings = [(hwm, None)]
    if i is not None:
        readings.append((int(rows.rss[i]), float(cols["t"][i])))
    if final is not None:
        readings.append((final.rss_bytes, final.at_s))
    peak_rss, peak_rss_at = max(readings, key=lambda r: (r[0], r[1] is not None))
    if peak_rss_at is None:  # VmHWM above every reading: it happened between two samples
        peak_rss_at = float(cols["t"][i]) if i is not None else 0.0
    return peak_rss, peak_rss_at


def freed_in_teardown(prof, tl: Timeline, end_s: float | None, exit_ns: int | None) -> int | None:
    """The bytes the program freed after its exit began (end_s: main returned, exit() was
    called or CPython began finalizing) and before heapsight's exit probe read the exit
    (exit_ns): its exit handlers', static destructors' and interpreter's frees, estimated
    from the sampled blocks freed then (sites.weights), less twice the estimate's standard
    error (a few samples must not explain away retention the program had while it worked);
    None without samples or those moments. Only where the library took no reading as the
    exit began (summarize counts it from that reading's live bytes where it did)."""
    if prof is None or end_s is None or not exit_ns or not tl.start_ns or not len(prof.allocs):
        return None
    a, begun = prof.allocs, np.uint64(tl.start_ns + int(end_s * 1e9))
    then = a[(a["free_ns"] >= begun) & (a["free_ns"] <= np.uint64(exit_ns))]
    if not len(then):
        return 0
    est, _, var = sites.weights(then["size"], prof.means(then))
    return max(0, int(est.sum() - 2 * math.sqrt(var.sum())))


def _findings(argv, segment, tl: Timeline, rows: _Rows, heap, final, release, allocator: str,
              sampled_sites, hmaps, mapped_by, duration_s: float, settings: dict,
              teardown: int | None = None, end_s: float | None = None,
              pools_free: int = 0, retained_age_s: float | None = None,
              killed: int = 0) -> tuple:
    """(findings, holds): what the exit's figures say (teardown: the bytes freed after the
    exit began, freed_in_teardown), and the moments memory was held while the program ran
    (end_s: when its exit began, end_begun_s), a hold the exit's findings already describe
    not repeated. pools_free: pymalloc's free space at exit, after CPython's teardown."""
    found = analysis.findings(argv, final, release, heap, live_over_time(rows.cols, final),
                              sampled_sites, exit_map_bytes(hmaps), mapped_by, settings,
                              teardown, pools_free, retained_age_s, killed)
    objects = analysis.pool_objects(rows.cols["t"], rows.parts["other_anon_bytes"], tl.pools,
                                    end_s)
    held = analysis.holds(rows.cols["t"], rows.parts, duration_s, objects)
    kinds = {"retained": ("retention", "fragmentation"), "non-heap": ("non-heap",)}
    news = [h for h in held if not any(f.kind in kinds[h.cause] and f.bytes >= h.held_bytes / 2
                                       for f in found)]
    found = found + analysis.hold_findings(news, allocator, argv, mapped_by, heap.arenas)
    return found, held


def summarize(argv, started_pid, rc, linkage, segment, tl: Timeline, hz, stats_hz,
              smaps_hz=math.nan, releases=None, prof=None, maps=(),
              release_wanted=True, follow: str = "",
              symbolizer=symbolize.symbolize, settings: dict | None = None) -> Summary:
    """The Summary of a captured run, in the order its parts depend on each other: whose
    figures they are, the program's time, the split at every sample, the release and the
    heap figures, call sites and heap maps, findings, the peak of RSS.

    prof: the sampled allocations (Segment.profile), None for none; maps: (moment name,
    heapmap.HeapMap) of the heap maps taken; release_wanted: False under --no-release (the
    exit map's copy releases all the same: its figure is not reported)."""
    attached, lost_at = _attachment(segment, tl, started_pid)
    elsewhere = segment.malloc_elsewhere() if attached else ""
    bypassed = ""
    if elsewhere and segment.counters().n_alloc == 0:
        # an allocator of the program's own answers its malloc before heapsight's hooks (the
        # executable exports malloc): what the hooks counted is nothing of the program's
        attached, bypassed = False, elsewhere
    inactive = (f"its own malloc, in {os.path.basename(bypassed)}, answers its calls"
                if bypassed else analysis.NOT_ACTIVE)
    allocator = segment.allocator_name() if attached else "unknown"
    baseline = segment.get("start_anon_bytes") if attached else 0
    done = attached and segment.get("state") == STATE_DONE
    duration_s, probe_s = _program_time(segment, tl, done)
    stats_before = segment.alloc_stats("exit_stats_before") if attached and done else None
    mapped_before = analysis.alloc_mapped_nan(stats_before)
    own_metadata, _ = allocators.own_metadata(allocator, stats_before)
    cols = tl.columns
    exit_map = dict(maps).get(heapmap.EXIT)
    end_s, end_how = end_begun_s(segment, tl) if attached else (None, "")
    resident = glibc_resident(exit_map, segment) if done else math.nan
    c = segment.counters() if attached else None
    parts = analysis.timeline_split(
        cols, baseline, allocator if attached else None, mapped_before if done else math.nan,
        tl.pools, analysis.resident_at_end(cols, resident, end_s, c.n_alloc, c.n_free,
                                           segment.get("exit_anon_before")) if done else math.nan)
    peak_bytes = segment.get("peak_usable_bytes") if attached else 0
    rows = _Rows.of(cols, parts, attached,
                    _since(tl, segment.get("peak_ns")) if peak_bytes else None, peak_bytes)
    rows.objects = analysis.pool_objects(cols["t"], parts["other_anon_bytes"], tl.pools,
                                         end_s, known=True)
    peak, final = rows.breakdown(rows.peak_i), rows.breakdown(rows.last)
    heap, peak_ns = None, None
    release = Release(False, "none", inactive)
    if attached:
        release, final = _exit_release(segment, c, rc, maps, allocator, baseline, mapped_before,
                                       release_wanted, done, final,
                                       _since(tl, segment.get("exit_ns")) if tl.start_ns
                                       else (segment.get("exit_ns") - segment.get("start_ns")) / 1e9,
                                       own_metadata, resident)
        if final is not None and exit_map is not None and exit_map.py_objects_bytes is not None:
            # CPython's objects at exit: pymalloc's pools read in the exit's copy
            final = dataclasses.replace(final, objects_bytes=min(final.other_anon_bytes,
                                                                 exit_map.py_objects_bytes))
        heap, peak_ns = _heap_figures(segment, tl, c, rows, stats_before, allocator,
                                      mapped_before, done)
        heap = dataclasses.replace(heap, freed_usable_bytes=c.freed_usable_bytes,
                                   **({} if math.isnan(resident) else
                                      {"resident_at_exit_bytes": int(resident)}))
        if done and (rows.peak_i is None or c.live_usable_bytes > rows.live[rows.peak_i]):
            peak = final  # the most live bytes seen were at exit (a program shorter than a tick)

    owner = segment.get("owner_pid") if attached else 0
    # the process measured was the started one's child until it took the segment (--follow,
    # a wrapper): it did not run beside itself
    children = [ch for ch in _children(tl) if ch["pid"] != owner]
    preload, note = _preload_note(segment, tl, linkage, attached, lost_at, owner, started_pid,
                                  follow, children, bypassed, elsewhere)
    library_cpu = (segment.get("library_cpu_ns") / 1e9
                   if segment is not None and segment.get("owner_pid") else 0.0)
    end_ns = segment.get("exit_ns") if done else None
    sampled_sites = call_sites(prof, tl, cols, heap, peak_ns, end_ns, symbolizer) if heap else None
    mapped_by_stack = mapped_sites(prof, tl, end_ns, symbolizer, allocator) if heap else None
    hmaps = heap_maps(maps, prof, sampled_sites, tl.start_ns) if attached else ()
    if heap is not None:
        check_classes(hmaps, heap.live_blocks)
    mapped_by = owners_resident(tuple({**o, "owner": analysis.owner_of(o["object"])}
                                      for o in (segment.owners() if attached else [])), prof, tl,
                                duration_s)
    end_i = end_reading(cols, end_s, library_read_s(segment, tl) if attached else None)
    if end_i is not None and done:   # counted: the live bytes then less those at exit
        teardown = max(0, int(rows.live[end_i]) - int(c.live_usable_bytes))
    else:
        teardown = freed_in_teardown(prof, tl, end_s, end_ns)
    # pymalloc's free space at exit after CPython's teardown freed its objects: the
    # teardown's, as the frees counted in teardown are for retention
    pools_free = (exit_map.py_pool_bytes - exit_map.py_objects_bytes
                  if exit_map is not None and exit_map.py_pool_bytes is not None
                  and end_how == EXIT_BEGUN_HOW[EXIT_BEGUN_PY_FINALIZING] else 0)
    # (at the row the end moment is read at)
    age = (analysis.retention_age(cols["t"], rows.parts["retained_bytes"],
                                  moments.end_row(cols["t"], rows.rss, end_s, rows.last, end_i),
                                  final.retained_bytes - (teardown or 0))
           if final is not None and done else None)
    found, held = (_findings(argv, segment, tl, rows, heap, final, release, allocator,
                             sampled_sites, hmaps, mapped_by, duration_s, settings or {},
                             teardown, end_s, pools_free, age,
                             # (the started process's signal: not a followed one's)
                             -rc if rc < 0 and segment.get("owner_pid") == started_pid else 0)
                   if heap else ([], []))
    # (no fork seen, no descendant that loaded the library, none read from /proc: a child
    # could only be one that ran a static program)
    started_none = attached and not tl.children and not segment.get("forks") and \
        not segment.get("foreign_attaches")
    # the kernel's count is then the program's own peak: above the last VmHWM read when the
    # program grew after it and ended without the library's exit reading (_exit, a signal);
    # one image's (an execve keeps the count of the image before)
    own_maxrss = (int(getattr(tl, "child_maxrss", 0) or 0)
                  if started_none and not follow and not segment.get("execs") else 0)
    peak_rss, peak_rss_at = _peak_rss(max(int(_num(tl.last("hwm"), 0)), own_maxrss), rows, final)
    waited = descendants_peak(tl, follow, started_none)
    # (under --follow the process measured was chosen: another process of the command comes
    # after its own findings)
    found = sorted(found + analysis.child_findings(children, peak_rss, argv, follow, waited),
                   key=lambda f: (bool(follow) and f.kind == "child", -f.bytes))
    found = analysis.fit_to_run(found, settings or {}, follow, argv)
    largest = max(held, key=lambda h: h.held_bytes, default=None)
    named = moments.build(cols["t"], rows.rss, rows.breakdown, duration_s, rows.peak_rss_i,
                          rows.last, final if done else None, end_s, end_how, end_i,
                          (largest.start_s, largest.end_s) if largest else None,
                          known_at(cols, rows.objects, mapped_before if done else math.nan))
    return Summary(
        command=tuple(argv), pid=owner or started_pid, started_pid=started_pid,
        exit_code=128 - rc if rc < 0 else rc, exit_signal=-rc if rc < 0 else 0,
        preload=preload, preload_note=note, duration_s=round(duration_s, 3), samples=len(tl),
        sample_hz=hz, sampler_cpu_s=round(tl.sampler_cpu_s, 4),
        peak_rss_bytes=peak_rss,
        # the last reading may precede the library's last writes: what it wrote counts too
        heapsight_rss_bytes=int(max(tl.own_rss_bytes, segment.written_bytes() if attached else 0)),
        final_rss_bytes=final.rss_bytes if final else 0, peak=peak, final=final, release=release,
        heap=heap, forks=segment.get("forks") if attached else 0,
        execs=segment.get("execs") if attached else 0,
        other_processes=segment.get("foreign_attaches") if attached else 0,
        findings=tuple(found), verdict=analysis.verdict(found, final, attached, teardown, inactive,
                                                         pools_free, age),
        holds=tuple(held),
        cpu_user_s=round(tl.child_user_s, 4), cpu_sys_s=round(tl.child_sys_s, 4),
        minor_faults=tl.child_minflt, peak_rss_at_s=round(peak_rss_at, 3),
        stats_hz=stats_hz, smaps_hz=smaps_hz, exit_probe_s=round(probe_s, 4),
        exit_held_s=round(max(0, segment.get("exit_done_ns") - segment.get("exit_ns")) / 1e9, 4)
        if done else 0.0,
        library_cpu_s=round(library_cpu, 4),
        program_cpu_s=round(max(0.0, tl.child_user_s + tl.child_sys_s - library_cpu), 4),
        snapshots=tuple(snapshots(tl, cols, parts, releases or {})),
        images=tuple(tl.images), children=tuple(children[:20]), mapped_by=mapped_by,
        outlived=tuple({"pid": int(pid), "name": name} for pid, name in tl.outlived),
        resident_by_kind=glibc_kinds(last_kinds(tl, duration_s), allocator),
        resident_by_kind_peak=glibc_kinds(peak_kinds(tl), allocator),
        sites=sampled_sites,
        mapped_sites=mapped_by_stack,
        heapmaps=hmaps, moments=named, moment=moments.about(found))


def known_at(cols: dict, objects, final_mapped: float = math.nan) -> np.ndarray:
    """Per row, how much of what its split is bounded by is known there: the allocator's
    mapped memory (read there, or the same in the readings around it:
    analysis.mapped_tight), and where pymalloc's pools were read, its objects (between two
    readings of them), which weigh more: moments.level reads a stretch where the most is
    known, and of a row that knows one of the two, the one that shows the objects (a
    python3 script holding 200 MiB of objects: its pools read only until 0.79 s of a stretch
    from 0.66 to 2.81 s, on a loaded machine, and its held column was read at 1.74 s,
    where the mapped memory was known and the objects were not: no objects shown)."""
    known = analysis.mapped_tight(cols["alloc_mapped"], final_mapped).astype(float)
    if objects is not None:
        known += 1.5 * ~np.isnan(np.asarray(objects, dtype=float))
    return known


def end_reading(cols: dict, end_s: float | None, read_s: float | None) -> int | None:
    """The row that is the library's own reading of the moment the exit began (main
    returned, exit() was called, or its first flush once CPython began finalizing:
    live/sampler.py's add_exit_begun_row puts it at that moment's time exactly), when the
    end is that moment (read_s: library_read_s); None otherwise (the end a tick saw:
    CPython's finalizing seen first from outside, a tick's own row), or when no row is
    there (a run under a seccomp filter, or recorded before the library took it)."""
    if end_s is None or read_s is None or end_s != read_s:
        return None
    t, rss = np.asarray(cols["t"], dtype=float), np.asarray(cols["rss"], dtype=float)
    hit = np.flatnonzero((np.abs(t - end_s) < 1e-6) & ~np.isnan(rss))
    return int(hit[-1]) if len(hit) else None


def library_read_s(segment, tl: Timeline) -> float | None:
    """When the library saw the exit begin (seconds on the timeline's "t" scale: the time of
    its reading's row, where it took one), None when it did not."""
    try:
        ns = segment.get("exit_begun_ns")
    except KeyError:   # a capture saved before the segment had these fields
        return None
    return _since(tl, ns) if ns and tl.start_ns else None


# How late the library's reading of CPython's finalizing may come after the first sample
# that saw it and still be the end (at least two ticks): on a loaded machine the program
# may be kept off its core between the two; a teardown that allocates nothing runs longer.
PY_READING_LATE_S = 0.1


def _tick_s(tl: Timeline) -> float:
    """The sampler's step between two rows, the median (0.01 s with fewer than two)."""
    t = tl.columns["t"] if len(tl) > 1 else []
    return float(median(np.diff(np.asarray(t, dtype=float)))) if len(t) > 1 else 0.01


def end_begun_s(segment, tl: Timeline) -> tuple:
    """(seconds since the run's start, how) of the moment the program's exit began, before
    its exit handlers, static destructors and an interpreter's teardown: the library's
    reading as CPython began finalizing where it took one soon after the first sample that
    saw it (PY_READING_LATE_S); else the earliest of the library's exit_begun_ns (main returned, or the
    program called exit()) and the first sample that saw CPython finalizing
    (tl.py_finalizing_s), and for CPython just after the last sample that read it running
    (tl.py_running_s); (None, "") when neither the library nor a sample saw it. Seconds on
    the timeline's "t" scale (_since)."""
    seen = []
    try:   # (a capture saved before the segment had these fields has neither)
        ns, how = (segment.get("exit_begun_ns"), segment.get("exit_begun_how")) \
            if segment is not None else (0, 0)
    except KeyError:
        ns, how = 0, 0
    if ns and tl.start_ns:
        seen.append((_since(tl, ns), EXIT_BEGUN_HOW.get(how, "")))
    library = seen[0][0] if seen else None
    py = getattr(tl, "py_finalizing_s", None)
    if library is not None and how == EXIT_BEGUN_PY_FINALIZING and (
            py is None or library <= py + max(2 * _tick_s(tl), PY_READING_LATE_S)):
        # the library's own reading of CPython's finalizing (its first flush after it): its
        # live bytes are those of that moment within a flush's bytes, where the sample before
        # the tick that saw it is up to a tick early (before the program's last act: python3
        # closing its sqlite3 database). Not a reading long after that tick: a teardown that
        # allocated nothing for a while (a slow __del__) is not the end.
        return seen[0]
    if py is not None:
        seen.append((float(py), EXIT_BEGUN_HOW[EXIT_BEGUN_PY_FINALIZING]))
    running = getattr(tl, "py_running_s", None)
    if (running is not None and library is not None and running < library
            and (py is None or py > library)
            and (not tl.images or tl.images[-1][0] <= running)):
        # No tick saw CPython finalizing before the library's reading as main returned,
        # which comes after its teardown (Py_FinalizeEx runs before exit): the teardown fell
        # between two ticks, or the tick that saw _finalizing came after (it stays set).
        # CPython began finalizing after the last sample that read it running: the exit
        # began just after that sample. (A C extension calling exit() between two ticks reads
        # so too: its end is then the sample before, at most a tick early.)
        seen.append((math.nextafter(float(running), math.inf),
                     EXIT_BEGUN_HOW[EXIT_BEGUN_PY_FINALIZING]))
    return min(seen) if seen else (None, "")
