"""The allocator catalogue: one entry per allocator heapsight knows (its library, the
Debian package that ships it, its identity in the segment, its release-now call as the
library makes it and as gdb makes it in a running process, its per-block header, whose
mappings its own heaps are), and the configurations (an allocator plus tunables) that
compare and lab run. The segment reader, attach and the analysis read their rows here.

Adding an allocator: one row in ALLOCATORS here, one adapter row in
native/src/allocators.c (with its identity in native/include/heapsight.h), and a line in
docs/numbers.md (see docs/allocators.md).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import field

from heapsight.dataclass import dataclass
from heapsight import elf, native
from heapsight.errors import HeapsightError

LIBDIR = "/usr/lib/x86_64-linux-gnu"


@dataclass(frozen=True)
class Allocator:
    name: str
    segment_id: int            # hs_segment_t.allocator_id (HS_ALLOC_* in native/include/heapsight.h)
    library: str | None        # what to preload after heapsight's; None: the C library's malloc
    package: str | None        # the Debian package that ships the library
    release_call: str          # what the preload library calls at exit to give memory back now
    # the same call made in a running process (attach --trim, live/inject.py): its function's
    # name in the allocator's library (glibc: libc) and its arguments (s:TEXT: a string)
    trim_call: tuple | None = None
    header_bytes: int = 0      # bytes in front of every block (0: sizes live in slab metadata)
    object_prefix: str | None = None  # its library's file name starts so (None: the C library)
    keeps: str = ""            # why it keeps freed memory resident, in words (glibc's: analysis)
    returns_preset: str | None = None  # the configuration (PRESETS) that returns it sooner
    release_code: str = ""     # the release call in the program's own code, with its header
    # its own metadata at exit: (which of the exit statistics' raw figures, in its words);
    # outside the mapped figure. None: it gives none (glibc's is its block headers)
    metadata: tuple | None = None
    # the versions whose statistics and structures heapsight reads (prefixes of the version
    # the allocator gives), and what another version may leave wrong
    versions: tuple = ()
    depends: str = ""
    # what it keeps at exit, in its own words: (raw figure index, or (index, less index),
    # words) of its exit statistics (native/src/allocators.c says each raw figure)
    keeps_parts: tuple = ()

    @property
    def own_heaps(self) -> str | None:
        """A regex for its library's path: the mmaps it makes are its own heaps."""
        return None if self.object_prefix is None else r"(^|/)" + re.escape(self.object_prefix)


ALLOCATORS = {a.name: a for a in (
    # glibc's chunk size word (malloc/malloc.c: the chunk header's mchunk_size)
    Allocator("glibc", 1, None, None, "malloc_trim(0)", ("malloc_trim", "0"), header_bytes=8,
              versions=("2.36",),
              depends="the heap map's walk reads glibc 2.36's chunk and arena layouts (it checks "
                      "them, and leaves a heap it cannot follow unwalked), and the statistics "
                      "read from outside glibc 2.36's arena offsets"),
    Allocator("jemalloc", 2, f"{LIBDIR}/libjemalloc.so.2", "libjemalloc2",
              'mallctl("arena.4096.purge")', ("mallctl", "s:arena.4096.purge", "0", "0", "0", "0"),
              object_prefix="libjemalloc", metadata=(5, "stats.metadata"),
              keeps_parts=((6, "dirty pages (returned over dirty_decay_ms)"),
                           (7, "muzzy pages (returned over muzzy_decay_ms)"),
                           ((1, 0), "free space in its active pages (slabs' free regions)")),
              versions=("5.3.",),
              depends="its statistics are read by jemalloc 5.3's mallctl names (one it does not "
                      "have is left unread)",
              keeps="jemalloc keeps freed pages dirty and returns them over dirty_decay_ms (10 s "
                    "by default), and only as the program goes on calling it: with no background "
                    "thread (off by default) a program that frees and then idles keeps them",
              returns_preset="jemalloc-eager",
              release_code='mallctl("arena.4096.purge", NULL, NULL, NULL, 0);   # in the '
                           "program, after the work that freed it (#include <jemalloc/jemalloc.h>)"),
    Allocator("tcmalloc", 3, f"{LIBDIR}/libtcmalloc_minimal.so.4", "libtcmalloc-minimal4",
              "MallocExtension_ReleaseFreeMemory()", ("MallocExtension_ReleaseFreeMemory",),
              object_prefix="libtcmalloc",
              metadata=(5, "metadata (generic.total_physical_bytes less its page heap)"),
              keeps_parts=((2, "free pages in its page heap (pageheap_free_bytes)"),
                           (4, "free blocks in its thread, transfer and central caches")),
              versions=("gperftools 2.10", "gperftools 2.9"),
              depends="its statistics are read by gperftools 2.10's property names (one it "
                      "does not have is left unread)",
              keeps="tcmalloc keeps freed pages in its page heap and returns them a little at a "
                    "time as more is freed (TCMALLOC_RELEASE_RATE), and small freed blocks in its "
                    "per-thread and central caches",
              returns_preset="tcmalloc-aggressive",
              release_code="MallocExtension_ReleaseFreeMemory();   # in the program, after the "
                           "work that freed it (#include <gperftools/malloc_extension_c.h>)"),
    Allocator("mimalloc", 4, f"{LIBDIR}/libmimalloc.so.2", "libmimalloc2.0", "mi_collect(true)",
              ("mi_collect", "1"), object_prefix="libmimalloc", versions=("2.0.",),
              depends="mi_process_info's fields are read as mimalloc 2.0's",
              keeps="mimalloc returns a page's memory only once every block on it is free, after "
                    "its decommit delay, on the calls of the thread that owns it",
              returns_preset="mimalloc-eager",
              release_code="mi_collect(true);   # in the program, on each thread that freed, "
                           "after the work (#include <mimalloc.h>)"),
    # libheapsight_mmap: one mapping per block; its header holds the mapping length and offset
    Allocator("mmap", 5, native.lib_path("libheapsight_mmap.so"), None,
              "none needed (every free unmaps)", header_bytes=16,
              object_prefix="libheapsight_mmap"),
)}

# The objects whose every frame is the allocator's: heapsight's own hooks and each
# allocator's library (libtcmalloc_minimal too)
ALLOCATOR_OBJECTS = re.compile(r"(^|/)(libheapsight|" + "|".join(
    re.escape(a.object_prefix) for a in ALLOCATORS.values() if a.object_prefix) + r")(?:_\w+)?[.-][^/]*$")

# the allocator's name by the identity the library writes in the segment
BY_SEGMENT_ID = {0: "unknown", **{a.segment_id: a.name for a in ALLOCATORS.values()}}



def own_heaps_of(name: str) -> str | None:
    """The pattern of the objects whose mmaps are allocator name's own heaps, or None."""
    a = ALLOCATORS.get(name)
    return a.own_heaps if a is not None else None

def trim_call(allocator: str) -> tuple | None:
    """The release-now call made in a running process: (function, argument...); None when
    none is known."""
    a = ALLOCATORS.get(allocator)
    return a.trim_call if a else None


def release_call(allocator: str) -> str:
    a = ALLOCATORS.get(allocator)
    return a.release_call if a else "none"


def header_bytes(allocator: str) -> int:
    a = ALLOCATORS.get(allocator)
    return a.header_bytes if a else 0


def version_note(allocator: str, version: str) -> str:
    """What heapsight cannot vouch for under this version of the allocator, in words; ""
    when it is one heapsight reads (or gave no version)."""
    a = ALLOCATORS.get(allocator)
    if a is None or not version or not a.versions or version.startswith(a.versions):
        return ""
    known = " or ".join(v.rstrip(".") for v in a.versions)
    return (f"{allocator} {version} is not a version heapsight knows ({known}): {a.depends}; "
            "the hooks' counts, the sampled call sites and RSS do not depend on it")


def kept_parts(allocator: str, stats) -> tuple:
    """What the allocator holds free at exit, in its own words: ((words, bytes), ...) from
    its exit statistics (an AllocStats), () when it gives none."""
    a = ALLOCATORS.get(allocator)
    if a is None or stats is None:
        return ()
    out = []
    for which, words in a.keeps_parts:
        a_i, b_i = which if isinstance(which, tuple) else (which, None)
        if len(stats.raw) <= max(a_i, b_i or 0):
            continue
        v = int(stats.raw[a_i]) - (int(stats.raw[b_i]) if b_i is not None else 0)
        out.append((words, max(0, v)))
    return tuple(out)


def metadata_known(allocator: str | None) -> bool:
    """Whether a moment's metadata figure of 0 is a figure: glibc's is its block headers,
    the mmap baseline has none; another allocator's, where it gives none (mimalloc 2.0;
    jemalloc and tcmalloc but at exit), is counted in retained."""
    return allocator in (None, "glibc", "mmap")


def own_metadata(allocator: str, stats) -> tuple:
    """(bytes, its name) of the allocator's own metadata in its exit statistics (stats: an
    AllocStats), or (NaN, "") when it gives none."""
    a = ALLOCATORS.get(allocator)
    if a is None or a.metadata is None or stats is None or len(stats.raw) <= a.metadata[0]:
        return math.nan, ""
    return float(stats.raw[a.metadata[0]]), a.metadata[1]


@dataclass(frozen=True)
class Config:
    """An allocator and the environment that tunes it: one row of compare, one run of lab."""
    name: str
    allocator: str
    env: dict = field(default_factory=dict)
    about: str = ""
    library: str | None = None  # a user's own build instead of the catalogue's library
    runtime: str | None = None  # only for programs of this runtime ("cpython"), else skipped


PRESETS = [
    Config("glibc", "glibc", {}, "glibc malloc, default settings (the baseline)"),
    Config("glibc-arena2", "glibc", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "at most 2 arenas"),
    Config("glibc-arena1", "glibc", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=1"}, "one arena"),
    Config("glibc-mmap128k", "glibc", {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"},
           "fixed 128 KiB mmap threshold (no dynamic raise)"),
    Config("glibc-trim128k", "glibc", {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
           "trim the heap top above 128 KiB free"),
    Config("jemalloc", "jemalloc", {}, "jemalloc 5.3, default decay"),
    Config("jemalloc-eager", "jemalloc", {"MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"},
           "jemalloc returning freed pages at once"),
    Config("jemalloc-bg", "jemalloc", {"MALLOC_CONF": "background_thread:true"},
           "jemalloc with its background purging thread"),
    Config("tcmalloc", "tcmalloc", {}, "gperftools tcmalloc (minimal), default"),
    Config("tcmalloc-aggressive", "tcmalloc", {"TCMALLOC_AGGRESSIVE_DECOMMIT": "true"},
           "tcmalloc decommitting free spans at once"),
    Config("mimalloc", "mimalloc", {}, "mimalloc 2.0, default"),
    Config("mimalloc-eager", "mimalloc", {"MIMALLOC_DECOMMIT_DELAY": "0"}, "mimalloc decommitting at once"),
    Config("mmap", "mmap", {}, "one mmap per allocation, munmap on free: the retention-free baseline"),
    Config("python-malloc", "glibc", {"PYTHONMALLOC": "malloc"},
           "CPython's objects from glibc malloc instead of pymalloc's arenas", runtime="cpython"),
    Config("python-malloc-jemalloc-eager", "jemalloc",
           {"PYTHONMALLOC": "malloc", "MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"},
           "CPython's objects from jemalloc, returning freed pages at once", runtime="cpython"),
]
PRESET = {c.name: c for c in PRESETS}
# a process whose executable defines malloc (an allocator built in): attach names it so
OWN_MALLOC = "its own malloc"
BASELINE = "glibc"   # the configuration compare and lab measure the others against
# mmap (one mapping per block) is a baseline, not a choice: on sqlite3 it took 15.75 s of
# a 23 s compare and 412 MiB; it is in the lab, and in --configs for whom asks for it
DEFAULT_CONFIGS = ("glibc,glibc-arena2,glibc-mmap128k,jemalloc,jemalloc-eager,tcmalloc,"
                   "tcmalloc-aggressive,mimalloc")


RUNTIME_DEFAULTS = {"cpython": ("python-malloc", "python-malloc-jemalloc-eager")}


def runtime_of(path: str) -> str | None:
    """The runtime a program runs on, when a preset is made for it: 'cpython' for a CPython
    interpreter (or a script whose #! line names one), else None."""
    interp = elf.script_interpreter(path) or path
    names = (os.path.basename(os.path.realpath(interp)),
             os.path.basename(path))   # a wrapper by the name (pyenv's shims: bash scripts)
    return "cpython" if any(re.fullmatch(r"python3(\.\d+)?", n) for n in names) else None


def presets(names: str, option: str = "--configs") -> list:
    """The preset configurations named in a comma-separated list, in order."""
    out = []
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        if name not in PRESET:
            raise HeapsightError(f"{option}: unknown configuration {name!r}; known: "
                                 f"{', '.join(PRESET)} (see heapsight compare --list)")
        out.append(PRESET[name])
    return out


def parse_config(text: str) -> Config:
    """A user's configuration, NAME:ALLOC[:ENV=VAL,...]; ALLOC is a catalogue name or the
    path of an allocator library (checked: a shared library that defines malloc)."""
    parts = text.split(":", 2)
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise HeapsightError(f"--config {text!r}: expected NAME:ALLOC[:ENV=VAL,...], "
                             "e.g. mine:jemalloc:MALLOC_CONF=narenas:2")
    name, alloc = parts[0], parts[1]
    env = {}
    if len(parts) == 3 and parts[2]:
        # values may contain ':' and ',' (MALLOC_CONF=a:1,b:2): split on ',' before NAME=
        current = None
        for piece in parts[2].split(","):
            key, eq, val = piece.partition("=")
            if eq and key.replace("_", "").isalnum() and key.upper() == key:
                current = key
                env[key] = val
            elif current:
                env[current] += "," + piece
            else:
                raise HeapsightError(f"--config {text!r}: {piece!r} is not ENV=VAL")
    if alloc in ALLOCATORS:
        return Config(name, alloc, env, "user-defined")
    if "/" in alloc or alloc.endswith(".so") or ".so." in alloc:
        # a missing library is its row's error (the others still run); a file that is
        # there but is no allocator is refused before anything runs
        why = elf.not_an_allocator(alloc) if os.path.exists(alloc) else None
        if why:
            raise HeapsightError(f"--config {text!r}: {alloc} {why}; give the path of an "
                                 "allocator's shared library (e.g. libjemalloc.so.2)")
        kind = next((a for a in ("jemalloc", "tcmalloc", "mimalloc") if a in os.path.basename(alloc)),
                    "unknown")
        return Config(name, kind, env, f"user-defined, {alloc}", library=alloc)
    raise HeapsightError(f"--config {text!r}: unknown allocator {alloc!r}; use "
                         f"{', '.join(ALLOCATORS)} or a library path")


def library_for(cfg: Config) -> tuple:
    """(library to preload or None, None) or (None, why it cannot run here)."""
    a = ALLOCATORS.get(cfg.allocator)
    lib = cfg.library or (a.library if a else None)
    if lib and not os.path.exists(lib):
        how = (f"install the Debian package {a.package} (apt-get install {a.package})"
               if a and a.package and not cfg.library
               else "check the path" if cfg.library else "reinstall heapsight")
        return None, f"{cfg.allocator} library {lib} is missing: {how}"
    return lib, None
