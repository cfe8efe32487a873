"""The page's "who holds it" part: the flame graph of the sampled call sites with the top
call sites beside it, and the heap map with the pinners, drawn from a run's "sites" and
"heapmaps" (the shapes in docs/numbers.md). Built from small profiles whose boxes and cells
are known, opened in headless Chromium; scripts added to the page click, hover and switch
moments, and write what they saw on <body>."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from heapsight.report import holders
from heapsight.report import html as report_html
from heapsight.report import png
from heapsight.timeline import COLUMNS

OUT_DIR = Path(__file__).resolve().parent.parent / "test-output"   # kept for people to look at
FLAME_LIMIT_MS = 500   # a 10,000-stack, 60-frame profile: well under a second to draw
MB = 1 << 20
XSS = '<img src=x onerror="document.body.dataset.pwned=1">'

needs_chromium = pytest.mark.skipif(
    shutil.which("chromium") is None and not Path("/usr/bin/chromium").exists(),
    reason="headless chromium (Debian package chromium) is not installed")


# ---------------------------------------------------------------------------- the documents

def b64(values) -> str:
    return base64.b64encode(bytes(values)).decode("ascii")


FRAMES = [
    {"function": "main", "file": "/src/prog.c", "line": 10, "object": "/usr/bin/prog", "address": "0x1000"},
    {"function": "load", "file": "/src/prog.c", "line": 20, "object": "/usr/bin/prog", "address": "0x1100"},
    {"function": "parse_row", "file": "/src/prog.c", "line": 30, "object": "/usr/bin/prog", "address": "0x1200"},
    {"function": "strdup", "file": None, "line": None, "object": "/lib/x86_64-linux-gnu/libc.so.6",
     "address": "0x9a000"},
    {"function": "build_index", "file": "/src/prog.c", "line": 40, "object": "/usr/bin/prog", "address": "0x1300"},
    {"function": None, "file": None, "line": None, "object": "/usr/lib/libfoo.so.1", "address": "0x1234"},
    {"function": XSS, "file": "/src/x.c", "line": 1, "object": "/usr/bin/prog", "address": "0x1400"},
    {"function": "main", "file": "/src/prog.c", "line": 12, "object": "/usr/bin/prog", "address": "0x1010"}]
NAMES = ["main", "load", "parse_row", "strdup", "build_index", "libfoo.so.1+0x1234", XSS, "main"]
# innermost first; main calls build_index from another line (frame 7); the last not unwound
STACKS = [[2, 1, 0], [3, 2, 1, 0], [4, 7], [5, 4, 7], [6, 0], []]


def entry(stack, nbytes, blocks, err):
    return {"stack": stack, "bytes": nbytes, "blocks": blocks, "error_bytes": err}


def site(name, frame, nbytes, total, blocks, err):
    return {"site": name, "frame": frame, "bytes": nbytes, "share": nbytes / total, "blocks": blocks,
            "error_bytes": err}


def small_sites() -> dict:
    """Three moments: at the peak 1000 MiB over four stacks, at exit 440 MiB over three (one
    named with markup, one not unwound), nothing never freed."""
    peak = [entry(0, 600 * MB, 6000, 30 * MB), entry(1, 200 * MB, 2000, 40 * MB),
            entry(2, 150 * MB, 10, 0), entry(3, 50 * MB, 5, 3 * MB)]
    exit_ = [entry(0, 100 * MB, 1000, 10 * MB), entry(4, 300 * MB, 3, 20 * MB), entry(5, 40 * MB, 9, 9 * MB)]
    return {"sample_bytes": 524288, "samples": 300, "frees_matched": 100, "dropped": 0,
            "unwinder": "libgcc (_Unwind_Backtrace)", "unwind_us_per_sample": 3.2,
            "frames_per_sample": 4.0, "symbolizer": "llvm-symbolizer", "frames": FRAMES, "stacks": STACKS,
            "moments": [
                {"name": "peak", "t_s": 1.5, "live_bytes": 1000 * MB, "estimated_bytes": 1000 * MB,
                 "samples": 200, "stacks": peak,
                 "sites": [site("parse_row (prog.c:30)", 2, 600 * MB, 1000 * MB, 6000, 30 * MB),
                           site("strdup (libc.so.6)", 3, 200 * MB, 1000 * MB, 2000, 40 * MB),
                           site("build_index (prog.c:40)", 4, 150 * MB, 1000 * MB, 10, 0),
                           site("0x1234 (libfoo.so.1)", 5, 50 * MB, 1000 * MB, 5, 3 * MB)]},
                {"name": "exit", "t_s": 3.99, "live_bytes": 400 * MB, "estimated_bytes": 440 * MB,
                 "samples": 40, "stacks": exit_,
                 "sites": [site(XSS + " (x.c:1)", 6, 300 * MB, 440 * MB, 3, 20 * MB),
                           site("parse_row (prog.c:30)", 2, 100 * MB, 440 * MB, 1000, 10 * MB),
                           site("(stack not unwound)", None, 40 * MB, 440 * MB, 9, 9 * MB)]},
                {"name": "never freed", "t_s": None, "live_bytes": None, "estimated_bytes": 0,
                 "samples": 0, "stacks": [], "sites": []}]}


# arena 0: one heap of 16 pages, in every state; arena 1: two heaps of 8 (free, pinned);
# arena 2: a heap of 4 pages whose walk failed (residency only, occupancy zeros)
OCC0 = [200] * 4 + [10] * 2 + [0] * 4 + [0] + [0] + [0] * 4
FLAGS0 = [3] * 4 + [3] * 2 + [1] * 4 + [3] + [0] + [5] * 4
# the states those pages are in, as the legend names them
STATES0 = ["live"] * 4 + ["pinned"] * 2 + ["free"] * 4 + ["kept"] + ["absent"] + ["top"] * 4


def small_heapmaps() -> list:
    return [
        {"moment": "exit", "t_s": 3.99, "status": "mapped", "allocator": "glibc", "page_bytes": 4096,
         "release_measured_bytes": 12 * MB, "rss_before": 80 * MB, "rss_after": 68 * MB,
         "fork_ms": 1.25, "map_ms": 30.5, "note": "",
         "arenas": [{"arena": 0, "pages": 16, "free_resident_pages": 5, "pinned_pages": 2,
                     "top_bytes": 4 * 4096,
                     "heaps": [{"start": "0x55d0c0000000", "kind": "main", "pages": 16, "walked": True,
                                "occupancy": b64(OCC0), "flags": b64(FLAGS0)}]},
                    {"arena": 1, "pages": 16, "free_resident_pages": 8, "pinned_pages": 8, "top_bytes": 0,
                     "heaps": [{"start": "0x7f0000000000", "pages": 8, "occupancy": b64([0] * 8),
                                "flags": b64([1] * 8)},
                               {"start": "0x7f0004000000", "pages": 8, "occupancy": b64([5] * 8),
                                "flags": b64([3] * 8)}]},
                    {"arena": 2, "pages": 4, "free_resident_pages": 0, "pinned_pages": 0, "top_bytes": 0,
                     "walked": False,
                     "heaps": [{"start": "0x7f0008000000", "kind": "thread", "pages": 4, "walked": False,
                                "occupancy": b64([0] * 4), "flags": b64([1, 1, 0, 3])}]}],
         "pinners": [{"stack": 0, "site": "parse_row (prog.c:30)", "blocks": 32768, "block_bytes": 64,
                      "pinned_bytes": 120 * MB, "error_bytes": 4 * MB},
                     {"stack": 4, "site": XSS, "blocks": 3, "block_bytes": 48, "pinned_bytes": 12288,
                      "error_bytes": 0}]},
        {"moment": "snapshot: loaded", "t_s": 2.0,
         "status": "not mapped: jemalloc's heaps are not walked (only glibc's are)",
         "allocator": "jemalloc", "page_bytes": 4096, "release_measured_bytes": 5 * MB,
         "rss_before": 90 * MB, "rss_after": 85 * MB, "arenas": [], "pinners": []}]


def run_doc(sites=None, heapmaps=None) -> dict:
    """A small run record as `heapsight run` saves it (4 s at 100 Hz), with a finding whose
    suggestions the first screen must show; sites and heapmaps only when given."""
    n = 400
    t = np.arange(n) / 100.0
    live = 50e6 * np.sin(t / 2) ** 2
    rss = live * 1.2 + 10e6
    cols = {c: np.zeros(n) for c in COLUMNS}
    cols.update(t=t, rss=rss, hwm=np.maximum.accumulate(rss), anon=rss - 5e6, file=np.full(n, 5e6),
                live_req=live, live_usable=live * 1.02, n_alloc=np.cumsum(np.full(n, 100.0)),
                n_free=np.cumsum(np.full(n, 90.0)), alloc_mapped=np.maximum.accumulate(rss),
                arenas=np.ones(n), threads=np.ones(n))
    peak = {"at_s": 1.5, "rss_bytes": int(rss.max()), "live_bytes": int(live.max()), "waste_bytes": 1000,
            "metadata_bytes": 1000, "retained_bytes": 5_000_000, "non_heap_bytes": 2_000_000,
            "file_bytes": 5_000_000, "baseline_anon_bytes": 131072, "other_anon_bytes": 0,
            "untouched_bytes": 0}
    s = {"command": ["./prog", "--rows", "1000"], "pid": 1, "started_pid": 1, "exit_code": 0,
         "exit_signal": 0, "preload": "active", "preload_note": "", "duration_s": 4.0, "samples": n,
         "sample_hz": 100.0, "peak_rss_bytes": int(rss.max()), "final_rss_bytes": int(rss[-1]),
         "peak": peak, "final": dict(peak, at_s=3.99),
         "release": {"measured": False, "call": "malloc_trim(0)", "why_not": "test"},
         "heap": {"allocator": "glibc", "arenas": 2, "threads_seen": 2},
         "findings": [{"kind": "fragmentation", "title": "Fragmentation", "detail": "freed memory is kept",
                       "suggestions": ["MALLOC_TRIM_THRESHOLD_=0 ./prog", "heapsight compare -- ./prog"]}],
         "verdict": "FRAGMENTATION: 20 MiB freed is kept by the allocator"}
    if sites is not None:
        s["sites"] = sites
    if heapmaps is not None:
        s["heapmaps"] = heapmaps
    return {"kind": "heapsight-run", "schema_version": 1, "summary": s,
            "timeline": {c: cols[c].tolist() for c in COLUMNS}}


def big_sites(n_stacks=10_000, depth=60, n_frames=3000, seed=1) -> dict:
    """A large profile: 10,000 stacks 60 frames deep, each following a random earlier one
    for a while and then branching off (a call tree), with heavy-tailed bytes."""
    rng = np.random.default_rng(seed)
    objects = ["/usr/bin/big", "/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/libpython3.11.so.1.0",
               "/usr/lib/libz.so.1"]
    frames = [{"function": f"fn_{i}_" + "x" * int(rng.integers(0, 30)), "file": f"/src/m{i % 50}.c",
               "line": i, "object": objects[i % 4], "address": hex(0x1000 + 16 * i)} for i in range(n_frames)]
    paths = []
    for _ in range(n_stacks):
        path = paths[int(rng.integers(0, len(paths)))][:int(rng.integers(1, depth))] if paths else [0]
        path = path + [int(f) for f in rng.integers(1, n_frames, depth - len(path))]
        paths.append(path)
    nbytes = ((rng.pareto(1.2, n_stacks) + 1) * 65536).astype(int)

    def moment(name, keep):
        idx = np.flatnonzero(rng.random(n_stacks) < keep)
        total = int(nbytes[idx].sum())
        return {"name": name, "t_s": 1.0, "live_bytes": total, "estimated_bytes": total,
                "samples": len(idx),
                "stacks": [entry(int(i), int(nbytes[i]), int(nbytes[i]) // 64 + 1, int(nbytes[i]) // 10)
                           for i in idx],
                "sites": [site(frames[paths[i][-1]]["function"], paths[i][-1], int(nbytes[i]), total, 1, 0)
                          for i in idx[np.argsort(-nbytes[idx])][:200]]}
    return {"sample_bytes": 524288, "samples": 30_000, "frees_matched": 0, "dropped": 0,
            "unwinder": "libgcc", "symbolizer": "llvm-symbolizer", "frames": frames,
            "stacks": [p[::-1] for p in paths], "moments": [moment("peak", 1.0), moment("exit", 0.4)]}


def big_heapmaps(seed=2) -> list:
    """A large map: a 1 GiB main heap and three thread arenas of four 64 MiB heaps each
    (458,752 pages), in random states."""
    rng = np.random.default_rng(seed)

    def heap(start, pages):
        return {"start": hex(start), "pages": pages,
                "occupancy": b64(rng.choice([0, 0, 10, 200], pages).astype(np.uint8)),
                "flags": b64(rng.choice([0, 1, 3, 3, 3, 5], pages).astype(np.uint8))}
    arenas = [{"arena": 0, "pages": 262144, "free_resident_pages": 0, "pinned_pages": 0, "top_bytes": 0,
               "heaps": [heap(0x55D0C0000000, 262144)]}]
    for a in range(1, 4):
        arenas.append({"arena": a, "pages": 4 * 16384, "free_resident_pages": 0, "pinned_pages": 0,
                       "top_bytes": 0,
                       "heaps": [heap(0x7F0000000000 + (a * 4 + h) * (64 << 20), 16384) for h in range(4)]})
    return [{"moment": "exit", "t_s": 1.0, "status": "mapped", "allocator": "glibc", "page_bytes": 4096,
             "release_measured_bytes": 0, "rss_before": 0, "rss_after": 0, "arenas": arenas, "pinners": []}]


# ---------------------------------------------------------------------------- reading the page

def body_attrs(dom: str) -> dict:
    body = re.search(r"<body([^>]*)>", dom).group(1)
    return {k: html.unescape(v) for k, v in re.findall(r'data-([a-z-]+)="([^"]*)"', body)}


def page_data(text: str) -> dict:
    m = re.search(r'<script type="application/json" id="hs-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))


def chart(text: str, kind: str) -> dict:
    return next(c for c in page_data(text)["charts"] if c["kind"] == kind)


def node_paths(flame: dict) -> list:
    """Each node of the page's flame tree as its call path from the outermost frame
    (function names; an unnamed frame as OBJECT+ADDRESS)."""
    def name(f):
        fn, _, _, obj, addr = flame["frames"][f]
        return fn if fn else f'{flame["objects"][obj]["path"].rsplit("/", 1)[-1]}+{addr}'
    out = [()]
    for i in range(1, len(flame["up"])):
        out.append(out[i - flame["up"][i]] + (name(flame["frame"][i]),))
    return out


def expected_boxes(sites: dict, moment: int) -> dict:
    """The boxes the data implies, worked out here from the stacks: every call path with
    live bytes, and the bytes under it."""
    out = {(): 0}
    for e in sites["moments"][moment]["stacks"]:
        path = tuple(NAMES[f] for f in reversed(sites["stacks"][e["stack"]])) or ("(stack not unwound)",)
        for k in range(len(path) + 1):
            out[path[:k]] = out.get(path[:k], 0) + e["bytes"]
    return out


@pytest.fixture
def probe_page(tmp_path):
    """probe_page(html, script): the page with `script` run after the charts are drawn,
    opened in Chromium; the <body> data it wrote."""
    def run(html_text: str, script: str, size=(1366, 900)) -> dict:
        f = tmp_path / f"probe-{len(list(tmp_path.iterdir()))}.html"
        f.write_text(html_text.replace("</body>", f"<script>(function(){{{script}}})();</script></body>"))
        return body_attrs(png.dump_dom(str(f), size=size))
    return run


# Helpers the probes share: the flame graph's boxes as [node, x, width, row] and a mouse
# event on an element.
PROBE_LIB = """
  var fig = document.getElementById('fig-s1-flame');
  function boxes() {
    return Array.prototype.map.call(fig.querySelectorAll('rect.fbox'), function (r) {
      return [+r.getAttribute('data-n'), +r.getAttribute('x'), +r.getAttribute('width'),
              +r.getAttribute('y')];
    });
  }
  function rectOf(n) { return fig.querySelector('rect.fbox[data-n="' + n + '"]'); }
  function mouse(el, type) {
    var r = el.getBoundingClientRect();
    el.dispatchEvent(new MouseEvent(type, {clientX: r.left + r.width / 2, clientY: r.top + r.height / 2,
                                           bubbles: true, button: 0}));
  }
  function put(k, v) { document.body.dataset[k] = typeof v === 'string' ? v : JSON.stringify(v); }
"""


@pytest.fixture(scope="module")
def small_page():
    return report_html.build([("synthetic run", run_doc(small_sites(), small_heapmaps()))]).html


def check_boxes(drawn: list, paths: list, want: dict):
    """Drawn boxes against the expected ones: the same call paths, each as wide as its
    bytes (the root box spans the plot; 0.5 px is left between boxes)."""
    got = {paths[n]: w for n, x, w, y in drawn}
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    full = got[()] + 0.5
    for path, w in got.items():
        assert abs(w + 0.5 - full * want[path] / want[()]) < 0.05, (path, w, full)


# ---------------------------------------------------------------------------- the flame graph

@needs_chromium
def test_flame_graph_draws_one_box_per_call_path_as_wide_as_its_bytes(small_page, probe_page):
    # GIVEN a run whose peak holds 1000 MiB over four stacks of known bytes
    flame = chart(small_page, "flame")
    paths = node_paths(flame)
    # WHEN the page is drawn, and the mouse rests on parse_row's box
    a = probe_page(small_page, PROBE_LIB + """
      put('boxes', boxes());
      var pr = boxes().filter(function (b) { return b[0] === %d; })[0];
      mouse(rectOf(pr[0]), 'mousemove');
      put('tip', fig.querySelector('.tip').textContent);
      mouse(rectOf(%d), 'mousemove');
      put('tipmain', fig.querySelector('.tip').textContent);
      var side = document.getElementById('side-s1-flame');
      put('table', side.textContent);
      var row = side.querySelectorAll('tbody tr')[1];   // strdup
      row.dispatchEvent(new MouseEvent('mouseenter'));
      put('match', Array.prototype.map.call(fig.querySelectorAll('rect.match'), function (r) {
        return +r.getAttribute('data-n'); }));
      row.dispatchEvent(new MouseEvent('mouseleave'));
      put('after', fig.querySelectorAll('rect.match').length);
    """ % (paths.index(("main", "load", "parse_row")), paths.index(("main",))))
    assert a["errors"] == "0"
    # THEN there is one box per call path with bytes (7: the root, main (both of its lines),
    # load, parse_row, strdup under it, build_index, the unnamed frame under that), each as
    # wide as its bytes
    drawn = json.loads(a["boxes"])
    assert len(drawn) == 7
    check_boxes(drawn, paths, expected_boxes(small_sites(), 0))
    # callers on top: each box's row is its depth
    assert all(y == 18 * len(paths[n]) for n, x, w, y in drawn)
    # AND the tooltip names the function, its source line and object, and its bytes with
    # the error of its two stacks (30 and 40 MiB add as squares: 50) and share
    tip = a["tip"]
    for want in ("parse_row", "/src/prog.c:30", "/usr/bin/prog", "800.0 MiB \u00b1 50.0 MiB",
                 "80% of the sampled live bytes at peak", "8,000"):
        assert want in tip, (want, tip)
    # main is one box, from either of its lines
    assert "/src/prog.c:10, 12" in a["tipmain"] and "100% of the sampled live bytes" in a["tipmain"]
    # AND the top call sites of the peak are listed beside it, largest first
    table = a["table"]
    assert "Top call sites at peak" in table
    assert table.index("parse_row (prog.c:30)") < table.index("strdup (libc.so.6)") < table.index("build_index")
    assert "600.0 MiB \u00b1 30.0 MiB" in table and "60%" in table and "6,000" in table
    # and hovering a row outlines its call site's boxes, until the mouse leaves
    assert [paths[n] for n in json.loads(a["match"])] == [("main", "load", "parse_row", "strdup")]
    assert a["after"] == "0"


@needs_chromium
def test_flame_graph_zooms_into_a_box_and_back_out(small_page, probe_page):
    flame = chart(small_page, "flame")
    paths = node_paths(flame)
    load = paths.index(("main", "load"))
    # WHEN load's box is clicked, then reset is pressed; then clicked and double-clicked
    a = probe_page(small_page, PROBE_LIB + """
      var w = +rectOf(0).getAttribute('width');
      mouse(rectOf(%d), 'click');
      put('zoomed', boxes()); put('zoom', fig.dataset.zoom); put('width', w);
      put('anc', fig.querySelectorAll('rect.fbox.anc').length);
      fig.querySelector('button.reset').click();
      put('reset', boxes()); put('zoomreset', fig.dataset.zoom);
      mouse(rectOf(%d), 'click');
      put('zoomagain', fig.dataset.zoom);
      mouse(rectOf(0), 'dblclick');
      put('dbl', boxes().length);
    """ % (load, load))
    assert a["errors"] == "0"
    # THEN load fills the width: its callers above it (full width, dimmed), what it calls
    # below, scaled to its 800 MiB; nothing else
    zoomed = {paths[n]: w for n, x, w, y in json.loads(a["zoomed"])}
    width = float(a["width"])
    assert a["zoom"] == "load" and a["anc"] == "2"
    assert sorted(zoomed) == [(), ("main",), ("main", "load"), ("main", "load", "parse_row"),
                              ("main", "load", "parse_row", "strdup")]
    assert zoomed[("main", "load")] == pytest.approx(width, abs=0.01)
    assert zoomed[("main", "load", "parse_row", "strdup")] + 0.5 == pytest.approx((width + 0.5) / 4, abs=0.05)
    # AND reset (or a double-click) shows the whole again
    assert len(json.loads(a["reset"])) == 7 and a["zoomreset"] == ""
    assert a["zoomagain"] == "load" and a["dbl"] == "7"


@needs_chromium
def test_moment_selector_redraws_the_graph_and_the_table(small_page, probe_page):
    flame = chart(small_page, "flame")
    paths = node_paths(flame)
    # WHEN the moment is switched to exit, then to "never freed"
    a = probe_page(small_page, PROBE_LIB + """
      var sel = fig.querySelector('select');
      put('options', Array.prototype.map.call(sel.options, function (o) { return o.textContent; }));
      sel.value = '1'; sel.dispatchEvent(new Event('change'));
      put('boxes', boxes()); put('moment', fig.dataset.moment);
      var side = document.getElementById('side-s1-flame');
      put('caption', side.querySelector('caption').textContent);
      put('first', side.querySelector('tbody td').textContent);
      sel = fig.querySelector('select');
      sel.value = '2'; sel.dispatchEvent(new Event('change'));
      put('never', fig.textContent); put('nboxes', boxes().length);
    """)
    assert a["errors"] == "0"
    assert json.loads(a["options"]) == ["peak at 1.5 s: 1000.0 MiB", "exit at 3.99 s: 440.0 MiB",
                                        "never freed: 0 B"]
    # THEN the exit's boxes are drawn (the stack named with markup and the one not unwound
    # among them) and its table
    assert a["moment"] == "exit"
    drawn = json.loads(a["boxes"])
    assert len(drawn) == 6
    check_boxes(drawn, paths, expected_boxes(small_sites(), 1))
    assert a["caption"] == "Top call sites at exit at 3.99 s"
    assert a["first"] == XSS + " (x.c:1)"   # as text
    # AND a moment with nothing live says so
    assert a["nboxes"] == "0" and "No sampled allocation is live at this moment" in a["never"]


# ---------------------------------------------------------------------------- the heap map

@needs_chromium
def test_heap_map_draws_a_cell_per_page_in_its_state_with_the_pinners(small_page, probe_page):
    # GIVEN a map of 36 pages in three arenas; the mouse on page 4 of arena 0 (pinned)
    a = probe_page(small_page, """
      var fig = document.getElementById('fig-s1-heapmap');
      var cells = {};
      fig.querySelectorAll('path.cells').forEach(function (p) {
        cells[p.getAttribute('data-state')] = (p.getAttribute('d').match(/M/g) || []).length;
      });
      document.body.dataset.cells = JSON.stringify(cells);
      document.body.dataset.ncells = fig.dataset.cells;
      document.body.dataset.legend = fig.querySelector('.legend').textContent;
      document.body.dataset.caption = fig.querySelector('svg .axis-title').textContent;
      var svg = fig.querySelector('svg'), r = svg.getBoundingClientRect();
      var px = 14 * 4 + 7;   // a page per 14 px cell: the fifth cell of the first row
      svg.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + px, clientY: r.top + 20 + 7, bubbles: true}));
      document.body.dataset.tip = fig.querySelector('.tip').textContent;
      document.body.dataset.side = document.getElementById('side-s1-heapmap').textContent;
    """)
    assert a["errors"] == "0"
    # THEN every page is a cell (one page each: the map is small), in its state
    want = {}
    for s in STATES0 + ["free"] * 8 + ["pinned"] * 8 + ["unwalked"] * 3 + ["absent"]:
        want[s] = want.get(s, 0) + 1
    assert a["ncells"] == "36" and json.loads(a["cells"]) == want
    assert a["caption"].startswith("one cell = 1 page (4.0 KiB);"), a["caption"]
    # the legend gives each state's bytes
    legend = a["legend"]
    for label, pages in (("pinned: a few live bytes keep it resident", 10), ("free: a release gives it back", 12),
                         ("top chunk", 4), ("not resident", 2)):
        assert f"{label}: {pages * 4}.0 KiB" in legend, (label, legend)
    # the cell under the mouse: its addresses, state and live bytes
    assert a["tip"].startswith("0x55d0c0004000 \u2013 0x55d0c0005000"), a["tip"]
    assert "pinned" in a["tip"] and f"\u2248 {round(10 / 255 * 4096)} B" in a["tip"]
    # AND beside it the release measured and the pinners, the first one as a sentence
    side = a["side"]
    assert "gave back 12.0 MiB: its RSS went from 80.0 MiB to 68.0 MiB" in side
    assert "32,768 blocks of 64 B from parse_row (prog.c:30) pin 120.0 MiB that a trim cannot return." in side
    assert "120.0 MiB \u00b1 4.0 MiB" in side and XSS in side
    assert "the program waited 1.25 ms for the fork; the copy took 30.5 ms" in side


@needs_chromium
def test_grouped_cells_keep_a_lone_pinned_page_in_sight(probe_page):
    # GIVEN a heap of 65,536 pages, free but for one pinned page in 64: too many for a cell each
    pages = 65536
    occ, flags = np.zeros(pages, np.uint8), np.ones(pages, np.uint8)
    occ[::64], flags[::64] = 1, 3
    maps = small_heapmaps()[:1]
    maps[0]["arenas"] = [{"arena": 0, "pages": pages, "heaps": [
        {"start": "0x10000000", "kind": "main", "pages": pages, "walked": True,
         "occupancy": b64(occ), "flags": b64(flags)}]}]
    page = report_html.build([("grouped", run_doc(None, maps))]).html
    a = probe_page(page, """
      var fig = document.getElementById('fig-s1-heapmap'), parts = {};
      fig.querySelectorAll('path.cells').forEach(function (p) {
        parts[p.getAttribute('data-state')] = (p.getAttribute('d').match(/M/g) || []).length;
      });
      document.body.dataset.parts = JSON.stringify(parts);
      document.body.dataset.group = fig.dataset.group;
      document.body.dataset.ncells = fig.dataset.cells;
      document.body.dataset.caption = fig.querySelector('svg .axis-title').textContent;
    """)
    assert a["errors"] == "0"
    # THEN the pages are grouped by a power of two that the caption names, and every cell
    # holding the pinned page shows a part of it, beside the free part
    group = int(a["group"])
    assert group > 1 and group & (group - 1) == 0 and int(a["ncells"]) == pages // group
    assert a["caption"].startswith(f"one cell = {group} pages ({group * 4}.0 KiB), split by the share")
    parts = json.loads(a["parts"])
    assert parts == {"pinned": pages // max(group, 64), "free": pages // group}


@needs_chromium
def test_a_map_not_made_says_why_and_the_release_only(small_page, probe_page):
    # WHEN the second map (not mapped: another allocator) is chosen
    a = probe_page(small_page, """
      var fig = document.getElementById('fig-s1-heapmap'), sel = fig.querySelector('select');
      sel.value = '1'; sel.dispatchEvent(new Event('change'));
      document.body.dataset.fig = fig.textContent;
      document.body.dataset.svgs = String(fig.querySelectorAll('svg').length);
      document.body.dataset.side = document.getElementById('side-s1-heapmap').textContent;
    """)
    assert a["errors"] == "0"
    # THEN the page says why, and the measured release, and nothing else
    assert "not mapped: jemalloc's heaps are not walked (only glibc's are)" in a["fig"]
    assert "gave back 5.0 MiB: its RSS went from 90.0 MiB to 85.0 MiB" in a["fig"]
    assert a["svgs"] == "0" and a["side"] == ""


# ---------------------------------------------------------------------------- the page as a whole

@needs_chromium
def test_names_with_markup_show_as_text(small_page, probe_page):
    # GIVEN a function (and call site, and pinner) named with markup, drawn at exit
    a = probe_page(small_page, PROBE_LIB + """
      var sel = fig.querySelector('select');
      sel.value = '1'; sel.dispatchEvent(new Event('change'));
      document.body.dataset.labels = Array.prototype.map.call(fig.querySelectorAll('text.flabel'),
        function (t) { return t.textContent; }).join('|');
    """)
    # THEN no markup ran or became an element: it is text in the boxes and tables
    assert "pwned" not in a and a["errors"] == "0"
    assert small_page.count("<img") == 0 and small_page.count("<script") == 3
    assert XSS in a["labels"]


@needs_chromium
def test_old_records_without_sites_render_as_before(tmp_path):
    # GIVEN a record from before call sites and heap maps
    page = report_html.build([("old run", run_doc())])
    f = tmp_path / "old.html"
    f.write_text(page.html)
    a = body_attrs(png.dump_dom(str(f)))
    # THEN its page has its three charts and no error, and nothing of the new parts
    assert a["errors"] == "0" and a["charts"] == "3 drawn"
    assert [c["kind"] for c in page.charts] == ["stacked", "line", "line"]
    assert 'class="holders' not in page.html and 'id="side-' not in page.html


@needs_chromium
def test_layout_holds_with_the_new_sections(small_page, tmp_path):
    # GIVEN the page of a run with sites and heap maps, at laptop size
    f = tmp_path / "page.html"
    f.write_text(small_page)
    a = body_attrs(png.dump_dom(str(f), size=(1366, 768)))
    # THEN the verdict, breakdown and first suggestion still make the first screen; no tick
    # label repeats or covers another; no flame graph label runs out of its box
    assert a["errors"] == "0" and a["charts"] == "5 drawn"
    assert a["first-screen"] == "verdict,breakdown,suggestion", a
    assert a["tick-repeats"] == "0" and a["overlaps"] == "0" and a["label-spills"] == "0", a
    # a screenshot of the whole page for people to look at
    OUT_DIR.mkdir(exist_ok=True)
    shutil.copy(f, OUT_DIR / "report-sites.html")
    png.screenshot(str(f), str(OUT_DIR / "report-sites.png"), size=(1366, 2300), scale=1)


@needs_chromium
def test_png_export_draws_the_new_charts(small_page, tmp_path):
    f = tmp_path / "page.html"
    f.write_text(small_page)
    for cid in ("s1-flame", "s1-heapmap"):
        out = tmp_path / f"{cid}.png"
        png.screenshot(str(f), str(out), cid)
        data = out.read_bytes()
        assert data[:8] == png.PNG_SIGNATURE
        size = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert size == (png.WIDTH * png.SCALE, png.HEIGHT * png.SCALE)
        assert len(data) > 20_000, cid   # drawn, not blank
        OUT_DIR.mkdir(exist_ok=True)
        shutil.copy(out, OUT_DIR / f"report-sites-{cid}.png")


@needs_chromium
def test_a_large_profile_draws_in_well_under_a_second(probe_page):
    # GIVEN a profile of 10,000 stacks 60 frames deep, and a heap map of 1.75 GiB
    sites = big_sites()
    t0 = time.monotonic()
    page = report_html.build([("large profile", run_doc(sites, big_heapmaps()))])
    build_s = time.monotonic() - t0
    # WHEN it is drawn, zoomed into a box deep down and switched to the other moment
    a = probe_page(page.html, PROBE_LIB + """
      put('ms', fig.dataset.ms); put('n', boxes().length);
      put('minw', Math.min.apply(null, boxes().map(function (b) { return b[2]; })));
      var deep = boxes().filter(function (b) { return b[3] >= 18 * 10 && b[2] > 20; })[0];
      var t0 = performance.now();
      mouse(rectOf(deep[0]), 'click');
      put('zoomms', String(Math.round(performance.now() - t0)));
      var sel = fig.querySelector('select');
      t0 = performance.now();
      sel.value = '1'; sel.dispatchEvent(new Event('change'));
      put('switchms', String(Math.round(performance.now() - t0)));
      var hm = document.getElementById('fig-s1-heapmap');
      put('hmms', hm.dataset.ms); put('hmcells', hm.dataset.cells); put('hmgroup', hm.dataset.group);
    """)
    print(f"large profile: page built in {build_s:.2f} s, {len(page.html) / MB:.1f} MiB; "
          f"flame graph drawn in {a['ms']} ms ({a['n']} boxes), zoom {a['zoomms']} ms, "
          f"moment switch {a['switchms']} ms; heap map {a['hmms']} ms ({a['hmcells']} cells of "
          f"{a['hmgroup']} pages); page {a['render-ms']} ms")
    assert a["errors"] == "0"
    # THEN it draws in well under a second, boxes under a pixel left out
    assert int(a["ms"]) < FLAME_LIMIT_MS, a
    assert int(a["zoomms"]) < FLAME_LIMIT_MS and int(a["switchms"]) < FLAME_LIMIT_MS, a
    assert 1000 < int(a["n"]) < 60 * 1366 and float(a["minw"]) >= 0.5
    assert a["label-spills"] == "0"
    # and the heap map groups pages by a power of two, every page in one cell
    group = int(a["hmgroup"])
    assert group & (group - 1) == 0 and group > 1
    assert int(a["hmcells"]) == -(-262144 // group) + 12 * -(-16384 // group)
    assert int(a["hmms"]) < FLAME_LIMIT_MS, a


# ---------------------------------------------------------------------------- the data behind

def test_paths_merge_from_the_outermost_frame():
    # GIVEN stacks sharing their outer frames (innermost first)
    parent, frame, end = holders.merge_paths([[2, 1, 0], [3, 1, 0], [4, 0], [2, 1, 0]], [0, 1, 2, 3])
    # THEN each (frame, path) is one node: root, 0, 0>1, 0>1>2, 0>1>3, 0>4
    assert len(parent) == 6 and frame[0] == -1 and parent[0] == -1
    path = {0: ()}
    for i in range(1, len(parent)):
        assert parent[i] < i
        path[i] = path[parent[i]] + (frame[i],)
    assert sorted(path.values()) == [(), (0,), (0, 1), (0, 1, 2), (0, 1, 3), (0, 4)]
    assert [path[end[s]] for s in range(4)] == [(0, 1, 2), (0, 1, 3), (0, 4), (0, 1, 2)]


def test_page_states_follow_occupancy_and_flags():
    st = holders.page_states(np.array(OCC0, dtype=np.uint8), np.array(FLAGS0, dtype=np.uint8))
    names = [holders.STATES[k][0] for k in st]
    assert names == STATES0
    # a page a quarter live is still "pinned", one more byte in 255 and it is live
    st = holders.page_states(np.array([holders.PIN_MAX, holders.PIN_MAX + 1], dtype=np.uint8),
                             np.array([3, 3], dtype=np.uint8))
    assert [holders.STATES[k][0] for k in st] == ["pinned", "live"]
    # a heap whose walk failed: resident or not, nothing more
    st = holders.page_states(np.zeros(3, dtype=np.uint8), np.array([1, 3, 0], dtype=np.uint8), walked=False)
    assert [holders.STATES[k][0] for k in st] == ["unwalked", "unwalked", "absent"]


def test_a_damaged_map_is_said_not_drawn():
    maps = small_heapmaps()
    maps[0]["arenas"][0]["heaps"][0]["occupancy"] = b64([1, 2, 3])   # 3 bytes for 16 pages
    c = holders.heapmap_chart({"heapmaps": maps}, "x")
    assert c["maps"][0]["status"].startswith("not drawn: the map in this record is damaged")
    assert "arenas" not in c["maps"][0] and c["maps"][1]["status"].startswith("not mapped")


def test_the_exit_maps_release_reads_as_the_summarys():
    # the copy's own RSS differs from the program's (heapsight's pages, what the copy never
    # touched): the panel gives the program's RSS before and after, as the terminal and the
    # facts table do; a snapshot's map keeps its copy's figures
    maps = small_heapmaps()
    rel = {"measured": True, "where": "copy", "call": "malloc_trim(0)",
           "rss_before_bytes": 82 * MB, "rss_after_bytes": 70 * MB}
    c = holders.heapmap_chart({"heapmaps": maps, "release": rel}, "x")
    exit_map, snap = c["maps"]
    assert (exit_map["rss_before"], exit_map["rss_after"]) == (82 * MB, 70 * MB)
    assert (snap["rss_before"], snap["rss_after"]) == (90 * MB, 85 * MB)


CXX_SITE = ("std::vector<std::__cxx11::basic_string<char, std::char_traits<char>, "
            "std::allocator<char> >, std::allocator<std::__cxx11::basic_string<char> > "
            ">::_M_realloc_insert (stl_vector.h:1287)")


@needs_chromium
def test_a_cxx_name_wraps_between_its_parts_in_the_narrow_table(probe_page):
    # GIVEN the call-site table beside the flame graph, a C++ name far wider than its cell
    sites = small_sites()
    sites["moments"][0]["sites"][0]["site"] = CXX_SITE
    page = report_html.build([("synthetic run", run_doc(sites, small_heapmaps()))]).html
    a = probe_page(page, """
      var td = document.getElementById('side-s1-flame').querySelector('td.site');
      var r = document.createRange(), tops = [], chars = [];
      var walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
      for (var n = walker.nextNode(); n; n = walker.nextNode())
        for (var i = 0; i < n.length; i++) {
          r.setStart(n, i); r.setEnd(n, i + 1);
          var b = r.getClientRects();
          // (a space where the line wraps has no box: it ends the line before)
          tops.push(b.length ? Math.round(b[0].top) : (tops.length ? tops[tops.length - 1] : 0));
          chars.push(n.data[i]);
        }
      var breaks = [];
      for (var k = 1; k < tops.length; k++)
        if (tops[k] > tops[k - 1]) breaks.push(chars.slice(0, k).join('').slice(-2) + '|' + chars[k]);
      document.body.dataset.breaks = JSON.stringify(breaks);
      document.body.dataset.text = td.textContent;
      document.body.dataset.width = String(td.getBoundingClientRect().width);
    """, size=(1100, 900))
    assert a["errors"] == "0"
    # THEN it wraps (the cell is narrower than the name), only after a separator or a
    # space, and reads (and copies) as the name itself
    breaks = json.loads(a["breaks"])
    assert a["text"] == CXX_SITE
    assert len(breaks) >= 2, (breaks, a["width"])
    assert all(b[:2] == "::" or b[1] in "<,(/ " for b in breaks), json.dumps(breaks)
