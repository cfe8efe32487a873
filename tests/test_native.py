"""The native part on its own: the segment layout both sides agree on, and the counters
hammered from more threads than there are slots."""

import math
import subprocess

import c_mirror
import numpy as np
from conftest import scenario
from heapsight import allocators, heapmap, layout as L, native


def test_the_segment_layout_is_the_compilers(tmp_path):
    # GIVEN every struct and constant heapsight.layout mirrors of heapsight.h
    rc, out, n = c_mirror.run(L.C_HEADER, L.C_STRUCTS, L.C_CONSTANTS, tmp_path, L.C_PARTIAL)
    # THEN the compiler lays out and values each alike (each field of each struct)
    assert rc == 0, out
    assert n > 250 and out.strip() == f"0 of {n} differ"
    # and the allocator catalogue's identities are heapsight.h's
    ids = {f"HS_ALLOC_{a.name.upper()}": a.segment_id for a in allocators.ALLOCATORS.values()}
    rc, out, _ = c_mirror.run(L.C_HEADER, {}, ids, tmp_path)
    assert rc == 0, out


def test_the_heap_map_files_layout_is_the_compilers(tmp_path):
    # GIVEN every struct and constant heapsight.heapmap mirrors of heapmap_file.h
    rc, out, n = c_mirror.run(heapmap.C_HEADER, heapmap.C_STRUCTS, heapmap.C_CONSTANTS, tmp_path)
    # THEN the compiler lays out and values each alike
    assert rc == 0, out
    assert n > 80 and out.strip() == f"0 of {n} differ"


def test_the_mirror_check_finds_a_field_out_of_place(tmp_path):
    # GIVEN the slot's dtype with two fields swapped, and a constant off by one
    names = list(L.SLOT_DTYPE.names)
    names[4], names[5] = names[5], names[4]
    swapped = np.dtype([(n, L.SLOT_DTYPE.fields[n][0]) for n in names])
    rc, out, _ = c_mirror.run(L.C_HEADER, {"hs_slot_t": swapped},
                              {"HS_MAX_SLOTS": L.MAX_SLOTS + 1}, tmp_path)
    # THEN each is named with both values
    assert rc != 0
    assert f"hs_slot_t.{names[4]}: offset: C says" in out
    assert f"HS_MAX_SLOTS: C says {L.MAX_SLOTS}, Python {L.MAX_SLOTS + 1}" in out
    # and a field only C has shows as a size (the slot without its last field)
    short = np.dtype([(n, L.SLOT_DTYPE.fields[n][0]) for n in L.SLOT_DTYPE.names[:-1]])
    rc, out, _ = c_mirror.run(L.C_HEADER, {"hs_slot_t": short}, {}, tmp_path)
    assert rc != 0 and "sizeof(hs_slot_t): C says" in out


def test_counters_exact_under_300_threads():
    p = subprocess.run([scenario("hs-test-counters")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "7 passed, 0 failed" in p.stdout


def test_the_marking_finds_each_word_s_block_as_a_search_of_every_block_does():
    # reach.c's index (runs of blocks, buckets) against a scan of every block: 120 layouts
    # like the heaps' (dense runs, big blocks, runs far apart, glibc's last-word rule and
    # the other allocators' blocks), 600,000 words inside, at the edges, between, outside
    p = subprocess.run([scenario("hs-test-reach-index")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "layouts=120 words=600000 mismatches=0" in p.stdout, p.stdout


def test_size_class_floors_match_hs_class_of():
    # GIVEN each class's smallest usable size as Python names it (segment.class_floor_bytes)
    floors = [L.class_floor_bytes(c) for c in range(L.CLASSES)]
    assert all(a < b for a, b in zip(floors, floors[1:]))
    # WHEN the C function the counters use classifies it, and the byte below it
    sizes = [f for f in floors] + [f - 1 for f in floors[1:]]
    got = subprocess.run([scenario("hs-class-of"), *map(str, sizes)], capture_output=True,
                         text=True, check=True).stdout.split()
    classes = list(map(int, got))
    # THEN the floor is in its class and the byte below it in the class before
    assert classes[:L.CLASSES] == list(range(L.CLASSES))
    assert classes[L.CLASSES:] == list(range(L.CLASSES - 1))


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
    # nor libgcc_s: the process that samples loads it before its main (test_exec_children.py)
    assert "libgcc_s.so" not in needed
