"""elf: whether a program is one the preload library can reach (dynamic, directly or
through its script's interpreter), and whether a file can serve as an allocator (a
shared library defining malloc and free), read from real files on the system, bundled
programs, and small hand-made files."""

import struct
from pathlib import Path

import pytest

from conftest import scenario
from heapsight import elf
from heapsight.native import lib_path

LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
JEMALLOC, TCMALLOC, MIMALLOC = (LIBDIR / "libjemalloc.so.2", LIBDIR / "libtcmalloc_minimal.so.4",
                                LIBDIR / "libmimalloc.so.2")
LIBZ, LIBC = LIBDIR / "libz.so.1", LIBDIR / "libc.so.6"
NOT_SHARED = "is not a shared library (not a 64-bit ELF shared object)"
NO_MALLOC = "is a shared library that does not define malloc and free"

PT_LOAD = 1


def elf_header(e_type=2, phoff=64, phnum=0, shoff=0, shnum=0, elf_class=2) -> bytes:
    """The 64-byte header of a little-endian x86-64 ELF file."""
    ident = b"\x7fELF" + bytes([elf_class, 1, 1]) + bytes(9)
    return ident + struct.pack("<HHIQQQIHHHHHH", e_type, 62, 1, 0, phoff, shoff, 0, 64,
                               56, phnum, 64, shnum, 0)


def program_header(p_type) -> bytes:
    return struct.pack("<IIQQQQQQ", p_type, 0, 0, 0, 0, 0, 0, 8)


def write(tmp_path, name, data, mode=0o755) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    p.chmod(mode)
    return str(p)


# linkage ------------------------------------------------------------------------------

def test_system_program_is_dynamic():
    assert elf.linkage("/usr/bin/true") == "dynamic"


def test_static_scenario_is_static():
    # hs-static is linked with -static and without PIE (scenarios/CMakeLists.txt)
    assert elf.linkage(scenario("hs-static")) == "static"


def test_scripts_take_their_interpreters_linkage(tmp_path):
    assert elf.linkage(write(tmp_path, "a.sh", b"#!/bin/sh\necho hi\n")) == "dynamic"
    assert elf.linkage(write(tmp_path, "b.sh", b"#! /bin/sh -e\n")) == "dynamic"
    assert elf.linkage(write(tmp_path, "c.sh", b"#!/usr/bin/env sh\n")) == "dynamic"   # via PATH
    static = scenario("hs-static").encode()
    assert elf.linkage(write(tmp_path, "d.sh", b"#!" + static + b"\n")) == "static"


def test_script_chain_ends_after_a_few_steps(tmp_path):
    # GIVEN a script whose interpreter is a script whose interpreter is the first one
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"#!" + str(b).encode() + b"\n")
    b.write_bytes(b"#!" + str(a).encode() + b"\n")
    # THEN linkage gives up instead of looping
    assert elf.linkage(str(a)) == "unknown"


@pytest.mark.parametrize("content", [
    b"#!\n",                                   # no interpreter named
    b"#!/usr/bin/env no-such-interpreter-hs\n",
    b"#!/no/such/interpreter\n",
    b"hello, not a program\n",
    b"",
    b"\x7fELF",                                # truncated
    elf_header(phnum=3)[:40],                  # header cut inside the program header fields
    elf_header(elf_class=1),                   # 32-bit ELF: not supported
])
def test_what_is_not_a_readable_64bit_program_is_unknown(tmp_path, content):
    assert elf.linkage(write(tmp_path, "x", content)) == "unknown"


def test_missing_file_and_directory_are_unknown(tmp_path):
    assert elf.linkage(str(tmp_path / "nope")) == "unknown"
    assert elf.linkage(str(tmp_path)) == "unknown"


def test_pt_interp_anywhere_in_the_program_headers_makes_it_dynamic(tmp_path):
    loads = program_header(PT_LOAD) * 2
    dynamic = elf_header(phnum=3) + loads + program_header(elf.PT_INTERP)
    static = elf_header(phnum=2) + loads
    assert elf.linkage(write(tmp_path, "dyn", dynamic)) == "dynamic"
    assert elf.linkage(write(tmp_path, "sta", static)) == "static"


# not_an_allocator ---------------------------------------------------------------------

@pytest.mark.parametrize("lib", [JEMALLOC, TCMALLOC, MIMALLOC, LIBC,
                                 lib_path("libheapsight_mmap.so")])
def test_allocator_libraries_are_accepted(lib):
    assert elf.not_an_allocator(str(lib)) is None


def test_a_library_without_malloc_is_refused():
    assert elf.not_an_allocator(str(LIBZ)) == NO_MALLOC


def test_files_that_are_not_shared_libraries_are_refused(tmp_path):
    assert elf.not_an_allocator("/etc/passwd") == NOT_SHARED
    assert elf.not_an_allocator(scenario("hs-static")) == NOT_SHARED     # ET_EXEC
    assert elf.not_an_allocator(write(tmp_path, "s.sh", b"#!/bin/sh\n")) == NOT_SHARED
    assert elf.not_an_allocator(write(tmp_path, "e", b"")) == NOT_SHARED


def test_truncated_or_lying_shared_objects_are_refused(tmp_path):
    # GIVEN the first 4 KiB of a real allocator (its section table is past the end), and a
    # header alone that claims sections far beyond the file
    cut = write(tmp_path, "libcut.so", JEMALLOC.read_bytes()[:4096])
    lying = write(tmp_path, "liblie.so", elf_header(e_type=elf.ET_DYN, shoff=1 << 20, shnum=9))
    # THEN both are refused with the same reason, no exception escapes
    assert elf.not_an_allocator(cut) == NOT_SHARED
    assert elf.not_an_allocator(lying) == NOT_SHARED


def test_missing_file_and_directory_are_named(tmp_path):
    assert elf.not_an_allocator(str(tmp_path / "libnope.so")) == "does not exist"
    assert elf.not_an_allocator(str(tmp_path)) == "is a directory"


def test_defined_symbols_reads_the_dynamic_symbol_table():
    assert elf.defined_symbols(str(JEMALLOC), {"malloc", "free", "mallctl", "no_such_symbol"}) \
        == {"malloc", "free", "mallctl"}
    # libz imports malloc and free (undefined there) and defines deflate
    assert elf.defined_symbols(str(LIBZ), {"malloc", "free", "deflate"}) == {"deflate"}
