"""`heapsight report`'s machinery: saved runs, comparisons and lab results as one
self-contained HTML page (html.py), its charts (charts.py, decimate.py, drawn in the
browser by assets/report.js) and PNG images of them (png.py).

Other commands write a page with write_html(path, [document]) where the document is what
they save: a run record (record.to_json_dict), a comparison with its "runs", a lab file;
a (name, document) pair names the section's source. check_output(path) refuses a page
path that cannot be written, before a long run rather than after it.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from heapsight.errors import HeapsightError
from heapsight.report.html import Page, build

KINDS = {"heapsight-run": ("a run record", "summary", dict),
         "heapsight-compare": ("a comparison", "configs", list),
         "heapsight-lab": ("lab results", "experiments", list)}
SCHEMA_VERSION = 1   # the newest schema of every kind this reader knows


def load(path: str) -> dict:
    """A saved document (gzip'd or plain JSON) of one of KINDS, or a HeapsightError (exit 2)
    saying why not."""
    what = "a heapsight run record, comparison or lab results file"
    p = Path(path)
    if not p.exists():
        raise HeapsightError(f"{path}: no such file", 2)
    if p.is_dir():
        raise HeapsightError(f"{path} is a directory, not {what}", 2)
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
    except OSError as e:
        raise HeapsightError(f"{path}: cannot read it ({e.strerror or e})", 2) from e
    except (EOFError, ValueError) as e:  # bad gzip, bad JSON, bad UTF-8
        raise HeapsightError(f"{path} is not {what} (it is not JSON: {e})", 2) from e
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind not in KINDS:
        raise HeapsightError(f"{path} is not {what} (its kind is {kind!r})", 2)
    name, key, typ = KINDS[kind]
    if not isinstance(doc.get(key), typ):
        raise HeapsightError(f"{path} is {name} without its {key!r}: damaged or cut short", 2)
    version = doc.get("schema_version", 0)
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise HeapsightError(f"{path} was written by a newer heapsight (schema {version}); "
                             "upgrade heapsight to read it", 2)
    return doc


def _items(docs: list) -> list:
    out = []
    for i, d in enumerate(docs, 1):
        if isinstance(d, tuple):
            out.append(d)
        else:
            out.append((f"{KINDS.get(d.get('kind'), ('document',))[0]} #{i}", d))
    return out


def build_page(docs: list, title: str | None = None) -> Page:
    """docs: documents as saved, or (source name, document) pairs."""
    return build(_items(docs), title)


def check_output(path: str, option: str = "--html") -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise HeapsightError(f"{option} {path}: directory {parent} does not exist", 2)
    if os.path.isdir(path):
        raise HeapsightError(f"{option} {path} is a directory", 2)


def write_html(path: str, docs: list, title: str | None = None) -> Page:
    """Writes the page for docs to path (whole or not at all) and returns it; the `--html
    FILE` of run, compare and lab."""
    check_output(path)
    page = build_page(docs, title)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page.html)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise HeapsightError(f"cannot write {path}: {e.strerror}", 1) from e
    return page


__all__ = ["KINDS", "Page", "build_page", "check_output", "load", "write_html"]
