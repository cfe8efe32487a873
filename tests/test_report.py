"""`heapsight report`: one self-contained HTML page from runs, comparisons and lab results,
checked by opening it in headless Chromium (every chart drawn, no script error)."""

import gzip
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import pytest
from heapsight.fmt import human

from heapsight.model import resident

from conftest import scenario
from heapsight import report
from heapsight.errors import HeapsightError
from heapsight.report import html as report_html
from heapsight.report.decimate import extreme_rows
from heapsight.report import png
from heapsight.timeline import COLUMNS

OUT_DIR = Path(__file__).resolve().parent.parent / "test-output"   # kept for people to look at
PAGE_LIMIT_BYTES = 5 * 1024 * 1024   # a 10-minute 1 kHz run must stay an easy page to open
RENDER_LIMIT_MS = 2000               # ... and draw in under two seconds
BUILD_LIMIT_S = 5.0                  # building it takes well under a second here; margin for load
PAYLOAD = "<script>alert(1)</script>"
PWN = '<img src=x onerror="document.body.dataset.pwned=1">'

pytestmark = pytest.mark.skipif(shutil.which("chromium") is None and not Path("/usr/bin/chromium").exists(),
                                reason="headless chromium (Debian package chromium) is not installed")


def hs(*args, timeout=180, env=None):
    return subprocess.run([sys.executable, "-m", "heapsight", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def body_attrs(dom: str) -> dict:
    body = re.search(r"<body([^>]*)>", dom).group(1)
    return dict(re.findall(r'([\w-]+)="([^"]*)"', body))


def figures(dom: str) -> dict:
    """chart id -> the figure's opening tag attributes and its inner SVG."""
    out = {}
    for m in re.finditer(r'<figure class="chart[^"]*" id="fig-([^"]+)"([^>]*)>(.*?)</figure>', dom, re.S):
        out[m.group(1)] = (dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(2))), m.group(3))
    return out


def page_data(html_text: str) -> dict:
    m = re.search(r'<script type="application/json" id="hs-data">(.*?)</script>', html_text, re.S)
    return json.loads(m.group(1))


def lab_doc(name: str = "release", payload: str = "") -> dict:
    """A small lab document in the CHARTS format: a log-log line chart with a min-max band,
    a bar chart with whiskers, a table, one claim of each verdict, and a failed experiment."""
    sizes = [2048 * 4 ** i for i in range(9)]
    return {"kind": "heapsight-lab", "schema_version": 1, "quick": True,
            "machine": {"cores": 2, "kernel": "6.1.0", "libc": "glibc 2.36", "python": "3.11"},
            "started": "2025-01-01T00:00:00",
            "experiments": [
                {"name": name, "title": "Which freed blocks go back to the OS" + payload,
                 "source": "A write-up on malloc", "about": "Allocate, free, measure." + payload,
                 "quick": True, "duration_s": 1.25, "data": {},
                 "tables": [{"title": "RSS after free" + payload, "columns": ["block", "glibc", "jemalloc"],
                             "rows": [["2 KiB", 2048, 1.5], [payload or "8 KiB", 8192, 2.25]],
                             "note": "kB as printed"}],
                 "claims": [
                     {"text": "small blocks stay" + payload, "source": "A write-up on malloc",
                      "verdict": "holds", "evidence": "2 KiB blocks kept 100%", "depends_on": ""},
                     {"text": "large blocks go back", "source": "A write-up on malloc",
                      "verdict": "fails", "evidence": "the second 1 MiB block stayed", "depends_on": ""},
                     {"text": "order does not matter", "source": "A write-up on malloc",
                      "verdict": "depends", "evidence": "freed last-first: kept; first-first: returned",
                      "depends_on": "the order of the frees"}],
                 "charts": [
                     {"id": "sweep", "title": "RSS after free by block size" + payload, "kind": "line",
                      "x": {"label": "block size", "unit": "bytes", "log": True},
                      "y": {"label": "RSS after free", "unit": "bytes", "log": True},
                      "series": [{"name": "glibc" + payload, "x": sizes, "y": [s * 2 for s in sizes],
                                  "lo": [s * 1.5 for s in sizes], "hi": [s * 2.5 for s in sizes]},
                                 {"name": "jemalloc", "x": sizes, "y": [4096 + s / 8 for s in sizes]}],
                      "note": "one point per size" + payload},
                     {"id": "rounding", "title": "Bytes allocated per request", "kind": "bar",
                      "x": {"label": "requested", "unit": "", "log": False,
                            "categories": ["1 B", "8 B", "24 B", "25 B" + payload]},
                      "y": {"label": "allocated", "unit": "bytes", "log": False},
                      "series": [{"name": "glibc", "x": ["1 B", "8 B", "24 B", "25 B"], "y": [32, 32, 32, 48]},
                                 {"name": "jemalloc", "x": ["1 B", "8 B", "24 B", "25 B"], "y": [8, 8, 32, 32],
                                  "lo": [8, 8, 30, 30], "hi": [8, 8, 34, 34]}],
                      "note": "usable size plus header"}]},
                {"name": "perl", "error": "perl exited with 2" + payload}]}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A real run, a real comparison and a hand-made lab document, saved as files."""
    d = tmp_path_factory.mktemp("report-inputs")
    run = d / "retention.hsrun.json.gz"
    p = hs("run", "-q", "-o", str(run), "--html", str(d / "run.html"), "--",
           scenario("hs-retention"), "--mb", "64")
    assert p.returncode == 0, p.stderr
    cmp_ = d / "compare.json.gz"
    p = hs("compare", "--repeat", "1", "--configs", "glibc,mmap", "-o", str(cmp_),
           "--html", str(d / "compare.html"), "--", scenario("hs-retention"), "--mb", "32")
    assert p.returncode == 0, p.stderr
    lab = d / "lab.json"
    lab.write_text(json.dumps(lab_doc()))
    return {"run": run, "compare": cmp_, "lab": lab, "dir": d}


@pytest.fixture(scope="module")
def page(inputs):
    """The report of all three, opened in Chromium; a screenshot kept in test-output/."""
    out = inputs["dir"] / "report.html"
    p = hs("report", str(inputs["run"]), str(inputs["compare"]), str(inputs["lab"]), "-o", str(out),
           "--title", "test report")
    assert p.returncode == 0, p.stderr
    OUT_DIR.mkdir(exist_ok=True)
    shutil.copy(out, OUT_DIR / "report.html")
    png.screenshot(str(out), str(OUT_DIR / "report.png"), size=(1280, 3400), scale=1)
    text = out.read_text()
    return {"path": out, "html": text, "dom": png.dump_dom(str(out)), "data": page_data(text)}


# a run's charts: its timeline's three, the flame graph of its sampled call sites, its heap map
RUN_CHARTS = ["s1-memory", "s1-rate", "s1-arenas", "s1-flame", "s1-heapmap"]


def test_every_chart_is_drawn_without_a_script_error(page):
    # GIVEN a report of a run, a comparison and a lab document, opened in Chromium
    charts = page["data"]["charts"]
    # THEN the page drew every chart it carries and recorded no error
    attrs = body_attrs(page["dom"])
    assert attrs["data-charts"] == f"{len(charts)} drawn", attrs
    assert attrs["data-errors"] == "0", re.search(r'id="hs-errors"[^>]*>(.*?)<', page["dom"])
    # run: memory, rate, arenas, its call sites' flame graph and its heap map; comparison:
    # memory, time, RSS; lab: its two charts
    assert len(charts) == 10, [c["id"] for c in charts]


def test_page_is_self_contained(page):
    # THEN the page loads nothing: no external scripts, styles, fonts or images
    text = page["html"].replace("'http://www.w3.org/2000/svg'", "")  # a name, not fetched
    for needle in ("<link", " src=", "@import", "url(http", "url(//", "@font-face", "fetch(",
                   "XMLHttpRequest", "http://", "https://"):
        assert needle not in text, needle
    assert text.count("<script") == 3 and text.count("<style") == 1


def test_each_chart_svg_holds_its_data(page):
    figs = figures(page["dom"])
    assert set(figs) == {c["id"] for c in page["data"]["charts"]}
    for cid, (attrs, inner) in figs.items():
        # THEN every chart drew marks (areas, lines, bars) inside an SVG, with axis labels
        assert int(attrs.get("data-marks", "0")) > 0, cid
        assert "<svg" in inner and inner.count("<path") + inner.count('class="bar"') > 0, cid
        assert 'class="axis-title"' in inner, cid


def test_sections_show_verdict_recommendation_and_claims(page):
    dom = page["dom"]
    # the run's verdict and breakdown, the comparison's recommendation, the lab's claims
    assert "RETENTION:" in dom and "Where the RSS went" in dom
    assert "recommendation:" in dom and "mmap" in dom
    assert dom.count('class="badge holds"') == 1 and dom.count('class="badge fails"') == 1
    assert re.search(r'class="badge depends">depends <span class="on">on the order of the frees', dom)
    assert "this experiment failed to run: perl exited with 2" in dom
    # the lab's table, with its numbers formatted
    assert "RSS after free" in dom and "2,048" in dom


def test_run_timeline_splits_samples_as_the_summary_does(page, inputs):
    # GIVEN the run's stacked timeline and the run's own summary
    mem = next(c for c in page["data"]["charts"] if c["id"] == "s1-memory")
    series = {s["name"]: np.array(s["y"], dtype=float) for s in mem["series"]
              if s.get("stack", True)}
    x = np.array(mem["series"][0]["x"])
    rss = np.array(next(s["y"] for s in mem["series"] if s["name"] == "RSS"), dtype=float)
    peak = json.loads(gzip.open(inputs["run"], "rt").read())["summary"]["peak"]
    # THEN at the peak sample the bands are the summary's peak breakdown, byte for byte
    # (its time is given to the ms: of two samples less than a ms apart, the one it is; a
    # sampler that fell behind once took two 0.1 ms apart, of the same RSS)
    # (the resident parts: what of live, waste and metadata was never touched is not in RSS)
    live, waste, metadata = resident(peak["live_bytes"], peak["waste_bytes"],
                                     peak["metadata_bytes"], peak["untouched_bytes"])
    bands = [(int(rss[i]), series["live"][i], series["waste + metadata"][i],
              series["retained (freed, kept)"][i], series["non-heap"][i])
             for i in np.flatnonzero(np.abs(x - peak["at_s"]) <= 0.0005 + 1e-9)]
    assert (peak["rss_bytes"], live, waste + metadata, peak["retained_bytes"],
            peak["non_heap_bytes"]) in bands, (peak, bands)
    # every sample's bands cover its RSS (above it only by live blocks never touched)
    assert np.all(np.sum(list(series.values()), axis=0) >= rss - 4)
    # and the release at exit is marked
    assert any("release at exit" in m["label"] for m in mem["markers"])
    # the peak markers say which peak: the live bytes' (the peak column) and RSS's, with the
    # summary's figures
    summary = json.loads(gzip.open(inputs["run"], "rt").read())["summary"]
    labels = [m["label"] for m in mem["markers"]]
    assert f"peak live {human(peak['live_bytes'])}" in labels, labels
    assert f"peak RSS {human(summary['peak_rss_bytes'])}" in labels, labels


def test_hover_shows_values_and_drag_zooms(page, tmp_path):
    # GIVEN the page with a script that moves the mouse over the run's timeline and drags
    probe = """<script>(function(){
      var fig=document.getElementById('fig-s1-memory'), ov=fig.querySelector('rect.overlay');
      var r=ov.getBoundingClientRect(), y=r.top+r.height/2;
      function ev(t,x){ov.dispatchEvent(new MouseEvent(t,{clientX:x,clientY:y,bubbles:true,button:0}));}
      ev('mousemove', r.left+r.width*0.5);
      var tip=fig.querySelector('.tip');
      document.body.dataset.tip=tip.style.display+'|'+tip.textContent;
      ev('mousedown', r.left+r.width*0.2); ev('mousemove', r.left+r.width*0.6); ev('mouseup', r.left+r.width*0.6);
      document.body.dataset.zoomed=fig.textContent.indexOf('zoomed in')>=0?'yes':'no';
      ov=fig.querySelector('rect.overlay'); ov.dispatchEvent(new MouseEvent('dblclick',{bubbles:true}));
      document.body.dataset.reset=fig.textContent.indexOf('zoomed in')>=0?'no':'yes';
    })();</script>"""
    f = tmp_path / "probe.html"
    f.write_text(page["html"].replace("</body>", probe + "</body>"))
    attrs = body_attrs(png.dump_dom(str(f)))
    # THEN the tooltip shows the time and each band's value in binary units
    assert attrs["data-tip"].startswith("block|time "), attrs["data-tip"]
    assert "retained (freed, kept)" in attrs["data-tip"] and "MiB" in attrs["data-tip"]
    # a drag zooms in, a double-click zooms back out, and none of it raised an error
    assert attrs["data-zoomed"] == "yes" and attrs["data-reset"] == "yes"
    assert attrs["data-errors"] == "0"


def test_a_real_lab_run_is_drawn_whole(tmp_path):
    # GIVEN a real (quick) lab experiment, saved by `heapsight lab`
    lab = tmp_path / "lab.json.gz"
    p = hs("lab", "release", "--quick", "--configs", "glibc,jemalloc", "-o", str(lab))
    assert p.returncode == 0, p.stderr
    out = tmp_path / "lab.html"
    p = hs("report", str(lab), "-o", str(out))
    assert p.returncode == 0, p.stderr
    # THEN each of its charts is drawn with marks, its claims carry badges, no script error
    dom = png.dump_dom(str(out))
    charts = page_data(out.read_text())["charts"]
    assert charts and body_attrs(dom)["data-charts"] == f"{len(charts)} drawn"
    assert body_attrs(dom)["data-errors"] == "0"
    assert all(int(a.get("data-marks", "0")) > 0 for a, _ in figures(dom).values())
    claims = json.loads(gzip.open(lab, "rt").read())["experiments"][0]["claims"]
    assert dom.count('class="badge ') == len(claims) > 0


def test_page_records_script_errors_for_tests(page, tmp_path):
    # GIVEN the page with a script that fails after the charts are drawn
    f = tmp_path / "broken.html"
    f.write_text(page["html"].replace(
        "</body>", "<script>console.error('first');throw new Error('boom')</script></body>"))
    dom = png.dump_dom(str(f))
    # THEN both are counted on <body> and written out on the page
    assert body_attrs(dom)["data-errors"] == "2"
    assert re.search(r'id="hs-errors"[^>]*>errors on this page: first \| [^<]*boom', dom)


def test_program_named_script_tag_shows_as_text(inputs, tmp_path):
    # GIVEN records whose program, verdict, configuration and lab texts are markup
    run = json.loads(gzip.open(inputs["run"], "rt").read())
    run["summary"]["command"] = [PAYLOAD, PWN]
    run["summary"]["verdict"] = PAYLOAD + PWN
    run["summary"]["findings"][0]["suggestions"] = [PAYLOAD]
    cmp_ = json.loads(gzip.open(inputs["compare"], "rt").read())
    cmp_["configs"][0]["name"] = PAYLOAD
    cmp_["configs"][1]["error"], cmp_["configs"][1]["ok"] = PWN, False
    cmp_["runs"][0]["config"] = "</script><script>document.body.dataset.pwned=1</script>"
    files = []
    for n, doc in (("run.json", run), ("cmp.json", cmp_), ("lab.json", lab_doc(PAYLOAD, PWN))):
        (tmp_path / n).write_text(json.dumps(doc))
        files.append(str(tmp_path / n))
    out = tmp_path / "x.html"
    # (as recorded: the summary itself carries the payloads, not the capture it would be
    # derived from again)
    p = hs("report", "--as-recorded", *files, "-o", str(out))
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    # THEN no payload reaches the page as markup: the only scripts are the page's own three
    assert PAYLOAD not in text and "<img" not in text
    assert text.count("<script") == 3
    dom = png.dump_dom(str(out))
    attrs = body_attrs(dom)
    assert "data-pwned" not in attrs and attrs["data-errors"] == "0"
    assert dom.count("<script") == 3 and "<img" not in dom
    # and it shows as text: in the page, the chart titles and legends drawn by the script
    assert dom.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 8
    assert "&lt;/script&gt;&lt;script&gt;document.body.dataset.pwned=1" in dom


def big_run(n=600_000):
    """A 10-minute run sampled at 1 kHz: every column of the sampler, one RSS spike."""
    rng = np.random.default_rng(7)
    t = np.arange(n) / 1000.0
    live = np.maximum(0, 200e6 * (0.5 + 0.5 * np.sin(t / 40)) + rng.normal(0, 2e6, n))
    rss = live * 1.1 + 30e6 + rng.normal(0, 1e5, n)
    spike = n // 3 + 17
    rss[spike] = 3.1e9
    n_alloc = np.cumsum(rng.integers(50, 150, n)).astype(float)
    cols = {"t": t, "rss": rss, "hwm": np.maximum.accumulate(rss), "anon": rss - 20e6,
            "file": np.full(n, 18e6), "shmem": np.full(n, 2e6), "pss": rss,
            "live_usable": live * 1.04, "live_req": live, "n_alloc": n_alloc,
            "n_free": n_alloc - np.floor(live / 512), "alloc_in_use": live * 1.05,
            "alloc_free": rss - live, "alloc_mapped": np.maximum.accumulate(rss),
            "arenas": np.minimum(1 + t // 60, 8), "threads": np.full(n, 9.0),
            "children_rss": np.zeros(n)}
    assert set(cols) == set(COLUMNS)
    peak = {"at_s": t[spike], "rss_bytes": int(rss[spike]), "live_bytes": 0, "waste_bytes": 0,
            "metadata_bytes": 0, "retained_bytes": 0, "non_heap_bytes": 0, "file_bytes": 0,
            "baseline_anon_bytes": 131072, "other_anon_bytes": 0, "untouched_bytes": 0}
    summary = {"command": ["./server"], "pid": 1, "started_pid": 1, "exit_code": 0, "exit_signal": 0,
               "preload": "active", "preload_note": "", "duration_s": 600.0, "samples": n,
               "sample_hz": 1000.0, "sampler_cpu_s": 1.0, "peak_rss_bytes": int(rss.max()),
               "final_rss_bytes": int(rss[-1]), "peak": peak, "final": dict(peak, at_s=600.0),
               "release": {"measured": False, "call": "malloc_trim(0)", "why_not": "test"},
               "heap": {"allocator": "glibc", "arenas": 8, "threads_seen": 9}, "findings": [],
               "verdict": "healthy"}
    return {"kind": "heapsight-run", "schema_version": 1, "summary": summary,
            "timeline": {c: cols[c].tolist() for c in COLUMNS}}, rss


def test_long_run_page_stays_small_fast_and_keeps_the_peak(tmp_path):
    # GIVEN a 10-minute run at 1 kHz (600,000 samples x 16 columns)
    doc, rss = big_run()
    # WHEN its page is built
    t0 = time.monotonic()
    page = report_html.build([("long run", doc)])
    took = time.monotonic() - t0
    # THEN it is small and quick to build,
    size = len(page.html.encode())
    assert size < PAGE_LIMIT_BYTES, size
    assert took < BUILD_LIMIT_S, took
    # the highest RSS of the record is in the page exactly (thinning kept the spike),
    mem = next(c for c in page_data(page.html)["charts"] if c["id"] == "s1-memory")
    line = next(s for s in mem["series"] if s["name"] == "RSS")
    assert max(v for v in line["y"] if v is not None) == round(rss.max())
    assert len(line["y"]) <= 4 * 2000 + 2
    # and Chromium draws it in under two seconds, without error
    f = tmp_path / "long.html"
    f.write_text(page.html)
    attrs = body_attrs(png.dump_dom(str(f)))
    assert attrs["data-errors"] == "0" and attrs["data-charts"] == f"{len(page.charts)} drawn"
    assert int(attrs["data-render-ms"]) < RENDER_LIMIT_MS, attrs


def test_thinning_keeps_each_stretch_lowest_and_highest_sample():
    # GIVEN two noisy columns of 100,003 samples with a few NaN, thinned to 500 buckets
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=100_003), rng.normal(size=100_003)
    a[rng.integers(0, len(a), 50)] = np.nan
    keep = extreme_rows([a, b], 500)
    # THEN the kept rows are real rows in time order, at most four per bucket plus the ends,
    assert np.all(np.diff(keep) > 0) and keep[0] == 0 and keep[-1] == len(a) - 1
    assert len(keep) <= 4 * 500 + 2
    # and every bucket's lowest and highest value of each column is among them
    per = -(-len(a) // 500)
    kept = set(keep.tolist())
    for col in (a, b):
        for start in range(0, len(col), per):
            chunk = col[start:start + per]
            for pick in (np.nanargmin, np.nanargmax):
                assert start + int(pick(chunk)) in kept


def test_png_writes_one_image_per_chart(inputs, tmp_path):
    # GIVEN the run alone, with --png
    out, pngs = tmp_path / "r.html", tmp_path / "png"
    p = hs("report", str(inputs["run"]), "-o", str(out), "--png", str(pngs))
    assert p.returncode == 0, p.stderr
    ids = [c["id"] for c in page_data(out.read_text())["charts"]]
    # THEN there is one PNG per chart, named by its id, of the fixed size (2x pixels)
    assert sorted(f.name for f in pngs.iterdir()) == sorted(f"{i}.png" for i in ids)
    for i in ids:
        data = (pngs / f"{i}.png").read_bytes()
        assert data[:8] == png.PNG_SIGNATURE
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert (width, height) == (png.WIDTH * png.SCALE, png.HEIGHT * png.SCALE)
        assert len(data) > 20_000  # a drawn chart, not a blank page
    OUT_DIR.mkdir(exist_ok=True)
    shutil.copy(pngs / f"{ids[0]}.png", OUT_DIR / f"report-{ids[0]}.png")


def test_other_commands_write_a_page_from_what_they_save(inputs, tmp_path):
    # GIVEN a run record as `heapsight run` holds it in memory (the --html of run/compare/lab)
    doc = json.loads(gzip.open(inputs["run"], "rt").read())
    # WHEN it is written as a page
    page = report.write_html(str(tmp_path / "run.html"), [("this run", doc)])
    # THEN the file is the page, with the run's charts and its source named
    text = (tmp_path / "run.html").read_text()
    assert text == page.html and [c["id"] for c in page.charts] == RUN_CHARTS
    assert "this run" in text
    with pytest.raises(HeapsightError):
        report.write_html(str(tmp_path / "no-such-dir" / "run.html"), [doc])


def test_run_and_compare_html_options_write_the_same_charts_as_report(inputs):
    # GIVEN the pages `run --html` and `compare --html` wrote next to their saved files
    for kind, charts in (("run", RUN_CHARTS),
                         ("compare", ["s1-memory", "s1-time", "s1-rss"])):
        html = (inputs["dir"] / f"{kind}.html").read_text()
        # THEN each holds its section's charts, as `heapsight report` draws them
        for chart_id in charts:
            assert f'"{chart_id}"' in html, (kind, chart_id)


def test_missing_file_is_an_error_and_writes_nothing(inputs, tmp_path):
    out = tmp_path / "r.html"
    p = hs("report", str(inputs["run"]), str(tmp_path / "nope.json.gz"), "-o", str(out))
    assert p.returncode == 2
    assert "nope.json.gz: no such file" in p.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [b"hello, not json", b'{"kind": "something-else"}',
                                     gzip.compress(b'{"kind": "heapsight-run"}', mtime=0)])
def test_file_that_is_not_a_record_is_an_error_and_writes_nothing(tmp_path, content):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(content)
    out = tmp_path / "r.html"
    p = hs("report", str(bad), "-o", str(out))
    assert p.returncode == 2
    assert "bad.json.gz" in p.stderr and "heapsight" in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()


def test_missing_chromium_names_the_package_before_writing(inputs, tmp_path):
    out = tmp_path / "r.html"
    env = dict(__import__("os").environ, HEAPSIGHT_CHROMIUM=str(tmp_path / "no-chromium"))
    p = hs("report", str(inputs["run"]), "-o", str(out), "--png", str(tmp_path / "png"), env=env)
    assert p.returncode == 2
    assert "Debian package chromium" in p.stderr
    assert not out.exists() and not (tmp_path / "png").exists()


def test_a_capture_whose_program_is_markup_is_derived_again_as_text(inputs, tmp_path):
    # GIVEN a run record whose capture (what the summary is derived from again) names a
    # program that is markup
    run = json.loads(gzip.open(inputs["run"], "rt").read())
    assert "capture" in run
    run["capture"]["argv"] = [PAYLOAD, PWN]
    (tmp_path / "run.json").write_text(json.dumps(run))
    out = tmp_path / "x.html"
    p = hs("report", str(tmp_path / "run.json"), "-o", str(out))
    assert p.returncode == 0, p.stderr
    # THEN the page derived from it shows the name as text, never as markup
    text = out.read_text()
    assert PAYLOAD not in text and "<img" not in text and text.count("<script") == 3
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
