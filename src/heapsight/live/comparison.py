"""One program under several configurations: the runs, their medians and spread, and the
recommendation. `heapsight compare` drives it; the report draws what it returns."""

from __future__ import annotations

import shlex
import subprocess
import time
from dataclasses import field

from heapsight.dataclass import dataclass
from heapsight import allocators, moments, record
from heapsight.allocators import Config, library_for
from heapsight.live.measure import Options, measure
from heapsight.moments import rss_of
from heapsight.ranking import recommend, stats_of

SCHEMA_KIND = "heapsight-compare"
def one_run(argv: list, cfg: Config, lib: str | None, show_output: bool,
            follow: str = "") -> tuple:
    """(summary, timeline, metrics or None, error or None, interrupted) for one run;
    follow: the program among those the command starts whose process is measured."""
    opts = Options(extra_env=cfg.env, extra_preload=(lib,) if lib else (), warn=False,
                   stdout=None if show_output else subprocess.DEVNULL, follow=follow,
                   reach=False)
    summary, timeline = measure(argv, opts)
    heap = summary.heap
    if heap is None:
        return summary, timeline, None, (f"the preload was ignored ({summary.preload_note}); "
                                         "no allocator figures")
    if cfg.allocator != "unknown" and heap.allocator != cfg.allocator:
        return summary, timeline, None, (f"asked for {cfg.allocator}, but {heap.allocator} answered "
                                         "(the program links its own allocator or drops LD_PRELOAD)")
    if summary.exit_code != 0:
        how = (f"was killed by signal {summary.exit_signal}" if summary.exit_signal
               else f"exited with code {summary.exit_code}")
        return summary, timeline, None, f"the program {how}"
    metrics = {
        "peak_rss": summary.peak_rss_bytes,
        "held_rss": rss_of(summary.moments, "held"),   # None: held nothing (run_all's)
        "end_rss": rss_of(summary.moments, "end"),
        "moment": summary.moment,
        "final_rss": summary.final_rss_bytes,
        "retained": summary.final.retained_bytes if summary.final else 0,
        "given_back": summary.release.gave_back_bytes,
        "wall_s": summary.duration_s,
        "cpu_s": summary.program_cpu_s,   # the program's own: heapsight's library apart
        "minor_faults": summary.minor_faults,
    }
    return summary, timeline, metrics, None


def how_to_run(cfg: Config, lib: str | None, argv: list) -> str:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in cfg.env.items())
    pre = f"LD_PRELOAD={lib} " if lib else ""
    return f"{pre}{env + ' ' if env else ''}{shlex.join(argv)}".strip()


@dataclass
class Comparison:
    """What compare measured: a row per configuration, every run's record, and whether an
    interrupt stopped it before the end."""
    argv: list
    repeat: int
    rank_by: str = ""   # the moment ranked by (moments.NAMES); "" until decided
    rows: list = field(default_factory=list)
    records: list = field(default_factory=list)
    interrupted: bool = False

    def doc(self, with_runs: bool = True) -> dict:
        d = {"kind": SCHEMA_KIND, "schema_version": record.SCHEMA_VERSION, "command": self.argv,
             "repeat": self.repeat, "configs": self.rows, "rank_by": self.ranked_by(),
             "rank_why": self.rank_why(),
             "recommendation": recommend(self.rows, self.ranked_by()),
             "interrupted": self.interrupted}
        if with_runs:
            d["runs"] = self.records
        return d


    def ranked_by(self) -> str:
        """The moment asked for, else the one glibc's first run's verdict was about."""
        return self.rank_by or self._verdict_moment() or "end"

    def _verdict_moment(self) -> str:
        base = next((r for r in self.rows if r["name"] == allocators.BASELINE), None)
        return next((x["moment"] for x in (base or {}).get("runs", ()) if x.get("moment")), "")

    def rank_why(self) -> str:
        if self.rank_by:
            return "asked for (--rank-by)"
        return ("the moment the verdict of glibc's run is about" if self._verdict_moment()
                else "no glibc run: the program's end")


def run_all(argv: list, configs: list, repeat: int, show_output: bool = False,
            progress=lambda msg: None, rank_by: str = "", follow: str = "") -> Comparison:
    """Runs every configuration repeat times, interleaved (machine noise hits every
    configuration alike). An interrupt (Ctrl-C, SIGTERM) ends the run in progress and
    stops the matrix; what finished is kept and cmp.interrupted is set."""
    cmp = Comparison(list(argv), repeat, rank_by)
    for cfg in configs:
        lib, err = library_for(cfg)
        cmp.rows.append({"name": cfg.name, "allocator": cfg.allocator, "about": cfg.about,
                         "env": cfg.env, "library": lib, "ok": err is None, "error": err,
                         "runs": [], "how": how_to_run(cfg, lib, argv)})
    total, done = len(configs) * repeat, 0
    started, finished = time.monotonic(), 0
    try:
        for i in range(repeat):
            for cfg, row in zip(configs, cmp.rows):
                done += 1
                if not row["ok"]:
                    continue
                eta = ""
                if finished:
                    left = (time.monotonic() - started) / finished * (total - done + 1)
                    eta = f", about {left:.0f} s left" if left >= 1 else ""
                progress(f"[{done}/{total}] {cfg.name} (run {i + 1} of {repeat}{eta})")
                summary, timeline, metrics, err = one_run(argv, cfg, row["library"], show_output,
                                                          follow)
                if summary.interrupted:
                    raise KeyboardInterrupt
                cmp.records.append({"config": cfg.name, "repeat": i,
                                    **record.to_json_dict(summary, timeline)})
                finished += 1
                if err:
                    row["ok"], row["error"] = False, err
                else:
                    row["runs"].append(metrics)
    except KeyboardInterrupt:
        cmp.interrupted = True  # the run in progress is dropped; the finished ones count
    _held_where_glibc_held(cmp)
    for r in cmp.rows:
        if r["ok"] and r["runs"]:
            r["stats"] = stats_of(r["runs"])
        elif r["ok"]:
            r["ok"], r["error"] = False, "interrupted before its first run finished"
    return cmp


def _held_where_glibc_held(cmp: Comparison) -> None:
    """Every run's held RSS where glibc's first run that held memory held it: its median RSS
    over that stretch, by share of the run (moments.rss_over). A run's own held moment may
    be another part of the run (its hold gone under a setting, it sat longest at its idle
    end): against glibc's hold that would credit the setting with a drop it did not make.
    Where no glibc run held anything (a program too short to hold for a stretch), a run's
    own held moment, else its peak. held_by says which: "moment", "stretch" or "peak"."""
    recs: dict = {}
    for rec in cmp.records:
        recs.setdefault(rec["config"], []).append(rec)
    first, share = next(((rec, sh) for rec in recs.get(allocators.BASELINE, ())
                         if (sh := moments.held_share(rec["summary"]["moments"],
                                                      rec["summary"]["duration_s"]))),
                        (None, None))
    for row in cmp.rows:
        for m, rec in zip(row["runs"], recs.get(row["name"], ())):
            if rec is first or (share is None and m["held_rss"] is not None):
                m["held_by"] = "moment"
                continue
            tl = rec.get("timeline") or {}
            v = (moments.rss_over(tl.get("t", ()), tl.get("rss", ()), rec["summary"]["duration_s"],
                                  share) if share else None)
            m["held_rss"], m["held_by"] = (v, "stretch") if v is not None else (m["peak_rss"], "peak")
