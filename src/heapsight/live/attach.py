"""The memory of a process heapsight did not start: its mappings classified from
/proc/PID/smaps, the allocator found from the libraries it maps, and the allocator's own
figures read by calling into it through gdb (glibc: malloc_info; jemalloc: mallctl;
tcmalloc: MallocExtension_GetNumericProperty). From these, the same split as `run`
(in use by the program, freed but kept, non-heap by owner), an estimate of what a
release would give back, and, when asked, the release itself, measured.

What cannot be known from outside: live bytes apart from the allocator's own overhead
(in use includes chunk headers, rounding and the per-thread caches); a process started
with libheapsight preloaded has exact figures in its stats segment (see docs/attach.md).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, field

from heapsight.dataclass import dataclass
from heapsight import allocators, analysis, elf, mappings
from heapsight.live import gdbcall, procfs, readloop
from heapsight.live.segment import open_pagemap
from heapsight.errors import HeapsightError
from heapsight.fmt import MiB, human, pct
from heapsight.fmt import share as fmt_share

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Attached:
    pid: int
    command: str
    allocator: str
    rss_bytes: int
    by_kind: dict                  # resident bytes per mappings.KINDS
    in_use_bytes: int | None = None        # held by the program: live + rounding + headers + caches
    retained_bytes: int | None = None      # freed by the program, kept resident by the allocator
    release_estimate_bytes: int | None = None
    non_heap: dict = field(default_factory=dict)   # owner -> resident bytes
    allocator_figures: dict = field(default_factory=dict)
    arenas: list = field(default_factory=list)
    trim: dict | None = None
    notes: list = field(default_factory=list)
    verdict: str = ""
    taken_at: float = 0.0
    # with libheapsight preloaded (`heapsight env`): its exact counters, no gdb needed
    preloaded: bool = False
    live_bytes: int | None = None          # requested, not freed
    waste_bytes: int | None = None         # rounding of the live blocks
    live_blocks: int | None = None
    runtime: str = ""                      # a runtime with its own heap it maps (analysis.OWNERS)
    release_measured: bool = False         # release_estimate_bytes was measured in a copy
    copy_pause_ms: float | None = None     # glibc's figures from a copy: the process's pause
    leaks: dict | None = None              # --leaks: inject.Leaks.to_dict(), marked in a copy
    track: dict | None = None              # --track: inject.Tracked.to_dict()
    # CPython's pymalloc, its pools read from outside (read_pools): the objects in use in
    # them and the pools' bytes; None when not read (not CPython, no pools, not readable)
    py_objects_bytes: int | None = None
    py_pool_bytes: int | None = None

    def to_dict(self) -> dict:
        return {"kind": "heapsight-attach", **asdict(self)}


def preloaded_segment(pid: int):
    """The stats segment of a process running with libheapsight preloaded (a service
    started with `heapsight env`'s line: HEAPSIGHT_SEGMENT=auto), or None."""
    from heapsight.live import segment as seg_mod
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return None
    value = next((e.split(b"=", 1)[1] for e in env if e.startswith(b"HEAPSIGHT_SEGMENT=")), None)
    if value is None:
        return None
    path = (os.path.join(seg_mod._shm_dir(), f"heapsight-{pid}-auto.seg") if value == b"auto"
            else os.fsdecode(value))
    try:
        seg = seg_mod.Segment(existing=path, owner_uid=os.stat(f"/proc/{pid}").st_uid)
    except (OSError, ValueError):
        return None
    if not seg.attached() or seg.get("owner_pid") != pid:
        return None
    return seg


def check_target(pid: int, use_gdb: bool = True) -> str:
    """The process's command line, or a refusal with the fix."""
    if pid <= 0:
        raise HeapsightError(f"{pid} is not a process id")
    if pid == os.getpid():
        raise HeapsightError("that is heapsight itself")
    try:
        raw = open(f"/proc/{pid}/cmdline", "rb").read()
    except FileNotFoundError:
        raise HeapsightError(f"no process {pid} (it ended, or is in another PID namespace: run "
                             "heapsight inside the same container)", gdbcall.EXIT_REFUSED) from None
    except PermissionError:
        raise HeapsightError(f"process {pid} belongs to another user: run heapsight as that user "
                             "or as root", gdbcall.EXIT_REFUSED) from None
    if not raw:
        raise HeapsightError(f"process {pid} is a kernel thread or a zombie: nothing to attach to",
                             gdbcall.EXIT_REFUSED)
    tracer = int(procfs.status_field(pid, "TracerPid") or 0) if use_gdb else 0
    if tracer:
        name = procfs.status_field(tracer, "Name") or "?"
        raise HeapsightError(f"process {pid} is already traced by process {tracer} ({name}): a "
                             "process has one tracer at a time; detach that one first (or use "
                             "--no-gdb for the /proc figures alone)", gdbcall.EXIT_REFUSED)
    return " ".join(os.fsdecode(a) for a in raw.rstrip(b"\0").split(b"\0"))


# ---------------------------------------------------------------- glibc: malloc_info

_HEAP_OPEN = re.compile(r'<heap nr="(\d+)">')


def _heaps(xml: str) -> tuple:
    """([(nr, body)] of each <heap nr="N">...</heap>, the text outside them), in one pass
    (a regular expression with a lazy .*? between the tags is quadratic on a file whose
    heaps never close: 260 KB took 54 s)."""
    heaps, outside, at = [], [], 0
    while True:
        i = xml.find('<heap nr="', at)
        j = xml.find("</heap>", i) if i >= 0 else -1
        if i < 0 or j < 0:
            outside.append(xml[at:])
            return heaps, "".join(outside)
        outside.append(xml[at:i])
        m = _HEAP_OPEN.match(xml, i)
        if m and m.end() <= j:
            heaps.append((m.group(1), xml[m.end():j]))
        at = j + len("</heap>")
_TOTAL = re.compile(r'<total type="(\w+)" count="(\d+)" size="(\d+)"/>')
_SYSTEM = re.compile(r'<system type="current" size="(\d+)"/>')
_SIZE = re.compile(r'<(?:size|unsorted) from="(\d+)" to="(\d+)" total="(\d+)" count="(\d+)"/>')


def parse_malloc_info(xml: str) -> dict:
    """malloc_info's XML (malloc/malloc.c: __malloc_info): per arena the free bytes (fast
    bins, and the rest: bins and the top chunk), its memory from the OS; mmapped chunks."""
    arenas = []
    heaps, tail = _heaps(xml)
    for nr, body in heaps:
        totals = {t: (int(c), int(s)) for t, c, s in _TOTAL.findall(body)}
        system = _SYSTEM.search(body)
        buckets = [tuple(map(int, b)) for b in _SIZE.findall(body)]
        binned = sum(b[2] for b in buckets)
        free = totals.get("fast", (0, 0))[1] + totals.get("rest", (0, 0))[1]
        # a free chunk gives back its whole pages: about its size less a page (the partial
        # pages at its two ends); chunks under two pages on average give back nothing
        pages = sum(max(0, total - count * PAGE) for lo, hi, total, count in buckets
                    if count and total >= 2 * PAGE * count)
        arenas.append({"nr": int(nr), "free_bytes": free, "binned_bytes": binned,
                       "top_bytes": max(0, totals.get("rest", (0, 0))[1] - binned
                                        + totals.get("fast", (0, 0))[1] - 0),
                       "system_bytes": int(system.group(1)) if system else 0,
                       "free_chunks": sum(c for c, _ in totals.values()),
                       "whole_free_pages_bytes": pages})
    totals = {t: (int(c), int(s)) for t, c, s in _TOTAL.findall(tail)}
    return {"arenas": arenas, "mmapped_chunks": totals.get("mmap", (0, 0))[0],
            "mmapped_bytes": totals.get("mmap", (0, 0))[1]}


def glibc_figures(pid: int) -> dict:
    """malloc_info's XML, written by the process into a memfd of its own (no file in any
    directory: none another user can plant a link in, and a process with a private /tmp
    writes it just the same) and read through /proc/PID/fd while gdb holds it stopped."""
    got = gdbcall.call(pid, ['(int)memfd_create("heapsight-malloc-info", 1)',
                             '(long)fdopen($1, "w")', "(int)malloc_info(0, (void*)$2)",
                             "(int)fflush((void*)$2)"], read_fd=0,
                       then=("(int)fclose((void*)$2)",))
    fd, info, xml = gdbcall.number(got[0]), gdbcall.number(got[2]), got[4]
    if fd is None or fd < 0:
        raise HeapsightError(f"process {pid}: memfd_create failed or is not in its C library "
                             "(glibc 2.27 or later has it): its heap figures cannot be read", 1)
    if xml and len(xml) >= gdbcall.READ_FD_MAX:
        raise HeapsightError(f"process {pid}: its malloc_info came to {gdbcall.READ_FD_MAX >> 20} "
                             "MiB or more (the process kept writing to it): not read", 1)
    if info != 0 or not xml or "<malloc" not in xml:
        raise HeapsightError(f"malloc_info failed in process {pid}: its glibc malloc did not "
                             "answer (a static binary, or another allocator)", 1)
    return parse_malloc_info(xml)


# ---------------------------------------------------------------- glibc: from a copy

def _mmapped_chunks(pid: int, maps: list) -> tuple:
    """glibc's mmapped chunks, as the copy finds them (heaproots.c): at the start of an
    anonymous mapping (prev_size 0, a size of whole pages with IS_MMAPPED alone, inside the
    mapping), then one after the other where the kernel merged their mappings (a python3
    service's 10 MiB dict table sat at the start of a mapping merged with pymalloc's arenas,
    and was counted "other anonymous"); (chunks, bytes), read through /proc/PID/mem. One
    that does not start its mapping is not found."""
    n = total = 0
    try:
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        return 0, 0
    with mem:
        for m in maps:
            if m.kind != "anon" or "w" not in m.perms or m.size < 2 * PAGE:
                continue
            at = m.start
            while at + PAGE <= m.end:
                try:
                    mem.seek(at)
                    head = mem.read(16)
                except (OSError, ValueError, OverflowError):
                    break
                if len(head) != 16:
                    break
                prev, word = int.from_bytes(head[:8], "little"), int.from_bytes(head[8:], "little")
                size = word & ~7
                if prev or word & 7 != 2 or size < PAGE or size % PAGE or size > m.end - at:
                    break
                n, total, at = n + 1, total + size, at + size
    return n, total


def glibc_from_copy(pid: int, maps: list) -> tuple:
    """glibc's figures from a copy of the process, its heaps walked chunk by chunk and a
    release measured there (live/inject.py; the process stops only for the copy, and no
    call is made in it): (arenas as parse_malloc_info gives them, figures, the copy's note,
    the release measured)."""
    from heapsight.live import inject
    hm, said, _tries, _rss = inject.copy_map(pid, "glibc", reach=False)
    if hm.status != "mapped" or not hm.heaps or not all(h.walked for h in hm.heaps):
        raise HeapsightError(f"the copy could not walk glibc's heaps ({hm.status}{': ' + hm.note if hm.note else ''})")
    page = hm.page_bytes
    arenas: dict = {}
    for h in hm.heaps:
        x = arenas.setdefault(h.arena, {"nr": h.arena, "free_bytes": 0, "binned_bytes": 0,
                                        "top_bytes": 0, "system_bytes": 0, "free_chunks": 0,
                                        "whole_free_pages_bytes": 0})
        system = h.pages * page
        held = h.live_bytes + 8 * h.inuse_chunks     # the in-use chunks, headers included
        x["system_bytes"] += system
        x["free_bytes"] += max(0, system - held)      # free chunks, tcache's, the top
        x["top_bytes"] += h.top_bytes
        x["free_chunks"] += h.free_chunks + h.tcache_chunks
    chunks, mmapped = _mmapped_chunks(pid, maps)
    figures = {"mmapped_chunks": chunks, "mmapped_bytes": mmapped}
    note = (f"glibc's figures from a copy of the process, its heaps walked (the process stopped "
            f"{said.get('pause_us', 0) / 1000:.1f} ms for the copy, "
            f"{said.get('reap_pause_us', 0) / 1000:.1f} ms to reap it; no call into it)")
    pause = (said.get("pause_us", 0) + said.get("reap_pause_us", 0)) / 1000
    return (sorted(arenas.values(), key=lambda x: x["nr"]), figures, note,
            hm.release_measured_bytes, pause)


# ---------------------------------------------------------------- jemalloc, tcmalloc

JEMALLOC_STATS = ("stats.allocated", "stats.active", "stats.metadata", "stats.resident",
                  "stats.mapped", "stats.arenas.4096.pdirty", "stats.arenas.4096.pmuzzy")


def jemalloc_figures(pid: int) -> dict:
    # a 64-byte buffer in the process: [0] epoch, [8] value, [56] size; freed at the end
    exprs = ["(long)malloc(64)", "*(long*)$1 = 1", "*(long*)($1 + 56) = 8",
             '(int)mallctl("epoch", 0, 0, (void*)$1, 8)']
    for name in JEMALLOC_STATS:
        exprs += [f'(int)mallctl("{name}", (void*)($1 + 8), (void*)($1 + 56), 0, 0)',
                  "*(unsigned long*)($1 + 8)"]
    exprs.append("(void)free((void*)$1)")
    got = gdbcall.call(pid, exprs)
    out, k = {}, 4
    for name in JEMALLOC_STATS:
        ok, value = gdbcall.number(got[k]), gdbcall.number(got[k + 1])
        out[name.replace("stats.", "").replace("arenas.4096.", "")] = value if ok == 0 else None
        k += 2
    return out


TCMALLOC_STATS = ("generic.current_allocated_bytes", "generic.heap_size",
                  "tcmalloc.pageheap_free_bytes", "tcmalloc.pageheap_unmapped_bytes")


def tcmalloc_figures(pid: int) -> dict:
    exprs = ["(long)malloc(16)"]
    for name in TCMALLOC_STATS:
        exprs += [f'(int)MallocExtension_GetNumericProperty("{name}", (void*)$1)', "*(unsigned long*)$1"]
    exprs.append("(void)free((void*)$1)")
    got = gdbcall.call(pid, exprs)
    out, k = {}, 1
    for name in TCMALLOC_STATS:
        ok, value = gdbcall.number(got[k]), gdbcall.number(got[k + 1])
        out[name.split(".", 1)[1]] = value if ok else None
        k += 2
    return out


# ---------------------------------------------------------------- the split

def split(a: Attached) -> None:
    """in use, retained and the release estimate from the allocator's figures and the
    mappings; non-heap by owner."""
    k = a.by_kind
    heap_rss = k["heap"] + k["arena"]
    other = k["anon"]
    f = a.allocator_figures
    if a.allocator == "glibc" and a.arenas:
        system = sum(x["system_bytes"] for x in a.arenas)
        free = sum(x["free_bytes"] for x in a.arenas)
        # pages of the heaps not resident are free ones (a trim madvised them away)
        a.retained_bytes = int(min(heap_rss, max(0, free - max(0, system - heap_rss))))
        mmapped = min(f.get("mmapped_bytes", 0), other)
        a.in_use_bytes = heap_rss - a.retained_bytes + mmapped
        other -= mmapped
        main = next((x for x in a.arenas if x["nr"] == 0), None)
        estimate = sum(x["whole_free_pages_bytes"] for x in a.arenas)
        if main:   # the main arena's top chunk goes back by sbrk (a thread arena's does not)
            estimate += max(0, main["top_bytes"] - 128 * 1024) // PAGE * PAGE
        # pages a release already returned are not resident: they cannot go back again
        estimate -= max(0, system - heap_rss)
        if not a.release_measured:
            a.release_estimate_bytes = int(min(max(0, estimate), a.retained_bytes))
    elif a.allocator == "jemalloc" and f.get("resident") is not None:
        # jemalloc's heaps are anonymous mappings of its own: resident = active + dirty +
        # metadata; dirty and muzzy pages are what a purge returns
        resident = min(f["resident"], other)
        a.in_use_bytes = min(resident, (f.get("allocated") or 0) + (f.get("metadata") or 0))
        a.retained_bytes = max(0, resident - a.in_use_bytes)
        other -= resident
        a.release_estimate_bytes = min(a.retained_bytes,
                                       ((f.get("pdirty") or 0) + (f.get("pmuzzy") or 0)) * PAGE)
    elif a.allocator == "tcmalloc" and f.get("heap_size") is not None:
        held = max(0, f["heap_size"] - (f.get("pageheap_unmapped_bytes") or 0))
        resident = min(held, other)
        a.in_use_bytes = min(resident, f.get("current_allocated_bytes") or 0)
        a.retained_bytes = max(0, resident - a.in_use_bytes)
        other -= resident
        a.release_estimate_bytes = min(a.retained_bytes, f.get("pageheap_free_bytes") or 0)
    else:
        a.in_use_bytes = None
    a.non_heap = {"stacks": k["stack"], "file-backed": k["file"], "shared memory": k["shared"],
                  "other anonymous": max(0, other)}
    if a.in_use_bytes is None:
        a.non_heap["allocator heaps ([heap], arenas)"] = heap_rss


def leak_verdict(a: Attached) -> str:
    """LEAK when a copy of the process (--leaks) found a MiB or more no pointer reaches."""
    r = (a.leaks or {}).get("reach") or {}
    lost = r.get("definitely_lost_bytes", 0) + r.get("indirectly_lost_bytes", 0)
    if lost < MiB:
        return ""
    sizes = a.leaks.get("lost_by_size") or []
    where = (a.leaks.get("lost_sites") or {}).get("sites") or []
    most = (f"; most of it from {where[0]['site']} ({fmt_share(where[0]['share'])} of the lost "
            "blocks --track sampled)" if where else
            f"; most of it {sizes[0]['blocks']:,} blocks of {human(sizes[0]['bytes'])}" if sizes else "")
    rss = a.leaks.get("rss_bytes") or a.rss_bytes   # the RSS of the copy's moment
    # (more than the RSS when pages of the lost blocks were never touched: calloc's)
    share = f" ({pct(lost, rss)} of RSS)" if lost <= rss else ""
    return (f"LEAK: {human(lost)}{share} that no pointer in the process "
            f"reaches ({r['definitely_lost_blocks'] + r['indirectly_lost_blocks']:,} blocks, marked "
            f"in a copy of it){most}")


def trimmed_words(a: Attached) -> str:
    """What --trim's release did, for the verdict ("" without --trim)."""
    if not a.trim:
        return ""
    t = a.trim
    return (f"; {t['call']} made now gave back {human(t['gave_back_bytes'])} (RSS "
            f"{human(t['rss_before_bytes'])} -> {human(t['rss_after_bytes'])}): the figures above "
            "are from before it")


def verdict(a: Attached) -> str:
    """The one-line answer; with --trim, what its release did (the figures are from before)."""
    return _verdict(a) + trimmed_words(a)


def grew_verdict(a: Attached) -> str:
    """GREW when --track saw a MiB or more allocated and kept while it followed the process."""
    t = a.track or {}
    live = (t.get("counters") or {}).get("live_bytes", 0)
    m = ((t.get("sites") or {}).get("moments") or [{}])[0]
    top = (m.get("sites") or [None])[0]
    if live < MiB or top is None:
        return ""
    return (f"GREW: {human(live)} allocated in the {t['seconds']:.1f} s followed and still live, "
            f"{fmt_share(top['share'])} of it from {top['site']}; heapsight attach {a.pid} "
            "--leaks says whether anything still points to it")


def _verdict(a: Attached) -> str:
    leak = leak_verdict(a) or grew_verdict(a)
    if leak:
        return leak
    if a.retained_bytes is None:
        return (f"RSS {human(a.rss_bytes)}; the allocator's own figures were not read "
                f"({'; '.join(a.notes) or 'unknown allocator'})")
    if a.retained_bytes >= MiB and a.retained_bytes >= 0.1 * a.rss_bytes:
        est = a.release_estimate_bytes or 0
        # the free tops of glibc's thread heaps: malloc_trim never shrinks them (it trims
        # only the main heap's top), and they are no fragmentation
        tops = sum(x.get("top_bytes", 0) for x in a.arenas if x.get("nr", 0) != 0)
        tops = min(tops, a.retained_bytes)
        if est < 0.5 * a.retained_bytes and tops >= 0.5 * (a.retained_bytes - est):
            return (f"RETENTION: {human(a.retained_bytes)} ({pct(a.retained_bytes, a.rss_bytes)} "
                    f"of RSS) freed by the program and kept by {a.allocator}, {human(tops)} of it "
                    f"in {analysis.THREAD_TOPS} (a release would give back about "
                    f"{human(est)}); started with {analysis.THREAD_TOPS_ENV} (fixed "
                    "thresholds), a thread's heap shrinks on free")
        kind = "RETENTION" if est >= 0.5 * a.retained_bytes else "FRAGMENTATION"
        # (a release measured to give back little is not offered: live blocks share the pages)
        release = ("" if a.trim else
                   f"; a release would give back {human(est)}, measured in a copy of the process "
                   + (f"(heapsight attach {a.pid} --trim makes it)" if kind == "RETENTION" else
                      "(live blocks share the pages of the rest)") if a.release_measured else
                   f"; a release would give back about {human(est)} (heapsight attach {a.pid} "
                   "--trim does it and measures)")
        return (f"{kind}: {human(a.retained_bytes)} ({pct(a.retained_bytes, a.rss_bytes)} of RSS) "
                f"freed by the program and kept by {a.allocator}" + release)
    other = a.non_heap.get("other anonymous", 0)
    objects = min(a.py_objects_bytes or 0, other)
    beside = (f" beside CPython's {human(objects)} of objects in use (pymalloc's pools, read "
              "from outside)" if a.py_objects_bytes is not None else "")
    if other - objects >= 4 * MiB and other - objects >= 0.25 * a.rss_bytes:
        rule = analysis.runtime_rule(a.runtime) if a.runtime else None
        if rule is None:
            return (f"NON-HEAP MEMORY: {human(other)} of anonymous memory the allocator did not "
                    "give (a runtime's own heap, the program's mmap)")
        if a.py_pool_bytes is not None:   # (read only where the runtime is CPython's)
            free = min(other - objects, max(0, a.py_pool_bytes - objects))
            return (f"NON-HEAP MEMORY: {human(other - objects)} of anonymous memory the allocator "
                    f"did not give{beside}: {human(free)} of it free in pymalloc's arenas (free "
                    f"blocks and emptied pools), the rest other mappings; {rule[0]}. "
                    "Started with PYTHONMALLOC=malloc, its objects go to malloc instead "
                    "(heapsight run --verify measures what that changes)")
        return (f"NON-HEAP MEMORY: {human(other)} of anonymous memory the allocator did not give; "
                f"the process runs {a.runtime}, its most likely owner: {rule[0]}. {rule[1]}")
    return (f"healthy: {human(a.in_use_bytes)} in use by the program"
            + (f", {human(objects)} of CPython's objects in pymalloc's pools" if beside else "")
            + f", {human(a.retained_bytes)} kept by {a.allocator} (RSS {human(a.rss_bytes)})")


def read_pools(a: Attached, pid: int, maps: list) -> None:
    """CPython's objects in use in pymalloc's pools, read from outside as `heapsight run`'s
    sampler reads them (readloop.read_pools: the pool headers on resident pages, by
    process_vm_readv; no stop, no call into the process), into a.py_objects_bytes and
    a.py_pool_bytes; left None when the process is not CPython, has no pools (PYTHONMALLOC=
    malloc, CPython before 3.10) or cannot be read."""
    if "pymalloc" not in a.runtime or not readloop.available():
        return
    fd = open_pagemap(pid)
    if fd is None:
        return
    try:
        got = readloop.read_pools(pid, fd, [(m.start, m.end, m.rss) for m in maps
                                            if m.kind in ("anon", "arena")])
    finally:
        os.close(fd)
    if got is not None and got[2]:
        a.py_objects_bytes, a.py_pool_bytes = int(got[0]), int(got[1])


def inspect(pid: int, use_gdb: bool = True) -> Attached:
    """One look at the process: mappings, allocator, its figures, the split."""
    command = check_target(pid, use_gdb)
    try:
        maps = procfs.smaps(pid)
    except FileNotFoundError:
        raise HeapsightError(f"process {pid} ended", gdbcall.EXIT_REFUSED) from None
    except PermissionError:
        raise HeapsightError(_smaps_refused(pid), gdbcall.EXIT_REFUSED) from None
    alloc = mappings.allocator_of(maps)
    try:
        exe = [os.readlink(f"/proc/{pid}/exe")]
    except OSError:
        exe = []
    own = own_malloc(pid, exe[0]) if exe and alloc != "static" else None
    alloc = own or alloc
    a = Attached(pid, command, alloc, sum(m.rss for m in maps), mappings.resident_by_kind(maps),
                 taken_at=time.time())
    a.runtime = analysis.runtime_loaded(exe + [m.path for m in maps])
    seg = preloaded_segment(pid)
    if seg is not None:
        c = seg.counters()
        a.preloaded, a.live_bytes, a.waste_bytes, a.live_blocks = (
            True, c.live_requested_bytes, c.waste_bytes, c.live_blocks)
        a.notes.append("libheapsight is preloaded: live usable bytes are its exact counters, "
                       "their waste estimated from its sampled blocks")
    if alloc == "static":
        a.notes.append("a static binary (or a Go program): no allocator to call, /proc figures only")
    elif own:
        a.notes.append(f"its executable defines malloc: {own} answers its calls (an allocator "
                       "built into the program, as Chromium's PartitionAlloc), whose figures "
                       "heapsight does not read: /proc figures only")
    elif not use_gdb:
        a.notes.append("--no-gdb: /proc figures only")
    elif alloc == "glibc" and _from_copy(a, pid, maps):
        pass
    elif alloc in ("glibc", "jemalloc", "tcmalloc") and gdbcall.restore_refusal():
        # gdb here cannot undo its calls: the /proc figures, and why no more
        a.notes.append("/proc figures only: " + gdbcall.restore_refusal())
    elif alloc in ("glibc", "jemalloc", "tcmalloc"):
        if alloc == "glibc":
            info = glibc_figures(pid)
            a.arenas = info.pop("arenas")
            a.allocator_figures = info
        elif alloc == "jemalloc":
            a.allocator_figures = jemalloc_figures(pid)
        else:
            a.allocator_figures = tcmalloc_figures(pid)
        a.notes.append(f"gdb stopped the process for at most {gdbcall.last_seconds * 1000:.0f} ms "
                       "to read these figures")
    else:
        a.notes.append(f"{alloc}: heapsight does not read its figures in a running process yet")
    split(a)
    read_pools(a, pid, maps)
    if a.release_measured and a.retained_bytes is not None:
        a.release_estimate_bytes = min(a.release_estimate_bytes or 0, a.retained_bytes)
    a.verdict = verdict(a)
    return a


def own_malloc(pid: int, exe: str) -> str | None:
    """'its own malloc (NAME)' when the process's executable defines malloc itself: its
    calls, and its libraries', reach that one before the C library's (the executable comes
    first in the lookup order), so glibc's heaps hold none of its blocks. None otherwise, or
    when the executable cannot be read."""
    try:
        defined = elf.defined_symbols(f"/proc/{pid}/exe", {"malloc"})
    except (OSError, ValueError):
        return None
    return f"{allocators.OWN_MALLOC} ({os.path.basename(exe)})" if defined else None


def _from_copy(a: Attached, pid: int, maps: list) -> bool:
    """glibc's figures from a copy of the process (glibc_from_copy) into a; False, with a
    note, when the copy could not give them (gdb is asked then, where it can call)."""
    try:
        a.arenas, a.allocator_figures, note, released, pause = glibc_from_copy(pid, maps)
    except HeapsightError as e:
        a.notes.append(f"no copy of the process could be walked: {e.message}")
        return False
    a.notes.append(note)
    a.release_estimate_bytes, a.release_measured = released, True
    a.copy_pause_ms = pause
    return True


def _smaps_refused(pid: int) -> str:
    """Why /proc/PID/smaps could not be read, with the fix."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        uid = None
    if uid is not None and uid != os.geteuid() and os.geteuid() != 0:
        return (f"cannot read /proc/{pid}/smaps: another user's process; run heapsight as that "
                "user or as root")
    who = "the init process of this PID namespace" if pid == 1 else f"process {pid}"
    return (f"cannot read /proc/{pid}/smaps: the kernel refused it although heapsight runs as "
            f"{'root' if os.geteuid() == 0 else 'its user'}: {who} is not dumpable (it set "
            "PR_SET_DUMPABLE 0, or runs a setuid program), or a security module (Yama, SELinux, "
            "AppArmor) forbids reading it; attach cannot read it either")


def trim(pid: int, allocator: str) -> dict:
    """The allocator's release-now call made in the process (live/inject.py: on one of its
    threads that waits in a system call, no gdb), with RSS before and after and what the
    process paid."""
    from heapsight.live import inject
    if allocators.trim_call(allocator) is None:
        raise HeapsightError(f"--trim: no release call is known for {allocator}")
    before = _rss(pid)
    t0 = time.monotonic()
    made = inject.release(pid, allocator)
    after = _rss(pid)
    return {"call": allocators.release_call(allocator), "rss_before_bytes": before,
            "rss_after_bytes": after, "gave_back_bytes": max(0, before - after),
            "seconds": round(time.monotonic() - t0, 3), "pause_ms": made["pause_ms"],
            "all_stopped_ms": made["all_stopped_ms"], "threads": made["threads"]}


def _rss(pid: int) -> int:
    rss = procfs.rss_bytes(pid)
    if rss is None:
        raise HeapsightError(f"process {pid} has ended before the release: nothing to release")
    return rss