"""Who holds the memory, for the page: a run's sampled call sites as a flame graph and its
heap maps page by page, as chart descriptions the renderer (assets/report.js) draws.

  kind "flame"    the call paths of the sampled allocations merged into one tree (node 0 is
                  the root; node i's parent is i - up[i], always before it; a named
                  function's frames are one frame, its lines listed), and for each moment
                  the bytes, blocks and 95% error of the stacks live then, on the node where
                  each stack ends. The renderer sums them up the tree: a box per (frame,
                  path), as wide as the bytes allocated through it. Errors add as squares
                  (the samples of different stacks are disjoint, so their variances add).
  kind "heapmap"  each heap map of the run with every page's state (STATES) and occupancy
                  as base64, one byte per page, and each state's pages and bytes; the
                  renderer groups pages into cells to fit its width.

Both read the summary's "sites" and "heapmaps" (made by heapsight.sites and
heapsight.heapmap); a summary without them (older records, sampling off) gives no chart.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import re

import numpy as np

from heapsight import heapmap

# ---------------------------------------------------------------------------- call sites

TOP_SITES = 100   # the table's rows per moment the page carries (the JSON has them all)
NOT_UNWOUND = "(stack not unwound)"   # as the call sites name it

# What kind of object a frame's code is in: its colour on the flame graph.
KIND_NAMES = {"program": "the program", "libc": "C library", "runtime": "language runtime",
              "library": "other libraries", "unknown": "unknown object"}
LIBC = re.compile(r"^(?:libc|libm|libpthread|libdl|librt|libresolv|ld-linux[-\w]*|ld)[.-]")
RUNTIME = re.compile(r"^(?:libstdc\+\+|libc\+\+(?:abi)?|libgcc_s|libpython|libperl|libruby|"
                     r"libjvm|libnode|libv8|libgo|liblua|libphp|libtcl|libjulia|libmono)[.\-\d]")
SHARED = re.compile(r"\.so(?:\.|$)|^linux-vdso|^linux-gate")


def object_kind(path: str | None) -> str:
    """program, libc, runtime, library or unknown, from an object's file name."""
    if not path:
        return "unknown"
    name = os.path.basename(path)
    if LIBC.match(name):
        return "libc"
    if RUNTIME.match(name):
        return "runtime"
    if SHARED.search(name):
        return "library"
    return "program"   # an executable: the program itself, or the interpreter it runs under


def merge_paths(stacks: list, wanted) -> tuple:
    """The call paths of the stacks in `wanted` (frame indices, innermost first) merged
    from the outermost frame down: (parent, frame, end) where node i's parent is
    parent[i] (node 0, the root, has -1) and end[stack] is the node where that stack ends.
    Nodes are numbered depth first, so a node's parent is most often the node just before
    it (the page sends i - parent[i]: mostly 1)."""
    frame, kids, end = [-1], [{}], {}
    for si in wanted:
        if si in end or not (0 <= si < len(stacks)):
            continue
        n = 0
        for f in reversed(stacks[si] or []):
            c = kids[n].get(f)
            if c is None:
                c = len(frame)
                frame.append(f)
                kids.append({})
                kids[n][f] = c
            n = c
        end[si] = n
    # renumber depth first (children in the order they were first seen)
    order, parent, todo = [], [], [(0, -1)]
    while todo:
        n, p = todo.pop()
        new = len(order)
        order.append(n)
        parent.append(p)
        todo.extend((c, new) for c in reversed(list(kids[n].values())))
    number = {old: i for i, old in enumerate(order)}
    return parent, [frame[n] for n in order], {s: number[n] for s, n in end.items()}


def _num(v, default=0):
    return v if isinstance(v, (int, float)) and v == v else default


def merged_sites(a: dict, b: dict, moment: str = "peak") -> dict | None:
    """Two runs' sampled call sites at one moment as one sites dict (frames matched by
    function, file, line and object; each run's stacks mapped onto them): its moments are
    "A: moment" and "B: moment", for a differential flame graph. None when either has none."""
    sa, sb = a.get("sites"), b.get("sites")
    if not isinstance(sa, dict) or not isinstance(sb, dict):
        return None
    frames, index, stacks, stack_index, moments = [], {}, [], {}, []
    for label, sites in (("A", sa), ("B", sb)):
        m = next((x for x in sites.get("moments") or () if x.get("name") == moment), None)
        if m is None:
            return None
        fr_in = sites.get("frames") or []
        remap = []
        for f in fr_in:
            key = (f.get("function"), f.get("file"), f.get("line"), f.get("object"),
                   None if f.get("function") else f.get("address"))
            if key not in index:
                index[key] = len(frames)
                frames.append(f)
            remap.append(index[key])
        st_in = sites.get("stacks") or []
        entries = []
        for e in m.get("stacks") or []:
            k = e.get("stack")
            if not isinstance(k, int) or not 0 <= k < len(st_in):
                continue
            path = tuple(remap[f] for f in st_in[k] if isinstance(f, int) and 0 <= f < len(remap))
            if path not in stack_index:
                stack_index[path] = len(stacks)
                stacks.append(list(path))
            entries.append({**e, "stack": stack_index[path]})
        moments.append({**m, "name": f"{label}: {moment}", "stacks": entries})
    return {"frames": frames, "stacks": stacks, "moments": moments}


def diff_flame_chart(a: dict, b: dict, cid: str) -> dict | None:
    """The flame graph of run B's call paths at the peak, each box coloured by how its
    bytes changed from run A's (red grew, blue shrank, grey within the sampling error)."""
    merged = merged_sites(a, b)
    if merged is None:
        return None
    chart = flame_chart({"sites": merged}, cid)
    if chart:
        chart["title"] = "Live bytes by call path at the peak, B against A"
        chart["diff"] = [0, 1]   # the moments compared: B's boxes coloured by B - A
    return chart


def flame_chart(summary: dict, cid: str) -> dict | None:
    """The flame graph of a run's sampled call sites, or None when it has none."""
    sites = summary.get("sites")
    if not isinstance(sites, dict) or not sites.get("moments"):
        return None
    stacks = sites.get("stacks") or []
    moments = [m for m in sites["moments"] if isinstance(m, dict)]
    wanted = [e.get("stack") for m in moments for e in m.get("stacks") or []
              if isinstance(e.get("stack"), int)]
    # a stack the unwinder could not take has no frames: it gets one of its own, so that
    # its bytes show as a box under the root like any other
    frames_in = [f if isinstance(f, dict) else {} for f in sites.get("frames") or []]
    unwound = len(frames_in)
    frames_in.append({"function": NOT_UNWOUND})
    # one box per function on a path, not per return address: the frames of one named
    # function in one object are one (their lines listed); unnamed frames stay apart
    canon, first = [], {}
    for i, fr in enumerate(frames_in):
        key = (fr.get("function"), fr.get("object")) if fr.get("function") else (i,)
        canon.append(first.setdefault(key, i))
    stacks = [[canon[f] if isinstance(f, int) and 0 <= f < len(canon) else f for f in s] if s else [unwound]
              for s in stacks]
    parent, frame, end = merge_paths(stacks, wanted)
    # only the frames the tree uses travel, renumbered; objects once each
    used = sorted({f for f in frame[1:] if isinstance(f, int)})
    renum = {f: i for i, f in enumerate(used)}
    lines = {}
    for i, c in enumerate(canon):
        if c in renum and isinstance(frames_in[i].get("line"), int):
            lines.setdefault(c, set()).add(frames_in[i]["line"])
    objects, obj_index, frames = [], {}, []
    for f in used:
        fr = frames_in[f] if 0 <= f < len(frames_in) else {}
        obj = fr.get("object") or ""
        if obj not in obj_index:
            obj_index[obj] = len(objects)
            objects.append({"path": obj, "kind": object_kind(obj)})
        frames.append([fr.get("function"), fr.get("file"), sorted(lines.get(f, ())), obj_index[obj],
                       fr.get("address")])
    # the sites table refers to frames too: keep its frame only if the tree has it
    out_moments = []
    for m in moments:
        per = {}
        for e in m.get("stacks") or []:
            n = end.get(e.get("stack"))
            if n is None:
                continue
            b, k, err = per.get(n, (0, 0, 0.0))
            per[n] = (b + _num(e.get("bytes")), k + _num(e.get("blocks")),
                      err + float(_num(e.get("error_bytes"))) ** 2)
        nodes = sorted(per)
        table = []
        for s in (m.get("sites") or [])[:TOP_SITES]:
            row = {k: s.get(k) for k in ("site", "bytes", "share", "blocks", "error_bytes")}
            f = s.get("frame")
            row["frame"] = renum.get(canon[f]) if isinstance(f, int) and 0 <= f < len(canon) else None
            table.append(row)
        out_moments.append({
            "name": m.get("name"), "t_s": m.get("t_s"), "live_bytes": m.get("live_bytes"),
            "estimated_bytes": m.get("estimated_bytes"), "samples": m.get("samples"),
            "node": nodes, "bytes": [per[n][0] for n in nodes], "blocks": [per[n][1] for n in nodes],
            # each node's own 95% error (their squares add up the tree)
            "err": [round(math.sqrt(per[n][2])) for n in nodes],
            "sites": table, "sites_total": len(m.get("sites") or [])})
    return {"id": cid, "kind": "flame", "title": "Live bytes by call path",
            "up": [i - p if p >= 0 else 0 for i, p in enumerate(parent)],
            "frame": [renum.get(f, -1) for f in frame],
            "frames": frames, "objects": objects, "kinds": KIND_NAMES, "moments": out_moments,
            "note": sampling_note(sites)}


def sampling_note(sites: dict) -> str:
    parts = [str(sites["note"]).rstrip(".")] if sites.get("note") else []
    n, mean = sites.get("samples"), sites.get("sample_bytes")
    if isinstance(n, int) and isinstance(mean, (int, float)) and mean > 0:
        low = sites.get("sample_bytes_min", mean)
        mean = sites.get("sample_bytes_max", mean)   # the coarsest reached
        per = (f"{_iec(low)} at first, coarsening to {_iec(mean)}," if isinstance(low, (int, float))
               and 0 < low < mean else _iec(mean))
        parts.append(f"{n:,} sampled allocations, one per {per} allocated on average; "
                     "bytes are estimates with their 95% interval")
    if sites.get("unwinder"):
        cost = sites.get("unwind_us_per_sample")
        depth = sites.get("frames_per_sample")
        how = ", ".join(x for x in (f"{cost:.1f} \u00b5s" if isinstance(cost, (int, float)) else "",
                                    f"{depth:.1f} frames" if isinstance(depth, (int, float)) else "") if x)
        parts.append(f"stacks by {sites['unwinder']}" + (f" ({how} per sample)" if how else ""))
    if sites.get("symbolizer"):
        parts.append(f"names by {sites['symbolizer']}")
    if sites.get("dropped"):
        parts.append(f"{sites['dropped']:,} samples dropped (the profile buffer was full)")
    return "; ".join(parts) + ("." if parts else "")


def _iec(v: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" or v == int(v) else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v} B"


# ---------------------------------------------------------------------------- heap maps

# A page's state, in the order the legend lists them; the codes are what "states" holds.
STATES = (("live", "live (a quarter of the page or more)", "#4e79a7"),
          ("pinned", "pinned: a few live bytes keep it resident", "#e15759"),
          ("free", "free: a release gives it back", "#8cd17d"),
          ("kept", "free, but a release keeps it (chunk headers, tcache)", "#f1ce63"),
          ("top", "top chunk", "#b07aa1"),
          ("unwalked", "resident, not walked (its chunks could not be read)", "#a0a4a8"),
          ("absent", "not resident", "#e4e7eb"))
LIVE, PINNED, FREE, KEPT, TOP, UNWALKED, ABSENT = range(len(STATES))
# Under another allocator the pages are its mappings as the hooks recorded them
# (native/src/heapother.c): what a release keeps there is its own bookkeeping, its caches,
# or a free page inside a larger unit of its (jemalloc's slab, tcmalloc's span, mimalloc's
# 64 KiB page) that holds a live block elsewhere: not told apart
OTHER_LABELS = {"kept": "free, but a release keeps it (the allocator's metadata, its caches, or "
                        "a slab or page of its that holds a live block)"}
# Pinned: resident after the release with live bytes under a quarter of the page
# (heapmap.PIN_FRACTION). The occupancy byte, ceil(live * 255 / page), says so exactly
# except for live bytes in (63/255, 64/255] of a page (16 bytes of a 4 KiB page), read
# here as pinned.
PIN_MAX = 64
# flags of a page, as the heap map writes them
RESIDENT_BEFORE, RESIDENT_AFTER, IN_TOP = heapmap.BEFORE, heapmap.AFTER, heapmap.TOP


def page_states(occupancy: np.ndarray, flags: np.ndarray, walked: bool = True) -> np.ndarray:
    """Each page's state code (STATES) from its occupancy (0: no live byte, else
    ceil(live * 255 / page)) and flags. The later rules win: a page of the top chunk is
    "top" whatever else holds, one not resident before the release is "absent". A heap
    whose walk failed has its residency only."""
    occ = np.asarray(occupancy, dtype=np.uint8)
    fl = np.asarray(flags, dtype=np.uint8)
    st = np.full(len(occ), LIVE, dtype=np.uint8)
    if not walked:
        st[:] = UNWALKED
    else:
        st[(occ > 0) & (occ <= PIN_MAX) & (fl & RESIDENT_AFTER != 0)] = PINNED
        st[(occ == 0) & (fl & RESIDENT_AFTER == 0)] = FREE
        st[(occ == 0) & (fl & RESIDENT_AFTER != 0)] = KEPT
        st[fl & IN_TOP != 0] = TOP
    st[fl & RESIDENT_BEFORE == 0] = ABSENT
    return st


def _b64(text) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text or "", validate=True), dtype=np.uint8)


def heap_cells(heap: dict, page: int) -> dict:
    """One heap of an arena, for the renderer: its pages' states and occupancy."""
    n = int(_num(heap.get("pages")))
    occ, fl = _b64(heap.get("occupancy")), _b64(heap.get("flags"))
    if len(occ) != n or len(fl) != n:
        raise ValueError(f"heap at {heap.get('start')}: {n} pages but {len(occ)} occupancy "
                         f"and {len(fl)} flag bytes")
    st = page_states(occ, fl, heap.get("walked", True) is not False)
    return {"start": heap.get("start"), "pages": n, "kind": heap.get("kind"),
            "states": base64.b64encode(st.tobytes()).decode("ascii"),
            "occupancy": base64.b64encode(occ.tobytes()).decode("ascii"),
            "counts": np.bincount(st, minlength=len(STATES)).tolist()}


def heapmap_entry(m: dict) -> dict:
    keep = ("moment", "t_s", "status", "allocator", "page_bytes", "release_measured_bytes",
            "rss_before", "rss_after", "note", "fork_ms", "map_ms")
    out = {k: m.get(k) for k in keep}
    out["pinners"] = [{k: p.get(k) for k in ("site", "stack", "blocks", "block_bytes", "pinned_bytes",
                                             "error_bytes")}
                      for p in m.get("pinners") or [] if isinstance(p, dict)]
    if m.get("status") != "mapped":
        return out
    page = int(_num(m.get("page_bytes"), 4096)) or 4096
    counts = np.zeros(len(STATES), dtype=np.int64)
    arenas = []
    try:
        for a in m.get("arenas") or []:
            heaps = [heap_cells(h, page) for h in a.get("heaps") or []]
            for h in heaps:
                counts += h["counts"]
            arenas.append({"arena": a.get("arena"), "pages": a.get("pages"),
                           "free_resident_pages": a.get("free_resident_pages"),
                           "pinned_pages": a.get("pinned_pages"), "top_bytes": a.get("top_bytes"),
                           "heaps": heaps})
    except (ValueError, TypeError, binascii.Error) as e:
        # a damaged map is said, not drawn; the rest of the page stands
        out["status"] = f"not drawn: the map in this record is damaged ({e})"
        return out
    out["arenas"] = arenas
    glibc = m.get("allocator") in (None, "glibc")
    out["legend"] = [{"state": key, "label": label if glibc else OTHER_LABELS.get(key, label),
                      "color": color, "pages": int(counts[i]), "bytes": int(counts[i]) * page}
                     for i, (key, label, color) in enumerate(STATES)
                     if glibc or key != "top"]   # only glibc has a top chunk
    return out


def heapmap_chart(summary: dict, cid: str) -> dict | None:
    """The heap maps of a run (at exit, at snapshots), or None when it has none."""
    maps = [m for m in summary.get("heapmaps") or [] if isinstance(m, dict)]
    if not maps:
        return None
    entries = [heapmap_entry(m) for m in maps]
    # the exit map's release is the summary's (the terminal's and the facts table's): the
    # program's RSS at exit less what the copy gave back, not the copy's own RSS
    rel = summary.get("release") or {}
    if rel.get("measured") and rel.get("where") == "copy":
        for e in entries:
            if e.get("moment") == "exit":
                e["rss_before"], e["rss_after"] = rel.get("rss_before_bytes"), rel.get("rss_after_bytes")
    return {"id": cid, "kind": "heapmap", "title": "The heap, page by page",
            "maps": entries,
            "states": [{"state": k, "label": label, "color": c} for k, label, c in STATES]}
