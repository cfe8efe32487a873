"""`heapsight diff A B`: what moved between two saved runs (diffing.py, commands/diff.py)."""

import json
import re
import os
import subprocess
import sys


from conftest import scenario

HS = [sys.executable, "-m", "heapsight"]


def record(tmp_path, name, *argv, env=None, opts=()):
    out = tmp_path / f"{name}.hsrun.json.gz"
    r = subprocess.run([*HS, "run", "-q", "-o", str(out), *opts, "--", *argv],
                       capture_output=True, text=True, timeout=180, cwd=tmp_path,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr
    return str(out)


def diff(tmp_path, a, b, *opts):
    js = tmp_path / "d.json"
    r = subprocess.run([*HS, "diff", a, b, "--json", str(js), *opts], capture_output=True,
                       text=True, timeout=120)
    return r, (json.loads(js.read_text()) if js.exists() else None)


def test_an_allocator_that_returns_memory_lowers_retained_and_moves_no_call_site(tmp_path):
    # GIVEN the retention scenario under glibc, then under jemalloc with immediate decay
    from test_allocators import allocator_lib
    a = record(tmp_path, "glibc", scenario("hs-retention"))
    b = record(tmp_path, "jemalloc", scenario("hs-retention"),
               env={"LD_PRELOAD": allocator_lib("jemalloc"),
                    "MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"})
    r, d = diff(tmp_path, a, b)
    assert r.returncode == 0, r.stderr
    # THEN retained at exit falls by most of its 256 MiB, and the program's call site did
    # not move: the program is the same, its allocator is not (what did move is the
    # allocators' own: jemalloc's start-up blocks, and the rounding of 256 KiB blocks to
    # glibc's mmapped chunks: under 1% of the peak)
    exit_rows = {x["row"]: x for x in d["split"]["exit"]}
    assert exit_rows["retained"]["a"] > 200 << 20
    assert exit_rows["retained"]["change"] < -150 << 20
    peak = {x["site"]: x for x in d["sites"]["peak"]["rows"]}
    main = next(x for name, x in peak.items() if name.startswith("worker (retention.c:19)"))
    # (8 threads: which blocks are live at "the peak" moves with their timing, a few MiB
    # beyond the sampling error now and then; see the one-thread test below)
    # (the two runs' estimates each carry a sampling error of several percent: the change
    # is held to their combined 99.9% interval, or a tenth, whichever is larger)
    assert abs(main["change"]) < max(0.1 * main["a"], main["interval"]), main
    assert main["a"] > 200 << 20, main
    moved = [x for x in d["sites"]["peak"]["rows"]
             if x["how"] != "no change" and x is not main]
    assert sum(abs(x["change"]) for x in moved) < 0.01 * main["a"], moved
    assert "retained" in r.stdout


def test_two_runs_of_the_same_program_name_no_call_site(tmp_path):
    # (one thread: with several, which blocks are live at "the peak" moves with the
    # threads' timing, beyond what sampling explains)
    # A site is named at 99.9%: by chance in about 1 diff of 200 here (five sites); a
    # second pair is diffed when the first names one, and both must not: a real bias
    # names its site again, a chance one rarely does (bench/diff-noise measures the
    # intervals: the z-scores of 100 pairs have a spread of 1.0, as they should)
    found = []
    for pair in range(2):
        a = record(tmp_path, f"a{pair}", scenario("hs-sites"))
        b = record(tmp_path, f"b{pair}", scenario("hs-sites"))
        r, d = diff(tmp_path, a, b)
        assert r.returncode == 0, r.stderr
        moved = []
        for moment in ("peak", "never freed"):
            assert d["sites"][moment]["rows"], moment
            moved += [(moment, x) for x in d["sites"][moment]["rows"] if x["how"] != "no change"]
        if not moved:
            assert r.stdout.count("no call site changed") == 2
            return
        found.append(moved)
    raise AssertionError(f"both pairs named a site: {found}")


def test_the_function_that_allocates_twice_as_much_is_named_and_no_other(tmp_path):
    a = record(tmp_path, "a", scenario("hs-sites"), opts=("--sample-bytes", "64K"))
    b = record(tmp_path, "b", scenario("hs-sites"), "--index-x", "2", opts=("--sample-bytes", "64K"))
    r, d = diff(tmp_path, a, b)
    assert r.returncode == 0, r.stderr
    moved = [x for x in d["sites"]["peak"]["rows"] if x["how"] != "no change"]
    assert [x["site"].split(" (")[0] for x in moved] == ["build_index"], moved
    assert moved[0]["how"] == "grew" and moved[0]["change"] > 20 << 20
    # the moment of each run's sites is given, with its exact live bytes (the sites' total),
    # and when each run's peak column was read (a sample: it may differ from the sites')
    peak = d["sites"]["peak"]
    assert peak["b_bytes"] - peak["a_bytes"] > 20 << 20 and peak["a_at_s"] > 0
    assert all(t is not None for t in d["at_s"]["peak"] + d["at_s"]["exit"])
    assert "usable at" in r.stdout and "(A at " in r.stdout, r.stdout
    # the bytes never freed did not move (leak_names, keep_cache's survivors)
    assert all(x["how"] == "no change" for x in d["sites"]["never freed"]["rows"])
    # and a gate on the peak's live bytes fails with 90
    r2, d2 = diff(tmp_path, a, b, "--fail-if-grew", "peak_live=10M")
    assert r2.returncode == 90 and "gate failed" in r2.stderr and d2["gates"][0]["failed"]
    r3, _ = diff(tmp_path, a, b, "--fail-if-grew", "lost=1M")
    assert r3.returncode == 0, r3.stderr


def test_two_programs_are_refused_unless_forced(tmp_path):
    a = record(tmp_path, "true", "true")
    b = record(tmp_path, "false", "sh", "-c", "exit 0")
    r, d = diff(tmp_path, a, b)
    assert r.returncode == 2 and "--force" in r.stderr and d is None
    r, d = diff(tmp_path, a, b, "--force")
    assert r.returncode == 0 and d is not None


def test_a_bad_gate_is_refused_by_name(tmp_path):
    a = record(tmp_path, "true", "true")
    r, _ = diff(tmp_path, a, a, "--fail-if-grew", "happiness=1M")
    assert r.returncode == 2 and "FIGURE=SIZE" in r.stderr and "retained" in r.stderr


def test_the_page_draws_both_runs_on_one_axis_and_what_moved(tmp_path):
    from heapsight.report import png
    a = record(tmp_path, "a", scenario("hs-sites"), opts=("--sample-bytes", "64K"))
    b = record(tmp_path, "b", scenario("hs-sites"), "--index-x", "2", opts=("--sample-bytes", "64K"))
    page = tmp_path / "d.html"
    r, _ = diff(tmp_path, a, b, "--html", str(page))
    assert r.returncode == 0, r.stderr
    dom = png.dump_dom(str(page))
    # THEN every chart is drawn without an error, the first the two runs on one time axis
    drawn = re.search(r'data-charts="(\d+) drawn"', dom)
    assert drawn and int(drawn.group(1)) >= 3 and 'data-errors="0"' in dom
    assert "Run A and run B on one time axis" in dom
    head = dom.split('class="doc diff"', 1)[1].split("</section>", 1)[0]
    assert "build_index" in head
    # with when each run's columns and call sites were read, as the terminal says
    assert re.search(r"the split at peak live \(samples: A at [0-9.]+ s, B at [0-9.]+ s\)", head), head[:2000]
    assert re.search(r"call sites peak \(A [0-9.]+ MiB usable at [0-9.]+ s, B ", head)
    # and the differential flame graph opens on B, its boxes coloured by the change from A:
    # build_index's path grew (red), the rest within the sampling error (grey)
    assert 'data-moment="B: peak"' in head
    fills = re.findall(r'<rect[^>]*fill="([^"]+)"[^>]*data-n', head)
    assert any(f.startswith("hsl(0,75%") for f in fills), fills
    assert not any(f.startswith("hsl(215,75%") for f in fills), fills


def test_a_comparisons_runs_are_diffed_by_their_configuration(tmp_path):
    cmp = tmp_path / "cmp.json.gz"
    r = subprocess.run([*HS, "compare", "--repeat", "1", "--configs", "glibc,jemalloc-eager",
                        "-o", str(cmp), "--", scenario("hs-retention")], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r, d = diff(tmp_path, f"{cmp}#glibc", f"{cmp}#jemalloc-eager")
    assert r.returncode == 0, r.stderr
    exit_rows = {x["row"]: x for x in d["split"]["exit"]}
    assert exit_rows["retained"]["change"] < -100 << 20
    # a configuration it does not have is refused with the ones it has
    r, _ = diff(tmp_path, f"{cmp}#glibc", f"{cmp}#nosuch")
    assert r.returncode == 2 and "no run of nosuch" in r.stderr and "jemalloc-eager" in r.stderr


# A: builds rows, keeps half; B: keeps every row as it goes but builds fewer at once (its
# exact peak is lower by ~0.8 MB). The peak column is a sample every 10 ms: it can miss A's
# peak and read growth from A to B where the peak fell.
ROWS_A = ("rows = [('x' * 60, i) for i in range(60000)]\n"
          "del rows[::2]\nimport time; time.sleep(0.05)")
ROWS_B = ("rows = [('x' * 60, i) for i in range(54000)]\n"
          "import time; time.sleep(0.05)")


def test_a_lower_exact_peak_is_never_read_as_growth(tmp_path):
    for n in range(3):
        a = record(tmp_path, f"a{n}", "python3", "-c", ROWS_A)
        b = record(tmp_path, f"b{n}", "python3", "-c", ROWS_B)
        r, d = diff(tmp_path, a, b, "--fail-if-grew", "peak_live=0")
        exact = next(x for x in d["figures"] if x["figure"] == "peak live (exact)")
        # THEN the exact peak fell, the gate on it agrees, and the table says it is exact
        assert exact["change"] < 0, exact
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "peak live (exact)" in r.stdout and "(samples: A at" in r.stdout


def test_the_diff_fits_80_columns_with_long_call_site_names(tmp_path):
    # GIVEN glibc against jemalloc on the retention scenario (a C++ runtime's site in B,
    # 70 columns of name), at 80 columns
    from test_allocators import allocator_lib
    a = record(tmp_path, "glibc", scenario("hs-retention"))
    b = record(tmp_path, "jemalloc", scenario("hs-retention"),
               env={"LD_PRELOAD": allocator_lib("jemalloc"), "MALLOC_CONF": "dirty_decay_ms:0"})
    r = subprocess.run([*HS, "diff", a, b], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # THEN no line is wider, and each site's name is there whole or cut with an ellipsis
    assert [x for x in lines if len(x) > 80] == []
    assert any("worker (retention.c:19)" in x for x in lines)
    assert "(samples: A at" in r.stdout


def test_a_figure_a_run_does_not_have_is_no_figure_not_zero():
    # GIVEN two runs without a held moment (their RSS never sat beyond live bytes), one of
    # them with a release measured at exit and one without
    from heapsight import diffing
    moments = [{"name": "peak", "at_s": 0.1, "breakdown": {"rss_bytes": 50 << 20}},
               {"name": "end", "at_s": 0.2, "breakdown": {"rss_bytes": 40 << 20}}]
    a = {"peak_rss_bytes": 50 << 20, "moments": moments, "release": {"gave_back_bytes": 1 << 20}}
    b = {"peak_rss_bytes": 60 << 20, "moments": moments, "release": None}
    rows = {r["figure"]: r for r in diffing.figures(a, b)}
    # THEN "held RSS" is no figure on either side ("0 B" read as a measured nothing), the
    # release none on B's, and neither is a change; the figures both have are compared
    held, release = rows["held RSS (A's stretch)"], rows["release at exit gave back"]
    assert (held["a"], held["b"], held["change"]) == (None, None, None)
    assert (release["a"], release["b"], release["change"]) == (1 << 20, None, None)
    assert diffing.amount(held["a"]) == "-" and diffing.change_text(held) == ""
    assert rows["end RSS"]["change"] == 0 and diffing.change_text(rows["end RSS"]) == "="
    assert rows["peak RSS"]["change"] == 10 << 20


def test_bs_held_rss_is_read_where_a_held():
    # GIVEN A holding 412 MiB through its work (0.2-0.5 s of 1 s) and idle at 20 after; B
    # (another allocator) at 100 MiB through the same work and idle at 15 MiB from 0.5 s on,
    # its own held moment
    from heapsight import diffing

    def held(rss, lo, hi):
        return {"name": "held", "at_s": lo, "start_s": lo, "end_s": hi,
                "breakdown": {"rss_bytes": rss << 20}}
    a = {"duration_s": 1.0, "moments": [held(412, 0.2, 0.5)]}
    b = {"duration_s": 1.0, "moments": [held(15, 0.5, 1.0)]}
    tl_b = {"t": [0.1, 0.3, 0.4, 0.6, 0.9], "rss": [x << 20 for x in (30, 100, 102, 15, 15)]}
    # THEN B's held RSS is its RSS through A's hold (101 MiB), not its idle 15 MiB (-96%)
    assert diffing.held_in_b(a, b, tl_b) == 101 << 20
    (row,) = [r for r in diffing.figures(a, b, tl_b) if r["figure"].startswith("held RSS")]
    assert (row["a"], row["b"]) == (412 << 20, 101 << 20)
    # AND without B's timeline, B's own held moment
    assert diffing.held_in_b(a, b, None) == 15 << 20


def test_a_change_past_tenfold_says_no_percentage():
    from heapsight import diffing
    # jemalloc's metadata against glibc's at exit: 368 B -> 3.0 MiB
    r = diffing._row(368, 3 << 20)
    assert diffing.change_text(r) == "+3.0 MiB" and r["percent"] > 1000   # (the JSON keeps it)
    assert diffing.change_text(diffing._row(10 << 20, 11 << 20)) == "+1.0 MiB (+10.0%)"
    assert diffing.change_text(diffing._row(1 << 20, 0)) == "-1.0 MiB (-100.0%)"
