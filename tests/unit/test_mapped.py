"""mapped: the resident part of the memory a program mapped outside malloc, by the object
that mapped it, from the library's records of each mapping and smaps' resident bytes."""

import numpy as np

from heapsight import mapped
from heapsight.profile import ALLOC_DTYPE, NEVER, Module, Profile

MiB = 1 << 20
JVM, PY, HS = "/usr/lib/jvm/lib/server/libjvm.so", "/usr/bin/python3.11", "/x/libheapsight.so"


def prof(rows):
    """A profile whose mappings are rows of (addr, size, time_ns, free_ns, caller object);
    each stack holds a frame of heapsight's hook, then the caller's."""
    mods = (Module(0x1000, 0x2000, 0, 0, HS), Module(0x10000, 0x20000, 0, 0, JVM),
            Module(0x30000, 0x40000, 0, 0, PY))
    at = {JVM: 0x10010, PY: 0x30010}
    words = [0]
    maps = np.zeros(len(rows), ALLOC_DTYPE)
    for i, (addr, size, t, free, who) in enumerate(rows):
        maps[i] = (i, addr, size, t, len(words), free, 0)
        words += [2, 0x1010, at[who]]
    return Profile(1, np.zeros(0, ALLOC_DTYPE), 0, np.array(words, dtype=np.uint64), mods, 0,
                   maps=maps)


def test_a_commit_over_a_reservation_counts_once_for_the_later_mapping():
    # GIVEN a 1 GiB reservation, then 8 MiB committed over its start (MAP_FIXED), and a
    # pymalloc arena mapped elsewhere; one mapping already unmapped
    p = prof([(1 << 32, 1 << 30, 10, NEVER, JVM), (1 << 32, 8 * MiB, 20, NEVER, JVM),
              (1 << 40, 256 << 10, 30, NEVER, PY), (1 << 41, MiB, 5, 15, PY)])
    ranges = mapped.live_ranges(p, 25)
    # THEN the ranges are disjoint, named by the caller of mmap (not heapsight's hook)
    assert ranges == [(1 << 32, (1 << 32) + (1 << 30), JVM)]
    later = mapped.live_ranges(p, 40)
    assert [r[2] for r in later] == [JVM, PY] and sum(r[1] - r[0] for r in later) == \
        (1 << 30) + (256 << 10)
    # GIVEN smaps: the committed 8 MiB entry with 6 MiB resident, the rest of the
    # reservation with none, the arena fully resident, and a mapping no record names
    vmas = [(1 << 32, (1 << 32) + 8 * MiB, 6 * MiB), ((1 << 32) + 8 * MiB, (1 << 32) + (1 << 30), 0),
            (1 << 40, (1 << 40) + (256 << 10), 256 << 10), (1 << 45, (1 << 45) + MiB, MiB)]
    # THEN each object gets the resident bytes of its ranges only
    assert mapped.resident_by_object(later, vmas) == {JVM: 6 * MiB, PY: 256 << 10}


def test_a_range_gets_its_share_of_an_entry_it_half_covers():
    vmas = [(0, 4 * MiB, 2 * MiB)]
    assert mapped.resident_by_object([(0, 2 * MiB, JVM)], vmas) == {JVM: MiB}
    assert mapped.resident_by_object([], vmas) == {} and \
        mapped.resident_by_object([(0, 1, JVM)], []) == {}


def test_the_caller_is_the_first_frame_outside_heapsights_library_for_every_row_at_once():
    # stacks: the hook then the JVM; the hook only; none unwound; an address in no object
    # first (the caller is not known: ""); the hook, Python, then the JVM
    mods = (Module(0x1000, 0x2000, 0, 0, HS), Module(0x10000, 0x20000, 0, 0, JVM),
            Module(0x30000, 0x40000, 0, 0, PY))
    stacks = [[0x1010, 0x10010], [0x1010, 0x1020], [], [0x9999, 0x10010],
              [0x1010, 0x30010, 0x10010]]
    words, maps = [0], np.zeros(len(stacks), ALLOC_DTYPE)
    for i, s in enumerate(stacks):
        maps[i] = (i, 0x7f0000000000 + i * MiB, MiB, 1, len(words) if s else 0, NEVER, 0)
        words += [len(s), *s] if s else []
    p = Profile(1, np.zeros(0, ALLOC_DTYPE), 0, np.array(words, dtype=np.uint64), mods, 0,
                maps=maps)
    assert mapped.caller_modules(p, p.maps) == [JVM, "", "", "", PY]
    assert mapped.caller_modules(p, p.maps[2:3]) == [""]
