"""record.load, the one loader of run records, comparisons and lab results, on hostile
files: each damage is one line naming the file and the field, exit code 2 through
`heapsight report`, no page written, never a traceback (the CLI runs in this process, so
any other exception fails the test)."""

from __future__ import annotations

import copy
import gzip
import json
import os
import threading

import pytest

from heapsight import cli, record
from heapsight.errors import HeapsightError
from heapsight.model import (SCHEMA_VERSION, Breakdown, Finding, HeapFigures, Release,
                             Snapshot, Summary)
from heapsight.timeline import COLUMNS, Timeline


def breakdown(at_s: float, rss: int) -> Breakdown:
    return Breakdown(at_s, rss, rss // 2, 100, 200, rss // 4, rss // 4 - 300, 4096, 8192,
                     0, 0)


def run_doc() -> dict:
    """A run record as `heapsight run` saves it (record.to_json_dict), three samples."""
    summary = Summary(
        command=("/usr/bin/prog", "--mb", "1"), pid=10, started_pid=10, exit_code=0,
        exit_signal=0, preload="active", preload_note="", duration_s=0.3, samples=3,
        sample_hz=10.0, sampler_cpu_s=0.01, peak_rss_bytes=3 << 20, final_rss_bytes=2 << 20,
        peak=breakdown(0.1, 3 << 20), final=breakdown(0.2, 2 << 20),
        release=Release(True, "malloc_trim(0)", "", 2 << 20, 1 << 20, 0, 0, 0.001),
        heap=HeapFigures("glibc", 10, 5, 5, 1000, 1200, 2000, 1800, 0.1, 5000, 0, 0, 1, 1,
                         ((32, 10, 5, 8.0),), 0, 4096),
        forks=0, execs=0, other_processes=0,
        findings=(Finding("retention", 1 << 20, "kept", "freed, kept", ("try this",)),),
        verdict="retention", snapshots=(Snapshot("s1", 0.15, breakdown(0.15, 3 << 20)),))
    tl = Timeline()
    for i in range(3):
        tl.append_row([0.1 * i if c == "t" else float((i + 1) << 20) for c in COLUMNS])
    return json.loads(json.dumps(record.to_json_dict(summary, tl)))


def compare_doc() -> dict:
    """A comparison as `heapsight compare` saves it: two configurations, one run each."""
    stats = {k: {"median": 1e6, "min": 9e5, "max": 1.1e6} for k in
             ("peak_rss", "final_rss", "retained", "given_back", "wall_s", "cpu_s", "minor_faults")}
    run = dict(run_doc(), config="glibc")
    return {"kind": "heapsight-compare", "schema_version": SCHEMA_VERSION,
            "command": ["/usr/bin/prog", "--mb", "1"], "repeat": 1,
            "configs": [{"name": "glibc", "allocator": "glibc", "about": "defaults", "ok": True,
                         "error": None, "runs": [{k: 1e6 for k in stats}], "stats": stats},
                        {"name": "jemalloc", "allocator": "jemalloc", "about": "", "ok": False,
                         "error": "not installed", "runs": [], "stats": None}],
            "recommendation": "keep glibc", "interrupted": False, "runs": [run]}


def lab_doc() -> dict:
    return {"kind": "heapsight-lab", "schema_version": SCHEMA_VERSION, "quick": True,
            "machine": {"cores": 2, "kernel": "6.1", "libc": "glibc 2.36"},
            "started": "2026-01-01T00:00:00",
            "experiments": [{
                "name": "release", "title": "What goes back", "duration_s": 1.5,
                "tables": [{"title": "RSS", "columns": ["block", "glibc"],
                            "rows": [["2 KiB", 2048], ["8 KiB", 1.5]]}],
                "claims": [{"text": "small blocks stay", "verdict": "holds", "evidence": "100%"}],
                "charts": [{"id": "sweep", "kind": "line", "title": "RSS after free",
                            "x": {"label": "size", "unit": "bytes", "log": True},
                            "y": {"label": "RSS", "unit": "bytes", "log": True},
                            "series": [{"name": "glibc", "x": [1, 2, 3], "y": [4, 5, None],
                                        "lo": [3, 4, 5], "hi": [5, 6, 7]}]}]},
                {"name": "perl", "error": "perl exited with 2"}]}


def report(capsys, path, tmp_path) -> tuple:
    """`heapsight report PATH -o page.html`: (exit code, stderr lines, page written?)."""
    page = tmp_path / "page.html"
    rc = cli.main(["report", str(path), "-o", str(page)])
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err, page.exists()


def refused(capsys, path, tmp_path, *fields) -> str:
    """Asserts the one-line refusal naming the file and fields; returns the line."""
    rc, err, written = report(capsys, path, tmp_path)
    assert rc == 2 and len(err) == 1 and not written, (rc, err)
    line = err[0]
    assert line.startswith(f"heapsight: error: {path}: "), line
    for f in fields:
        assert f in line, (f, line)
    with pytest.raises(HeapsightError) as e:
        record.load(str(path))
    assert e.value.exit_code == 2 and f"heapsight: error: {e.value.message}" == line
    return line


def edited(doc: dict, fn) -> str:
    d = copy.deepcopy(doc)
    fn(d)
    return json.dumps(d)


def test_good_documents_of_each_kind_load_and_draw(tmp_path, capsys):
    for name, doc in (("run", run_doc()), ("compare", compare_doc()), ("lab", lab_doc())):
        path = tmp_path / f"{name}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
        assert record.load(str(path)) == doc
        rc, err, written = report(capsys, path, tmp_path)
        assert rc == 0 and written, err


def setp(d: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for k in parents:
        d = d[int(k)] if k.isdigit() else d[k]
    if value is DELETE:
        del d[int(last) if last.isdigit() else last]
    else:
        d[int(last) if last.isdigit() else last] = value


DELETE = object()

# (kind, field to change, new value, what the message must name)
DAMAGE = [
    ("run", "summary.peak_rss_bytes", 10 ** 30, "summary.peak_rss_bytes: a number too large"),
    ("run", "summary.final.rss_bytes", "lots", "summary.final.rss_bytes: expected a number"),
    ("run", "summary.minor_faults", "many", "summary.minor_faults: expected a number"),
    ("run", "summary.duration_s", None, "summary.duration_s: expected a number"),
    ("run", "summary.peak.at_s", DELETE, "summary.peak.at_s: missing"),
    ("run", "summary.final.at_s", DELETE, "summary.final.at_s: missing"),
    ("run", "summary", DELETE, "summary: missing"),
    ("run", "summary", [1, 2], "summary: expected an object"),
    ("run", "summary.command", "prog --mb 1", "summary.command: expected a list"),
    ("run", "summary.command.0", 7, "summary.command[0]: expected text"),
    ("run", "summary.heap.n_alloc", "10", "summary.heap.n_alloc: expected a number"),
    ("run", "summary.heap.allocator", ["glibc"], "summary.heap.allocator: expected text"),
    ("run", "summary.release", "trimmed", "summary.release: expected an object"),
    ("run", "summary.findings.0.suggestions", "do x", "summary.findings[0].suggestions"),
    ("run", "summary.snapshots.0.label", DELETE, "summary.snapshots[0].label: missing"),
    ("run", "timeline.rss.1", "3M", "timeline.rss[1]: expected a number"),
    ("run", "timeline.rss.1", True, "timeline.rss[1]: expected a number"),
    ("run", "timeline.live_req.2", -10 ** 20, "timeline.live_req[2]: a number too large"),
    ("run", "timeline.t", DELETE, "timeline.t: missing"),
    ("run", "timeline.anon", [1.0, 2.0], "timeline: columns of uneven length"),
    ("run", "timeline", [[0, 1]], "timeline: expected an object"),
    ("run", "kind", ["heapsight-run"], "kind"),
    ("run", "kind", "heapsight-other", "kind"),
    ("run", "schema_version", "999", "schema_version: expected a whole number"),
    ("run", "schema_version", SCHEMA_VERSION + 1, "schema_version: 2 was written by a newer heapsight"),
    ("compare", "configs", DELETE, "configs: missing"),
    ("compare", "configs", {"glibc": {}}, "configs: expected a list"),
    ("compare", "configs.0.ok", "yes", "configs[0].ok: expected true or false"),
    ("compare", "configs.0.name", DELETE, "configs[0].name: missing"),
    ("compare", "configs.0.stats.peak_rss", DELETE, "configs[0].stats.peak_rss: missing"),
    ("compare", "configs.0.stats.wall_s.median", DELETE, "configs[0].stats.wall_s.median: missing"),
    ("compare", "configs.0.stats.cpu_s.max", "1s", "configs[0].stats.cpu_s.max: expected a number"),
    ("compare", "configs.0.stats.minor_faults", 5, "configs[0].stats.minor_faults: expected an object"),
    ("compare", "command", 5, "command: expected a list"),
    ("compare", "repeat", "3", "repeat: expected a number"),
    ("compare", "runs.0.config", ["glibc"], "runs[0].config: expected text"),
    ("compare", "runs.0.timeline.t", DELETE, "runs[0].timeline.t: missing"),
    ("compare", "runs.0.summary.peak.rss_bytes", DELETE, "runs[0].summary.peak.rss_bytes: missing"),
    ("lab", "experiments", {"release": {}}, "experiments: expected a list"),
    ("lab", "machine", "x86", "machine: expected an object"),
    ("lab", "experiments.0.claims.0.verdict", DELETE, "experiments[0].claims[0].verdict: missing"),
    ("lab", "experiments.0.claims.0.verdict", {"holds": 1}, "experiments[0].claims[0].verdict"),
    ("lab", "experiments.0.tables.0.rows.0", "2 KiB", "experiments[0].tables[0].rows[0]: expected a list"),
    ("lab", "experiments.0.tables.0.rows.0.1", {"kB": 2}, "experiments[0].tables[0].rows[0][1]"),
    ("lab", "experiments.0.duration_s", "1.5 s", "experiments[0].duration_s: expected a number"),
    ("lab", "experiments.0.charts.0.series", DELETE, "experiments[0].charts[0].series: missing"),
    ("lab", "experiments.0.charts.0.series.0.x", [1, 2], "experiments[0].charts[0].series[0].x: 2 values for 3"),
    ("lab", "experiments.0.charts.0.series.0.lo.0", "low", "experiments[0].charts[0].series[0].lo[0]"),
    ("lab", "experiments.0.charts.0.x", "size", "experiments[0].charts[0].x: expected an object"),
]
DOCS = {"run": run_doc, "compare": compare_doc, "lab": lab_doc}


@pytest.mark.parametrize("kind,field,value,expect", DAMAGE,
                         ids=[f"{k}:{f}={'del' if v is DELETE else type(v).__name__}"
                              for k, f, v, _ in DAMAGE])
def test_a_damaged_field_is_named_in_one_line(tmp_path, capsys, kind, field, value, expect):
    path = tmp_path / "bad.json"
    path.write_text(edited(DOCS[kind](), lambda d: setp(d, field, value)))
    refused(capsys, path, tmp_path, expect)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused_where_they_are(tmp_path, capsys, constant):
    # json.loads accepts them; heapsight never writes them
    text = json.dumps(run_doc()).replace('"peak_rss_bytes": 3145728',
                                         f'"peak_rss_bytes": {constant}', 1)
    path = tmp_path / "bad.json"
    path.write_text(text)
    refused(capsys, path, tmp_path, f"summary.peak_rss_bytes: {constant} is not a number")


def test_an_integer_of_thousands_of_digits_is_named_not_a_parse_error(tmp_path, capsys):
    text = json.dumps(run_doc()).replace('"peak_rss_bytes": 3145728',
                                         '"peak_rss_bytes": ' + "9" * 5000, 1)
    path = tmp_path / "bad.json"
    path.write_text(text)
    refused(capsys, path, tmp_path, "summary.peak_rss_bytes: an integer of 5000 digits")


@pytest.mark.parametrize("text,expect", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "kind"),
    ('"just text"', "kind"),
    ("[" * 100000 + "]" * 100000, "not valid JSON"),
    ('{"kind": "heapsight-run", "summary": {"command": []}}\xff', "not valid JSON"),
])
def test_what_is_not_a_heapsight_document_is_one_line(tmp_path, capsys, text, expect):
    path = tmp_path / "bad.json"
    path.write_bytes(text.encode("latin-1"))
    refused(capsys, path, tmp_path, expect)


def test_a_json_summary_is_told_from_a_record(tmp_path, capsys):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(run_doc()["summary"]))     # what `run --json` writes
    refused(capsys, path, tmp_path, "kind: missing", "heapsight run -o FILE")


def test_unreadable_paths_are_one_line(tmp_path, capsys):
    refused(capsys, tmp_path, tmp_path, "is a directory")
    refused(capsys, tmp_path / "absent.json", tmp_path, "no such file")
    refused(capsys, tmp_path / ("n" * 300 + ".json"), tmp_path, "File name too long")


def test_damaged_gzip_is_one_line(tmp_path, capsys):
    whole = gzip.compress(json.dumps(run_doc()).encode())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    refused(capsys, cut, tmp_path, "cut short")
    garbled = tmp_path / "garbled.json.gz"
    garbled.write_bytes(whole[:20] + bytes(200) + whole[220:])
    refused(capsys, garbled, tmp_path, "damaged gzip")


def test_concatenated_gzip_members_are_one_document(tmp_path):
    text = json.dumps(run_doc()).encode()
    path = tmp_path / "two.json.gz"
    path.write_bytes(gzip.compress(text[:100]) + gzip.compress(text[100:]))
    assert record.load(str(path)) == json.loads(text)


def test_a_gzip_inflating_past_the_limit_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(record, "MAX_JSON_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b" " * (4 << 20)))
    refused(capsys, bomb, tmp_path, "inflates to more than 1 MiB")


def test_a_pipe_is_read_with_the_same_limit(tmp_path, capsys, monkeypatch):
    # GIVEN a pipe (heapsight report <(zcat x)) that would bring more than the limit
    monkeypatch.setattr(record, "MAX_JSON_BYTES", 1 << 20)
    r, w = os.pipe()

    def feed():
        with open(w, "wb") as f:
            try:
                f.write(json.dumps(dict(run_doc(), padding=" " * (2 << 20))).encode())
            except BrokenPipeError:
                pass
    writer = threading.Thread(target=feed)
    writer.start()
    # THEN it is refused at the limit, not read to its end
    try:
        with pytest.raises(HeapsightError, match="larger than 1 MiB"):
            record.load(f"/dev/fd/{r}")
    finally:
        os.close(r)
    writer.join(timeout=10)


def test_a_named_fifo_or_a_device_is_refused_at_once(tmp_path, capsys):
    # a FIFO nobody writes would hold report forever; a terminal would wait for typing
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    refused(capsys, fifo, tmp_path, "is a FIFO (named pipe)")
    refused(capsys, "/dev/zero", tmp_path, "is a device or a socket")


def test_a_nan_schema_version_is_named_as_written(tmp_path, capsys):
    # it printed "found _Unwritten '<heapsight.record._Unwritten o'"
    text = json.dumps(run_doc()).replace('"schema_version": ', '"schema_version": NaN, "x": ', 1)
    path = tmp_path / "bad.json"
    path.write_text(text)
    refused(capsys, path, tmp_path, "schema_version: expected a whole number, found NaN")
