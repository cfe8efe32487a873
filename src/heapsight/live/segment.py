"""The stats segment, live: the file in /dev/shm a run shares with the program (made,
locked and removed here; stale ones of dead runs removed), and its reader, which the
sampler calls every tick. The layout it reads is heapsight.layout's."""

from __future__ import annotations

import ctypes
import errno
import fnmatch
import fcntl
import mmap
import os
import resource
import stat
import struct
import time

from heapsight.layout import (CREATED, EVENT_BYTES, HEADER_AT, HEADER_BYTES, MAGIC, MAX_SLOTS,
                              MODULE_BYTES, OWNER_FIELDS, PROBE_WHY_NOT, PROFILE_HEADER_FIELDS,
                              PROFILE_MAGIC, PROFILE_OFFSET, ROOM_DEFAULT, ROOM_SMALL,
                              SEGMENT_BASE_BYTES, SLOT_BYTES, SLOT_FIELDS, SLOTS_OFFSET,
                              STATE_DONE, SUMMED, VERSION, class_floor_bytes, itemsize, offsets,
                              profile_layout, segment_bytes, slot_usable)

# The segment is read without numpy while the program runs (the run starts it before
# numpy is imported): its header's scalars and strings, a few of each slot's and owner's
# fields, by their offsets (heapsight.layout); the rest (the slots as a table, the size
# histogram, the profile) through numpy, imported then.
_SCALAR = {"<u8": "<Q", "<i8": "<q", "<f8": "<d", "<u4": "<I"}
_OWNER_AT, _OWNER_BYTES = offsets(OWNER_FIELDS), itemsize(OWNER_FIELDS)
_SLOT_AT = offsets(SLOT_FIELDS)
_PROFILE_AT = offsets(PROFILE_HEADER_FIELDS)


class FieldsView:
    """A struct's scalar and string fields in place, by their offsets (layout.offsets):
    scalars as ints, strings as bytes without their trailing NULs, as numpy's structured
    views read them, without numpy."""

    def __init__(self, buf, base: int, at: dict) -> None:
        self._buf, self._base, self._at = buf, base, at

    def __getitem__(self, name: str):
        at, kind, shape = self._at[name]
        if shape or not isinstance(kind, str):
            raise KeyError(f"{name} is a record: read it through numpy")
        at += self._base
        if kind in _SCALAR:
            return struct.unpack_from(_SCALAR[kind], self._buf, at)[0]
        return bytes(self._buf[at:at + itemsize(kind)]).rstrip(b"\0")


class HeaderView(FieldsView):
    """The segment's header in place: its scalars and strings read (and its scalars
    written) without numpy; its records (the owners, the histogram, the allocator's
    statistics) through numpy's view of it."""

    def __init__(self, buf) -> None:
        super().__init__(buf, 0, HEADER_AT)
        self._np = None

    def __getitem__(self, name: str):
        _, kind, shape = HEADER_AT[name]
        return self.view()[name] if shape or not isinstance(kind, str) else super().__getitem__(name)

    def __setitem__(self, name: str, value) -> None:
        at, kind, shape = HEADER_AT[name]
        if shape or kind not in _SCALAR:
            self.view()[name] = value
            return
        struct.pack_into(_SCALAR[kind], self._buf, at, value)

    def view(self):
        """numpy's structured view of the whole header."""
        if self._np is None:
            import numpy as np
            from heapsight.layout import HEADER_DTYPE
            self._np = np.ndarray((), HEADER_DTYPE, buffer=self._buf, offset=0)
        return self._np


def settled(slots, tries: int = 100):
    """A copy of the slots in which no row was read while its owner was folding a countdown
    in (seq odd, or moved while the row was copied): such rows are read again, at first at
    once, then every half millisecond (an owner descheduled in the middle of a fold), up to
    `tries` times (the program is never waited on: past that the last copy stands)."""
    import numpy as np
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


SHM_SHARE = 4   # a segment takes at most a quarter of /dev/shm's free space
def profile_room() -> int:
    """The profile's room for a run: the default, or the least when the program will have
    an address-space limit (it inherits heapsight's), which the segment's mapping counts
    against."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return ROOM_DEFAULT if soft == resource.RLIM_INFINITY else ROOM_SMALL


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# a pagemap entry's top byte -> 1 when it says present (bit 63) and shared (bit 61)
_PRESENT_SHARED = bytes(1 if b & 0xa0 == 0xa0 else 0 for b in range(256))


def open_pagemap(pid: int) -> int | None:
    """/proc/PID/pagemap, to read which of the segment's pages the program has resident;
    None when it cannot be opened (Segment.resident_in_owner then counts what was written)."""
    try:
        return os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None

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
            head = bytearray(HEADER_BYTES)
            for name, value in (("magic", CREATED), ("version", VERSION), ("size_bytes", size),
                                ("creator_pid", os.getpid())):
                struct.pack_into("<Q", head, HEADER_AT[name][0], value)
            os.pwrite(fd, bytes(head), 0)
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
        self.header = HeaderView(self._map)

    @property
    def slots(self):
        """The slots as numpy's table (numpy imported on first use)."""
        if self._slots is None:
            import numpy as np
            from heapsight.layout import SLOT_DTYPE
            self._slots = np.ndarray((MAX_SLOTS,), SLOT_DTYPE, buffer=self._map, offset=SLOTS_OFFSET)
        return self._slots

    _slots = None

    def address(self) -> int:
        """Where the segment is mapped in this process, for the C reader (libhsread)."""
        if self._anchor is None:
            try:
                self._anchor = ctypes.c_char.from_buffer(self._map)
                self._address = ctypes.addressof(self._anchor)
            except TypeError:   # mapped read-only (another process's segment): numpy's view
                import numpy as np
                self._anchor = np.frombuffer(self._map, dtype=np.uint8)
                self._address = self._anchor.ctypes.data
        return self._address

    _anchor = None

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
        out, first, count = [], HEADER_AT["owners"][0], HEADER_AT["owners"][2][0]
        for o in (FieldsView(self._map, first + i * _OWNER_BYTES, _OWNER_AT) for i in range(count)):
            if o["base"]:
                out.append({"object": o["name"].split(b"\0")[0].decode(errors="replace"),
                            "mapped_bytes": max(0, o["mapped_bytes"]),
                            "peak_bytes": o["peak_bytes"], "mappings": o["mappings"]})
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
                # memory of an image that replaced it (each entry's top byte, bits 7 and 5)
                return raw[7::8].translate(_PRESENT_SHARED).count(1) * page
        return self.written_bytes() if addr else 0

    def written_bytes(self) -> int:
        """The bytes of the pages the library writes in the program: the header, the slots
        up to the last one used, and the used parts of the profile's regions."""
        pages = lambda lo, hi: (hi + PAGE_BYTES - 1) // PAGE_BYTES - lo // PAGE_BYTES if hi > lo else 0
        n = pages(0, SLOTS_OFFSET + (self._used() + 1) * SLOT_BYTES)
        lay = profile_layout(self.size_bytes)
        if lay is not None:
            head = FieldsView(self._map, PROFILE_OFFSET, _PROFILE_AT)
            if head["magic"] == PROFILE_MAGIC:
                base = PROFILE_OFFSET
                n += 1 + pages(base + lay.events_offset, base + lay.events_offset +
                               min(head["events_used"], lay.events) * EVENT_BYTES)
                n += pages(base + lay.stacks_offset, base + lay.stacks_offset +
                           min(head["stack_words_used"], lay.stack_words) * 8)
                n += pages(base + lay.modules_offset, base + lay.modules_offset +
                           min(head["modules_used"], lay.modules) * MODULE_BYTES)
        return n * PAGE_BYTES

    def allocator_name(self) -> str:
        return bytes(self.header["allocator_name"]).split(b"\0")[0].decode() or "unknown"

    def allocator_version(self) -> str:
        return bytes(self.header["allocator_version"]).split(b"\0")[0].decode(errors="replace")

    def malloc_elsewhere(self) -> str:
        """The object whose malloc the program's calls reach when it is not heapsight's
        (an executable with an allocator of its own), "" when heapsight's is reached."""
        return bytes(self.header["malloc_elsewhere"]).split(b"\0")[0].decode(errors="surrogateescape")

    def _used(self) -> int:
        return min(MAX_SLOTS, max(1, int(self.header["slots_used"])))

    def counters(self):
        """Totals over the slots, exact but for the live requested bytes: estimated from the
        sampled size histogram (live_waste, docs/numbers.md)."""
        import numpy as np
        from heapsight.analysis import live_waste
        from heapsight.model import HeapCounters
        s = settled(self.slots[:self._used()])
        f = {name: int(s[name].sum(dtype=np.uint64)) for name in SUMMED}
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
                            f["n_mmapped"], f["n_large"], error, f["usable_free_bytes"])

    def mmapped_chunk_bytes(self) -> int:
        """glibc's chunks served by their own mmap, live now (mallinfo2's hblkhd, counted
        by the hooks): the slots' sums, as native/src/counters.c's _hs_mmapped_chunk_bytes."""
        slots = [FieldsView(self._map, SLOTS_OFFSET + i * SLOT_BYTES, _SLOT_AT)
                 for i in range(self._used())]
        return max(0, sum(s["mmapped_alloc_bytes"] - s["mmapped_free_bytes"] for s in slots))

    def size_classes(self) -> list:
        """The size histogram, estimated from the sampled allocations: per usable-size class
        sampled, (smallest usable size of the class, allocations, blocks live now, mean
        bytes wasted per block, the live blocks' standard error)."""
        import numpy as np
        h = self.header["hist"]
        alloc_w, live_w, waste_w, var = (np.array(h[k], dtype=np.float64)
                                         for k in ("alloc_w", "live_w", "waste_w", "live_var"))
        out = []
        for c in np.flatnonzero(alloc_w > 0).tolist():
            out.append((class_floor_bytes(c), int(round(alloc_w[c])), int(round(max(0.0, live_w[c]))),
                        round(float(waste_w[c] / alloc_w[c]), 2), int(round(max(0.0, var[c]) ** 0.5))))
        return out

    def alloc_stats(self, field: str):
        """The allocator's figures the exit probe took (field: exit_stats_before or
        exit_stats_after; written once, before the state is DONE), or None when it did not
        take them (exit_probe_why_not says why)."""
        from heapsight.model import AllocStats
        rec = self.header[field].copy()
        if int(rec["time_ns"]) == 0:
            return None
        return AllocStats.from_record(rec)

    def profile(self):
        """The sampled allocations (profile.decode of the tables the library wrote), or None
        when it never set them up (an older library, a static program, a program that never
        started) or sampling was off. Read from the file, once the program has ended."""
        from heapsight.layout import EVENT_DTYPE, MODULE_DTYPE, PROFILE_HEADER_DTYPE
        from heapsight.profile import decode as decode_profile
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            lay = profile_layout(os.fstat(fd).st_size)
            if lay is None:   # made without the profile's tables: the run sampled nothing
                return None
            head = _region(fd, 0, PROFILE_HEADER_DTYPE, 1)
            if len(head) != 1 or int(head["magic"][0]) != PROFILE_MAGIC:
                return None
            h = {k: int(head[k][0]) for k in PROFILE_HEADER_DTYPE.names}
            events = _region(fd, lay.events_offset, EVENT_DTYPE, min(h["events_used"], lay.events))
            words = _region(fd, lay.stacks_offset, "<u8", min(h["stack_words_used"], lay.stack_words))
            mods = _region(fd, lay.modules_offset, MODULE_DTYPE, min(h["modules_used"], lay.modules))
            return decode_profile(h, events, words, mods)
        finally:
            os.close(fd)

    def reading(self):
        """The segment's figures, once, as the capture keeps them (summarize reads them)."""
        import dataclasses
        from heapsight.capture import HEADER_FIELDS, Reading, stats_json
        scalars = {name: int(self.header[name]) for name in HEADER_FIELDS}
        attached = self.attached()
        stats = {"exit_stats_before": stats_json(self.alloc_stats("exit_stats_before"))}
        return Reading({
            "header": scalars, "attached": attached, "image": self.image(),
            "allocator_name": self.allocator_name(),
            "allocator_version": self.allocator_version(),
            "malloc_elsewhere": self.malloc_elsewhere(), "owners": self.owners(),
            "written_bytes": self.written_bytes() if attached else 0,
            "exit_probe_why_not": self.exit_probe_why_not(),
            "counters": dataclasses.asdict(self.counters()),
            "size_classes": [list(c) for c in self.size_classes()], "alloc_stats": stats})

    def exit_probe_why_not(self) -> str:
        """Why the exit figures and the release were not measured though the program ran
        its exit handlers (exit_probe_status), or "" when they were or it did not."""
        if int(self.header["state"]) != STATE_DONE:
            return ""
        return PROBE_WHY_NOT.get(int(self.header["exit_probe_status"]), "")


def _region(fd: int, offset: int, dtype, count: int):
    """count rows of dtype at offset from the profile's start."""
    import numpy as np
    want = count * np.dtype(dtype).itemsize
    raw = os.pread(fd, want, PROFILE_OFFSET + offset) if want else b""
    return np.frombuffer(raw, dtype=dtype, count=len(raw) // np.dtype(dtype).itemsize).copy()
