"""Runs beside one that held memory: their RSS where that one held (moments.held_share,
moments.rss_over), and compare's held RSS column for them (comparison._held_where_glibc_held):
every run is read over the stretch glibc's held, whether or not it held itself."""

from __future__ import annotations

from heapsight import moments
from heapsight.live import comparison

MiB = 1 << 20


def test_the_stretch_is_taken_by_share_of_each_runs_duration():
    held = [{"name": "peak", "at_s": 0.3}, {"name": "held", "at_s": 0.7, "start_s": 0.6, "end_s": 0.9}]
    assert moments.held_share(held, 1.0) == (0.6, 0.9)
    assert moments.held_share(held[:1], 1.0) is None
    # a run twice as long: the same shares, twice the seconds; the median of those inside
    t, rss = [0.2, 0.6, 1.2, 1.4, 1.6, 1.8, 1.9], [9, 440, 100, 94, 92, 90, 5]
    assert moments.rss_over(t, rss, 2.0, (0.6, 0.9)) == 93
    # none inside: the nearest to the stretch's middle; a NaN reading is no reading
    assert moments.rss_over([0.1, 0.5, 0.95], [1, float("nan"), 7], 1.0, (0.6, 0.7)) == 7
    assert moments.rss_over([], [], 1.0, (0.6, 0.7)) is None


def _run(config, duration, samples, held=None):
    ms = [{"name": "peak", "at_s": 0.1}]
    if held:
        ms.append({"name": "held", "at_s": held[0], "start_s": held[0], "end_s": held[1]})
    record = {"config": config, "summary": {"moments": ms, "duration_s": duration},
              "timeline": {"t": [t for t, _ in samples], "rss": [r * MiB for _, r in samples]}}
    metrics = {"peak_rss": max(r for _, r in samples) * MiB,
               "held_rss": 400 * MiB if held else None}
    return record, metrics


def test_compare_gives_a_run_that_held_nothing_its_rss_where_glibc_held():
    cmp = comparison.Comparison(["./app"], 1)
    glibc = _run("glibc", 1.0, [(0.3, 413), (0.7, 412), (0.8, 412)], held=(0.6, 0.9))
    jem = _run("jemalloc", 2.0, [(0.6, 440), (1.3, 94), (1.7, 90)])
    for name, (rec, m) in (("glibc", glibc), ("jemalloc", jem)):
        cmp.records.append(rec)
        cmp.rows.append({"name": name, "ok": True, "runs": [m]})
    comparison._held_where_glibc_held(cmp)
    assert glibc[1]["held_by"] == "moment" and glibc[1]["held_rss"] == 400 * MiB
    # 0.6-0.9 of jemalloc's 2 s: 1.2-1.8 s, its samples there 94 and 90 MiB (not its 440 peak)
    assert jem[1]["held_by"] == "stretch" and jem[1]["held_rss"] == 92 * MiB
    # AND where no glibc run held anything: the peak, as before
    cmp = comparison.Comparison(["./app"], 1)
    rec, m = _run("jemalloc", 2.0, [(0.6, 440), (1.3, 94)])
    cmp.records.append(rec)
    cmp.rows.append({"name": "jemalloc", "ok": True, "runs": [m]})
    comparison._held_where_glibc_held(cmp)
    assert m["held_by"] == "peak" and m["held_rss"] == 440 * MiB


def test_compare_reads_a_run_with_a_held_moment_of_its_own_where_glibc_held():
    # GIVEN glibc holding 412 MiB through its work (0.2-0.5 of its 1 s) and then idle at 20;
    # jemalloc returning pages at once: 100 MiB through the same work, idle at 15 MiB from
    # 0.5 s on, a stretch longer than its work: its own held moment is the idle end
    cmp = comparison.Comparison(["./app"], 1)
    glibc = _run("glibc", 1.0, [(0.1, 30), (0.3, 412), (0.4, 410), (0.6, 20), (0.9, 20)],
                 held=(0.2, 0.5))
    jem = _run("jemalloc", 1.0, [(0.1, 30), (0.3, 100), (0.4, 102), (0.6, 15), (0.9, 15)],
               held=(0.5, 1.0))
    jem[1]["held_rss"] = 15 * MiB
    for name, (rec, m) in (("glibc", glibc), ("jemalloc", jem)):
        cmp.records.append(rec)
        cmp.rows.append({"name": name, "ok": True, "runs": [m]})
    comparison._held_where_glibc_held(cmp)
    # THEN jemalloc's held RSS is its RSS through glibc's hold (101 MiB), not its idle 15 MiB
    # (a 96% drop it did not make)
    assert glibc[1]["held_by"] == "moment" and glibc[1]["held_rss"] == 400 * MiB
    assert jem[1]["held_by"] == "stretch" and jem[1]["held_rss"] == 101 * MiB


def test_compare_says_under_its_table_how_a_held_column_was_filled(monkeypatch):
    import io

    from heapsight.ranking import stats_of
    from heapsight.reporters import terminal
    cmp = comparison.Comparison(["./app"], 1, rank_by="held")
    for name, (rec, m) in (("glibc", _run("glibc", 1.0, [(0.3, 413), (0.7, 412)], held=(0.6, 0.9))),
                           ("jemalloc", _run("jemalloc", 2.0, [(0.6, 440), (1.3, 94)]))):
        m.update(wall_s=1.0, end_rss=m["peak_rss"], final_rss=m["peak_rss"])
        cmp.records.append(rec)
        cmp.rows.append({"name": name, "allocator": name, "about": "", "env": {}, "ok": True,
                         "error": None, "runs": [m], "how": "./app"})
    comparison._held_where_glibc_held(cmp)
    for r in cmp.rows:
        r["stats"] = stats_of(r["runs"])
    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    terminal.render_compare(cmp.doc(with_runs=False), out)
    # THEN jemalloc's held cell is its RSS over glibc's held stretch, and the table says so
    text = " ".join(out.getvalue().split())
    assert "held RSS: each run's median RSS over the stretch where glibc's first run held " \
        "memory" in text, text
    assert "94.0MiB" in text.replace(" MiB", "MiB") or "94MiB" in text, text
