"""`heapsight report`'s machinery: saved runs, comparisons and lab results as one
self-contained HTML page (html.py), its charts (charts.py, decimate.py; a run's call
sites and heap maps: holders.py; all drawn in the browser by assets/report.js) and PNG
images of them (png.py).

Other commands write a page with write_html(path, [document]) where the document is what
they save: a run record (record.to_json_dict), a comparison with its "runs", a lab file;
a (name, document) pair names the section's source. check_output(path) refuses a page
path that cannot be written, before a long run rather than after it.
"""

from __future__ import annotations

from heapsight import output, record
from heapsight.report.html import Page, build, printable



def load(path: str) -> dict:
    """A saved document, checked (record.load: one loader for every reader)."""
    return record.load(path)


def _items(docs: list) -> list:
    out = []
    for i, d in enumerate(docs, 1):
        if isinstance(d, tuple):
            out.append(d)
        else:
            out.append((f"{record.KINDS.get(d.get('kind'), 'document')} #{i}", d))
    return out


def build_page(docs: list, title: str | None = None) -> Page:
    """docs: documents as saved, or (source name, document) pairs."""
    return build(_items(docs), title)


def check_output(path: str, option: str = "--html") -> None:
    output.check(path, option)


def write_html(path: str, docs: list, title: str | None = None) -> Page:
    """Writes the page for docs to path (whole or not at all) and returns it; the `--html
    FILE` of run, compare and lab."""
    page = build_page(docs, title)
    output.write(path, printable(page.html), gzip=False)
    return page


__all__ = ["Page", "build_page", "check_output", "load", "printable", "write_html"]
