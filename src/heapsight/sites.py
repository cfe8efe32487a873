"""Who holds the memory: the sampled allocations (profile.py) turned into estimated live
bytes per stack and per call site at the run's moments, with their sampling error.

Estimates. The library samples allocations by bytes, a Poisson process of mean M over
usable bytes: a block of usable size s is sampled with probability p = 1 - exp(-s/M).
A sampled block stands for 1/p blocks and s/p bytes (Horvitz-Thompson: unbiased whatever
the sizes); the variance of a sum is estimated by the sum of s^2 (1-p)/p^2 over its
samples, and error_bytes is 1.96 times its square root (a 95% interval). Blocks of M bytes
or more are nearly always sampled and add almost no error; the error comes from the small
ones, about 1.96 * sqrt(M * B) for B bytes held in blocks much smaller than M.

The live set at a moment t: the ALLOC events at or before t whose block was not freed at
or before t. A share is a site's estimate over the moment's estimated total (both from the
same samples, so the shares add up to 1); the moment's live_bytes is the exact counter at
that moment, beside the estimate for comparison.

The call site of a stack is its innermost frame outside the allocator and the known
allocation wrappers (ALLOCATOR_NAMES, allocators.ALLOCATOR_OBJECTS); when that frame has no name (a
static function of a stripped binary), the first named frame after it in the same object,
if any (_named_past). The stacks keep every frame.
"""

from __future__ import annotations

import os
import re

import numpy as np

from heapsight.dataclass import dataclass
from heapsight import allocators, layout, profile
from heapsight import symbolize
from heapsight.fmt import printable, shell_quote

# Functions that allocate for their caller: the call site is further out. The C allocator
# and glibc's internals; libstdc++'s operator new and std::allocator; perl's safesys*;
# CPython's PyMem_*, PyObject_Malloc family, _PyObject_* and pymalloc; SQLite's malloc
# layer; GLib's g_malloc family; xmalloc and its kin (gnulib, libiberty, Ruby, git's
# do_xmalloc and xmallocz); strdup.
ALLOCATOR_NAMES = re.compile(r"""^(?:
    (?:__libc_|__GI___libc_|__GI_|__)?(?:malloc|calloc|realloc|reallocarray|free|cfree|
        posix_memalign|aligned_alloc|memalign|valloc|pvalloc|strdup|strndup)
  | _int_\w+ | sysmalloc | tcache_\w+ | _mid_memalign | malloc_hook_ini
  | operator\ (?:new|delete)\b.*
  | (?:std::|__gnu_cxx::)\w*allocator(?:_traits)?<.*>::(?:allocate|_S_allocate)\b.*
  | Perl_safesys\w+
  | _?PyMem_\w+ | _?PyObject_(?:Malloc|Calloc|Realloc) | _PyObject_\w+ | pymalloc_\w+
  | sqlite3(?:_malloc|_malloc64|_realloc|_realloc64|Malloc\w*|MemMalloc|MemRealloc|Realloc\w*|
        DbMalloc\w*|DbRealloc\w*|DbStrDup|DbStrNDup) | mallocWithAlarm | dbMallocRawFinish
        | dbReallocFinish
  | g_(?:try_)?(?:malloc|malloc0|realloc)(?:_n)? | g_slice_alloc0? | g_strn?dup | g_memdup2?
  | (?:ruby_|do_)?x(?:malloc|calloc|realloc|zalloc|strdup|strndup|memdup|malloc2|realloc2|
        mallocz|memdupz)(?:_gently)?
)$""", re.X)

Z95 = 1.96
# What sampling cannot see: a site may hold up to about 3 M bytes in blocks much smaller
# than the mean M with none of them sampled (a 5% chance: exp(-3)). The samples' own
# variance says nothing of those bytes (a site known only by one large block shows 0), so
# an interval is never narrower than this. M is the mean in force while that site
# allocated (site_mean), not the run's coarsest.
UNSEEN_MEANS = 3.0


def errors_bytes(variance: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """A 95% interval's half-width, for each (variance, mean) pair: the samples' own error,
    at least what the sampling cannot see (UNSEEN_MEANS means; none where every block was
    recorded: mean 1)."""
    err = Z95 * np.sqrt(variance)
    return np.round(np.where(mean > 1, np.maximum(err, UNSEEN_MEANS * mean), err)).astype(np.int64)


def error_bytes(variance: float, mean: float) -> int:
    """errors_bytes of one pair."""
    return int(errors_bytes(np.float64(variance), np.float64(mean)))


def site_mean(bytes_: float, per_mean: float, fallback: float) -> float:
    """The mean for a site's unseen floor, from its samples: Σ b / Σ (b / m) over them (b
    the bytes a sample stands for, m the mean it was drawn at), the byte-weighted harmonic
    mean of their means. Why that one: blocks much smaller than the mean go unseen, and
    B bytes of them allocated while the means m_j were in force, a share f_j at each, are
    all missed with probability exp(-B Σ f_j / m_j); that is 5% (exp(-3)) at B = 3 / Σ f_j
    / m_j, UNSEEN_MEANS times this mean, when the unseen bytes were allocated over the same
    stretches as the seen ones (the shares f_j estimated by the samples' bytes). A site
    whose samples were all drawn at 16 KiB gets 48 KiB, not 3 x 512 KiB; one of a single
    level gets that level's mean. fallback: without samples (no bytes)."""
    return float(site_means(np.float64(bytes_), np.float64(per_mean), fallback))


def site_means(bytes_: np.ndarray, per_mean: np.ndarray, fallback: float) -> np.ndarray:
    """site_mean for each (bytes, per_mean) pair."""
    ok = (per_mean > 0) & (bytes_ > 0)
    return np.where(ok, bytes_ / np.where(ok, per_mean, 1.0), float(fallback))


NO_STACK = "(stack not unwound)"


# An interpreter's frame (the program's own function: profile.IFrame) is a frame of this
# pseudo-object; a stack that holds one has its innermost one for call site.
INTERP_OBJECTS = ("[python]", "[perl]")


def is_interp(f: symbolize.Frame) -> bool:
    return f.object in INTERP_OBJECTS


# A comprehension's own frame (CPython before 3.12, which inlines them: PEP 709): the call
# site is the function it is in, at the comprehension's line, as 3.12+ shows it.
COMPREHENSION = re.compile(r"(?:^|\.)<(?:listcomp|dictcomp|setcomp)>$")


def interp_site(frames: list, stack: list, at: int, end: int) -> int:
    """The call site from stack[at], the innermost interpreter frame: past comprehension
    frames to the function they are in (the next interpreter frame out: before 3.11 the
    interpreter's own call frames lie between)."""
    while frames[stack[at]].function and COMPREHENSION.search(frames[stack[at]].function):
        out = next((i for i in range(at + 1, end) if is_interp(frames[stack[i]])), None)
        if out is None:
            break
        at = out
    return stack[at]


def interp_frame(prof: profile.Profile, word: int) -> symbolize.Frame:
    f = prof.iframe(word)
    o = word & layout.IFRAME_OFFSET_MASK
    kind = profile.INTERP_NAMES.get((word >> layout.IFRAME_KIND_SHIFT) & 0x7f, "python")
    if f is None:
        return symbolize.Frame(None, None, None, f"[{kind}]", o)
    return symbolize.Frame(f.function or None, f.file or None, f.line or None, f"[{f.interp}]", o)


def interp_note(prof: profile.Profile) -> str:
    """Why an interpreter's frames were not read (one line), or ""."""
    i = prof.interp or {}
    status = int(i.get("status") or 0)
    if not i.get("kind") or not status:
        return ""
    name = "Python" if int(i["kind"]) == 1 else "Perl"
    v = int(i.get("version") or 0)
    if name == "Python" and v:
        name += f" {v >> 24}.{(v >> 16) & 0xff}"
    return (f"{name}'s own frames were not read ({profile.INTERP_WHY.get(status, 'unknown reason')}): "
            "call sites name the interpreter's functions")


# The C and C++ runtimes and the interpreters: a call site in them (std::string's
# _M_construct, fopen, PyList_Append) is named after the program's own frame that called
# into them, the first frame past them that is neither theirs nor inlined from a system
# header (stl_vector.h's emplace_back, inlined into the program).
RUNTIME_OBJECTS = re.compile(
    r"(^|/)(?:lib(?:c|m|dl|pthread|rt|stdc\+\+|gcc_s|python3[.\d]*|perl)(?:[.-][^/]*)?"
    r"|ld-linux[^/]*|python3(?:\.\d+)?|perl(?:5[.\d]*)?)$")


def is_runtime(f: symbolize.Frame) -> bool:
    """A frame of the C/C++ runtime or an interpreter's C code, or inlined from a system
    header: not the program's own code."""
    return (RUNTIME_OBJECTS.search(f.object) is not None
            or (f.file or "").startswith("/usr/include/"))


def own_frame(frames: list, stack: list, at: int, end: int) -> int | None:
    """The program's own frame that called into the runtime at stack[at] (the call site),
    when the site is the runtime's: the first frame after it that is named, neither the
    runtime's nor the allocator's; None when the site is the program's own or none is."""
    f = frames[stack[at]]
    if is_interp(f) or not is_runtime(f):
        return None
    for i in range(at + 1, end):
        g = frames[stack[i]]
        if is_interp(g):
            return stack[i]
        if g.function is not None and not is_runtime(g) and not is_allocator(g):
            return stack[i]
    return None


CALLED_VIA = " \u2190 "   # "worker(int) (cache.cc:16) ← std::basic_string::_M_construct"


# Blocks a runtime allocates for itself as the program starts and keeps for its life, by
# the frame that allocated them: named, so no one chases them as the program's. memcheck
# frees libstdc++'s pool before it checks (its freeres); heapsight reports it as it is.
RUNTIME_KEPT = (
    # (Debian's libstdc++ has no name for it: the one unnamed frame of a block allocated
    # before the unwinder was set up, called from libstdc++ alone)
    (re.compile(r"pool::pool|_GLOBAL__sub_I_eh_alloc|^$"), re.compile(r"libstdc\+\+"),
     "libstdc++'s emergency pool, kept for life"),
    (re.compile(r"."), re.compile(r"(^|/)ld-linux[^/]*$"),
     "the dynamic loader's own, kept for life"),
)


def runtime_kept(f: symbolize.Frame) -> str | None:
    """What a runtime's own start-up block is, in words, or None for any other frame."""
    return next((words for fn, obj, words in RUNTIME_KEPT
                 if obj.search(f.object) and fn.search(f.function or "")), None)


def site_name(frames: list, site: int | None, own: int | None) -> str:
    """A call site's name: its frame's, after the program's own frame when the site is
    in the runtime (own_frame); a runtime's own start-up block says what it is."""
    if site is None:
        return NO_STACK
    kept = runtime_kept(frames[site]) if own is None else None
    if kept:
        return f"{kept} ({short_function(frames[site]) if frames[site].function else frames[site].name()})"
    if own is None:
        return frames[site].name()
    return f"{frames[own].name()}{CALLED_VIA}{short_function(frames[site])}"


def short_function(f: symbolize.Frame) -> str:
    """A runtime's frame in few words: C++ template arguments and parameters dropped,
    std::__cxx11:: as std:: ("std::basic_string::_M_construct (libstdc++.so.6)")."""
    name = f.function or ""
    while True:
        shorter = re.sub(r"<[^<>]*>", "", name)
        if shorter == name:
            break
        name = shorter
    name = re.sub(r"\s*(?:\[clone [^\]]*\]|\(\.(?:isra|constprop|part|cold)[.\w]*\))", "", name).strip()
    name = re.sub(r"\((?:[^()]|\([^()]*\))*\)(?:\s*const)?$", "", name)
    name = re.sub(r"^[\w:*&\s]+\s(?=[\w:~]+$)", "", name)   # a return type before the name
    name = name.replace("std::__cxx11::", "std::")
    if not name:
        return f.name()
    return symbolize.Frame(name, None, None, f.object, f.address).name()


def is_allocator(f: symbolize.Frame) -> bool:
    if allocators.ALLOCATOR_OBJECTS.search(f.object):
        return True
    return f.function is not None and ALLOCATOR_NAMES.match(f.function) is not None


@dataclass(frozen=True)
class Moment:
    """A moment to estimate at: t_ns (CLOCK_MONOTONIC; None: after every event), when it
    is in the run's seconds, and the exact live bytes the counters had then."""
    name: str
    t_ns: int | None
    t_s: float
    live_bytes: int


def weights(sizes: np.ndarray, mean) -> tuple:
    """Per sampled block: (bytes it stands for, blocks it stands for, its variance). mean:
    the sampling mean, one for all or one per block (adaptive sampling)."""
    s = sizes.astype(float)
    p = -np.expm1(-s / np.asarray(mean, dtype=float))
    p = np.where(p > 0, p, 1.0)
    return s / p, 1.0 / p, s * s * (1.0 - p) / (p * p)


# A moment's t_ns for every sampled allocation of the run, freed or not (pprof's alloc_*)
ALLOCATED = "allocated"
ALL = -1


def live_mask(allocs: np.ndarray, t_ns: int | None) -> np.ndarray:
    """Which sampled blocks were live at t_ns (None: at the end: never freed; ALL: every
    sampled allocation)."""
    if t_ns == ALL:
        return np.ones(len(allocs), dtype=bool)
    if t_ns is None:
        return allocs["free_ns"] == profile.NEVER
    t = np.uint64(max(0, t_ns))
    return (allocs["time_ns"] <= t) & (allocs["free_ns"] > t)


def _addresses(prof: profile.Profile) -> tuple:
    """The sampled stacks' addresses: the distinct stacks' offsets, each sample's stack (an
    index into them), each stack's length, each frame's index in keys, and keys: each
    distinct (object path, address in its file) once ("[interp]" for an interpreter's
    frame, "[unknown]" outside every object)."""
    allocs = prof.allocs
    offsets, first, of_alloc = np.unique(allocs["stack"], return_index=True, return_inverse=True)
    first_event = allocs["index"][first]
    addrs, n = prof.stacks(offsets)
    events = np.repeat(first_event, n)
    mod = prof.module_index(addrs, events)
    # an interpreter's frame (a tagged word, profile.IFrame): a pseudo-module of its own
    mod[addrs >= np.uint64(layout.IFRAME_TAG)] = -2
    # Frames are return addresses: the call is the byte before (its line, its inlining).
    # Each distinct (object, address) is looked up once; the rest is array work, as a
    # deep program's stacks hold hundreds of thousands of addresses.
    bias = np.array([m.bias for m in prof.modules] + [0], dtype=np.uint64)[np.maximum(mod, -1)]
    at = np.where((mod >= 0) & (addrs > bias), addrs - bias - np.uint64(1), addrs)
    order = np.lexsort((at, mod))
    new = np.ones(len(order), dtype=bool)
    new[1:] = (mod[order][1:] != mod[order][:-1]) | (at[order][1:] != at[order][:-1])
    inv = np.empty(len(order), dtype=np.int64)
    inv[order] = np.cumsum(new) - 1
    first = order[new]
    keys = [(prof.modules[m].path if m >= 0 else "[interp]" if m == -2 else "[unknown]", a)
            for m, a in zip(mod[first].tolist(), at[first].tolist())]
    return offsets, of_alloc, n, inv, keys


def _in_objects(keys: list) -> list:
    return [k for k in keys if k[0] not in ("[unknown]", "[interp]")]


def lookups(prof: profile.Profile) -> list:
    """What the symbolizer is asked for the profile's stacks (the objects' addresses)."""
    return _in_objects(_addresses(prof)[-1])


class Stacks:
    """The distinct stacks of the sampled blocks, symbolized: frames (deduplicated, each
    a symbolize.Frame), each stack as frame indices innermost first, and its call site."""

    def __init__(self, prof: profile.Profile, symbolizer=symbolize.symbolize, skip_unnamed=False):
        """skip_unnamed: frames with no function name are stepped over too when the call
        site is looked for (the mappings': a runtime's arena code is often static, unnamed
        in a stripped binary, and the named caller past it says more)."""
        self.offsets, self.of_alloc, n, inv, keys = _addresses(prof)
        found = symbolizer(_in_objects(keys))
        self.symbolizer, self.note = found.tool, found.note
        # each distinct address's chain of frames (inlined ones first), as frame indices
        self.frames, index, chains = [], {}, []
        for key in keys:
            ids = []
            named = [interp_frame(prof, key[1])] if key[0] == "[interp]" else found.frames.get(key)
            for f in named or symbolize.unknown(*key):
                if f not in index:
                    index[f] = len(self.frames)
                    self.frames.append(f)
                ids.append(index[f])
            chains.append(ids)
        lens = np.array([len(c) for c in chains], dtype=np.int64)
        chain_at = np.concatenate([[0], np.cumsum(lens)])[:-1]
        chain_flat = np.array([i for c in chains for i in c], dtype=np.int64)
        # every stack's frames, one flat array: each address replaced by its chain
        per = lens[inv]
        out_at = np.cumsum(per) - per
        flat = chain_flat[np.repeat(chain_at[inv] - out_at, per) + np.arange(int(per.sum()))]
        ends = np.concatenate([[0], np.cumsum(per)])[np.cumsum(np.concatenate([[0], n]))]
        flat_list = flat.tolist()
        self.stacks = [flat_list[a:b] for a, b in zip(ends[:-1].tolist(), ends[1:].tolist())]
        # the call site: the first frame of each stack outside the allocator, else its last
        alloc = np.array([is_allocator(f) or (skip_unnamed and f.function is None)
                          for f in self.frames] or [False], dtype=bool)
        outside = np.flatnonzero(~alloc[flat]) if len(flat) else np.zeros(0, np.int64)
        j = np.searchsorted(outside, ends[:-1])
        # ... unless the stack runs through an interpreter: its innermost frame of the
        # program's own code (memory a C function allocates for it is its caller's)
        interp = np.array([is_interp(f) for f in self.frames] or [False], dtype=bool)
        inside = np.flatnonzero(interp[flat]) if len(flat) else np.zeros(0, np.int64)
        ji = np.searchsorted(inside, ends[:-1])
        self.site_of, self.own_of = [], []
        for a, b, k, ki in zip(ends[:-1].tolist(), ends[1:].tolist(), j.tolist(), ji.tolist()):
            own = None
            if a == b:
                self.site_of.append(None)
            elif ki < len(inside) and inside[ki] < b:
                self.site_of.append(interp_site(self.frames, flat_list, int(inside[ki]), b))
            elif k < len(outside) and outside[k] < b:
                at = _named_at(self.frames, flat_list, int(outside[k]), b)
                self.site_of.append(flat_list[at])
                own = own_frame(self.frames, flat_list, at, b)
            else:
                self.site_of.append(flat_list[b - 1])
            self.own_of.append(own)
        # each stack's call site as an id, stacks of one call site together (the same name
        # in the same object), for every moment's estimate (named at each, a frame's name a
        # stack a moment was 27k names for python3's compileall)
        known: dict = {}
        self.site_ids = np.array([known.setdefault(
            (_site_key(None if frame is None else self.frames[frame]),
             _site_key(None if own is None else self.frames[own])), len(known))
            for frame, own in zip(self.site_of, self.own_of)], dtype=np.int64)

    def frame_dicts(self) -> list:
        return [{"function": f.function, "file": f.file, "line": f.line, "object": f.object,
                 "address": f"{f.address:#x}"} for f in self.frames]


def _site_key(f: symbolize.Frame | None) -> tuple:
    return ("",) if f is None else (f.name(), f.object)


def estimate(prof: profile.Profile, stacks: Stacks, m: Moment) -> dict:
    """One moment: the estimate per live stack and per call site, largest first."""
    allocs = prof.allocs
    live = live_mask(allocs, m.t_ns)
    means = prof.means(allocs[live])
    b, k, v = weights(allocs["size"][live], means)
    which = stacks.of_alloc[live]
    ns = len(stacks.stacks)
    # (the fourth: Σ b / m, for each stack's and site's own mean: site_mean)
    by = [np.bincount(which, weights=w, minlength=ns) for w in (b, k, v, b / means)]
    present = np.flatnonzero(np.bincount(which, minlength=ns) > 0)
    total = float(b.sum())
    pb, pk, pv, pbm = (x[present] for x in by)
    out_stacks = [{"stack": s, "bytes": nb, "blocks": nk, "error_bytes": e}
                  for s, nb, nk, e in zip(present.tolist(),
                                          np.round(pb).astype(np.int64).tolist(),
                                          np.round(pk).astype(np.int64).tolist(),
                                          errors_bytes(pv, site_means(pb, pbm, prof.mean_bytes))
                                          .tolist())]
    out_stacks.sort(key=lambda x: -x["bytes"])
    # stacks of one call site together, each site named by its first live stack's frames,
    # in the order they first come (the sums in stack order, as one by one)
    ids = stacks.site_ids[present]
    if len(ids):
        first = np.unique(ids, return_index=True)[1]
        first = first[np.argsort(first, kind="stable")]   # by first appearance
        order = ids[first]
        sums = [np.bincount(ids, weights=x, minlength=int(ids.max()) + 1)[order]
                for x in (pb, pk, pv, pbm)]
        reps = present[first].tolist()
    else:
        sums, reps = [np.zeros(0)] * 4, []
    errors = errors_bytes(sums[2], site_means(sums[0], sums[3], prof.mean_bytes)).tolist()
    out_sites = []
    for rep, nb, nk, e in zip(reps, sums[0].tolist(), sums[1].tolist(), errors):
        frame, own = stacks.site_of[rep], stacks.own_of[rep]
        out_sites.append({"site": site_name(stacks.frames, frame, own), "frame": frame,
                          **({"own_frame": own} if own is not None else {}),
                          "bytes": int(round(nb)),
                          "share": round(float(nb / total), 4) if total else 0.0,
                          "blocks": int(round(nk)),
                          "error_bytes": e})
    out_sites.sort(key=lambda x: -x["bytes"])
    return {"name": m.name, "t_s": round(m.t_s, 3), "live_bytes": int(m.live_bytes),
            "estimated_bytes": int(round(total)), "samples": int(live.sum()),
            "stacks": out_stacks, "sites": out_sites}


def build(prof: profile.Profile, moments: list, unwinder: str = "",
          symbolizer=symbolize.symbolize, skip_unnamed: bool = False) -> dict:
    """The run's "sites" (the JSON shape every reader shares): the sampling's own figures,
    the frames and stacks, and each moment's estimates."""
    stacks = Stacks(prof, symbolizer, skip_unnamed)
    per = (prof.unwinds or 0)
    walks = int((prof.interp or {}).get("walks") or 0)
    interp = {}
    if walks:
        # what reading the interpreter's frames cost, per sample that read them
        interp = {"interp_us_per_sample": round(prof.interp["ns"] / walks / 1000, 2),
                  "interp_frames_per_sample": round(prof.interp["frames"] / walks, 1)}
    if prof.unwind.get("checked"):   # HEAPSIGHT_UNWIND_CHECK=1: both walks, compared
        interp.update(unwind_checked=int(prof.unwind["checked"]),
                      unwind_mismatches=int(prof.unwind["mismatches"]))
    estimates = [estimate(prof, stacks, m) for m in moments]
    return {
        "sample_bytes": prof.mean_bytes, "samples": int(len(prof.allocs)),
        # the finest and the coarsest mean drawn at (adaptive sampling starts finer and
        # coarsens with the live sampled blocks, up to sample_bytes: past it only where the
        # profile's room ran low); sample_bytes itself when the mean was fixed
        "sample_bytes_min": int(prof.means().min()) if len(prof.allocs) else prof.mean_bytes,
        "sample_bytes_max": int(prof.means().max()) if len(prof.allocs) else prof.mean_bytes,
        "frees_matched": int(prof.frees_matched), "dropped": int(prof.dropped),
        "unwinder": unwinder,
        "unwind_us_per_sample": round(prof.unwind_ns / per / 1000, 2) if per else 0.0,
        "frames_per_sample": round(prof.unwind_frames / per, 1) if per else 0.0,
        **interp,
        "symbolizer": stacks.symbolizer,
        "note": "; ".join(n for n in (stacks.note, interp_note(prof),
                                      unnamed_note(stacks.frames, estimates)) if n),
        "frames": stacks.frame_dicts(), "stacks": stacks.stacks,
        "moments": estimates,
    }


def unnamed_note(frames: list, estimates: list) -> str:
    """Where the first moment's largest sites (a tenth of its bytes or more, of its top
    three) are addresses in an object without symbols (a stripped binary: git, vim), how
    to name them, in one line; else ""."""
    first = estimates[0]["sites"][:3] if estimates else ()
    objects = sorted({frames[x["frame"]].object for x in first
                      if x.get("frame") is not None and x["share"] >= 0.1
                      and frames[x["frame"]].function is None
                      and not frames[x["frame"]].object.startswith("[")})
    if not objects:
        return ""
    named = " and ".join(printable(short_object(o)) for o in objects)
    has, its = ("has", "its") if len(objects) == 1 else ("have", "their")
    return (f"{named} {has} no symbols (stripped), so {its} sites are addresses; {its} debug "
            "symbols would name them: on Debian, install the -dbgsym package (from the debug "
            f"archive) of the package `dpkg -S {shell_quote(objects[0])}` names; they are "
            "found under /usr/lib/debug by build-id")


# The block rows heapmap.pinners takes: address, usable size, sampling probability, the
# index of its stack in the sites' "stacks", and the mean it was drawn at (by_site's floor).
BLOCK_DTYPE = np.dtype([("addr", "<u8"), ("size", "<u8"), ("p", "<f8"), ("stack", "<i8"),
                        ("mean", "<f8")])


def live_blocks(prof: profile.Profile, t_ns: int | None) -> np.ndarray:
    """The sampled blocks live at t_ns (None: never freed), as BLOCK_DTYPE rows; stack
    indices are those of build()'s "stacks" (the distinct stack offsets, in order)."""
    allocs = prof.allocs
    live = live_mask(allocs, t_ns)
    # with return_index np.unique skips its masked-array check, which imports numpy.ma
    # (10 ms of every run's start)
    offsets = np.unique(allocs["stack"], return_index=True)[0]
    out = np.zeros(int(live.sum()), BLOCK_DTYPE)
    out["addr"], out["size"] = allocs["addr"][live], allocs["size"][live]
    out["mean"] = prof.means(allocs[live])
    out["p"] = -np.expm1(-allocs["size"][live].astype(float) / out["mean"])
    out["stack"] = np.searchsorted(offsets, allocs["stack"][live])
    return out


def _named_at(frames: list, stack: list, at: int, end: int) -> int:
    """Where the call site is, from stack[at], the first frame outside the allocator: when
    it has no name (a static function of a stripped binary: CPython's _PyMem_RawMalloc,
    SQLite's sqlite3MemMalloc), the first named frame after it in the same object stands
    for it (the function whose work it was: PyUnicode_New); when none is named (all of
    git), it stays. A position in stack."""
    f = frames[stack[at]]
    if f.function is not None:
        return at
    for i in range(at + 1, end):
        g = frames[stack[i]]
        if g.object == f.object and g.function is not None and not is_allocator(g):
            return i
    return at


def _frames_of(frames: list, stack: list) -> list:
    return [symbolize.Frame(f["function"], f["file"], f["line"], f["object"], int(f["address"], 16))
            for f in (frames[i] for i in stack)]


def site_position(frames: list, stack: list) -> int:
    """Where a saved stack's call site is (an index into stack: the frames before it are
    the allocator's), as the moments' sites are named."""
    fr = _frames_of(frames, stack)
    inside = next((i for i, f in enumerate(fr) if is_interp(f)), None)
    if inside is not None:
        return interp_site(fr, list(range(len(fr))), inside, len(fr))
    at = next((i for i, f in enumerate(fr) if not is_allocator(f)), None)
    if at is None:
        return max(0, len(fr) - 1)
    return _named_at(fr, list(range(len(fr))), at, len(fr))


def site_of_stack(sites: dict, stack: int) -> str:
    """The call site's name of a stack of a run's sites (as its moments name it), for the
    pinners of a heap map."""
    st = sites["stacks"][stack]
    if not st:
        return NO_STACK
    fr = _frames_of(sites["frames"], st)
    at = site_position(sites["frames"], st)
    own = None if is_interp(fr[at]) else own_frame(fr, list(range(len(fr))), at, len(fr))
    return site_name(fr, at, own)


def by_site(sites: dict, blocks: np.ndarray) -> dict:
    """Sampled blocks (live_blocks' rows, a subset: the lost ones, say) as estimated bytes
    and blocks per call site, with their 95% error, largest first, in a moment's shape."""
    p = np.where(blocks["p"] > 0, blocks["p"], 1.0)
    s = blocks["size"].astype(float)
    b, k, v = s / p, 1.0 / p, s * s * (1.0 - p) / (p * p)
    mean = float(sites.get("sample_bytes", 1))
    means = (blocks["mean"] if "mean" in (blocks.dtype.names or ()) else np.full(len(b), mean))
    bm = b / np.where(means > 0, means, 1.0)
    acc: dict = {}
    names: dict = {}
    for i, stack in enumerate(blocks["stack"].tolist()):
        name = names.get(stack) or names.setdefault(stack, site_of_stack(sites, stack))
        a = acc.setdefault(name, [0.0, 0.0, 0.0, 0.0])
        a[0] += b[i]
        a[1] += k[i]
        a[2] += v[i]
        a[3] += bm[i]
    total = float(b.sum())
    out = [{"site": name, "bytes": int(round(nb)), "blocks": int(round(nk)),
            "share": round(nb / total, 4) if total else 0.0,
            "error_bytes": error_bytes(nv, site_mean(nb, nbm, mean))}
           for name, (nb, nk, nv, nbm) in acc.items()]
    out.sort(key=lambda x: -x["bytes"])
    return {"samples": int(len(blocks)), "estimated_bytes": int(round(total)), "sites": out}


def moment(sites: dict | None, name: str) -> dict | None:
    """A moment of a summary's sites by name ("peak", "never freed", "snapshot: X")."""
    for m in (sites or {}).get("moments", ()):
        if m["name"] == name:
            return m
    return None


def short_object(path: str) -> str:
    return os.path.basename(path) or path
