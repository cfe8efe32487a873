"""Comma-separated tables for spreadsheets and CI: compare's comparison (one row per
configuration, raw numbers in base units) and lab's tables (one row per table row)."""

from __future__ import annotations

import csv
import io

from heapsight.ranking import METRICS


def render_compare(doc: dict) -> str:
    """configuration, ok, error, then median/min/max of each metric (bytes, seconds, counts)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    head = ["configuration", "allocator", "ok", "error", "runs"]
    for key, _ in METRICS:
        head += [f"{key}_median", f"{key}_min", f"{key}_max"]
    w.writerow(head)
    for r in doc["configs"]:
        row = [r["name"], r["allocator"], int(bool(r["ok"])), r.get("error") or "", len(r["runs"])]
        for key, _ in METRICS:
            st = (r.get("stats") or {}).get(key)
            row += [st["median"], st["min"], st["max"]] if st else ["", "", ""]
        w.writerow(row)
    return out.getvalue()


def render_lab(doc: dict) -> str:
    """experiment, table, then the table's own columns (each table's header row first)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    for e in doc["experiments"]:
        for t in e.get("tables", []):
            w.writerow(["experiment", "table", *t["columns"]])
            for row in t["rows"]:
                w.writerow([e["name"], t["title"], *row])
    return out.getvalue()
