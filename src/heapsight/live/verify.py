"""run --verify: after the main run, each setting the findings suggest is measured on the
program itself, at the moment the verdict is about (moments.about), against a run without
it measured the same way; the suggestions are then ordered by what was measured, each
saying its effect and its cost ("-93% end RSS, +110% time, measured").

The runs are light (no call sites, no heap map, no release: what the moment's RSS and the
wall time need), one each; a setting counts as lowering the memory only from
LOWERS_BY down, so a run-to-run wobble does not promote a setting."""

from __future__ import annotations

import dataclasses
import os
import subprocess

from heapsight import moments, remedies
from heapsight.live.measure import Options, measure
from heapsight.model import Summary

# a setting helps when it lowers the moment's RSS by at least this share
LOWERS_BY = 0.10


def candidates(s: Summary) -> list:
    """The distinct settings ({VAR: value}) the findings suggest, in the order shown."""
    out = []
    for f in s.findings:
        for x in f.suggestions:
            env = remedies.env_of(x)
            if env and env not in out:
                out.append(env)
    return out


def _light(opts: Options, env: dict) -> Options:
    preload = tuple(p for p in env.get("LD_PRELOAD", "").split(":") if p)
    rest = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    return opts.replace(
        extra_env={**opts.extra_env, **rest}, extra_preload=preload, keep=False,
        release=False, heap_maps=False, sample_bytes=0, warn=False, exporter=None,
        snapshot_signal=None, snapshot_at=(), snapshot_every_s=0.0, release_at_snapshot=False,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _moment_rss(s: Summary, name: str) -> int | None:
    return moments.rss_of(s.moments, name)


def measure_all(argv: list, s: Summary, opts: Options, progress=lambda msg: None) -> list:
    """[{env, rss_bytes, wall_s, change, time_change, error}] for the baseline (env {})
    and each candidate, measured at s.moment."""
    envs = candidates(s)
    if not envs:
        return []
    out, share = [], None
    for i, env in enumerate([{}] + envs):
        what = "without a setting" if not env else " ".join(f"{k}={v}" for k, v in env.items())
        progress(f"[{i + 1}/{len(envs) + 1}] {what}")
        missing = [p for p in env.get("LD_PRELOAD", "").split(":") if p and not os.path.exists(p)]
        if missing:
            out.append({"env": env, "error": f"{missing[0]} is not installed"})
            continue
        run, tl = measure(argv, _light(opts, env))
        rss = _moment_rss(run, s.moment)
        if not env:   # the stretch the program held memory through, without a setting
            share = moments.held_share(run.moments, run.duration_s)
        # a setting is measured where the run without one held: its median RSS over that
        # stretch, by share of the run (moments.rss_over), against the held RSS without.
        # Its own held moment may be elsewhere: the rounds' hold gone, its idle end is what
        # it sat at longest, and its end against the rounds would claim what it did not do
        stretch = s.moment == "held" and bool(env) and share is not None and tl is not None
        if stretch:
            cols = tl.columns
            rss = moments.rss_over(cols["t"], cols["rss"], run.duration_s, share)
        err = (f"exited with code {run.exit_code}" if run.exit_code else
               "the run was interrupted" if run.interrupted else
               f"no {s.moment} moment in its run" if rss is None else "")
        out.append({"env": env, "rss_bytes": rss, "wall_s": run.duration_s, "error": err,
                    "stretch": stretch})
        if run.interrupted:
            break
    base = out[0]
    for r in out[1:]:
        if not r.get("error") and not base.get("error") and base["rss_bytes"]:
            r["change"] = r["rss_bytes"] / base["rss_bytes"] - 1
            r["time_change"] = r["wall_s"] / base["wall_s"] - 1 if base["wall_s"] else 0.0
    return out


def words(r: dict, moment: str) -> str:
    """A measured setting's effect and cost, in words."""
    if r.get("error"):
        return f"not measured: {r['error']}"
    if "change" not in r:
        return "not measured: the run without it failed"
    verdict = "" if r["change"] <= -LOWERS_BY else ": does not help here"
    return f"{remedies.effect(r, moment)}, measured{verdict}"


def apply(s: Summary, results: list) -> Summary:
    """The summary with each finding's settings annotated with what was measured and
    ordered: the settings that lowered the moment's RSS by LOWERS_BY or more first (the
    most first), then the other suggestions as they were, then the settings that did not."""
    if not results:
        return s
    by_env = {tuple(sorted(r["env"].items())): r for r in results[1:]}

    def key(x):
        env = remedies.env_of(x)
        return by_env.get(tuple(sorted(env.items()))) if env else None
    found = []
    for f in s.findings:
        helped, other, not_helped = [], [], []
        for x in f.suggestions:
            r = key(x)
            if r is None:
                if "--verify" not in x:
                    other.append(x)
                continue
            text = remedies.annotate(x, words(r, s.moment))
            if r.get("change", 0) <= -LOWERS_BY and not r.get("error"):
                helped.append((r["change"], text))
            else:
                not_helped.append(text)
        sugg = tuple(t for _, t in sorted(helped)) + tuple(other) + tuple(not_helped)
        found.append(dataclasses.replace(f, suggestions=sugg))
    table = tuple({"setting": " ".join(f"{k}={v}" for k, v in r["env"].items()) or "none",
                   "moment": s.moment, **{k: r[k] for k in ("rss_bytes", "wall_s", "change",
                                                           "time_change", "error", "stretch")
                                         if k in r}}
                  for r in results)
    return dataclasses.replace(s, findings=tuple(found), verified=table)
