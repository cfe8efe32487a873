"""The page as a reader sees it at laptop size (1366x768, headless Chromium): the verdict,
the breakdown and the first thing to try in the first screen; no axis repeating a tick
label; no label over another; long lab tables folded; legends toggle series."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import scenario
from heapsight.report import png

HS = [sys.executable, "-m", "heapsight"]


def attrs(dom: str) -> dict:
    body = re.search(r"<body([^>]*)>", dom).group(1)
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body))


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    d = tmp_path_factory.mktemp("layout")
    run, cmp, lab = d / "r.hsrun.json.gz", d / "c.json.gz", d / "l.json.gz"
    for argv in (["run", "-q", "-o", str(run), "--", scenario("hs-retention")],
                 ["compare", "--repeat", "2", "--configs", "glibc,glibc-arena2,jemalloc", "-o", str(cmp),
                  "--", scenario("hs-retention")],
                 ["lab", "waste", "--quick", "--configs", "glibc,jemalloc", "-o", str(lab)]):
        p = subprocess.run([*HS, *argv], capture_output=True, text=True, cwd=d, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
    out = d / "page.html"
    p = subprocess.run([*HS, "report", str(run), str(cmp), str(lab), "-o", str(out)],
                       capture_output=True, text=True, cwd=d, timeout=120)
    assert p.returncode == 0, p.stderr
    return out


def test_the_first_screen_has_the_verdict_breakdown_and_first_suggestion(page):
    a = attrs(png.dump_dom(str(page), size=(1366, 768)))
    assert a["errors"] == "0"
    assert a["first-screen"] == "verdict,breakdown,suggestion", a
    # and a long lab table is folded under its title, out of the way
    assert '<details class="table"><summary>' in page.read_text()


def test_no_axis_repeats_a_label_and_no_label_covers_another(page):
    a = attrs(png.dump_dom(str(page), size=(1366, 768)))
    assert a["tick-repeats"] == "0", a
    assert a["overlaps"] == "0", a
