"""run --verify's arithmetic (live/verify.py), on runs made up here: a setting is measured at
the verdict's moment against the run without a setting at the same moment; a setting under
which the program held nothing (no held moment in its run) is measured at the end of both."""

from __future__ import annotations

from heapsight.live import verify
from heapsight.model import Breakdown, Finding, Moment, Summary

MiB = 1 << 20
JEMALLOC = ("LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 "
            "MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 heapsight run -- ./app")
ARENAS = "GLIBC_TUNABLES=glibc.malloc.arena_max=2 heapsight run -- ./app"


def summary(**given) -> Summary:
    """A summary of ./app, 1 s, with what is given and nothing else."""
    return Summary(**{**dict(command=("./app",), pid=1, started_pid=1, exit_code=0,
                             exit_signal=0, preload="active", preload_note="", duration_s=1.0,
                             samples=100, sample_hz=100.0, sampler_cpu_s=0.0, peak_rss_bytes=0,
                             final_rss_bytes=0, peak=None, final=None, release=None, heap=None,
                             forks=0, execs=0, other_processes=0), **given})


def run(**rss) -> Summary:
    """A run whose moments have these RSS ({name: MiB})."""
    return summary(moments=tuple(
        Moment(name, 0.5, Breakdown(0.5, mib * MiB, *[0] * 9)) for name, mib in rss.items()))


def test_a_setting_that_leaves_no_hold_is_measured_at_the_end_of_both(monkeypatch):
    # GIVEN a program that held 400 MiB (412 at its held moment, 410 at its end); under
    # jemalloc no held moment at all (94 MiB at its end, but its peak 440: the work's live
    # bytes), under arena_max=2 a hold of 356
    held = summary(moment="held", findings=(
        Finding("hold", 400 * MiB, "held", "", (ARENAS, JEMALLOC)),))
    runs = iter([run(peak=413, held=412, end=410), run(peak=413, held=356, end=356),
                 run(peak=440, end=94)])   # (in the order suggested: arena_max, jemalloc)
    monkeypatch.setattr(verify, "measure", lambda argv, opts: (next(runs), None))
    results = verify.measure_all(["./app"], held, verify.Options())
    base, arenas, jem = results
    # THEN jemalloc's is its end against the end without a setting: -77%, not "not measured"
    # (nor its peak's +7%)
    assert jem["as_end"] and not jem["error"]
    assert round(jem["change"], 2) == round(94 / 410 - 1, 2)
    assert "no held moment under it: end RSS 94.0 MiB, against 410.0 MiB at the end without" \
        in verify.words(jem, "held")
    # and a setting with a held moment is measured there, against the held RSS without
    assert not arenas["as_end"] and round(arenas["change"], 2) == round(356 / 412 - 1, 2)
    # AND the suggestions are ordered by it: jemalloc's first
    s = verify.apply(held, results)
    assert s.findings[0].suggestions[0].startswith("LD_PRELOAD=") and \
        "-77% held RSS" in s.findings[0].suggestions[0]


def test_a_moment_missing_from_a_run_is_said_so(monkeypatch):
    # GIVEN a verdict about the end, and a setting's run without one (killed before it)
    end = summary(moment="end", findings=(
        Finding("retention", 40 * MiB, "kept", "", (ARENAS,)),))
    runs = iter([run(peak=100, end=90), run(peak=100)])
    monkeypatch.setattr(verify, "measure", lambda argv, opts: (next(runs), None))
    _, arenas = verify.measure_all(["./app"], end, verify.Options())
    assert arenas["error"] == "no end moment in its run" and "change" not in arenas
