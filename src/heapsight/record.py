"""Saved documents: the run record (summary + timeline) that `heapsight run` writes, the
comparison and lab results that compare and lab write, and the one loader that reads them
all back (`load`), checking every field the report's readers (report/html.py,
report/charts.py) use.

A damaged or hostile file gives one line naming the file and the field (exit code 2),
never a traceback: wrong types, numbers out of range, NaN or Infinity, uneven timeline
columns, missing fields the readers index, a schema newer than this heapsight. A gzip
file is measured in a stream before it is inflated, so a small one that would inflate
past MAX_JSON_BYTES is refused without taking that memory.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import typing
import zlib

from heapsight import output
from heapsight.errors import HeapsightError
from heapsight.model import (SCHEMA_VERSION, Breakdown, Finding, HeapFigures, Hold, Moment,
                             Release, Snapshot, Summary)
from heapsight.timeline import Timeline

KIND = "heapsight-run"
KINDS = {"heapsight-run": "a run record", "heapsight-compare": "a comparison",
         "heapsight-lab": "lab results"}
MAX_JSON_BYTES = 512 << 20   # an hour at 1 kHz is under 20 MB; more is damage or a bomb
MAX_NUMBER = 2 ** 63         # no figure heapsight writes comes near it
CHUNK = 1 << 20


def _clean(values) -> list:
    return [None if (isinstance(v, float) and math.isnan(v)) else v for v in values]


def to_json_dict(summary: Summary, timeline: Timeline | None) -> dict:
    doc = {"kind": KIND, "schema_version": SCHEMA_VERSION, "summary": summary.to_dict()}
    if timeline is not None:
        doc["timeline"] = {c: _clean(arr.tolist()) for c, arr in timeline.columns.items()}
        if timeline.capture is not None:   # what the analysis read (capture.py)
            doc["capture"] = timeline.capture
    return doc


def save(path: str, summary: Summary, timeline: Timeline) -> str:
    """The run record, gzip'd by its .gz suffix (output.save_doc: whole or not at all);
    the path written."""
    return output.save_doc(path, to_json_dict(summary, timeline))


# The writers' earlier home; output.py is the one writer now.
write_json = output.write_json
save_doc = output.save_doc


# ---------------------------------------------------------------------------- reading

def _refuse(path: str, problem: str) -> HeapsightError:
    return HeapsightError(f"{path}: {problem}", 2)


def _pipe_dev() -> int:
    """The device of anonymous pipes (pipefs): a pipe such as <(zcat r.gz) has one."""
    r, w = os.pipe()
    try:
        return os.fstat(r).st_dev
    finally:
        os.close(r)
        os.close(w)


def _refuse_special(path: str) -> None:
    """A named FIFO would wait for a writer, a terminal for typing: refused at once."""
    try:
        st = os.stat(path)
    except OSError:
        return   # open() says why
    mode = st.st_mode
    if stat.S_ISFIFO(mode) and st.st_dev != _pipe_dev():
        raise _refuse(path, "is a FIFO (named pipe), which would wait for a writer: give the "
                            "file itself, or a pipe such as <(zcat run.hsrun.json.gz)")
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
        raise _refuse(path, "is a device or a socket, not a heapsight file")


def _read(path: str) -> bytes:
    """The file's bytes, at most MAX_JSON_BYTES of them (a pipe such as <(...) too)."""
    _refuse_special(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISDIR(st.st_mode):
                raise _refuse(path, "is a directory, not a heapsight file")
            if stat.S_ISREG(st.st_mode) and st.st_size > MAX_JSON_BYTES:
                raise _refuse(path, f"larger than {MAX_JSON_BYTES >> 20} MiB: not a heapsight file")
            raw = f.read(MAX_JSON_BYTES + 1)
    except IsADirectoryError:
        raise _refuse(path, "is a directory, not a heapsight file") from None
    except FileNotFoundError:
        raise _refuse(path, "no such file") from None
    except OSError as e:
        raise _refuse(path, f"cannot read it ({e.strerror})") from None
    if len(raw) > MAX_JSON_BYTES:
        raise _refuse(path, f"larger than {MAX_JSON_BYTES >> 20} MiB: not a heapsight file")
    return raw


def _inflate(raw: bytes, path: str):
    """The inflated pieces of a gzip file (members one after the other), each at most
    CHUNK bytes: memory stays small whatever the file inflates to."""
    data = raw
    while data[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not d.eof:
            try:
                piece = d.decompress(data, CHUNK)
            except zlib.error as e:
                raise _refuse(path, f"a damaged gzip file ({e})") from None
            if not piece and len(d.unconsumed_tail) == len(data):
                raise _refuse(path, "a gzip file cut short")
            data = d.unconsumed_tail
            if piece:
                yield piece
        data = d.unused_data


def _text(path: str) -> bytes:
    raw = _read(path)
    if raw[:2] != b"\x1f\x8b":
        return raw
    size = 0
    for piece in _inflate(raw, path):    # measured first, kept only when it fits
        size += len(piece)
        if size > MAX_JSON_BYTES:
            raise _refuse(path, f"inflates to more than {MAX_JSON_BYTES >> 20} MiB of JSON: "
                          "not a heapsight file (or a damaged one)")
    return b"".join(_inflate(raw, path))


class Damaged(Exception):
    """A field that is not what the readers need: where it is and what is wrong."""
    def __init__(self, where: str, what: str):
        super().__init__(f"{where}: {what}")
        self.where, self.what = where, what


def _shown(v) -> str:
    """A found value, briefly (a list of millions is not printed)."""
    if isinstance(v, (list, dict)):
        return f"{'a list' if isinstance(v, list) else 'an object'} of {len(v)}"
    if isinstance(v, _Unwritten):   # NaN, Infinity, a number of too many digits
        return v.text
    return f"{type(v).__name__} {str(v)[:30]!r}"


# Checks: check(value, where) raises Damaged or returns. Built from a few shapes so that
# each kind's spec below reads as the list of what its readers use.

def number(v, where: str) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Damaged(where, f"expected a number, found {_shown(v)}")
    if not -MAX_NUMBER < v < MAX_NUMBER:    # NaN and Infinity never parse (see load)
        raise Damaged(where, "a number too large to be a figure")


def string(v, where: str) -> None:
    if not isinstance(v, str):
        raise Damaged(where, f"expected text, found {_shown(v)}")


def boolean(v, where: str) -> None:
    if not isinstance(v, bool):
        raise Damaged(where, f"expected true or false, found {_shown(v)}")


def scalar(v, where: str) -> None:
    if v is not None and not isinstance(v, (str, bool)):
        number(v, where)


def maybe(check):
    return lambda v, where: None if v is None else check(v, where)


def num_or_text(v, where: str) -> None:
    if v is not None and not isinstance(v, str):
        number(v, where)


def list_of(check):
    def checked(v, where: str) -> None:
        if not isinstance(v, list):
            raise Damaged(where, f"expected a list, found {_shown(v)}")
        for i, x in enumerate(v):
            check(x, f"{where}[{i}]")
    return checked


def numbers(v, where: str) -> None:
    """A list of numbers or nulls (a timeline column, a chart's values): checked in bulk,
    element by element only to name a bad one."""
    if not isinstance(v, list):
        raise Damaged(where, f"expected a list, found {_shown(v)}")
    kinds = set(map(type, v))
    if kinds <= {int, float, type(None)}:
        finite = [x for x in v if x is not None] if type(None) in kinds else v
        if not finite or (max(finite) < MAX_NUMBER and min(finite) > -MAX_NUMBER):
            return
    list_of(maybe(number))(v, where)


def fields(required: dict = None, optional: dict = None):
    """A dict with these keys (others are ignored: the readers do not use them)."""
    required, optional = required or {}, optional or {}

    def checked(v, where: str) -> None:
        if not isinstance(v, dict):
            raise Damaged(where, f"expected an object, found {_shown(v)}")
        for key, check in required.items():
            if key not in v:
                raise Damaged(f"{where}.{key}" if where else key, "missing")
        for key, check in (required | optional).items():
            if key in v:
                check(v[key], f"{where}.{key}" if where else key)
    return checked


def each_value(check):
    def checked(v, where: str) -> None:
        if not isinstance(v, dict):
            raise Damaged(where, f"expected an object, found {_shown(v)}")
        for key, x in v.items():
            check(x, f"{where}.{key}")
    return checked


# ----------------------------------------------------------------- a run record

def anything(v, where: str) -> None:
    """A field no reader relies on (kept JSON-shaped as written)."""


def schema_of(cls, required: tuple = (), extra: dict | None = None, **overrides):
    """The check of a model dataclass's JSON form, from its fields' types (int and float:
    number, str: string, bool: boolean, X | None: maybe(X)); a field of another type (a
    nested one, a tuple, a dict) must be given in overrides, and extra adds keys to_dict
    writes beyond the fields. So a field added to the model is checked here at once."""
    hints = typing.get_type_hints(cls)
    simple = {int: number, float: number, str: string, bool: boolean}

    def check_of(name, t):
        if name in overrides:
            return overrides[name]
        if t in simple:
            return simple[t]
        args = typing.get_args(t)
        if len(args) == 2 and type(None) in args:
            inner = next(a for a in args if a is not type(None))
            if inner in simple:
                return maybe(simple[inner])
        raise TypeError(f"{cls.__name__}.{name}: a {t} field needs its check given")
    checks = {f.name: check_of(f.name, hints[f.name]) for f in dataclasses.fields(cls)}
    checks.update(extra or {})
    return fields(required={k: checks.pop(k) for k in required}, optional=checks)


BREAKDOWN = schema_of(Breakdown, required=("at_s", "rss_bytes"))
RELEASE = schema_of(Release, extra={"gave_back_bytes": number})
HEAP = schema_of(HeapFigures, size_classes=list_of(list_of(number)), kept_parts=list_of(anything))
FINDING = schema_of(Finding, suggestions=list_of(string))
HOLD = schema_of(Hold)
SNAPSHOT = schema_of(Snapshot, required=("at_s", "label"), breakdown=BREAKDOWN,
                     release=maybe(each_value(anything)))
FRAME = fields(required={"object": string, "address": string},
               optional={"function": maybe(string), "file": maybe(string), "line": maybe(number)})
MOMENT_STACK = fields(required={"stack": number, "bytes": number},
                      optional={"blocks": number, "error_bytes": number})
MOMENT_SITE = fields(required={"site": string, "bytes": number},
                     optional={"frame": maybe(number), "share": number, "blocks": number,
                               "error_bytes": number})
MOMENT = fields(required={"name": string, "stacks": list_of(MOMENT_STACK),
                          "sites": list_of(MOMENT_SITE)},
                optional={k: number for k in ("t_s", "live_bytes", "estimated_bytes", "samples")})


def _index(v, n: int, where: str, of: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
        raise Damaged(where, f"{_shown(v)} is not the index of one of the {n} {of}")


def _indices(v, n: int, where: str, of: str) -> None:
    """A list of indices into n things: checked in bulk (a deep program's stacks hold
    hundreds of thousands), element by element only to name a bad one."""
    if not isinstance(v, list):
        raise Damaged(where, f"expected a list, found {_shown(v)}")
    if not v or (set(map(type, v)) == {int} and min(v) >= 0 and max(v) < n):
        return
    for i, x in enumerate(v):
        _index(x, n, f"{where}[{i}]", of)


def sites(v, where: str) -> None:
    """The sampled call sites (sites.build): frames, stacks of frame indices, and moments
    whose stacks and sites index them; every index in range."""
    fields(required={"frames": list_of(FRAME), "stacks": list_of(lambda x, w: None),
                     "moments": list_of(MOMENT)},
           optional={"symbolizer": string, "unwinder": string, "note": string,
                     **{k: number for k in ("sample_bytes", "samples", "frees_matched", "dropped",
                                            "unwind_us_per_sample", "frames_per_sample",
                                            "unwind_checked", "unwind_mismatches")}})(v, where)
    nf, ns = len(v["frames"]), len(v["stacks"])
    for i, st in enumerate(v["stacks"]):
        _indices(st, nf, f"{where}.stacks[{i}]", "frames")
    for i, m in enumerate(v["moments"]):
        _indices([st["stack"] for st in m["stacks"]], ns, f"{where}.moments[{i}].stacks", "stacks")
        named = [x.get("frame") for x in m["sites"]]
        if not (set(map(type, named)) <= {int, type(None)}
                and 0 <= min((f for f in named if f is not None), default=0)
                and max((f for f in named if f is not None), default=-1) < nf):
            for j, f in enumerate(named):
                if f is not None:
                    _index(f, nf, f"{where}.moments[{i}].sites[{j}].frame", "frames")


HEAP_OF_MAP = fields(required={"occupancy": string, "flags": string},
                     optional={"start": string, "kind": string, "pages": number, "walked": boolean})
ARENA_OF_MAP = fields(required={"heaps": list_of(HEAP_OF_MAP)},
                      optional={"walked": boolean, **{k: number for k in (
                          "arena", "pages", "free_resident_pages", "pinned_pages", "top_bytes",
                          "live_bytes", "top_resident_pages", "interleaved_bytes")}})
PINNER = fields(required={"stack": number, "pinned_bytes": number},
                optional={"site": string, **{k: number for k in ("blocks", "block_bytes",
                                                                 "error_bytes")}})
HEAPMAP = fields(required={"moment": string, "status": string, "arenas": list_of(ARENA_OF_MAP)},
                 optional={"t_s": maybe(number), "allocator": string, "note": string,
                           "pinners": list_of(PINNER),
                           **{k: number for k in (
                               "page_bytes", "release_measured_bytes", "rss_before", "rss_after",
                               "anon_before", "anon_after", "released_pages", "fork_ms",
                               "map_ms")}})


NAMED_MOMENT = schema_of(Moment, required=("name", "at_s"), breakdown=BREAKDOWN)
VERIFIED = fields(required={"setting": string},
                  optional={"moment": string, "error": string, "stretch": boolean,
                            **{k: maybe(number) for k in (
                                "rss_bytes", "wall_s", "change", "time_change")}})


SUMMARY = schema_of(
    Summary, required=("command",),
    command=list_of(string), peak=maybe(BREAKDOWN), final=maybe(BREAKDOWN), release=RELEASE,
    heap=maybe(HEAP), findings=list_of(FINDING), holds=list_of(HOLD),
    snapshots=list_of(SNAPSHOT), sites=maybe(sites), heapmaps=list_of(HEAPMAP),
    mapped_sites=maybe(sites), moments=list_of(NAMED_MOMENT), verified=list_of(VERIFIED),
    # what only the terminal and the page's notes read, as written
    images=list_of(anything), children=list_of(anything), outlived=list_of(anything),
    mapped_by=list_of(anything),
    resident_by_kind=maybe(each_value(anything)), resident_by_kind_peak=maybe(each_value(anything)),
    # a run heapsight could not start has no process
    **{k: maybe(number) for k in ("pid", "started_pid", "exit_code", "exit_signal")})


def timeline(v, where: str) -> None:
    """Columns of numbers (null: not measured), all as long as the time column "t"."""
    each_value(numbers)(v, where)
    if v and "t" not in v:
        raise Damaged(f"{where}.t", "missing (the time column every other one is read against)")
    lengths = {c: len(col) for c, col in v.items()}
    if len(set(lengths.values())) > 1:
        raise Damaged(where, "columns of uneven length: "
                      + ", ".join(f"{c} {n}" for c, n in sorted(lengths.items())))


def run_record(v, where: str) -> None:
    """A run record; a heap map's pinners name stacks of the run's sites."""
    fields(required={"summary": SUMMARY}, optional={"timeline": maybe(timeline)})(v, where)
    s = v["summary"]
    n = len((s.get("sites") or {}).get("stacks", ()))
    for i, m in enumerate(s.get("heapmaps") or ()):
        for j, p in enumerate(m.get("pinners") or ()):
            _index(p["stack"], n, f"summary.heapmaps[{i}].pinners[{j}].stack", "stacks of the sites")


RUN = run_record

# ----------------------------------------------------------------- a comparison

CHARTED = ("peak_rss", "final_rss", "retained", "wall_s", "cpu_s")   # charts.compare_charts
SPREAD = fields(optional={k: maybe(number) for k in ("median", "min", "max")})


def config(v, where: str) -> None:
    fields(required={"name": string, "ok": boolean},
           optional={"error": maybe(string), "about": string,
                     "runs": list_of(each_value(num_or_text)),
                     "stats": maybe(each_value(SPREAD))})(v, where)
    if v["ok"] and v.get("stats"):   # drawn as bars: every charted figure is indexed
        fields(required={k: fields(required={s: number for s in ("median", "min", "max")})
                         for k in CHARTED})(v["stats"], f"{where}.stats")


COMPARE = fields(required={"configs": list_of(config)},
                 optional={"command": list_of(string), "repeat": number,
                           "recommendation": string, "interrupted": boolean,
                           "rank_by": string, "rank_why": string,
                           "runs": list_of(fields(optional={"config": string, "summary": SUMMARY,
                                                            "timeline": maybe(timeline)}))})

# ----------------------------------------------------------------- lab results


def series(v, where: str) -> None:
    fields(required={"y": list_of(num_or_text)},
           optional={"name": string, "x": list_of(num_or_text), "lo": numbers, "hi": numbers,
                     "color": string, "step": boolean, "dash": boolean, "stack": boolean})(v, where)
    for k in ("x", "lo", "hi"):
        if k in v and len(v[k]) != len(v["y"]):
            raise Damaged(f"{where}.{k}", f"{len(v[k])} values for {len(v['y'])} in y")


AXIS = fields(optional={"label": string, "unit": string, "log": boolean, "min": number,
                        "categories": list_of(scalar)})
CHART = fields(required={"series": list_of(series)},
               optional={"id": string, "title": string, "kind": string, "note": string,
                         "x": AXIS, "y": AXIS,
                         "markers": list_of(fields(required={"x": number},
                                                   optional={"label": string}))})
EXPERIMENT = fields(
    optional={"name": string, "title": string, "source": string, "about": string,
              "error": string, "duration_s": number,
              "tables": list_of(fields(required={"rows": list_of(list_of(scalar))},
                                       optional={"title": string, "columns": list_of(scalar),
                                                 "note": string})),
              "claims": list_of(fields(required={"text": string, "verdict": string,
                                                 "evidence": string},
                                       optional={"depends_on": string, "source": string})),
              "charts": list_of(CHART)})
LAB = fields(required={"experiments": list_of(EXPERIMENT)},
             optional={"machine": each_value(scalar), "started": string})

SPECS = {"heapsight-run": RUN, "heapsight-compare": COMPARE, "heapsight-lab": LAB}


class _Unwritten:
    """Where the JSON held a number heapsight never writes (NaN, Infinity, an integer of
    thousands of digits): kept in place while parsing so the field can be named."""
    def __init__(self, text: str):
        self.text = text


def _parse(text: bytes, path: str):
    seen = []

    def unwritten(s: str):
        seen.append(s)
        return _Unwritten(s if len(s) < 16 else f"an integer of {len(s)} digits")
    try:
        try:
            doc = json.loads(text, parse_constant=unwritten)
        except ValueError as e:
            if "digits" not in str(e):   # int()'s limit on digits (Python 3.11)
                raise
            doc = json.loads(text, parse_constant=unwritten,
                             parse_int=lambda s: int(s) if len(s) < 40 else unwritten(s))
    except (ValueError, RecursionError) as e:  # bad JSON or UTF-8, too deep
        raise _refuse(path, f"not a heapsight file (not valid JSON: {str(e)[:120]})") from None
    return doc, bool(seen)


def _find_unwritten(v, where: str = ""):
    if isinstance(v, _Unwritten):
        raise Damaged(where or "(the document)", f"{v.text} is not a number heapsight writes")
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        if isinstance(x, (dict, list, _Unwritten)):
            _find_unwritten(x, f"{where}[{k}]" if isinstance(k, int) else
                            f"{where}.{k}" if where else k)


def load(path: str) -> dict:
    """A saved document of one of KINDS, checked; else HeapsightError (exit 2) whose one
    line names the file and the damaged field."""
    doc, unwritten = _parse(_text(path), path)
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if not isinstance(kind, str) or kind not in KINDS:
        if isinstance(doc, dict) and "kind" not in doc and {"command", "peak_rss_bytes"} <= doc.keys():
            raise _refuse(path, "kind: missing; this is the summary `heapsight run --json` "
                          "writes: report reads the run record (heapsight run -o FILE)")
        shown = repr(kind[:40]) if isinstance(kind, str) else "missing" if kind is None else _shown(kind)
        raise _refuse(path, f"kind: {shown} is not a heapsight run record, comparison or lab "
                      "results file")
    version = doc.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise _refuse(path, f"schema_version: expected a whole number, found {_shown(version)}")
    if version > SCHEMA_VERSION:
        raise _refuse(path, f"schema_version: {version} was written by a newer heapsight (this "
                      f"one reads {SCHEMA_VERSION}); upgrade heapsight to read it")
    try:
        if unwritten:
            _find_unwritten(doc)
        SPECS[kind](doc, "")
    except Damaged as e:
        raise _refuse(path, f"{e.where}: {e.what} ({KINDS[kind]}, damaged)") from None
    return doc
