"""The segment's layout: a mirror of native/include/heapsight.h, the one place the Python
side knows it. Every struct and constant mirrored here is listed in C_MIRROR, and the test
suite has the compiler check each field's offset and size and each constant's value
(tests/test_native.py): a field added on one side and not the other fails there.

Pure facts and the arithmetic the library defines (its countdowns, its size classes); the
live segment (a file in /dev/shm, its lock, its reader) is heapsight.live.segment."""

from __future__ import annotations

from collections import namedtuple

MAGIC = 0x3147455354485348      # attached by its owner
CREATED = 0x3157454e54485348    # made here, not yet attached: what the library looks for
VERSION = 26
MAX_SLOTS = 256
CLASSES = 64 + (64 - 10) * 8
STATE_EMPTY, STATE_RUNNING, STATE_EXITING, STATE_DONE = 0, 1, 2, 3
# How long a heap map's copy may take before it ends itself, and the allocator's calls at
# exit (HS_MAP_LIMIT_S, HS_PROBE_LIMIT_S): the CLI waits for each a little longer.
MAP_LIMIT_S = 30
# The heap map at exit is written to "<segment>.map.exit" (probe.c), a snapshot's to
# "<segment>.map.<its number>"
MAP_EXIT = "exit"
PROBE_LIMIT_S = 30
# exit_probe_status (HS_PROBE_*): only PROBE_DONE means the exit figures were measured
PROBE_NOT_RUN, PROBE_DONE, PROBE_ALLOCATOR_LOCKED, PROBE_TIMED_OUT, PROBE_NO_HELPER = 0, 1, 2, 3, 4
PROBE_SECCOMP = 5
PROBE_WHY_NOT = {
    PROBE_ALLOCATOR_LOCKED: "the allocator's lock was held when the program called exit() "
                            "(from a signal handler that interrupted malloc, or a thread "
                            "stuck inside the allocator): the exit figures are the last sample's",
    PROBE_TIMED_OUT: f"the allocator's own calls at exit ran past {PROBE_LIMIT_S} s: the exit figures are "
                     "the last sample's",
    PROBE_NO_HELPER: "heapsight's thread in the program could not start: no exit figures",
    PROBE_SECCOMP: "the program installed a seccomp filter, which may forbid any system call: "
                   "heapsight made none from then on (no exit figures, no copy at exit, no "
                   "call sites read from an interpreter's frames)",
}

# exit_begun_how (HS_EXIT_BEGUN_*): how the program's exit began, as the library saw it
# (the third at its first flush once CPython's _PyRuntime._finalizing is set; the sampler's
# ticks read that word too)
EXIT_BEGUN_MAIN_RETURNED, EXIT_BEGUN_EXIT_CALLED, EXIT_BEGUN_PY_FINALIZING = 1, 2, 3
EXIT_BEGUN_HOW = {EXIT_BEGUN_MAIN_RETURNED: "main returned", EXIT_BEGUN_EXIT_CALLED: "exit() called",
                  EXIT_BEGUN_PY_FINALIZING: "CPython began finalizing"}

# The structs, as numpy's dtypes read them: each a list of (name, type[, shape]), a type a
# numpy type string or another such list. numpy makes them dtypes on first use (the
# *_DTYPE names, __getattr__ below); the header's fields are read without it too
# (HeaderView): the run starts the program before numpy is imported.
U8, I8, F8 = "<u8", "<i8", "<f8"

STATS_FIELDS = [
    ("time_ns", U8), ("in_use_bytes", U8), ("free_bytes", U8), ("mapped_bytes", U8),
    ("resident_bytes", U8), ("mmapped_bytes", U8), ("arenas", U8), ("top_pad_bytes", U8),
    ("raw", U8, (10,)),
]

MAX_OWNERS = 16
OWNER_FIELDS = [("base", U8), ("mapped_bytes", I8), ("peak_bytes", U8),
                ("mappings", U8), ("name", "S96")]

SLOT_FIELDS = [
    ("left", I8), ("free_left", I8), ("alloc_chunk_bytes", U8), ("free_chunk_bytes", U8),
    ("n_alloc", U8), ("n_free", U8), ("req_alloc_bytes", U8), ("n_realloc", U8),
    ("claimed", U8), ("tid", U8), ("left_base", I8), ("sample_left", I8), ("flushed_net", I8),
    ("n_large", U8), ("n_mmapped", U8), ("mmapped_alloc_bytes", U8), ("mmapped_free_bytes", U8),
    ("free_base", I8), ("n_alloc_base", U8), ("seq", U8), ("pad", U8, (4,)),
]
# What a block adds to the countdowns beyond its usable bytes (HS_BLOCK_EXTRA).
BLOCK_EXTRA = 8
# What all threads together may hold back from the live figure and its peak
# (HS_FLUSH_TOTAL_BYTES).
FLUSH_TOTAL_BYTES = 1 << 20


def slot_usable(slots) -> tuple:
    """(usable bytes allocated, freed) of each slot, as hs_slot_usable: the chunk bytes
    folded in, plus what the countdowns counted since, less BLOCK_EXTRA per block. uint64,
    wrapping as the library's arithmetic does."""
    import numpy as np
    with np.errstate(over="ignore"):
        u = np.uint64
        alloc = (slots["alloc_chunk_bytes"] + counted(slots["left_base"], slots["left"])
                 - u(BLOCK_EXTRA) * slots["n_alloc"])
        freed = (slots["free_chunk_bytes"] + counted(slots["free_base"], slots["free_left"])
                 - u(BLOCK_EXTRA) * slots["n_free"])
    return alloc, freed


POKE = 1 << 60   # heapsight.h's HS_POKE


def counted(base, left):
    """hs_counted: the bytes a countdown counted since its base, modulo the pokes the CLI
    took off it (uint64, wrapping as the library's arithmetic does)."""
    import numpy as np
    with np.errstate(over="ignore"):
        u = np.uint64
        d = (base.astype(u) - left.astype(u)) + u(POKE // 2)
        return (d & u(POKE - 1)) - u(POKE // 2)


# The size histogram from the sampled allocations (hs_hist_t): per usable-size class, sums
# of each sampled block's weight (1 / the probability it had to be sampled).
HIST_FIELDS = [
    ("alloc_w", F8, (CLASSES,)), ("live_w", F8, (CLASSES,)), ("waste_w", F8, (CLASSES,)),
    ("live_u_w", F8, (CLASSES,)), ("live_var", F8, (CLASSES,)), ("live_var_u", F8, (CLASSES,)),
    ("live_var_uu", F8, (CLASSES,)), ("live_samples", U8),
]

_HEADER_FIELDS = [
    ("magic", U8), ("version", U8), ("size_bytes", U8), ("slot_bytes", U8), ("max_slots", U8),
    ("n_classes", U8), ("owner_pid", U8), ("state", U8), ("execs", U8), ("forks", U8),
    ("foreign_attaches", U8), ("slots_used", U8), ("slot_overflows", U8), ("start_ns", U8),
    ("start_rss_bytes", U8), ("start_anon_bytes", U8), ("live_usable_bytes", I8),
    ("peak_usable_bytes", U8), ("peak_ns", U8), ("allocator_id", U8), ("allocator_name", "S32"),
    ("allocator_version", "S32"), ("malloc_elsewhere", "S128"),
    ("usable_by_header", U8), ("helper_mallocs", U8),
    ("exit_ns", U8), ("release_ns", U8), ("exit_rss_before", U8),
    ("exit_rss_after", U8), ("exit_anon_before", U8), ("exit_anon_after", U8),
    ("exit_release_kind", U8), ("exit_stats_before", STATS_FIELDS),
    ("exit_stats_after", STATS_FIELDS), ("slots_offset", U8), ("creator_pid", U8),
    ("image", "S128"), ("exit_probe_status", U8), ("library_threads", U8),
    ("library_cpu_ns", U8), ("snapshot_seq", U8), ("snapshot_ack", U8),
    ("snapshot_label", "S64"), ("heapmap_seq", U8), ("heapmap_ack", U8),
    ("heapmap_at_exit", U8), ("mapped_at", U8), ("heapmap_exit_pid", U8),
    ("heapmap_copy_pid", U8),
    ("exit_done_ns", U8), ("slot_claims", U8), ("own_private_bytes", U8),
    ("glibc_main_arena", U8), ("glibc_arena_next_off", U8), ("glibc_arena_sysmem_off", U8),
    ("threads_seen", U8), ("seccomp_at_ns", U8),
    ("exit_begun_ns", U8), ("exit_begun_how", U8),
    ("exit_begun_read", U8), ("exit_begun_rss", U8), ("exit_begun_anon", U8),
    ("exit_begun_own_private", U8), ("exit_begun_usable_alloc", U8),
    ("exit_begun_usable_free", U8), ("exit_begun_req_alloc", U8),
    ("exit_begun_n_alloc", U8), ("exit_begun_n_free", U8), ("exit_begun_alloc_mapped", U8),
    ("exit_begun_arenas", U8), ("py_finalizing_addr", U8),
    ("owners", OWNER_FIELDS, (MAX_OWNERS,)), ("hist", HIST_FIELDS),
]
# The counters summed over the slots every reading.
SUMMED = ("n_alloc", "n_free", "req_alloc_bytes", "n_realloc", "n_large", "n_mmapped")


def itemsize(fields) -> int:
    """The bytes of a struct (a list of fields) or of a type, as numpy lays it out: packed,
    in order."""
    if isinstance(fields, str):
        return int(fields[1:]) if fields[0] == "S" else int(fields[2:])
    return sum(_field_bytes(f) for f in fields)


def _field_bytes(f) -> int:
    n = itemsize(f[1])
    for d in (f[2] if len(f) > 2 else ()):
        n *= d
    return n


def offsets(fields) -> dict:
    """name -> (offset, type, shape) of each field of a struct, numpy's layout."""
    out, at = {}, 0
    for f in fields:
        out[f[0]] = (at, f[1], f[2] if len(f) > 2 else ())
        at += _field_bytes(f)
    return out


HEADER_AT = offsets(_HEADER_FIELDS)
HEADER_BYTES = itemsize(_HEADER_FIELDS)
SLOT_BYTES = itemsize(SLOT_FIELDS)
SLOTS_OFFSET = (HEADER_BYTES + 63) // 64 * 64
# Sampled allocations and their stacks (hs_profile_t), after the slots on a page boundary:
# a header page, then the tables, as many as the file's size says (its room, heapsight.h);
# left out of the file when the run samples nothing (SEGMENT_BASE_BYTES).
PROFILE_MAGIC = 0x31464f5250534853
STATS_UNKNOWN = (1 << 64) - 1   # hs_alloc_stats_t: a figure that needs a walk, not taken
PROFILE_TABLES = 4096           # within the profile: the tables start a page in
EVENTS_UNIT, WORDS_UNIT, MODULES_UNIT = 1 << 15, 1 << 16, 512
ROOM_DEFAULT, ROOM_SMALL, ROOM_MAX = 8, 1, 16
EVENT_EMPTY, EVENT_ALLOC, EVENT_FREE, EVENT_MAP = 0, 1, 2, 3
EVENT_KIND_MASK, EVENT_LEVEL_SHIFT = 0xff, 8   # an event's kind; an ALLOC's level above it
# An interpreter's frame in a stored stack: the word IFRAME_TAG | kind << IFRAME_KIND_SHIFT
# | the word offset of its record, whose fifth word packs the line (bits 0-31), the name's
# bytes (from IFRAME_NAME_SHIFT) and the file's (from IFRAME_FILE_SHIFT).
IFRAME_TAG, IFRAME_MAGIC = 1 << 63, 0x454d415246534823
IFRAME_KIND_SHIFT, IFRAME_NAME_SHIFT, IFRAME_FILE_SHIFT = 56, 32, 48
IFRAME_OFFSET_MASK = (1 << IFRAME_KIND_SHIFT) - 1
INTERP_NONE, INTERP_PYTHON, INTERP_PERL = 0, 1, 2
INTERP_STATUS_OK, INTERP_STATUS_VERSION, INTERP_STATUS_SYMBOLS, INTERP_STATUS_READS, \
    INTERP_STATUS_OFF = 0, 1, 2, 3, 4
EVENT_FIELDS = [("addr", U8), ("size", U8), ("time_ns", U8), ("stack", "<u4"), ("kind", "<u4")]
MODULE_FIELDS = [("lo", U8), ("hi", U8), ("bias", U8), ("first_event", U8), ("path", "S224")]
PROFILE_HEADER_FIELDS = [
    ("magic", U8), ("mean_bytes", U8), ("events_used", U8), ("stack_words_used", U8),
    ("modules_used", U8), ("dropped_samples", U8), ("unwind_ns", U8), ("unwinds", U8),
    ("unwind_frames", U8), ("interp_kind", U8), ("interp_status", U8), ("interp_version", U8),
    ("interp_ns", U8), ("interp_walks", U8), ("interp_frames", U8), ("unwind_cached", U8),
    ("unwind_checked", U8), ("unwind_mismatches", U8),
]
EVENT_BYTES, MODULE_BYTES = itemsize(EVENT_FIELDS), itemsize(MODULE_FIELDS)
UNIT_BYTES = EVENTS_UNIT * EVENT_BYTES + WORDS_UNIT * 8 + MODULES_UNIT * MODULE_BYTES
PROFILE_OFFSET = (SLOTS_OFFSET + MAX_SLOTS * SLOT_BYTES + 4095) // 4096 * 4096
SEGMENT_BASE_BYTES = PROFILE_OFFSET   # the file without the profile's tables


# The profile's tables in a segment of one room: their lengths, and their offsets from the
# profile's start (a named tuple: read before the program starts, where the dataclasses
# module would cost 10-25 ms)
ProfileLayout = namedtuple("ProfileLayout", "room events stack_words modules events_offset "
                                            "stacks_offset modules_offset")


def segment_bytes(room: int) -> int:
    """The size of a segment file whose profile has this room (0: no profile)."""
    return PROFILE_OFFSET + PROFILE_TABLES + room * UNIT_BYTES if room else SEGMENT_BASE_BYTES


def profile_layout(size_bytes: int) -> ProfileLayout | None:
    """The tables of a segment file of this size; None when it has no profile."""
    for room in range(1, ROOM_MAX + 1):
        if segment_bytes(room) == size_bytes:
            ev, words = room * EVENTS_UNIT, room * WORDS_UNIT
            stacks = PROFILE_TABLES + ev * EVENT_BYTES
            return ProfileLayout(room, ev, words, room * MODULES_UNIT, PROFILE_TABLES, stacks,
                                 stacks + words * 8)
    return None


# a segment of the default room (what a run makes unless told otherwise)
SEGMENT_BYTES = segment_bytes(ROOM_DEFAULT)
_DEFAULT = profile_layout(SEGMENT_BYTES)
PROFILE_EVENTS, PROFILE_STACK_WORDS, PROFILE_MODULES = _DEFAULT.events, _DEFAULT.stack_words, _DEFAULT.modules
PROFILE_EVENTS_OFFSET = _DEFAULT.events_offset
PROFILE_STACKS_OFFSET = _DEFAULT.stacks_offset
PROFILE_MODULES_OFFSET = _DEFAULT.modules_offset
# glibc's usable size for a class's smallest member, used to name histogram classes.
def class_floor_bytes(c: int) -> int:
    if c < 64:
        return c * 16
    e = 10 + (c - 64) // 8
    return (1 << e) + ((c - 64) % 8) * (1 << (e - 3))


def _c_constants() -> dict:
    """C expression -> the value this module gives it."""
    c = {"HS_SEGMENT_MAGIC": MAGIC, "HS_SEGMENT_CREATED": CREATED, "HS_SEGMENT_VERSION": VERSION,
         "HS_MAX_SLOTS": MAX_SLOTS, "HS_CLASSES": CLASSES, "HS_MAX_OWNERS": MAX_OWNERS,
         "HS_MAP_LIMIT_S": MAP_LIMIT_S, "HS_PROBE_LIMIT_S": PROBE_LIMIT_S,
         "HS_STATS_UNKNOWN": STATS_UNKNOWN, "HS_BLOCK_EXTRA": BLOCK_EXTRA,
         "HS_FLUSH_TOTAL_BYTES": FLUSH_TOTAL_BYTES, "HS_POKE": POKE,
         "HS_PROFILE_MAGIC": PROFILE_MAGIC, "HS_PROFILE_TABLES": PROFILE_TABLES,
         "HS_PROFILE_EVENTS_UNIT": EVENTS_UNIT, "HS_PROFILE_WORDS_UNIT": WORDS_UNIT,
         "HS_PROFILE_MODULES_UNIT": MODULES_UNIT, "HS_PROFILE_ROOM_DEFAULT": ROOM_DEFAULT,
         "HS_PROFILE_ROOM_MAX": ROOM_MAX, "HS_PROFILE_UNIT_BYTES": UNIT_BYTES,
         "HS_SEGMENT_BASE_BYTES": SEGMENT_BASE_BYTES,
         "offsetof(hs_segment_t, slots)": SLOTS_OFFSET,
         "offsetof(hs_segment_t, profile)": PROFILE_OFFSET,
         "HS_EVENT_KIND_MASK": EVENT_KIND_MASK, "HS_EVENT_LEVEL_SHIFT": EVENT_LEVEL_SHIFT,
         "HS_IFRAME_TAG": IFRAME_TAG, "HS_IFRAME_MAGIC": IFRAME_MAGIC,
         "HS_IFRAME_KIND_SHIFT": IFRAME_KIND_SHIFT, "HS_IFRAME_OFFSET_MASK": IFRAME_OFFSET_MASK,
         "HS_IFRAME_NAME_SHIFT": IFRAME_NAME_SHIFT, "HS_IFRAME_FILE_SHIFT": IFRAME_FILE_SHIFT}
    for prefix, names in (("HS_STATE_", "EMPTY RUNNING EXITING DONE"),
                          ("HS_PROBE_", "NOT_RUN DONE ALLOCATOR_LOCKED TIMED_OUT NO_HELPER SECCOMP"),
                          ("HS_EXIT_BEGUN_", "MAIN_RETURNED EXIT_CALLED PY_FINALIZING"),
                          ("HS_EVENT_", "EMPTY ALLOC FREE MAP"),
                          ("HS_INTERP_", "NONE PYTHON PERL"),
                          ("HS_INTERP_STATUS_", "OK VERSION SYMBOLS READS OFF")):
        for n in names.split():
            c[prefix + n] = globals()[prefix[3:] + n]
    c.update({f"hs_segment_bytes({k})": segment_bytes(k) for k in range(ROOM_MAX + 1)})
    return c


# What this module mirrors of native/include/heapsight.h, for the compiler to check
# (tests/test_native.py): each C struct with its dtype (every field's offset and size, and
# the struct's size: a C field this side lacks changes it), and each constant's value.
C_HEADER = "heapsight.h"
# (numpy's dtypes, made here on first use: the test that checks them against the C
# headers imports numpy anyway)
_STRUCTS = {"HEADER_DTYPE": _HEADER_FIELDS, "SLOT_DTYPE": SLOT_FIELDS, "STATS_DTYPE": STATS_FIELDS,
            "HIST_DTYPE": HIST_FIELDS, "OWNER_DTYPE": OWNER_FIELDS, "EVENT_DTYPE": EVENT_FIELDS,
            "MODULE_DTYPE": MODULE_FIELDS, "PROFILE_HEADER_DTYPE": PROFILE_HEADER_FIELDS}
_C_NAMES = {"hs_segment_t": "HEADER_DTYPE", "hs_slot_t": "SLOT_DTYPE",
            "hs_alloc_stats_t": "STATS_DTYPE", "hs_hist_t": "HIST_DTYPE",
            "hs_owner_t": "OWNER_DTYPE", "hs_event_t": "EVENT_DTYPE",
            "hs_module_t": "MODULE_DTYPE", "hs_profile_t": "PROFILE_HEADER_DTYPE"}


def __getattr__(name: str):
    """The numpy dtypes (HEADER_DTYPE, ...; C_STRUCTS), made when first asked for."""
    if name in _STRUCTS:
        import numpy as np
        globals()[name] = value = np.dtype(_STRUCTS[name])
        return value
    if name == "C_STRUCTS":
        globals()[name] = value = {c: __getattr__(n) for c, n in _C_NAMES.items()}
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
# hs_segment_t goes on past what the header's dtype covers: its slots (64-byte aligned) and
# the profile (page aligned), whose offsets are checked as constants
C_PARTIAL = ("hs_segment_t",)
C_CONSTANTS = _c_constants()
