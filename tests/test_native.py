"""The native part on its own: the segment layout both sides agree on, and the counters
hammered from more threads than there are slots."""

import json
import subprocess

from conftest import scenario
from heapsight import segment as S


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
