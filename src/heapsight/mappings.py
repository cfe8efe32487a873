"""A process's memory read from /proc/PID/smaps, mapping by mapping, and classified: the
allocator's heaps (glibc's [heap] and its thread arenas), thread stacks, file-backed and
shared memory, and other anonymous memory (mmapped malloc chunks, other allocators'
heaps, runtimes' heaps, the program's own mmap). Also: which allocator the process uses,
from the libraries it has mapped.

The layout rules (glibc 2.36, x86-64):
- a thread arena is a heap of HEAP_MAX_SIZE (64 MiB) reserved at a 64 MiB-aligned
  address: its used part is an anonymous rw-p mapping starting on that boundary, its
  rest a ---p mapping right after (malloc/arena.c: new_heap);
- a thread stack (nptl/allocatestack.c) is an anonymous rw-p mapping right above a ---p
  guard of a few pages. Other allocators guard their regions the same way (Chromium's
  PartitionAlloc: a 4 KiB guard below each 2 MiB super page; V8's pages), so where the
  threads' stack pointers can be read (/proc/PID/task/TID/syscall) they decide: a mapping
  is a stack when one points into it; one shaped like a stack that none points into is
  still taken for one only where the threads whose pointer could not be read (running
  then) could own it (_stacks_by_pointer). In Chromium's browser process the shape alone
  called 25 MiB stacks; its 33 threads' pointers, 644 KiB.
"""

from __future__ import annotations

import os

HEAP_MAX = 64 << 20   # glibc's HEAP_MAX_SIZE on 64-bit: a thread arena's heap (heapmap.c too)
GUARD_MAX = 1 << 20
KINDS = ("heap", "arena", "stack", "file", "shared", "anon")
KIND_NAMES = {"heap": "main heap ([heap])", "arena": "glibc thread arenas",
              "stack": "stacks", "file": "file-backed (code, mapped files)",
              "shared": "shared memory", "anon": "other anonymous"}


class Mapping:
    """One mapping of smaps: its range, permissions and path, resident, anonymous and swapped
    bytes, and its kind (KINDS). (A plain class: the sampler's first tick reads smaps, where
    the dataclasses module would cost 10-25 ms.)"""

    __slots__ = ("start", "end", "perms", "path", "rss", "anonymous", "swap", "kind")

    def __init__(self, start: int, end: int, perms: str, path: str, rss: int = 0,
                 anonymous: int = 0, swap: int = 0, kind: str = "anon") -> None:
        self.start, self.end, self.perms, self.path = start, end, perms, path
        self.rss, self.anonymous, self.swap, self.kind = rss, anonymous, swap, kind

    def _fields(self) -> tuple:
        return tuple(getattr(self, k) for k in self.__slots__)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and self._fields() == other._fields()

    def __repr__(self) -> str:
        return "Mapping(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"

    @property
    def size(self) -> int:
        return self.end - self.start


def parse_smaps(text: str, stack_pointers: tuple | None = None) -> list:
    """The mappings of an smaps file's text, each with its Rss, Anonymous and Swap, classified
    (stack_pointers: as classify takes them)."""
    maps, cur = [], None
    for line in text.splitlines():
        if not line:
            continue
        head = line.split(None, 5)
        if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            lo, hi = head[0].split("-")
            cur = Mapping(int(lo, 16), int(hi, 16), head[1], head[5] if len(head) > 5 else "")
            maps.append(cur)
        elif cur is not None and len(head) >= 2 and head[0] in ("Rss:", "Anonymous:", "Swap:"):
            setattr(cur, {"Rss:": "rss", "Anonymous:": "anonymous", "Swap:": "swap"}[head[0]],
                    int(head[1]) * 1024)
    classify(maps, stack_pointers)
    return maps


def classify(maps: list, stack_pointers: tuple | None = None) -> None:
    """Sets each mapping's kind (KINDS), by the layout rules above. stack_pointers: (the
    threads' stack pointers read, how many threads' could not be read), or None where
    none could (the shape alone then says what is a stack)."""
    shaped = []
    for i, m in enumerate(maps):
        anon = m.path == "" or m.path.startswith("[anon")
        if m.path == "[heap]":
            m.kind = "heap"
        elif m.path == "[stack]":
            m.kind = "stack"
        elif m.perms[3:4] == "s" or m.path.startswith(("/dev/shm/", "/memfd:", "/SYSV")):
            m.kind = "shared"
        elif not anon:
            m.kind = "file"     # includes [vdso], [vvar]: the kernel's, tiny
        elif m.perms.startswith("rw"):
            before = maps[i - 1] if i else None
            after = maps[i + 1] if i + 1 < len(maps) else None
            if (m.start % HEAP_MAX == 0 and after is not None and after.start == m.end
                    and after.perms.startswith("---") and after.end - m.start <= HEAP_MAX):
                m.kind = "arena"
            elif (before is not None and before.end == m.start and before.perms.startswith("---")
                  and before.size <= GUARD_MAX and before.path == ""):
                m.kind = "stack"
                shaped.append((m, before.size + m.size))
            else:
                m.kind = "anon"
        else:
            m.kind = "anon"
    if stack_pointers is not None:
        _stacks_by_pointer(maps, shaped, *stack_pointers)


def _stacks_by_pointer(maps: list, shaped: list, pointers: list, unread: int) -> None:
    """The stacks the threads' pointers show: an anonymous mapping a stack pointer points
    into is a stack (a thread's without a guard too). Of the stack-shaped ones (mapping,
    its size with its guard) none points into, the threads not read could own as many: all
    of them if they are no more, else those of a size (guard included) that a read thread's
    stack has, if they are no more, else none (a running thread's stack, a few pages
    mostly, is then counted as other anonymous memory)."""
    import bisect
    anon = sorted((m for m in maps if m.kind in ("anon", "stack")), key=lambda m: m.start)
    starts = [m.start for m in anon]
    pointed = set()
    for sp in pointers:
        i = bisect.bisect_right(starts, sp) - 1
        if i >= 0 and sp < anon[i].end:
            pointed.add(id(anon[i]))
            anon[i].kind = "stack"
    unpointed = [(m, size) for m, size in shaped if id(m) not in pointed]
    if len(unpointed) <= unread:
        return
    sizes = {size for m, size in shaped if id(m) in pointed}
    alike = [m for m, size in unpointed if size in sizes]
    keep = {id(m) for m in alike} if len(alike) <= unread else set()
    for m, _ in unpointed:
        if id(m) not in keep:
            m.kind = "anon"


def resident_by_kind(maps: list) -> dict:
    out = dict.fromkeys(KINDS, 0)
    for m in maps:
        out[m.kind] += m.rss
    return out


def allocator_of(maps: list) -> str:
    """The allocator that answers malloc: a known allocator's library if one is mapped,
    else glibc's when libc is mapped, else 'static' (nothing from the dynamic loader)."""
    from heapsight import allocators
    paths = {os.path.basename(m.path) for m in maps if m.kind == "file"}
    for a in allocators.ALLOCATORS.values():
        if a.object_prefix and any(p.startswith(a.object_prefix) for p in paths):
            return a.name
    if any(p.startswith("libc.so") or p.startswith("libc-") for p in paths):
        return "glibc"
    if not any(p.startswith("ld-linux") for p in paths):
        return "static"
    return "unknown"


def has_library(maps: list, prefix: str) -> bool:
    return any(os.path.basename(m.path).startswith(prefix) for m in maps if m.kind == "file")
