"""Formatting for people: sizes (IEC units), shares, table cells. Every command and
reporter formats through here, so one figure reads the same everywhere."""

from __future__ import annotations


def human(n: float) -> str:
    """Bytes in IEC units: 512 B, 1.5 KiB, 20.0 MiB."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


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
    """Bytes as the classic write-ups printed them: whole KiB with thousands separators."""
    return f"{n / 1024:,.0f} kB"


def seconds(v: float) -> str:
    return f"{v:.3f} s"


def count(v: float) -> str:
    return f"{v:,.0f}"


def metric(key: str, v: float | None) -> str:
    """A figure of compare's table (comparison.METRICS) for a cell: times in seconds,
    faults as a count, the rest in bytes."""
    if v is None:
        return "-"
    if key.endswith("_s"):
        return seconds(v)
    if key == "minor_faults":
        return count(v)
    return human(v)
