"""The compiler's check of a Python mirror of C declarations: a module lists the structs it
mirrors (C name -> numpy dtype) and the constants (C expression -> value); this writes a C
program comparing every field's offset and size, every struct's size and every constant
with what the compiler makes of the header, builds it and runs it. Every field the Python
side names is checked, and a field only the C side has changes its struct's size."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INCLUDES = [ROOT / "native" / "include", ROOT / "native" / "src"]


def _fields(ctype: str, prefix: str, dtype, base: int, out: list) -> None:
    """offset and size checks of dtype's fields at C member prefix (offset base), recursing
    into nested structs and the first element of arrays of structs."""
    for name in dtype.names:
        sub, offset = dtype.fields[name][:2]
        member = prefix + name
        out.append((f"{ctype}.{member}: offset", f"offsetof({ctype}, {member})", base + offset))
        out.append((f"{ctype}.{member}: size", f"sizeof((({ctype} *)0)->{member})", sub.itemsize))
        inner = sub.subdtype[0] if sub.subdtype else sub
        if inner.names:
            _fields(ctype, member + ("[0]." if sub.subdtype else "."), inner, base + offset, out)


def checks(structs: dict, constants: dict, partial: tuple = ()) -> list:
    """(what, C expression, Python value) for every field, struct size and constant."""
    out = []
    for ctype, dtype in structs.items():
        assert sum(dtype.fields[n][0].itemsize for n in dtype.names) == dtype.itemsize, \
            f"{ctype}'s dtype has gaps: name every byte, as the C struct does"
        _fields(ctype, "", dtype, 0, out)
        if ctype not in partial:   # a dtype of the struct's start only: no size to compare
            out.append((f"sizeof({ctype})", f"sizeof({ctype})", dtype.itemsize))
    for expr, value in constants.items():
        out.append((expr, expr, value))
    return out


def program(header: str, rows: list) -> str:
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <stdint.h>",
             f'#include "{header}"', "static int bad;",
             "static void check(const char *what, unsigned long long c, unsigned long long py) {",
             '  if (c != py) { printf("%s: C says %llu, Python %llu\\n", what, c, py); bad++; }',
             "}", "int main(void) {"]
    for what, expr, value in rows:
        lines.append(f'  check("{what}", (unsigned long long)({expr}), {value % 2**64}ull);')
    lines += [f'  printf("%d of {len(rows)} differ\\n", bad);', "  return bad != 0;", "}"]
    return "\n".join(lines) + "\n"


def run(header: str, structs: dict, constants: dict, tmp: Path, partial: tuple = ()):
    """Builds and runs the check: (returncode, what it printed, how many checks)."""
    rows = checks(structs, constants, partial)
    src, exe = tmp / "mirror.c", tmp / "mirror"
    src.write_text(program(header, rows))
    cc = subprocess.run(["cc", "-std=gnu11", "-D_GNU_SOURCE", *(f"-I{d}" for d in INCLUDES),
                         str(src), "-o", str(exe)], capture_output=True, text=True)
    if cc.returncode != 0:
        return cc.returncode, cc.stderr, len(rows)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout, len(rows)
