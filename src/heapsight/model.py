"""The run's data types: what one run measured and what heapsight concludes from it.
Frozen dataclasses with units in their names; Summary.to_dict() gives the JSON form and
Summary.from_dict() reads it back (record.py checks a saved one against these same
fields before it is read)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, field, replace

import numpy as np

from heapsight.dataclass import dataclass
from heapsight.layout import STATS_UNKNOWN

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class AllocStats:
    """The allocator's own view (hs_alloc_stats_t)."""
    in_use_bytes: int | None
    free_bytes: int | None
    mapped_bytes: int
    resident_bytes: int
    mmapped_bytes: int
    arenas: int
    top_pad_bytes: int
    raw: tuple

    @staticmethod
    def from_record(rec) -> "AllocStats":
        # in use and free: None where they would need a walk of the free lists (glibc's,
        # read without its locks)
        known = lambda v: None if int(v) == STATS_UNKNOWN else int(v)
        return AllocStats(known(rec["in_use_bytes"]), known(rec["free_bytes"]), int(rec["mapped_bytes"]),
                          int(rec["resident_bytes"]), int(rec["mmapped_bytes"]), int(rec["arenas"]),
                          int(rec["top_pad_bytes"]), tuple(int(x) for x in rec["raw"]))


@dataclass(frozen=True)
class HeapCounters:
    """Sums over every thread slot at one moment."""
    n_alloc: int
    n_free: int
    requested_total_bytes: int
    live_usable_bytes: int
    live_requested_bytes: int
    live_blocks: int
    n_mmapped: int
    n_large_heap: int
    waste_error_bytes: int = 0  # the live waste's estimate, ± one standard error
    # the usable bytes of every block the program freed, all told (None: not recorded: a
    # capture before version 10)
    freed_usable_bytes: int | None = None

    @property
    def waste_bytes(self) -> int:
        return self.live_usable_bytes - self.live_requested_bytes


@dataclass(frozen=True)
class Breakdown:
    """RSS at one moment, split so that live + waste + metadata + retained + non_heap is
    the RSS (less untouched_bytes: allocated blocks whose pages were never touched)."""
    at_s: float
    rss_bytes: int
    live_bytes: int          # requested bytes of blocks still allocated
    waste_bytes: int         # usable - requested for those blocks (allocator rounding)
    metadata_bytes: int      # chunk headers and allocator bookkeeping
    retained_bytes: int      # freed by the program, kept resident by the allocator
    non_heap_bytes: int      # file_bytes + baseline_anon_bytes + other_anon_bytes
    file_bytes: int          # code, file mappings, shared memory
    baseline_anon_bytes: int  # anonymous memory before main() (static data, main stack)
    other_anon_bytes: int    # anonymous memory malloc does not explain: stacks, own mmaps
    untouched_bytes: int     # heap blocks counted live but not resident
    # of other_anon_bytes, CPython's objects in use in pymalloc's pools, at least, read from
    # outside between two readings of them (analysis.pool_objects, known=True); None: not known
    objects_bytes: int | None = None

    def parts(self) -> dict:
        """The resident parts, which add up to rss_bytes (see resident())."""
        live, waste, metadata = resident(self.live_bytes, self.waste_bytes, self.metadata_bytes,
                                         self.untouched_bytes)
        return {"live": int(live), "waste": int(waste), "metadata": int(metadata),
                "retained": self.retained_bytes, "non-heap": self.non_heap_bytes}


def resident(live, waste, metadata, untouched) -> tuple:
    """live, waste and metadata less what of them was never touched (so not in RSS), taken
    from live first: with retained and non-heap they add up to RSS. Numbers or arrays."""
    cut_live = np.minimum(live, untouched)
    cut_waste = np.minimum(waste, untouched - cut_live)
    cut_meta = np.minimum(metadata, untouched - cut_live - cut_waste)
    return live - cut_live, waste - cut_waste, metadata - cut_meta


@dataclass(frozen=True)
class Release:
    """The release probe at exit: RSS before and after the allocator's release-now call."""
    measured: bool
    call: str
    why_not: str = ""
    rss_before_bytes: int = 0
    rss_after_bytes: int = 0
    anon_before_bytes: int = 0
    anon_after_bytes: int = 0
    seconds: float = 0.0
    where: str = "program"   # program: the program called it; copy: the exit map's fork()ed
                             # copy did, at the same moment (the program kept its RSS)
    counted_fast_chunks: int = 0  # the copy counted it from the pages by malloc_trim's rule,
                                  # not run: its fastbins held this many chunks (heapmap.py)

    @property
    def gave_back_bytes(self) -> int:
        return max(0, self.rss_before_bytes - self.rss_after_bytes) if self.measured else 0


@dataclass(frozen=True)
class Finding:
    kind: str                # leak | kept | never-freed | retention | fragmentation | waste | non-heap | hold
    bytes: int
    title: str
    detail: str
    suggestions: tuple = ()  # each a command or a concrete change
    word: str = ""           # the verdict's word for it, where not its kind's (analysis.verdict)


@dataclass(frozen=True)
class Snapshot:
    """A moment the user asked for (a signal to heapsight, --at, --every, or the program's
    heapsight_snapshot()): the split there, the allocator's latest figures, and, with
    --release-at-snapshot, a release measured there."""
    label: str
    at_s: float
    breakdown: Breakdown
    allocator_in_use_bytes: int | None = None
    allocator_free_bytes: int | None = None
    allocator_mapped_bytes: int | None = None
    release: dict | None = None


@dataclass(frozen=True)
class Hold:
    """A stretch of the run where the process held much more memory than its live bytes
    (analysis.holds gives the rule): when, how much, and whose."""
    start_s: float
    end_s: float
    held_bytes: int          # the median, over the stretch, of RSS less the resident live bytes
    max_held_bytes: int
    live_bytes: int          # the median live bytes over the stretch
    retained_bytes: int      # of held_bytes (median): freed, kept by the allocator
    other_anon_bytes: int    # of held_bytes (median): anonymous memory malloc did not give
    cause: str               # "retained" | "non-heap"
    # CPython's objects in use in pymalloc's pools (median, analysis.pool_objects): live
    # bytes outside malloc, left out of held_bytes and other_anon_bytes; 0 when not read
    objects_bytes: int = 0


@dataclass(frozen=True)
class Moment:
    """A moment a user can mean, by name (moments.py: peak, held, end, exit): when, the
    split there, and for held the stretch it lasted."""
    name: str
    at_s: float
    breakdown: Breakdown
    start_s: float = 0.0     # held: the stretch RSS stayed at that level or above
    end_s: float = 0.0
    how: str = ""            # how the moment was found, in words


@dataclass(frozen=True)
class HeapFigures:
    allocator: str
    n_alloc: int
    n_free: int
    live_blocks: int
    live_requested_bytes: int
    live_usable_bytes: int
    peak_live_usable_bytes: int
    peak_live_requested_bytes: int
    peak_at_s: float
    requested_total_bytes: int
    n_mmapped: int
    n_large_heap: int
    arenas: int
    threads_seen: int
    # the size histogram, estimated from the sampled allocations: (smallest usable size of
    # the class, allocations, live blocks, mean waste bytes per allocation, the live blocks'
    # standard error) for each usable-size class sampled
    size_classes: tuple
    helper_mallocs: int
    # the allocator's mapped memory read at exit, before the release (None: not read);
    # the last reading that bounds the timeline's retained memory (analysis.mapped_bound)
    mapped_at_exit_bytes: int | None = None
    # the live blocks' waste (live usable - live requested bytes) is estimated from the
    # sampled blocks: its standard error (0: from all allocations' waste, no sampled block live)
    live_waste_error_bytes: int = 0
    # the exit's metadata is the allocator's own figure, by this name (jemalloc's
    # stats.metadata: read at exit only, so counted in retained at the other moments);
    # "": its block headers (glibc's), or none known
    metadata_figure: str = ""
    # what it held free at exit in its own words (allocators.kept_parts): ((words, bytes),)
    kept_parts: tuple = ()
    allocator_version: str = ""  # as the allocator gives it ("": it gives none)
    version_note: str = ""       # what heapsight cannot vouch for under that version
    # the usable bytes of every block the program freed, all told (None: not known):
    # retained memory beyond it is free space the allocator made itself
    freed_usable_bytes: int | None = None
    # glibc's resident memory at exit (its heaps' resident pages in the exit's copy and its
    # mmapped chunks: summary.glibc_resident; None: not known), which bounds retained at the
    # exit and at the samples since the end that share its heap (analysis.resident_at_end)
    resident_at_exit_bytes: int | None = None


@dataclass(frozen=True)
class Summary:
    command: tuple
    pid: int                 # the process the figures are for
    started_pid: int         # the process heapsight started
    exit_code: int
    exit_signal: int
    preload: str             # active | static | not-attached
    preload_note: str
    duration_s: float
    samples: int
    sample_hz: float
    sampler_cpu_s: float
    peak_rss_bytes: int
    final_rss_bytes: int
    peak: Breakdown | None
    final: Breakdown | None
    release: Release
    heap: HeapFigures | None
    forks: int
    execs: int
    other_processes: int
    findings: tuple = field(default_factory=tuple)
    verdict: str = ""
    cpu_user_s: float = 0.0   # the program's CPU time (wait4 rusage, with waited-for children)
    cpu_sys_s: float = 0.0
    minor_faults: int = 0
    interrupted: bool = False  # Ctrl-C, SIGTERM or SIGHUP came while it ran
    still_running: bool = False  # attach --watch: the process ran on after the watch (its exit
                                 # code, when it ends, is its parent's to read)
    holds: tuple = ()          # Hold: the stretches that held much more than live bytes
    snapshots: tuple = ()      # Snapshot: the moments the user asked for
    images: tuple = ()         # (t, executable) of each image the program ran (execve)
    children: tuple = ()       # {pid, name, peak_rss_bytes} of the processes it started
    outlived: tuple = ()       # {pid, name} of those still running when it ended, heapsight's
                               # library in them (a daemon that left its parent)
    resident_by_kind_peak: dict = field(default_factory=dict)  # the same, read near peak RSS
    resident_by_kind: dict = field(default_factory=dict)  # the last smaps reading, by mapping
                               # kind (heap, arena, stack, file, shared, anon), with its time at_s
    mapped_by: tuple = ()      # {object, owner, mapped_bytes, peak_bytes, mappings}: anonymous
                               # memory the program mapped itself, by the object that did
    peak_rss_at_s: float = 0.0  # when RSS was highest (the peak column is at peak live bytes)
    stats_hz: float = 0.0       # the rates asked for: the allocator's statistics (the library
    smaps_hz: float = 0.0       # slows them down when a reading gets expensive) and smaps_rollup
    library_cpu_s: float = 0.0  # CPU of heapsight's library in the program (the exit probe,
                                # the copies' making): in cpu_user_s + cpu_sys_s, not the program's
    program_cpu_s: float = 0.0  # cpu_user_s + cpu_sys_s less library_cpu_s
    exit_probe_s: float = 0.0   # wall time after the program's end: heapsight's exit probe
                                # (statistics, the release) and the process teardown
    exit_held_s: float = 0.0    # of it, the time heapsight's exit probe held the program (its
                                # exit handler: statistics, the exit map's fork, a release
                                # asked for in the program)
    sites: dict | None = None   # sampled call sites (sites.build: the JSON shape "sites"),
                                # None when sampling was off or the library not active
    heapmaps: tuple = ()        # heap maps at exit and at snapshots (heapmap.to_json, with
                                # "pinners"): dicts, JSON-ready like sites
    mapped_sites: dict | None = None  # the stacks of the memory mapped outside malloc (every
                                # mapping, not sampled), in the shape of sites: moments
                                # "peak mapped" and "exit"
    heapsight_rss_bytes: int = 0  # the most of heapsight's memory in the program at once (its
                                # stats segment's resident pages, its private tables): left
                                # out of every RSS and anonymous figure above
    moments: tuple = ()         # Moment: peak, held, end, exit (those that exist)
    moment: str = ""            # the one the verdict is about (moments.about)
    verified: tuple = ()        # run --verify: {setting, moment, rss_bytes, wall_s, change,
                                # time_change, error, stretch} per setting measured ("none"
                                # first; stretch: no held moment in its run, its RSS where
                                # the run without a setting held: moments.rss_over)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        # sites is JSON-ready already, and large: asdict would copy it deeply, slowly
        d = asdict(replace(self, sites=None, heapmaps=(), mapped_sites=None))
        d["sites"], d["heapmaps"] = self.sites, list(self.heapmaps)
        d["mapped_sites"] = self.mapped_sites
        d["release"]["gave_back_bytes"] = self.release.gave_back_bytes
        return d

    @staticmethod
    def from_dict(d: dict) -> "Summary":
        """The Summary of its JSON form (to_dict's, or a saved record's: fields it does not
        have take their defaults, fields this heapsight does not know are left)."""
        return from_dict(Summary, d)


# The fields that hold another of these types: one, or a tuple of them ((X,))
NESTED = {"Summary": {"peak": Breakdown, "final": Breakdown, "release": Release,
                      "heap": HeapFigures, "findings": (Finding,), "holds": (Hold,),
                      "snapshots": (Snapshot,), "moments": (Moment,)},
          "Snapshot": {"breakdown": Breakdown}, "Moment": {"breakdown": Breakdown}}


def _tuples(v):
    """A JSON list as the tuple a frozen dataclass holds (nested lists too; objects stay
    dicts: the JSON-shaped fields, sites and heap maps, are kept as they are)."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def from_dict(cls, d: dict):
    """An instance of dataclass cls from its JSON form (see Summary.from_dict); ValueError
    naming the first field it needs and the form lacks."""
    nested = NESTED.get(cls.__name__, {})
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"its {cls.__name__.lower()} has no {f.name}")
            continue
        v, of = d[f.name], nested.get(f.name)
        if isinstance(of, tuple):
            kw[f.name] = tuple(from_dict(of[0], x) for x in v)
        elif of is not None:
            kw[f.name] = None if v is None else from_dict(of, v)
        else:
            kw[f.name] = _tuples(v)
    return cls(**kw)
