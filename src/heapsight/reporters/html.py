"""The HTML format: saved runs, comparisons and lab results as one self-contained page
(the page itself is built by heapsight.report)."""

from __future__ import annotations

from heapsight import report


def write(path: str, docs: list, title: str | None = None):
    """Writes the page for docs (documents as saved, or (source name, document) pairs) to
    path, whole or not at all, and returns it."""
    return report.write_html(path, docs, title)
