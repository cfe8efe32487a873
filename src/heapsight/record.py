"""The run record: summary + timeline, saved as gzip'd JSON with a schema version, read
back by `heapsight report` and `heapsight compare`."""

from __future__ import annotations

import gzip
import json
import math
import os
import sys
from pathlib import Path

from heapsight.errors import HeapsightError
from heapsight.model import SCHEMA_VERSION, Summary
from heapsight.sampler import Timeline

KIND = "heapsight-run"


def _clean(values) -> list:
    return [None if (isinstance(v, float) and math.isnan(v)) else v for v in values]


def to_json_dict(summary: Summary, timeline: Timeline | None) -> dict:
    doc = {"kind": KIND, "schema_version": SCHEMA_VERSION, "summary": summary.to_dict()}
    if timeline is not None:
        doc["timeline"] = {c: _clean(arr.tolist()) for c, arr in timeline.columns.items()}
    return doc


def save(path: str, summary: Summary, timeline: Timeline) -> None:
    """Written to a temporary name and renamed: a reader never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    data = json.dumps(to_json_dict(summary, timeline), separators=(",", ":"), allow_nan=False)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(tmp, "wt", encoding="utf-8") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise HeapsightError(f"cannot write the run record {path}: {e.strerror}", 1) from e


def write_json(path: str, doc: dict, indent: int = 2) -> None:
    """The --json FILE of the commands: indented JSON to FILE, or to stdout for '-'."""
    text = json.dumps(doc, indent=indent)
    if path == "-":
        print(text, flush=True)
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def write_text(path: str, text: str) -> None:
    """A text output (--csv FILE): to FILE whole, or to stdout for '-'."""
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def save_doc(path: str, doc: dict) -> None:
    """A comparison or lab document, gzip'd compact JSON, written whole or not at all."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with gzip.open(tmp, "wt", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise HeapsightError(f"cannot write {path}: {e.strerror}", 1) from e


def load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise HeapsightError(f"{path} is not a readable heapsight run record: {e}", 2) from e
    if doc.get("kind") != KIND:
        raise HeapsightError(f"{path} is not a heapsight run record", 2)
    if doc.get("schema_version", 0) > SCHEMA_VERSION:
        raise HeapsightError(f"{path} was written by a newer heapsight (schema "
                             f"{doc['schema_version']}); upgrade heapsight to read it", 2)
    return doc
