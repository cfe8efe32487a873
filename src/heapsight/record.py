"""Saved documents: the run record (summary + timeline) that `heapsight run` writes, the
comparison and lab results that compare and lab write, and the one loader that reads them
all back for `heapsight report`, checking every field the readers use.

A damaged or hostile file gives one line naming the file and the field (exit code 2),
never a traceback; a small gzip that would inflate past MAX_JSON_BYTES is refused
without inflating it.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from pathlib import Path

from heapsight import output
from heapsight.errors import HeapsightError
from heapsight.model import SCHEMA_VERSION, Summary
from heapsight.sampler import Timeline

KIND = "heapsight-run"
KINDS = {"heapsight-run": "a run record", "heapsight-compare": "a comparison",
         "heapsight-lab": "lab results"}
MAX_JSON_BYTES = 512 << 20   # an hour at 1 kHz is under 20 MB; more is damage or a bomb
MAX_INT = 1 << 63


def _clean(values) -> list:
    return [None if (isinstance(v, float) and math.isnan(v)) else v for v in values]


def to_json_dict(summary: Summary, timeline: Timeline | None) -> dict:
    doc = {"kind": KIND, "schema_version": SCHEMA_VERSION, "summary": summary.to_dict()}
    if timeline is not None:
        doc["timeline"] = {c: _clean(arr.tolist()) for c, arr in timeline.columns.items()}
    return doc


def save(path: str, summary: Summary, timeline: Timeline) -> None:
    """The run record, gzip'd by its .gz suffix (output.write: whole or not at all)."""
    output.save_doc(path, to_json_dict(summary, timeline))


# ---------------------------------------------------------------------------- reading

class Damaged(Exception):
    """A field that is not what the readers need: where it is and what is wrong."""
    def __init__(self, where: str, what: str):
        super().__init__(f"{where}: {what}")
        self.where, self.what = where, what


def _read(path: str) -> bytes:
    p = Path(path)
    if not p.exists():
        raise HeapsightError(f"{path}: no such file", 2)
    if p.is_dir():
        raise HeapsightError(f"{path} is a directory, not a heapsight file", 2)
    try:
        raw = p.read_bytes() if p.stat().st_size <= MAX_JSON_BYTES else None
    except OSError as e:
        raise HeapsightError(f"{path}: cannot read it ({e.strerror})", 2) from e
    if raw is None:
        raise HeapsightError(f"{path} is larger than {MAX_JSON_BYTES >> 20} MiB: not a heapsight file", 2)
    if raw[:2] != b"\x1f\x8b":
        return raw
    # inflate in pieces, never past the limit (a 2 MB bomb could expand to gigabytes)
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    parts, size = [], 0
    try:
        data = raw
        while data:
            chunk = d.decompress(data, 1 << 20)
            size += len(chunk)
            if size > MAX_JSON_BYTES:
                raise HeapsightError(f"{path} inflates to more than {MAX_JSON_BYTES >> 20} MiB: "
                                     "not a heapsight file (or a damaged one)", 2)
            parts.append(chunk)
            data = d.unconsumed_tail
            if not data and d.unused_data[:2] == b"\x1f\x8b":   # concatenated members
                data, d = d.unused_data, zlib.decompressobj(16 + zlib.MAX_WBITS)
    except zlib.error as e:
        raise HeapsightError(f"{path}: a damaged gzip file ({e})", 2) from e
    if not d.eof:
        raise HeapsightError(f"{path}: a gzip file cut short", 2)
    return b"".join(parts)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number heapsight writes")


def _num(v, where: str, allow_none: bool = False):
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Damaged(where, f"expected a number, found {type(v).__name__} {str(v)[:30]!r}")
    if isinstance(v, int) and not -MAX_INT <= v < MAX_INT:
        raise Damaged(where, "a number too large to be a figure")
    if isinstance(v, float) and not math.isfinite(v):
        raise Damaged(where, "not a finite number")


def _typ(v, typ, where: str, allow_none: bool = False):
    if v is None and allow_none:
        return v
    if not isinstance(v, typ) or isinstance(v, bool) and typ is not bool:
        names = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise Damaged(where, f"expected {names}, found {type(v).__name__}")
    return v


def _nums(d: dict, keys, where: str, allow_none: bool = False) -> None:
    for k in keys:
        if k in d:
            _num(d[k], f"{where}.{k}", allow_none)


BREAKDOWN = ("at_s", "rss_bytes", "live_bytes", "waste_bytes", "metadata_bytes", "retained_bytes",
             "non_heap_bytes", "file_bytes", "baseline_anon_bytes", "other_anon_bytes",
             "untouched_bytes")


def _summary(s, where: str) -> None:
    _typ(s, dict, where)
    _typ(s.get("command", []), list, f"{where}.command")
    for i, a in enumerate(s.get("command", [])):
        _typ(a, str, f"{where}.command[{i}]")
    _nums(s, ("pid", "exit_code", "exit_signal", "duration_s", "samples", "sample_hz",
              "peak_rss_bytes", "final_rss_bytes", "forks", "execs", "cpu_user_s", "cpu_sys_s"), where)
    for k in ("peak", "final"):
        b = _typ(s.get(k), dict, f"{where}.{k}", allow_none=True)
        if b is not None:
            _nums(b, BREAKDOWN, f"{where}.{k}")
    rel = _typ(s.get("release", {}), dict, f"{where}.release")
    _nums(rel, ("rss_before_bytes", "rss_after_bytes", "gave_back_bytes", "seconds"), f"{where}.release")
    heap = _typ(s.get("heap"), dict, f"{where}.heap", allow_none=True)
    if heap is not None:
        _typ(heap.get("allocator", ""), str, f"{where}.heap.allocator")
        _nums(heap, [k for k in heap if k not in ("allocator", "size_classes", "mapped_at_exit_bytes")],
              f"{where}.heap")
        _num(heap.get("mapped_at_exit_bytes"), f"{where}.heap.mapped_at_exit_bytes", allow_none=True)
    for i, f in enumerate(_typ(s.get("findings", []), list, f"{where}.findings")):
        _typ(f, dict, f"{where}.findings[{i}]")
        for k in ("kind", "title", "detail"):
            _typ(f.get(k, ""), str, f"{where}.findings[{i}].{k}")
        _num(f.get("bytes", 0), f"{where}.findings[{i}].bytes")
        for j, sug in enumerate(_typ(f.get("suggestions", []), list, f"{where}.findings[{i}].suggestions")):
            _typ(sug, str, f"{where}.findings[{i}].suggestions[{j}]")
    _typ(s.get("verdict", ""), str, f"{where}.verdict")
    for i, h in enumerate(_typ(s.get("holds", []), list, f"{where}.holds")):
        _typ(h, dict, f"{where}.holds[{i}]")
        _nums(h, [k for k in h if k != "cause"], f"{where}.holds[{i}]")


def _timeline(tl, where: str) -> None:
    if tl is None:
        return
    _typ(tl, dict, where)
    lengths = {}
    for col, values in tl.items():
        _typ(values, list, f"{where}.{col}")
        for i, v in enumerate(values):
            _num(v, f"{where}.{col}[{i}]", allow_none=True)
        lengths[col] = len(values)
    if len(set(lengths.values())) > 1:
        raise Damaged(where, "columns of uneven length "
                      + ", ".join(f"{c} {n}" for c, n in sorted(lengths.items())))


def _run(doc, where: str) -> None:
    _summary(doc.get("summary"), f"{where}summary")
    _timeline(doc.get("timeline"), f"{where}timeline")


def _compare(doc) -> None:
    for i, r in enumerate(_typ(doc.get("configs"), list, "configs")):
        w = f"configs[{i}]"
        _typ(r, dict, w)
        _typ(r.get("name"), str, f"{w}.name")
        _typ(r.get("ok"), bool, f"{w}.ok")
        _typ(r.get("error"), str, f"{w}.error", allow_none=True)
        for j, m in enumerate(_typ(r.get("runs", []), list, f"{w}.runs")):
            _typ(m, dict, f"{w}.runs[{j}]")
            _nums(m, m.keys(), f"{w}.runs[{j}]")
        if r.get("ok"):
            stats = _typ(r.get("stats"), dict, f"{w}.stats")
            for key, st in stats.items():
                _typ(st, dict, f"{w}.stats.{key}")
                _nums(st, ("median", "min", "max"), f"{w}.stats.{key}")
    _num(doc.get("repeat", 1), "repeat")
    _typ(doc.get("recommendation", ""), str, "recommendation")
    for i, run in enumerate(_typ(doc.get("runs", []), list, "runs")):
        _typ(run, dict, f"runs[{i}]")
        _run(run, f"runs[{i}].")


def _chart(c, where: str) -> None:
    _typ(c, dict, where)
    _typ(c.get("id"), str, f"{where}.id")
    for i, s in enumerate(_typ(c.get("series", []), list, f"{where}.series")):
        _typ(s, dict, f"{where}.series[{i}]")
        for k in ("x", "y", "lo", "hi"):
            if k in s:
                for j, v in enumerate(_typ(s[k], list, f"{where}.series[{i}].{k}")):
                    if not isinstance(v, str):
                        _num(v, f"{where}.series[{i}].{k}[{j}]", allow_none=True)


def _lab(doc) -> None:
    for i, e in enumerate(_typ(doc.get("experiments"), list, "experiments")):
        w = f"experiments[{i}]"
        _typ(e, dict, w)
        _typ(e.get("name"), str, f"{w}.name")
        if "error" in e:
            _typ(e["error"], str, f"{w}.error")
            continue
        for j, t in enumerate(_typ(e.get("tables", []), list, f"{w}.tables")):
            _typ(t, dict, f"{w}.tables[{j}]")
            _typ(t.get("title", ""), str, f"{w}.tables[{j}].title")
            _typ(t.get("columns"), list, f"{w}.tables[{j}].columns")
            for k, row in enumerate(_typ(t.get("rows"), list, f"{w}.tables[{j}].rows")):
                _typ(row, list, f"{w}.tables[{j}].rows[{k}]")
        for j, cl in enumerate(_typ(e.get("claims", []), list, f"{w}.claims")):
            _typ(cl, dict, f"{w}.claims[{j}]")
            for k in ("text", "verdict", "evidence"):
                _typ(cl.get(k), str, f"{w}.claims[{j}].{k}")
        for j, c in enumerate(_typ(e.get("charts", []), list, f"{w}.charts")):
            _chart(c, f"{w}.charts[{j}]")
        _num(e.get("duration_s", 0), f"{w}.duration_s")


def load(path: str) -> dict:
    """A saved document of one of KINDS, checked; else HeapsightError (exit 2) naming the
    file and the damaged field."""
    raw = _read(path)
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:  # bad JSON, bad UTF-8, NaN, too deep
        raise HeapsightError(f"{path} is not a heapsight file (not valid JSON: {str(e)[:120]})", 2) from e
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind not in KINDS:
        raise HeapsightError(f"{path} is not a heapsight run record, comparison or lab results "
                             f"file (its kind is {str(kind)[:40]!r})", 2)
    version = doc.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise HeapsightError(f"{path}: schema_version: expected a whole number, found "
                             f"{str(version)[:20]!r}", 2)
    if version > SCHEMA_VERSION:
        raise HeapsightError(f"{path} was written by a newer heapsight (schema {version}); "
                             "upgrade heapsight to read it", 2)
    try:
        {"heapsight-run": lambda d: _run(d, ""), "heapsight-compare": _compare,
         "heapsight-lab": _lab}[kind](doc)
    except Damaged as e:
        raise HeapsightError(f"{path}: {e.where}: {e.what} ({KINDS[kind]}, damaged)", 2) from e
    return doc
