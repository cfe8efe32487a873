"""The seam between capturing and analysing: everything summary.summarize reads, taken
once from the live run (the segment's figures, the timeline, the sampled allocations, the
heap maps, what the symbolizer said) and kept in the run record as plain data, so that a
saved run is analysed again by today's code (`heapsight report` does) and the analysis is
tested without a process.

  take(...)       the capture of a finished run, before summarize (which cuts the timeline)
  to_json / from_json
  rederive(doc)   a run record's summary, derived again from its capture

Reading is the segment as summarize reads it (the same methods as live.segment.Segment's it
calls), from a dict. A heap map's reach keeps, of the blocks not reachable, those a sample
fell in and the largest lost ones: all the analysis uses (a map may list a million)."""

from __future__ import annotations

import base64
import dataclasses

import numpy as np

from heapsight import heapmap, profile as profile_mod, symbolize
from heapsight.arrays import isin
from heapsight.model import AllocStats, HeapCounters

# The capture's version: raised whenever its shape changes (a key added, removed or
# renamed anywhere in it: tests/test_capture_versions.py compares today's capture of a
# stored program with the stored record of this version), with an upgrader below from the
# version before, and records of each version in tests/data that today's code analyses
# again.
#   1  the first (records up to the named moments)
#   2  + "settings": the allocator settings in the program's environment (remedies.py);
#      the segment's reading may carry exit_begun_ns/how and the timeline py_finalizing_s
#   3  the segment's header keeps only HEADER_FIELDS (it kept every field of the segment's,
#      whose layout then changed the capture's shape); no in-run allocator statistics
#   4  + the segment's "allocator_version"
#   5  + the segment's "malloc_elsewhere": whose malloc the program's calls reached when
#      not heapsight's (an executable with an allocator of its own)
#   6  + the timeline's "py_running_s": the last sample that read CPython running (the end
#      moment of a CPython program that finalized between two ticks is that sample, not the
#      library's reading, which came after its teardown)
#   7  + the timeline's "child_maxrss": wait4's ru_maxrss for the program (the most RSS of
#      it and of each descendant it waited for: gcc's cc1, which came and went between two
#      readings of the descendants, peaked at 30.8 MiB where the readings saw 6.4)
#   8  + each heap map's reach "workers": the processes that marked (two at exit past 16 MiB
#      of blocks, native/src/reach.c)
#   9  + the timeline's "pools": readings of pymalloc's pools (objects in use, pools' bytes)
#  10  + the timeline's "outlived": the program's descendants still running when it ended,
#      heapsight's library in them (a daemon that left its parent); + the counters'
#      "freed_usable_bytes": all the program freed (free space beyond it is the allocator's)
#  11  + each heap map's "counted_fast_chunks": the release counted from the pages, not run,
#      and the chunks glibc's fastbins then held (0: run; native/src/heapmap.c)
VERSION = 11

# The segment header's fields the analysis reads, by heapsight.h's names: all a capture
# keeps of the header (Reading.get refuses any other). Adding one is a new version.
HEADER_FIELDS = (
    "state", "owner_pid", "execs", "forks", "foreign_attaches", "slot_claims",
    "slot_overflows", "start_ns", "start_anon_bytes", "peak_ns", "peak_usable_bytes",
    "helper_mallocs", "library_threads", "library_cpu_ns", "exit_ns", "exit_done_ns",
    "release_ns", "exit_rss_before", "exit_rss_after", "exit_anon_before", "exit_anon_after",
    "exit_release_kind", "heapmap_at_exit", "exit_begun_ns", "exit_begun_how")


def _from_1(cap: dict) -> dict:
    """A version 1 capture as version 2: no settings were recorded (none assumed); the
    segment's exit_begun fields and the timeline's finalizing time are absent, which the
    analysis reads as "not seen" (the end moment is then the last sample)."""
    return {**cap, "version": 2, "settings": {}}


def _from_2(cap: dict) -> dict:
    """A version 2 capture as version 3: the header's fields past HEADER_FIELDS are left
    out (nothing reads them), and the in-run statistics some carry."""
    seg = cap.get("segment")
    if seg is not None:
        head = {k: v for k, v in seg["header"].items() if k in HEADER_FIELDS}
        stats = {k: v for k, v in (seg.get("alloc_stats") or {}).items() if k != "stats"}
        seg = {**seg, "header": head, "alloc_stats": stats}
    return {**cap, "version": 3, "segment": seg}


def _from_3(cap: dict) -> dict:
    """A version 3 capture as version 4: the allocator's version was not read ("")."""
    seg = cap.get("segment")
    return {**cap, "version": 4,
            "segment": None if seg is None else {**seg, "allocator_version": ""}}


def _from_4(cap: dict) -> dict:
    """A version 4 capture as version 5: whose malloc the program reached was not read
    (heapsight's taken as reached, as that version's analysis did)."""
    seg = cap.get("segment")
    return {**cap, "version": 5,
            "segment": None if seg is None else {**seg, "malloc_elsewhere": ""}}


def _from_5(cap: dict) -> dict:
    """A version 5 capture as version 6: no sample's reading of CPython's _finalizing was
    kept (the end moment is then as that version's analysis found it)."""
    tl = cap.get("timeline")
    return {**cap, "version": 6,
            "timeline": None if tl is None else {**tl, "py_running_s": None}}


def _from_6(cap: dict) -> dict:
    """A version 6 capture as version 7: the kernel's count of the program's and its
    descendants' peak RSS was not kept (0: not read; the descendants' peaks are then the
    sampler's readings alone, as that version's analysis took them)."""
    tl = cap.get("timeline")
    return {**cap, "version": 7,
            "timeline": None if tl is None else {**tl, "child_maxrss": 0}}


def _from_7(cap: dict) -> dict:
    """A version 7 capture as version 8: every marking was one process's."""
    maps = [[name, m if m.get("reach") is None else {**m, "reach": {**m["reach"], "workers": 1}}]
            for name, m in cap.get("maps") or []]
    return {**cap, "version": 8, **({"maps": maps} if "maps" in cap else {})}


def _from_8(cap: dict) -> dict:
    """A version 8 capture as version 9: pymalloc's pools were not read (Timeline.pools;
    a heap map's py_objects_bytes and py_pool_bytes stay None)."""
    tl = cap.get("timeline")
    return {**cap, "version": 9, **({"timeline": {**tl, "pools": []}} if tl is not None else {})}


def _from_9(cap: dict) -> dict:
    """A version 9 capture as version 10: no process was seen outliving the program."""
    tl = cap.get("timeline")
    return {**cap, "version": 10, **({"timeline": {**tl, "outlived": []}} if tl is not None else {})}


def _from_10(cap: dict) -> dict:
    """A version 10 capture as version 11: every heap map's release was run in its copy."""
    maps = [[name, {**m, "counted_fast_chunks": 0}] for name, m in cap.get("maps") or []]
    return {**cap, "version": 11, **({"maps": maps} if "maps" in cap else {})}


UPGRADES = {1: _from_1, 2: _from_2, 3: _from_3, 4: _from_4, 5: _from_5, 6: _from_6,
            7: _from_7, 8: _from_8, 9: _from_9, 10: _from_10}


class NewerCapture(ValueError):
    """A capture of a version this heapsight does not know (a newer heapsight wrote it)."""


def upgrade(cap: dict) -> dict:
    """A capture of any known version as today's, one upgrader at a time."""
    v = cap.get("version")
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"capture version {v!r} is not one heapsight ever wrote")
    if v > VERSION:
        raise NewerCapture(f"capture version {v}, newer than this heapsight's {VERSION}: "
                           "upgrade heapsight to analyse it again")
    while cap["version"] < VERSION:
        cap = UPGRADES[cap["version"]](cap)
    return cap


# ------------------------------------------------------------------ the segment's figures

class Reading:
    """The segment's figures as summarize reads them, from a plain dict (taken from a live
    segment by heapsight.live.segment.Segment.reading)."""

    def __init__(self, d: dict):
        self.d = d

    def get(self, name: str) -> int:
        """A header field the capture keeps (KeyError when an older capture lacks it)."""
        if name not in HEADER_FIELDS:
            raise ValueError(f"the segment's {name} is not kept in a capture: add it to "
                             "capture.HEADER_FIELDS (a new capture version)")
        return int(self.d["header"][name])

    def attached(self) -> bool:
        return bool(self.d["attached"])

    def image(self) -> str:
        return self.d["image"]

    def allocator_name(self) -> str:
        return self.d["allocator_name"]

    def allocator_version(self) -> str:
        return self.d["allocator_version"]

    def malloc_elsewhere(self) -> str:
        return self.d["malloc_elsewhere"]

    def owners(self) -> list:
        return [dict(o) for o in self.d["owners"]]

    def written_bytes(self) -> int:
        return int(self.d["written_bytes"])

    def exit_probe_why_not(self) -> str:
        return self.d["exit_probe_why_not"]

    def counters(self) -> HeapCounters:
        return HeapCounters(**self.d["counters"])

    def size_classes(self) -> list:
        return [tuple(c) for c in self.d["size_classes"]]

    def alloc_stats(self, field: str) -> AllocStats | None:
        s = self.d["alloc_stats"].get(field)
        return None if s is None else AllocStats(**{**s, "raw": tuple(s["raw"])})


def stats_json(s: AllocStats | None) -> dict | None:
    return None if s is None else {**dataclasses.asdict(s), "raw": [int(x) for x in s.raw]}


# ------------------------------------------------------------------ arrays and records

def _array(a: np.ndarray) -> dict:
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.descr if a.dtype.names else a.dtype.str, "shape": list(a.shape),
            "data": base64.b64encode(a.tobytes()).decode("ascii")}


def _unarray(d: dict) -> np.ndarray:
    dt = d["dtype"]
    dtype = np.dtype([tuple(f) for f in dt]) if isinstance(dt, list) else np.dtype(dt)
    return np.frombuffer(base64.b64decode(d["data"]), dtype=dtype).reshape(d["shape"]).copy()


def _timeline_json(tl) -> dict:
    skip = {"flat", "_columns", "max_rows", "capture"}
    from heapsight.timeline import FIELDS
    out = {name: getattr(tl, name) for name in FIELDS if name not in skip}
    out["children"] = [[pid, name, peak] for pid, (name, peak) in tl.children.items()]
    return out


def _timeline(d: dict, columns: dict):
    from heapsight.timeline import COLUMNS, Timeline
    tl = Timeline()
    n = len(columns.get("t", ()))
    rows = np.full((n, len(COLUMNS)), np.nan)
    for i, c in enumerate(COLUMNS):
        if c in columns:
            rows[:, i] = np.array([np.nan if v is None else v for v in columns[c]], dtype=float)
    tl.flat.frombytes(rows.tobytes())
    for k, v in d.items():
        if k == "children":
            tl.children = {int(pid): [name, peak] for pid, name, peak in v}
        elif k in ("snapshots", "images", "kinds", "vmas", "pools"):
            setattr(tl, k, [tuple(x) for x in v])
        elif k in ("kinds_peak", "kinds_exit", "vmas_peak", "vmas_exit"):
            setattr(tl, k, None if v is None else tuple(v))
        else:
            setattr(tl, k, v)
    return tl


def _profile_json(p) -> dict | None:
    if p is None:
        return None
    return {"mean_bytes": p.mean_bytes, "allocs": _array(p.allocs), "frees_matched": p.frees_matched,
            "stack_words": _array(p.stack_words), "dropped": p.dropped,
            "modules": [dataclasses.asdict(m) for m in p.modules], "unwind_ns": p.unwind_ns,
            "unwinds": p.unwinds, "unwind_frames": p.unwind_frames, "maps": _array(p.maps),
            "interp": p.interp, "unwind": p.unwind}


def _profile(d: dict | None):
    if d is None:
        return None
    return profile_mod.Profile(d["mean_bytes"], _unarray(d["allocs"]), d["frees_matched"],
                               _unarray(d["stack_words"]),
                               tuple(profile_mod.Module(**m) for m in d["modules"]), d["dropped"],
                               d["unwind_ns"], d["unwinds"], d["unwind_frames"], _unarray(d["maps"]),
                               d.get("interp") or {}, d.get("unwind") or {})


def _heapmap_json(hm, sampled_addrs: np.ndarray) -> dict:
    out = {f.name: getattr(hm, f.name) for f in dataclasses.fields(hm) if f.name not in ("heaps", "reach")}
    out["heaps"] = [{**{f.name: getattr(h, f.name) for f in dataclasses.fields(h)
                        if f.name not in ("live", "flags")},
                     "live": _array(h.live), "flags": _array(h.flags)} for h in hm.heaps]
    r = hm.reach
    if r is not None:
        u = r.unreached
        keep = isin(u["addr"], sampled_addrs)
        lost = np.flatnonzero(isin(u["state"].astype(np.int64), LOST))
        keep[lost[np.argsort(-u["usable"][lost].astype(np.int64), kind="stable")[:5]]] = True
        out["reach"] = {**{f.name: getattr(r, f.name) for f in dataclasses.fields(r)
                           if f.name != "unreached"}, "unreached": _array(u[keep])}
    else:
        out["reach"] = None
    return out


LOST = (heapmap.REACH_CLASSES.index("definitely_lost"), heapmap.REACH_CLASSES.index("indirectly_lost"))


def _heapmap(d: dict):
    heaps = [heapmap.Heap(**{**h, "live": _unarray(h["live"]), "flags": _unarray(h["flags"])})
             for h in d["heaps"]]
    r = d.get("reach")
    reach = None if r is None else heapmap.Reach(**{**r, "unreached": _unarray(r["unreached"])})
    rest = {k: v for k, v in d.items() if k not in ("heaps", "reach")}
    return heapmap.HeapMap(**rest, heaps=heaps, reach=reach)


# ------------------------------------------------------------------ the symbolizer

class Recording:
    """A symbolizer that remembers what it found, for the capture."""

    def __init__(self, symbolizer=symbolize.symbolize):
        self.symbolizer, self.frames, self.tool, self.note = symbolizer, {}, "", ""

    def __call__(self, lookups):
        found = self.symbolizer(lookups)
        self.frames.update(found.frames)
        self.tool, self.note = found.tool, found.note
        return found

    def to_json(self) -> dict:
        return {"tool": self.tool, "note": self.note,
                "frames": [[path, addr, [f.as_dict() for f in fs]]
                           for (path, addr), fs in self.frames.items()]}


# A replay of nothing: every address its unknown frame (nothing is shown or saved)
NO_SYMBOLS = {"tool": "none", "note": "not symbolized: nothing shows or saves the call sites",
              "frames": []}


class Replay:
    """The symbolizer of a capture: what was found then (an address it had not looked up
    gets the unknown frame)."""

    def __init__(self, d: dict):
        self.tool, self.note = d["tool"], d["note"]
        self.frames = {(path, addr): [symbolize.Frame(**f) for f in fs] for path, addr, fs in d["frames"]}

    def __call__(self, lookups):
        return symbolize.Result({k: self.frames.get(k) or symbolize.unknown(*k) for k in lookups},
                                self.tool, self.note)


# ------------------------------------------------------------------ the capture

def take(argv, started_pid, rc, linkage, reading, tl, hz, stats_hz, smaps_hz, releases, prof,
         maps, release_wanted, follow, settings=None) -> dict:
    """Everything summarize reads (reading: live.segment.Segment.reading()'s, None without a segment; the
    caller adds what the symbolizer found, "symbols", once summarize has asked it)."""
    addrs = prof.allocs["addr"] if prof is not None else np.zeros(0, np.uint64)
    return {"version": VERSION, "argv": list(argv), "started_pid": started_pid, "rc": rc,
            "linkage": linkage, "hz": hz, "stats_hz": stats_hz, "smaps_hz": smaps_hz,
            "releases": [[label, at, rel] for (label, at), rel in (releases or {}).items()],
            "release_wanted": release_wanted, "follow": follow, "settings": settings or {},
            "segment": reading.d if reading is not None else None,
            "timeline": _timeline_json(tl), "profile": _profile_json(prof),
            "maps": [[name, _heapmap_json(hm, addrs)] for name, hm in maps]}


def summarize_from(cap: dict, columns: dict):
    """The summary derived from a capture and the record's timeline columns."""
    from heapsight.summary import summarize   # the analysis of a run
    seg = Reading(cap["segment"]) if cap["segment"] is not None else None
    replay = Replay(cap["symbols"]) if cap.get("symbols") else symbolize.symbolize
    return summarize(cap["argv"], cap["started_pid"], cap["rc"], cap["linkage"], seg,
                     _timeline(cap["timeline"], columns), cap["hz"], cap["stats_hz"],
                     cap["smaps_hz"], {(label, at): rel for label, at, rel in cap["releases"]},
                     _profile(cap["profile"]), [(name, _heapmap(m)) for name, m in cap["maps"]],
                     cap["release_wanted"], cap["follow"], symbolizer=replay,
                     settings=cap.get("settings") or {})


def rederive(doc: dict):
    """A run record's summary derived again from its capture (of any version up to today's:
    upgrade), or None when it carries no capture (a record saved before captures were
    kept, or by attach). NewerCapture for one a newer heapsight wrote."""
    cap = doc.get("capture")
    if not isinstance(cap, dict):
        return None
    return summarize_from(upgrade(cap), doc.get("timeline") or {})


def reanalysed(path: str, doc: dict, command: str = "heapsight") -> dict:
    """A run record with its summary derived again from its capture, or as saved when it
    has none (older records, attach's) or the analysis fails on it (said on stderr): what
    `report` shows and `diff` compares."""
    if doc.get("kind") != "heapsight-run" or "capture" not in doc:
        return doc
    try:
        summary = rederive(doc)
    except Exception as e:   # a damaged capture never costs the page: the saved summary
        import sys
        print(f"{command}: {path}: shown as recorded (its capture could not be analysed "
              f"again: {type(e).__name__}: {e})", file=sys.stderr)
        return doc
    return doc if summary is None else {**doc, "summary": summary.to_dict()}
