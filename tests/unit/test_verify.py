"""run --verify's arithmetic (live/verify.py), on runs made up here: a setting is measured at
the verdict's moment against the run without a setting at the same moment; for held, where
the run without a setting held (its median RSS over that stretch, by share of the run),
whether the setting's run held memory itself or not."""

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


class _Timeline:
    def __init__(self, samples):
        self.columns = {"t": [t for t, _ in samples], "rss": [r * MiB for _, r in samples]}


def run(samples=((0.5, 1),), held=None, **rss) -> tuple:
    """A run (summary, timeline) whose moments have these RSS ({name: MiB}), held its
    (start, end, MiB) when given, and whose timeline is samples ((t, MiB), ...)."""
    ms = [Moment(name, 0.5, Breakdown(0.5, mib * MiB, *[0] * 9)) for name, mib in rss.items()]
    if held:
        ms.append(Moment("held", held[0], Breakdown(held[0], held[2] * MiB, *[0] * 9),
                         start_s=held[0], end_s=held[1]))
    return summary(moments=tuple(ms)), _Timeline(samples)


def test_a_setting_that_leaves_no_hold_is_measured_where_the_run_without_it_held(monkeypatch):
    # GIVEN a program that holds 400 MiB from 0.6 to 0.9 s of its 1 s (412 MiB RSS) and then
    # ends at 410; under jemalloc no held moment at all (its peak 440 MiB, the work's live
    # bytes at 0.3 s; 90-100 MiB from 0.6 s on); under arena_max=2 a hold of 356
    held = summary(moment="held", findings=(
        Finding("hold", 400 * MiB, "held", "", (ARENAS, JEMALLOC)),))
    jemalloc = [(0.1, 200), (0.3, 440), (0.5, 300), (0.6, 100), (0.7, 94), (0.8, 92), (0.9, 90)]
    arena_max = [(0.3, 413), (0.6, 357), (0.7, 356), (0.8, 355), (0.95, 356)]
    runs = iter([run(held=(0.6, 0.9, 412), peak=413, end=410),
                 run(arena_max, held=(0.6, 0.9, 356), peak=413, end=356),
                 run(jemalloc, peak=440, end=90)])   # (in the order suggested)
    monkeypatch.setattr(verify, "measure", lambda argv, opts: next(runs))
    results = verify.measure_all(["./app"], held, verify.Options())
    base, arenas, jem = results
    # THEN jemalloc's is its median RSS over 0.6-0.9 s against the 412 held without: -77%,
    # not "not measured" (nor its peak's +7%)
    assert jem["stretch"] and not jem["error"] and jem["rss_bytes"] == 93 * MiB
    assert round(jem["change"], 3) == round(93 / 412 - 1, 3)
    assert "(93.0 MiB where the run without it held)" in verify.words(jem, "held")
    # and a setting with a held moment is measured over the same stretch
    assert arenas["stretch"] and round(arenas["change"], 3) == round(356 / 412 - 1, 3)
    # AND the suggestions are ordered by it: jemalloc's first
    s = verify.apply(held, results)
    assert s.findings[0].suggestions[0].startswith("LD_PRELOAD=") and \
        "-77% held RSS" in s.findings[0].suggestions[0]


def test_a_moment_missing_from_a_run_is_said_so(monkeypatch):
    # GIVEN a verdict about the end, and a setting's run without one (killed before it)
    end = summary(moment="end", findings=(
        Finding("retention", 40 * MiB, "kept", "", (ARENAS,)),))
    runs = iter([run(peak=100, end=90), run(peak=100)])
    monkeypatch.setattr(verify, "measure", lambda argv, opts: next(runs))
    _, arenas = verify.measure_all(["./app"], end, verify.Options())
    assert arenas["error"] == "no end moment in its run" and "change" not in arenas


def test_a_setting_that_sits_longest_elsewhere_is_measured_where_the_run_without_it_held(
        monkeypatch):
    # GIVEN a program holding 412 MiB through its rounds (0.2-0.5 s of 1 s), then idle at 20;
    # under a setting the rounds take 100 MiB and its idle end (15 MiB, 0.5 s) is the
    # stretch it sat at longest: its own held moment
    held = summary(moment="held", findings=(Finding("hold", 400 * MiB, "held", "", (ARENAS,)),))
    setting = [(0.1, 30), (0.3, 100), (0.4, 102), (0.6, 15), (0.9, 15)]
    runs = iter([run([(0.3, 412), (0.4, 410), (0.6, 20)], held=(0.2, 0.5, 411), peak=413),
                 run(setting, held=(0.5, 1.0, 15), peak=102)])
    monkeypatch.setattr(verify, "measure", lambda argv, opts: next(runs))
    _, arenas = verify.measure_all(["./app"], held, verify.Options())
    # THEN it is its RSS through the rounds (101 MiB: -75%), not its idle end's 15 (-96%)
    assert arenas["stretch"] and arenas["rss_bytes"] == 101 * MiB
    assert round(arenas["change"], 3) == round(101 / 411 - 1, 3)
