"""What an ELF file is, read from its headers: is a program dynamically linked (a preload
library only reaches programs that the dynamic loader starts: an ELF file with a PT_INTERP
header, or a script whose interpreter is one), and does a shared library (or an
executable: an allocator built into the program) define malloc."""

from __future__ import annotations

import struct

PT_INTERP = 3
ET_EXEC, ET_DYN = 2, 3
SHT_DYNSYM = 11
SHN_UNDEF = 0


def _interpreter_of_script(path: str) -> str | None:
    with open(path, "rb") as f:
        first = f.readline(256)
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].strip().split()
    if not parts:
        return None
    interp = parts[0].decode(errors="replace")
    if interp.endswith("/env") and len(parts) > 1:
        import shutil
        found = shutil.which(parts[1].decode(errors="replace"))
        return found
    return interp


def script_interpreter(path: str) -> str | None:
    """The interpreter a script's #! line names (through env), or None for anything else."""
    try:
        return _interpreter_of_script(path)
    except OSError:
        return None


def is_elf(path: str) -> bool:
    """Whether the file is an ELF file (what a symbolizer can read)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def linkage(path: str, depth: int = 0) -> str:
    """'dynamic', 'static', or 'unknown' (not ELF, unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:2] == b"#!" and depth < 4:
                interp = _interpreter_of_script(path)
                return linkage(interp, depth + 1) if interp else "unknown"
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only
                return "unknown"
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except (OSError, IndexError, struct.error, TypeError):
        return "unknown"
    for i in range(phnum):
        p_type, = struct.unpack_from("<I", table, i * phentsize)
        if p_type == PT_INTERP:
            return "dynamic"
    return "static"


def defined_symbols(path: str, names: set) -> set:
    """Which of names the ELF file (a shared object or an executable, PIE or not) defines in
    its dynamic symbol table (raises OSError, ValueError for a file that is not a 64-bit
    little-endian ELF file)."""
    return set(_dynamic_symbols(path, names, executable=True))


def symbol_values(path: str, names: set) -> dict:
    """The value (the offset from the object's load address) of each of names the ELF
    shared object defines in its dynamic symbol table (raises OSError, ValueError for a file
    that is not a 64-bit little-endian ELF shared object)."""
    return _dynamic_symbols(path, names, executable=False)


def _dynamic_symbols(path: str, names: set, executable: bool) -> dict:
    """The value of each of names defined in the dynamic symbol table; a position-dependent
    executable (whose values are addresses) only when executable is true. Reads the header,
    the section headers and the two sections it needs, each at its offset (a browser's
    executable is some 250 MB). A table that does not hold together is a ValueError."""
    try:
        return _read_dynamic_symbols(path, names, executable)
    except struct.error as e:
        raise ValueError(f"has a damaged symbol table ({e})") from None


def _read_dynamic_symbols(path: str, names: set, executable: bool) -> dict:
    with open(path, "rb") as f:
        def at(offset: int, size: int) -> bytes:
            f.seek(offset)
            got = f.read(size)
            if len(got) != size:
                raise ValueError("is cut short")
            return got
        head = f.read(64)
        if head[:4] != b"\x7fELF" or len(head) < 64 or head[4] != 2 or head[5] != 1:
            raise ValueError("is not a 64-bit ELF file")
        e_type, = struct.unpack_from("<H", head, 16)
        if e_type != ET_DYN and not (executable and e_type == ET_EXEC):
            raise ValueError("is not a shared library")
        shoff, = struct.unpack_from("<Q", head, 40)
        shentsize, shnum = struct.unpack_from("<HH", head, 58)
        if not shnum or shentsize < 64 or shnum > 65535:
            return {}
        table = at(shoff, shentsize * shnum)
        found = {}
        for i in range(shnum):
            sh = i * shentsize
            sh_type, = struct.unpack_from("<I", table, sh + 4)
            if sh_type != SHT_DYNSYM:
                continue
            sym_off, sym_size, link, _info, _align, entsize = struct.unpack_from(
                "<QQIIQQ", table, sh + 24)
            if link >= shnum or sym_size > 256 << 20:
                raise ValueError("has a damaged symbol table")
            str_off, str_size = struct.unpack_from("<QQ", table, link * shentsize + 24)
            syms, strs = at(sym_off, sym_size), at(str_off, min(str_size, 256 << 20))
            for j in range(sym_size // max(entsize, 1)):
                st_name, _st_info, _other, st_shndx, st_value = struct.unpack_from(
                    "<IBBHQ", syms, j * entsize)
                if st_shndx == SHN_UNDEF:
                    continue
                end = strs.find(b"\0", st_name)
                name = strs[st_name:end if end >= 0 else None].decode(errors="replace")
                if name in names:
                    found[name] = st_value
        return found


def not_an_allocator(path: str) -> str | None:
    """Why the file cannot serve as an allocator to preload, or None if it can (a shared
    library that defines malloc and free)."""
    try:
        found = set(symbol_values(path, {"malloc", "free"}))
    except FileNotFoundError:
        return "does not exist"
    except IsADirectoryError:
        return "is a directory"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    except (ValueError, struct.error, IndexError):
        return "is not a shared library (not a 64-bit ELF shared object)"
    if found != {"malloc", "free"}:
        return "is a shared library that does not define malloc and free"
    return None
