"""The native part on its own: the segment layout both sides agree on, and the counters
hammered from more threads than there are slots."""

import json
import math
import subprocess

from conftest import scenario
from heapsight import native, segment as S


def test_layout_matches_the_compiler():
    layout = json.loads(subprocess.run([scenario("hs-layout")], capture_output=True, text=True,
                                       check=True).stdout)
    assert layout["segment_bytes"] == S.PROFILE_OFFSET + S.PROFILE_TABLES
    # the file's size says the profile's room: both sides size every room alike
    assert layout["segment_bytes_by_room"] == [S.segment_bytes(k) for k in range(S.ROOM_MAX + 1)]
    assert (layout["profile_tables"], layout["profile_unit_bytes"], layout["room_default"]) == (
        S.PROFILE_TABLES, S.UNIT_BYTES, S.ROOM_DEFAULT)
    assert layout["unit"] == [S.EVENTS_UNIT, S.WORDS_UNIT, S.MODULES_UNIT]
    assert layout["slot_bytes"] == S.SLOT_DTYPE.itemsize
    assert layout["stats_bytes"] == S.STATS_DTYPE.itemsize
    assert layout["classes"] == S.CLASSES
    assert (layout["block_extra"], layout["flush_total_bytes"]) == (S.BLOCK_EXTRA,
                                                                   S.FLUSH_TOTAL_BYTES)
    assert (layout["map_limit_s"], layout["probe_limit_s"]) == (S.MAP_LIMIT_S, S.PROBE_LIMIT_S)
    for name, (offset, size) in layout["segment"].items():
        if name == "slots":
            assert offset == S.SLOTS_OFFSET
            continue
        if name == "profile":
            assert (offset, size) == (S.PROFILE_OFFSET, S.PROFILE_HEADER_DTYPE.itemsize)
            continue
        dtype, py_offset = S.HEADER_DTYPE.fields[name][:2]
        assert (py_offset, dtype.itemsize) == (offset, size), name
    for name, (offset, size) in layout["slot"].items():
        dtype, py_offset = S.SLOT_DTYPE.fields[name][:2]
        assert (py_offset, dtype.itemsize) == (offset, size), name
    assert (layout["event_bytes"], layout["module_bytes"]) == (
        S.EVENT_DTYPE.itemsize, S.MODULE_DTYPE.itemsize)
    for name, (offset, size) in layout["profile"].items():
        dtype, py_offset = S.PROFILE_HEADER_DTYPE.fields[name][:2]
        assert (py_offset, dtype.itemsize) == (offset, size), name
    for name, (offset, size) in layout["stats"].items():
        dtype, py_offset = S.STATS_DTYPE.fields[name][:2]
        assert (py_offset, dtype.itemsize) == (offset, size), name


def test_counters_exact_under_300_threads():
    p = subprocess.run([scenario("hs-test-counters")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "7 passed, 0 failed" in p.stdout


def test_size_class_floors_match_hs_class_of():
    # GIVEN each class's smallest usable size as Python names it (segment.class_floor_bytes)
    floors = [S.class_floor_bytes(c) for c in range(S.CLASSES)]
    assert all(a < b for a, b in zip(floors, floors[1:]))
    # WHEN the C function the counters use classifies it, and the byte below it
    sizes = [f for f in floors] + [f - 1 for f in floors[1:]]
    got = subprocess.run([scenario("hs-class-of"), *map(str, sizes)], capture_output=True,
                         text=True, check=True).stdout.split()
    classes = list(map(int, got))
    # THEN the floor is in its class and the byte below it in the class before
    assert classes[:S.CLASSES] == list(range(S.CLASSES))
    assert classes[S.CLASSES:] == list(range(S.CLASSES - 1))


def test_the_librarys_log_and_expm1_are_libms():
    # GIVEN arguments over the ranges the sampling uses: the uniform draw in (0, 1] (down to
    # 2^-53), and usable / mean from a byte of 512 KiB to far past 1
    xs = [2.0 ** -e for e in range(0, 54)] + [i / 997 for i in range(1, 997)] + \
         [10 ** (k / 8) for k in range(-56, 30)] + [1 / 524288, 0.5, 0.35, 700, 745, 800, 5e-324]
    got = subprocess.run([scenario("hs-math"), *map(repr, xs)], capture_output=True,
                         text=True, check=True).stdout.split("\n")
    # THEN each is libm's to within a few units in the last place
    for x, line in zip(xs, got):
        log, em1 = map(float, line.split())
        assert math.isclose(log, math.log(x), rel_tol=1e-15, abs_tol=1e-300), (x, log)
        assert math.isclose(em1, math.expm1(-x), rel_tol=1e-15, abs_tol=1e-300), (x, em1)


def test_the_library_brings_no_libm_into_the_program():
    # (libm's pages were half a MiB of a C program's RSS that was heapsight's)
    needed = subprocess.run(["readelf", "-d", native.LIB], capture_output=True, text=True,
                            check=True).stdout
    assert "libm.so" not in needed
    assert "libgcc_s.so" in needed  # the unwinder: loaded with the library, never later
