"""Which anonymous mappings are thread stacks: the shape (an rw-p mapping right above a ---p
guard) is also the shape of other allocators' guarded regions (Chromium's PartitionAlloc
puts a 4 KiB guard below each 2 MiB super page: its browser process read "stacks 26.9 MiB"
against 668 KiB of real stacks), so the threads' stack pointers decide where they are read."""

from heapsight.mappings import Mapping, classify

KiB, MiB = 1 << 10, 1 << 20


def layout():
    """[stack], two thread stacks (8 MiB with a 4 KiB guard), four guarded 2 MiB regions."""
    maps, at = [], 0x7f0000000000
    for _ in range(2):   # thread stacks
        maps += [Mapping(at, at + 4 * KiB, "---p", ""),
                 Mapping(at + 4 * KiB, at + 8 * MiB + 4 * KiB, "rw-p", "", rss=64 * KiB)]
        at += 16 * MiB
    regions = 0x2d0c00000000
    for i in range(4):   # 2 MiB regions, each with a guard page below it
        lo = regions + i * 2 * MiB
        maps += [Mapping(lo, lo + 4 * KiB, "---p", ""),
                 Mapping(lo + 4 * KiB, lo + 2 * MiB, "rw-p", "", rss=2 * MiB - 4 * KiB)]
    maps.sort(key=lambda m: m.start)
    maps.append(Mapping(0x7ffd00000000, 0x7ffd00021000, "rw-p", "[stack]", rss=132 * KiB))
    return maps


def stacks(maps):
    return sum(m.rss for m in maps if m.kind == "stack")


def test_without_the_pointers_the_shape_alone_decides():
    maps = layout()
    classify(maps)
    assert stacks(maps) == 132 * KiB + 2 * 64 * KiB + 4 * (2 * MiB - 4 * KiB)


def test_the_stack_pointers_leave_guarded_regions_out_of_the_stacks():
    # GIVEN both threads blocked in a call: their pointers read, none unread
    maps = layout()
    sps = [maps[i].end - 256 for i in range(len(maps))
           if maps[i].rss == 64 * KiB] + [0x7ffd00020000]
    classify(maps, (sps, 0))
    # THEN only the mappings they point into are stacks; the regions are other anonymous
    assert stacks(maps) == 132 * KiB + 2 * 64 * KiB
    assert sum(m.rss for m in maps if m.kind == "anon") == 4 * (2 * MiB - 4 * KiB)


def test_a_running_threads_stack_is_kept_when_a_read_threads_has_its_size():
    # GIVEN one thread running (no pointer), the other read
    maps = layout()
    read = next(m for m in maps if m.rss == 64 * KiB)
    classify(maps, ([read.end - 256, 0x7ffd00020000], 1))
    # THEN the other 8 MiB stack is still a stack (the regions, another size, are not)
    assert stacks(maps) == 132 * KiB + 2 * 64 * KiB


def test_unread_threads_that_could_own_every_shaped_mapping_keep_them():
    # GIVEN no pointer read but the main thread's, and more threads unread than such mappings
    maps = layout()
    classify(maps, ([0x7ffd00020000], 8))
    assert stacks(maps) == 132 * KiB + 2 * 64 * KiB + 4 * (2 * MiB - 4 * KiB)


def test_a_pointer_into_an_unguarded_mapping_makes_it_a_stack():
    # GIVEN a thread whose stack has no guard (guardsize 0, or a coroutine's mmapped stack)
    maps = [Mapping(0x10000, 0x30000, "rw-p", "", rss=32 * KiB)]
    classify(maps, ([0x2ff00], 0))
    assert maps[0].kind == "stack"
