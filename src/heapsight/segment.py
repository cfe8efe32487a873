"""The stats segment, read side: a mirror of native/include/heapsight.h (the test suite
checks this layout against the compiler's) and a reader the sampler calls every tick."""

from __future__ import annotations

import errno
import fnmatch
import fcntl
import math
import mmap
import os
import resource

import stat
import time
from dataclasses import dataclass

import numpy as np

MAGIC = 0x3147455354485348      # attached by its owner
CREATED = 0x3157454e54485348    # made here, not yet attached: what the library looks for
VERSION = 23
MAX_SLOTS = 256
CLASSES = 64 + (64 - 10) * 8
STATE_EMPTY, STATE_RUNNING, STATE_EXITING, STATE_DONE = 0, 1, 2, 3
# How long a heap map's copy may take before it ends itself, and the allocator's calls at
# exit (HS_MAP_LIMIT_S, HS_PROBE_LIMIT_S): the CLI waits for each a little longer.
MAP_LIMIT_S = 30
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

# exit_begun_how (HS_EXIT_BEGUN_*): how the program's exit began; the library writes the
# first two, the third is the sampler's (it reads CPython's _PyRuntime._finalizing)
EXIT_BEGUN_MAIN_RETURNED, EXIT_BEGUN_EXIT_CALLED, EXIT_BEGUN_PY_FINALIZING = 1, 2, 3
EXIT_BEGUN_HOW = {EXIT_BEGUN_MAIN_RETURNED: "main returned", EXIT_BEGUN_EXIT_CALLED: "exit() called",
                  EXIT_BEGUN_PY_FINALIZING: "CPython began finalizing"}

U8, I8 = np.dtype("<u8"), np.dtype("<i8")

STATS_DTYPE = np.dtype([
    ("time_ns", U8), ("in_use_bytes", U8), ("free_bytes", U8), ("mapped_bytes", U8),
    ("resident_bytes", U8), ("mmapped_bytes", U8), ("arenas", U8), ("top_pad_bytes", U8),
    ("raw", U8, (10,)),
])

MAX_OWNERS = 16
OWNER_DTYPE = np.dtype([("base", U8), ("mapped_bytes", I8), ("peak_bytes", U8),
                        ("mappings", U8), ("name", "S96")])

SLOT_DTYPE = np.dtype([
    ("left", I8), ("free_left", I8), ("alloc_chunk_bytes", U8), ("free_chunk_bytes", U8),
    ("n_alloc", U8), ("n_free", U8), ("req_alloc_bytes", U8), ("n_realloc", U8),
    ("claimed", U8), ("tid", U8), ("left_base", I8), ("sample_left", I8), ("flushed_net", I8),
    ("n_large", U8), ("n_mmapped", U8), ("mmapped_alloc_bytes", U8), ("mmapped_free_bytes", U8),
    ("free_base", I8), ("n_alloc_base", U8), ("seq", U8), ("pad", U8, (4,)),
])
# What a block adds to the countdowns beyond its usable bytes (HS_BLOCK_EXTRA).
BLOCK_EXTRA = 8
# What all threads together may hold back from the live figure and its peak
# (HS_FLUSH_TOTAL_BYTES).
FLUSH_TOTAL_BYTES = 1 << 20


def slot_usable(slots) -> tuple:
    """(usable bytes allocated, freed) of each slot, as hs_slot_usable: the chunk bytes
    folded in, plus what the countdowns counted since, less BLOCK_EXTRA per block. uint64,
    wrapping as the library's arithmetic does."""
    with np.errstate(over="ignore"):
        u = np.uint64
        alloc = (slots["alloc_chunk_bytes"] + counted(slots["left_base"], slots["left"])
                 - u(BLOCK_EXTRA) * slots["n_alloc"])
        freed = (slots["free_chunk_bytes"] + counted(slots["free_base"], slots["free_left"])
                 - u(BLOCK_EXTRA) * slots["n_free"])
    return alloc, freed


POKE = 1 << 60   # heapsight.h's HS_POKE


def counted(base, left) -> np.ndarray:
    """hs_counted: the bytes a countdown counted since its base, modulo the pokes the CLI
    took off it (uint64, wrapping as the library's arithmetic does)."""
    with np.errstate(over="ignore"):
        u = np.uint64
        d = (base.astype(u) - left.astype(u)) + u(POKE // 2)
        return (d & u(POKE - 1)) - u(POKE // 2)


def settled(slots, tries: int = 100) -> np.ndarray:
    """A copy of the slots in which no row was read while its owner was folding a countdown
    in (seq odd, or moved while the row was copied): such rows are read again, at first at
    once, then every half millisecond (an owner descheduled in the middle of a fold), up to
    `tries` times (the program is never waited on: past that the last copy stands)."""
    got = np.empty_like(slots)
    todo = np.ones(len(slots), dtype=bool)
    for i in range(tries):
        before = slots["seq"][todo].copy()      # seq first, then the row, then seq again
        got[todo] = slots[todo]
        ok = (before % 2 == 0) & (slots["seq"][todo] == before)
        todo[np.flatnonzero(todo)[ok]] = False
        if not todo.any():
            break
        if i >= 10:
            time.sleep(0.0005)
    return got


# The size histogram from the sampled allocations (hs_hist_t): per usable-size class, sums
# of each sampled block's weight (1 / the probability it had to be sampled).
F8 = np.dtype("<f8")
HIST_DTYPE = np.dtype([
    ("alloc_w", F8, (CLASSES,)), ("live_w", F8, (CLASSES,)), ("waste_w", F8, (CLASSES,)),
    ("live_u_w", F8, (CLASSES,)), ("live_var", F8, (CLASSES,)), ("live_var_u", F8, (CLASSES,)),
    ("live_var_uu", F8, (CLASSES,)), ("live_samples", U8),
])

_HEADER_FIELDS = [
    ("magic", U8), ("version", U8), ("size_bytes", U8), ("slot_bytes", U8), ("max_slots", U8),
    ("n_classes", U8), ("owner_pid", U8), ("state", U8), ("execs", U8), ("forks", U8),
    ("foreign_attaches", U8), ("slots_used", U8), ("slot_overflows", U8), ("start_ns", U8),
    ("start_rss_bytes", U8), ("start_anon_bytes", U8), ("live_usable_bytes", I8),
    ("peak_usable_bytes", U8), ("peak_ns", U8), ("allocator_id", U8), ("allocator_name", "S32"),
    ("usable_by_header", U8), ("helper_mallocs", U8),
    ("exit_ns", U8), ("release_ns", U8), ("exit_rss_before", U8),
    ("exit_rss_after", U8), ("exit_anon_before", U8), ("exit_anon_after", U8),
    ("exit_release_kind", U8), ("exit_stats_before", STATS_DTYPE),
    ("exit_stats_after", STATS_DTYPE), ("slots_offset", U8), ("creator_pid", U8),
    ("image", "S128"), ("exit_probe_status", U8), ("library_threads", U8),
    ("library_cpu_ns", U8), ("snapshot_seq", U8), ("snapshot_ack", U8),
    ("snapshot_label", "S64"), ("heapmap_seq", U8), ("heapmap_ack", U8),
    ("heapmap_at_exit", U8), ("mapped_at", U8), ("heapmap_exit_pid", U8),
    ("heapmap_copy_pid", U8),
    ("exit_done_ns", U8), ("slot_claims", U8), ("own_private_bytes", U8),
    ("glibc_main_arena", U8), ("glibc_arena_next_off", U8), ("glibc_arena_sysmem_off", U8),
    ("threads_seen", U8), ("seccomp_at_ns", U8),
    ("exit_begun_ns", U8), ("exit_begun_how", U8), ("py_finalizing_addr", U8),
    ("owners", OWNER_DTYPE, (MAX_OWNERS,)), ("hist", HIST_DTYPE),
]
HEADER_DTYPE = np.dtype(_HEADER_FIELDS)
# The counters summed over the slots every reading.
_SCALARS = ("n_alloc", "n_free", "req_alloc_bytes", "n_realloc", "n_large", "n_mmapped")
SLOTS_OFFSET = (HEADER_DTYPE.itemsize + 63) // 64 * 64
# Sampled allocations and their stacks (hs_profile_t), after the slots on a page boundary:
# a header page, then the tables, as many as the file's size says (its room, heapsight.h);
# left out of the file when the run samples nothing (SEGMENT_BASE_BYTES).
PROFILE_MAGIC = 0x31464f5250534853
STATS_UNKNOWN = (1 << 64) - 1   # hs_alloc_stats_t: a figure that needs a walk, not taken
PROFILE_TABLES = 4096           # within the profile: the tables start a page in
EVENTS_UNIT, WORDS_UNIT, MODULES_UNIT = 1 << 15, 1 << 16, 512
ROOM_DEFAULT, ROOM_SMALL, ROOM_MAX = 8, 1, 16
SHM_SHARE = 4   # a segment takes at most a quarter of /dev/shm's free space
EVENT_EMPTY, EVENT_ALLOC, EVENT_FREE, EVENT_MAP = 0, 1, 2, 3
EVENT_DTYPE = np.dtype([("addr", U8), ("size", U8), ("time_ns", U8), ("stack", "<u4"),
                        ("kind", "<u4")])
MODULE_DTYPE = np.dtype([("lo", U8), ("hi", U8), ("bias", U8), ("first_event", U8),
                         ("path", "S224")])
PROFILE_HEADER_DTYPE = np.dtype([
    ("magic", U8), ("mean_bytes", U8), ("events_used", U8), ("stack_words_used", U8),
    ("modules_used", U8), ("dropped_samples", U8), ("unwind_ns", U8), ("unwinds", U8),
    ("unwind_frames", U8), ("interp_kind", U8), ("interp_status", U8), ("interp_version", U8),
    ("interp_ns", U8), ("interp_walks", U8), ("interp_frames", U8), ("unwind_cached", U8),
    ("unwind_checked", U8), ("unwind_mismatches", U8),
])
UNIT_BYTES = EVENTS_UNIT * EVENT_DTYPE.itemsize + WORDS_UNIT * 8 + MODULES_UNIT * MODULE_DTYPE.itemsize
PROFILE_OFFSET = (SLOTS_OFFSET + MAX_SLOTS * SLOT_DTYPE.itemsize + 4095) // 4096 * 4096
SEGMENT_BASE_BYTES = PROFILE_OFFSET   # the file without the profile's tables


@dataclass(frozen=True)
class ProfileLayout:
    """The profile's tables in a segment of one room: their lengths, and their offsets from
    the profile's start."""
    room: int
    events: int
    stack_words: int
    modules: int
    events_offset: int
    stacks_offset: int
    modules_offset: int


def profile_room() -> int:
    """The profile's room for a run: the default, or the least when the program will have
    an address-space limit (it inherits heapsight's), which the segment's mapping counts
    against."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return ROOM_DEFAULT if soft == resource.RLIM_INFINITY else ROOM_SMALL


def segment_bytes(room: int) -> int:
    """The size of a segment file whose profile has this room (0: no profile)."""
    return PROFILE_OFFSET + PROFILE_TABLES + room * UNIT_BYTES if room else SEGMENT_BASE_BYTES


def profile_layout(size_bytes: int) -> ProfileLayout | None:
    """The tables of a segment file of this size; None when it has no profile."""
    for room in range(1, ROOM_MAX + 1):
        if segment_bytes(room) == size_bytes:
            ev, words = room * EVENTS_UNIT, room * WORDS_UNIT
            stacks = PROFILE_TABLES + ev * EVENT_DTYPE.itemsize
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
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def open_pagemap(pid: int) -> int | None:
    """/proc/PID/pagemap, to read which of the segment's pages the program has resident;
    None when it cannot be opened (Segment.resident_in_owner then counts what was written)."""
    try:
        return os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None

# glibc's usable size for a class's smallest member, used to name histogram classes.
def class_floor_bytes(c: int) -> int:
    if c < 64:
        return c * 16
    e = 10 + (c - 64) // 8
    return (1 << e) + ((c - 64) % 8) * (1 << (e - 3))


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

    @property
    def waste_bytes(self) -> int:
        return self.live_usable_bytes - self.live_requested_bytes


def _shm_dir() -> str:
    if os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    import tempfile   # only here: it costs every start 2 ms
    return tempfile.gettempdir()


def segment_dir() -> str:
    """Where a run's segment file is made."""
    return _shm_dir()


# A leftover that never got its size may be a segment being made (its creator locks it
# just after creating it): it is judged stale only when older than this.
EMPTY_GRACE_S = 60.0
AUTO_GRACE_S = 5.0   # a process's own segment, made this recently, may not be mapped yet


def remove_stale_segments() -> None:
    """Segments of heapsight processes of ours that died without cleaning up (kill -9),
    and their heap maps. A segment is stale when its flock can be taken: its creator holds
    one for the run's whole life (Segment), and the kernel drops it when the creator dies,
    whatever PID namespace anyone is in (a pid is not proof: inside `unshare -p` the host's
    runs all look dead). Another user's files, ones we cannot remove, and the segments a
    process makes for itself (HEAPSIGHT_SEGMENT=auto: no heapsight process holds those) are
    left alone."""
    shm, uid = _shm_dir(), os.geteuid()
    try:
        names = os.listdir(shm)
    except OSError:
        return
    for name in fnmatch.filter(names, "heapsight-*-*.seg"):
        p = os.path.join(shm, name)
        if not name.endswith("-auto.seg") and _ours(p, uid) and _stale(p):
            for m in fnmatch.filter(names, name + ".map.*"):
                _remove(os.path.join(shm, m), uid)
        elif name.endswith("-auto.seg") and _ours(p, uid) and _auto_gone(p, name):
            _remove(p, uid)
    # maps whose segment is gone, and maps an exit copy left half written (heapmap.c)
    for kind in (".seg.map.", ".seg.part-map."):
        for m in fnmatch.filter(names, f"heapsight-*-*{kind}*"):
            seg = m.split(kind, 1)[0]
            if not seg.endswith("-auto") and not os.path.exists(os.path.join(shm, seg + ".seg")):
                _remove(os.path.join(shm, m), uid)


def _auto_gone(p: str, name: str) -> bool:
    """Whether a segment a process made for itself (HEAPSIGHT_SEGMENT=auto, named by its
    pid) has outlived it: no process of that pid maps the file any more (it was killed, or
    ended). One made in the last few seconds is left (its process may be starting)."""
    try:
        pid = int(name[len("heapsight-"):-len("-auto.seg")])
        st = os.lstat(p)
    except (ValueError, OSError):
        return False
    if time.time() - st.st_mtime < AUTO_GRACE_S:
        return False
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return os.fsencode(p) not in f.read()
    except FileNotFoundError:
        return True
    except OSError:   # not ours to read: not known to be gone
        return False


def _ours(p: str, uid: int) -> bool:
    try:
        st = os.lstat(p)
    except OSError:
        return False
    return st.st_uid == uid and stat.S_ISREG(st.st_mode)


def _remove(p: str, uid: int) -> None:
    if _ours(p, uid):
        try:
            os.unlink(p)
        except OSError:
            pass


def _stale(p: str) -> bool:
    """Removes p if no process holds its lock; whether it did. The size is read under our
    lock: the creator locks before it sizes the file, so a sized, unlocked file is one
    whose creator has gone."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st = os.fstat(fd)
        if st.st_size == 0 and time.time() - st.st_mtime < EMPTY_GRACE_S:
            return False
        now = os.lstat(p)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        os.unlink(p)
        return True
    except OSError:   # held (BlockingIOError), or not ours to remove
        return False
    finally:
        os.close(fd)


class Segment:
    """A segment file this process created for one run; removed by close()."""

    def __init__(self, existing: str | None = None, profile: bool = True,
                 owner_uid: int | None = None) -> None:
        """A new segment for a run (without the profile's tables when profile is False: the
        run samples nothing); or, with existing, the segment a running process made for
        itself (HEAPSIGHT_SEGMENT=auto), mapped to read (and never removed here).
        A new one's pages are reserved at once: OSError (ENOSPC) if /dev/shm has no room."""
        if existing is not None:
            self._open_existing(existing, owner_uid)
            return
        remove_stale_segments()
        rooms = [profile_room()] if profile else [0]
        if rooms[0] > ROOM_SMALL:
            rooms.append(ROOM_SMALL)   # a /dev/shm without room for the default: the least
        rooms = self._rooms_that_leave_room(rooms)
        for room in rooms:
            try:
                self._create(segment_bytes(room))
                return
            except OSError as e:
                if e.errno != errno.ENOSPC or room == rooms[-1]:
                    raise

    room_note = ""   # why the segment is smaller than the default, when it is

    def _rooms_that_leave_room(self, rooms: list) -> list:
        """The rooms whose segment takes at most 1/SHM_SHARE of what /dev/shm has free: a
        program that fills a small /dev/shm itself (Docker's is 64 MiB) must find the room
        it has bare (a tmpfs page it cannot get is a SIGBUS). The smallest, without call
        sites if need be; none (ENOSPC) when even that does not fit."""
        try:
            st = os.statvfs(_shm_dir())
            free = st.f_bavail * st.f_frsize
        except OSError:
            return rooms
        fits = [r for r in rooms if segment_bytes(r) * SHM_SHARE <= free]
        if not fits and segment_bytes(0) * SHM_SHARE <= free:
            fits = [0]
        if not fits:
            raise OSError(errno.ENOSPC, f"{_shm_dir()} has {free >> 10} KiB free, too little to "
                                        "share with the program")
        if fits[0] != rooms[0]:
            self.room_note = (f"{_shm_dir()} has {free / 2**20:.1f} MiB free: heapsight's segment "
                              f"is {segment_bytes(fits[0]) / 2**20:.1f} MiB, not "
                              f"{segment_bytes(rooms[0]) / 2**20:.1f}, to leave the program its room"
                              + ("; no call sites are sampled" if fits[0] == 0 else
                                 "; fewer call sites are kept"))
        return fits

    def _create(self, size: int) -> None:
        self.path = os.path.join(_shm_dir(), f"heapsight-{os.getpid()}-{os.urandom(6).hex()}.seg")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        # held until close(), before the file has its size: what remove_stale_segments asks
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._lock_fd = os.dup(fd)
        try:
            os.fchmod(fd, 0o600)  # exactly: a umask such as 0277 would leave it read-only
            # reserved, not only sized: a tmpfs page that cannot be had at the library's
            # first write to it would kill the program with SIGBUS
            os.posix_fallocate(fd, 0, size)
            # what the library checks before it writes a byte (native/src/segment.c)
            head = np.zeros((), HEADER_DTYPE)
            head["magic"], head["version"], head["size_bytes"] = CREATED, VERSION, size
            head["creator_pid"] = os.getpid()
            os.pwrite(fd, head.tobytes(), 0)
            # read, and written in one place: the answer to heapsight_snapshot (snapshot_ack)
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            fd = -1
            self.close()
            raise
        finally:
            if fd >= 0:
                os.close(fd)
        self.size_bytes = size
        self._views()

    def _open_existing(self, path: str, owner_uid: int | None = None) -> None:
        """A segment another process made: opened without following a link and without
        waiting (a FIFO planted there would hang the open), and taken only as a regular
        file of the right size owned by this user, root, or owner_uid (the process whose
        segment it is): in /dev/shm anyone can put a file at a name another will read."""
        self.path, self.owned = path, False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_size != SEGMENT_BASE_BYTES and
                                                 profile_layout(st.st_size) is None):
                raise ValueError(f"{path} is not a segment of this heapsight (size {st.st_size})")
            if st.st_uid not in (os.geteuid(), 0, owner_uid):
                raise ValueError(f"{path} belongs to another user (uid {st.st_uid}): not read")
            self._map = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ)
            self.size_bytes = st.st_size
        finally:
            os.close(fd)
        self._views()
        if int(self.header["version"]) != VERSION:
            raise ValueError(f"{path} was made by another heapsight (segment version "
                             f"{int(self.header['version'])}, this one reads {VERSION})")

    def _views(self) -> None:
        self.header = np.ndarray((), HEADER_DTYPE, buffer=self._map, offset=0)
        self.slots = np.ndarray((MAX_SLOTS,), SLOT_DTYPE, buffer=self._map, offset=SLOTS_OFFSET)

    owned = True
    _lock_fd = -1

    def close(self) -> None:
        if not self.owned:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        if self._lock_fd >= 0:   # after the unlink: the file is never seen unlocked
            os.close(self._lock_fd)
            self._lock_fd = -1

    # -- reading -----------------------------------------------------------------------
    def attached(self) -> bool:
        return int(self.header["magic"]) == MAGIC and int(self.header["owner_pid"]) != 0

    def get(self, name: str) -> int:
        return int(self.header[name])

    def owners(self) -> list:
        """The objects that mapped anonymous memory themselves (mmap outside malloc): name,
        mapped now, peak, mmap calls; largest peak first."""
        out = []
        for o in self.header["owners"]:
            if int(o["base"]):
                out.append({"object": bytes(o["name"]).split(b"\0")[0].decode(errors="replace"),
                            "mapped_bytes": max(0, int(o["mapped_bytes"])),
                            "peak_bytes": int(o["peak_bytes"]), "mappings": int(o["mappings"])})
        return sorted(out, key=lambda o: -o["peak_bytes"])

    def snapshot_request(self, seen: int) -> tuple | None:
        """(seq, label) of the program's latest heapsight_snapshot() call after seq seen."""
        seq = int(self.header["snapshot_seq"])
        if seq <= seen:
            return None
        label = bytes(self.header["snapshot_label"]).split(b"\0")[0].decode(errors="replace")
        return seq, label or f"heapsight_snapshot #{seq}"

    def ack_snapshot(self, seq: int) -> None:
        """Tells the program's heapsight_snapshot() that its sample was taken."""
        self.header["snapshot_ack"] = seq

    def image(self) -> str:
        """The executable that attached (its last 127 bytes)."""
        return bytes(self.header["image"]).split(b"\0")[0].decode(errors="surrogateescape")

    def resident_in_owner(self, pagemap_fd: int | None) -> int:
        """heapsight's own bytes in the program's RSS: the pages of this segment present in
        its owner's page tables (/proc/PID/pagemap, bit 63, over the range the library
        mapped it at), which is exact whatever touched them (the kernel maps neighbouring
        pages on a read fault). When pagemap cannot be read, the pages the library has
        written: the header, the slots used and the used parts of the profile."""
        addr, page = int(self.header["mapped_at"]), PAGE_BYTES
        n = self.size_bytes // page
        if pagemap_fd is not None and addr:
            try:
                raw = os.pread(pagemap_fd, n * 8, addr // page * 8)
            except OSError:
                raw = b""
            if len(raw) == n * 8:
                # present (bit 63) and a shared page (61): the segment's, not anonymous
                # memory of an image that replaced it
                e = np.frombuffer(raw, "<u8") >> np.uint64(61)
                return int(np.count_nonzero((e & np.uint64(5)) == 5)) * page
        return self.written_bytes() if addr else 0

    def written_bytes(self) -> int:
        """The bytes of the pages the library writes in the program: the header, the slots
        up to the last one used, and the used parts of the profile's regions."""
        pages = lambda lo, hi: (hi + PAGE_BYTES - 1) // PAGE_BYTES - lo // PAGE_BYTES if hi > lo else 0
        n = pages(0, SLOTS_OFFSET + (self._used() + 1) * SLOT_DTYPE.itemsize)
        lay = profile_layout(self.size_bytes)
        if lay is not None:
            head = np.frombuffer(self._map, PROFILE_HEADER_DTYPE, count=1, offset=PROFILE_OFFSET)[0]
            if int(head["magic"]) == PROFILE_MAGIC:
                base = PROFILE_OFFSET
                n += 1 + pages(base + lay.events_offset, base + lay.events_offset +
                               min(int(head["events_used"]), lay.events) * EVENT_DTYPE.itemsize)
                n += pages(base + lay.stacks_offset, base + lay.stacks_offset +
                           min(int(head["stack_words_used"]), lay.stack_words) * 8)
                n += pages(base + lay.modules_offset, base + lay.modules_offset +
                           min(int(head["modules_used"]), lay.modules) * MODULE_DTYPE.itemsize)
        return n * PAGE_BYTES

    def allocator_name(self) -> str:
        return bytes(self.header["allocator_name"]).split(b"\0")[0].decode() or "unknown"

    def _used(self) -> int:
        return min(MAX_SLOTS, max(1, int(self.header["slots_used"])))

    def counters(self) -> HeapCounters:
        """Totals over the slots, exact but for the live requested bytes: estimated from the
        sampled size histogram (live_waste, docs/numbers.md)."""
        s = settled(self.slots[:self._used()])
        f = {name: int(s[name].sum(dtype=np.uint64)) for name in _SCALARS}
        alloc, freed = slot_usable(s)
        f["usable_alloc_bytes"] = int(alloc.sum(dtype=np.uint64))
        f["usable_free_bytes"] = int(freed.sum(dtype=np.uint64))
        # Frees of blocks the hooks never saw allocated (a library that reached malloc past
        # them) would make live figures negative: never publish an impossible count.
        live_usable = max(0, f["usable_alloc_bytes"] - f["usable_free_bytes"])
        waste, error = live_waste(self.header["hist"], live_usable, f["usable_alloc_bytes"],
                                  f["req_alloc_bytes"])
        return HeapCounters(f["n_alloc"], f["n_free"], f["req_alloc_bytes"], live_usable,
                            live_usable - waste, max(0, f["n_alloc"] - f["n_free"]),
                            f["n_mmapped"], f["n_large"], error)

    def mmapped_chunk_bytes(self) -> int:
        """glibc's chunks served by their own mmap, live now (mallinfo2's hblkhd, counted
        by the hooks): the slots' sums, as native/src/counters.c's _hs_mmapped_chunk_bytes."""
        s = self.slots[:self._used()]
        alloc = int(s["mmapped_alloc_bytes"].sum(dtype=np.uint64))
        freed = int(s["mmapped_free_bytes"].sum(dtype=np.uint64))
        return max(0, alloc - freed)

    def size_classes(self) -> list:
        """The size histogram, estimated from the sampled allocations: per usable-size class
        sampled, (smallest usable size of the class, allocations, blocks live now, mean
        bytes wasted per block, the live blocks' standard error)."""
        h = self.header["hist"]
        alloc_w, live_w, waste_w, var = (np.array(h[k], dtype=np.float64)
                                         for k in ("alloc_w", "live_w", "waste_w", "live_var"))
        out = []
        for c in np.flatnonzero(alloc_w > 0).tolist():
            out.append((class_floor_bytes(c), int(round(alloc_w[c])), int(round(max(0.0, live_w[c]))),
                        round(float(waste_w[c] / alloc_w[c]), 2), int(round(max(0.0, var[c]) ** 0.5))))
        return out

    def alloc_stats(self, field: str) -> AllocStats | None:
        """The allocator's figures the exit probe took (field: exit_stats_before or
        exit_stats_after; written once, before the state is DONE), or None when it did not
        take them (exit_probe_why_not says why)."""
        rec = self.header[field].copy()
        if int(rec["time_ns"]) == 0:
            return None
        return AllocStats.from_record(rec)

    def exit_probe_why_not(self) -> str:
        """Why the exit figures and the release were not measured though the program ran
        its exit handlers (exit_probe_status), or "" when they were or it did not."""
        if int(self.header["state"]) != STATE_DONE:
            return ""
        return PROBE_WHY_NOT.get(int(self.header["exit_probe_status"]), "")
