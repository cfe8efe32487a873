"""Formatting for people: sizes (IEC units), shares, table cells. Every command and
reporter formats through here, so one figure reads the same everywhere."""

from __future__ import annotations

import re
import shlex


KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def human(n: float) -> str:
    """Bytes in IEC units: 512 B, 1.5 KiB, 20.0 MiB."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Text from the program (its name, arguments, snapshot labels) as the terminal should
    show it: control characters (an escape sequence would be obeyed) written as \\xNN."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def shell_quote(word: str) -> str:
    """A word for a command line to copy: shlex's quoting, or bash's $'...' with escapes
    for a word holding control characters (a program path with an escape sequence in it
    would otherwise reach the terminal raw, and be obeyed)."""
    if not _CONTROL.search(word):
        return shlex.quote(word)
    body = "".join((f"\\x{ord(ch):02x}" if ord(ch) < 0x80 else f"\\u{ord(ch):04x}")
                   if _CONTROL.match(ch) else ("\\" + ch if ch in "\\'" else ch) for ch in word)
    return f"$'{body}'"


def shell_join(words) -> str:
    return " ".join(shell_quote(w) for w in words)


def clip(text: str, width: int) -> str:
    """text on one line of width columns: cut with an ellipsis when longer."""
    return text if len(text) <= width else text[:max(1, width - 1)] + "\u2026"


def middle_cut(line: str, width: int) -> str:
    """line within width, its middle given up for "..." when it is longer (both ends say
    the most: what runs, and under what)."""
    if len(line) <= width:
        return line
    keep = max(0, width - 3)
    return line[:keep - keep // 3] + "..." + line[len(line) - keep // 3:]


def clip_left(text: str, width: int) -> str:
    """A path on one line of width columns: its start cut when longer (the file's name is
    what tells two apart)."""
    return text if len(text) <= width else "\u2026" + text[len(text) - max(1, width - 1):]


def human_short(n: float) -> str:
    """Bytes in IEC units with three significant digits, for narrow table cells: 264MiB,
    59.7MiB, 6.1KiB."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1000 or unit == "TiB":
            if unit == "B" or abs(n) >= 100:
                return f"{n:.0f}{unit}"
            return f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.0f}TiB"


def pct(part: float, whole: float) -> str:
    """part as a share of whole: '42%', or 'n/a' when whole is not positive."""
    return f"{100.0 * part / whole:.0f}%" if whole > 0 else "n/a"


def share(fraction: float) -> str:
    """A fraction already divided out, as a percentage: 0.42 -> '42%'."""
    return f"{100 * fraction:.0f}%"


def cell(v) -> str:
    """A table cell: floats with two decimals, ints with thousands separators."""
    if isinstance(v, float):
        return f"{v:,.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def kib(n: float) -> str:
    """Bytes in whole KiB with thousands separators, as the classic write-ups' tables
    counted them."""
    return f"{n / 1024:,.0f} KiB"


def seconds(v: float) -> str:
    return f"{v:.3f} s"


def count(v: float) -> str:
    return f"{v:,.0f}"


def metric(key: str, v: float | None, short: bool = False) -> str:
    """A figure of compare's table (ranking.METRICS) for a cell: times in seconds,
    faults as a count, the rest in bytes (short: for a narrow terminal)."""
    if v is None:
        return "-"
    if key.endswith("_s"):
        return f"{v:.2f}s" if short else seconds(v)
    if key == "minor_faults":
        return count(v)
    return human_short(v) if short else human(v)


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1000, "KIB": 1 << 10, "M": 1 << 20, "MB": 1000 ** 2,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1000 ** 3, "GIB": 1 << 30, "T": 1 << 40,
          "TB": 1000 ** 4, "TIB": 1 << 40}


def parse_size(text: str) -> int:
    """'512', '64K', '1.5MiB', '2GB' as bytes (K, M, G alone and KiB... are powers of 1024;
    KB, MB, GB powers of 1000). ValueError with the accepted forms otherwise."""
    t = text.strip().upper().replace(" ", "")
    num = t.rstrip("KMGTIB")
    unit = t[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not (value >= 0) or value == float("inf"):
        raise ValueError(f"{text!r} is not a size: give bytes, or a number with K, M, G "
                         "(KiB, MiB, GiB) or KB, MB, GB, e.g. 512M")
    return int(value * _UNITS[unit])
