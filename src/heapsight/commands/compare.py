"""Run one program under several allocators and tunables and compare their memory and time.

Each configuration runs --repeat times (default 3) under `heapsight run`'s measurement;
the table gives medians with min-max: peak RSS, RSS at exit, retained at exit, what a
release at exit gave back, wall and CPU time, minor faults, each relative to glibc's
default. Each run checks that the allocator it asked for is the one that answered; a
mismatch (a static binary, a program that ignores LD_PRELOAD) is an error in its row.

examples:
  heapsight compare -- ./server --bench
  heapsight compare --configs glibc,glibc-arena2,jemalloc-eager --repeat 5 -- ./app
  heapsight compare --config mine:jemalloc:MALLOC_CONF=narenas:2 -- ./app
  heapsight compare --list
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field

from heapsight import native, record, report
from heapsight.analysis import human
from heapsight.commands import run
from heapsight.errors import HeapsightError

LIBDIR = "/usr/lib/x86_64-linux-gnu"
ALLOCATOR_LIBS = {  # allocator -> (library to preload, Debian package that ships it)
    "glibc": (None, None),
    "jemalloc": (f"{LIBDIR}/libjemalloc.so.2", "libjemalloc2"),
    "tcmalloc": (f"{LIBDIR}/libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
    "mimalloc": (f"{LIBDIR}/libmimalloc.so.2", "libmimalloc2.0"),
    "mmap": (str(native.PACKAGE_DIR / "_lib" / "libheapsight_mmap.so"), None),
}


@dataclass(frozen=True)
class Config:
    name: str
    allocator: str
    env: dict = field(default_factory=dict)
    about: str = ""
    library: str | None = None  # overrides ALLOCATOR_LIBS (a user's own build)


PRESETS = [
    Config("glibc", "glibc", {}, "glibc malloc, default settings (the baseline)"),
    Config("glibc-arena2", "glibc", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "at most 2 arenas"),
    Config("glibc-arena1", "glibc", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=1"}, "one arena"),
    Config("glibc-mmap128k", "glibc", {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"},
           "fixed 128 KiB mmap threshold (no dynamic raise)"),
    Config("glibc-trim128k", "glibc", {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
           "trim the heap top above 128 KiB free"),
    Config("jemalloc", "jemalloc", {}, "jemalloc 5.3, default decay"),
    Config("jemalloc-eager", "jemalloc", {"MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"},
           "jemalloc returning freed pages at once"),
    Config("jemalloc-bg", "jemalloc", {"MALLOC_CONF": "background_thread:true"},
           "jemalloc with its background purging thread"),
    Config("tcmalloc", "tcmalloc", {}, "gperftools tcmalloc (minimal), default"),
    Config("tcmalloc-aggressive", "tcmalloc", {"TCMALLOC_AGGRESSIVE_DECOMMIT": "true"},
           "tcmalloc decommitting free spans at once"),
    Config("mimalloc", "mimalloc", {}, "mimalloc 2.0, default"),
    Config("mimalloc-eager", "mimalloc", {"MIMALLOC_DECOMMIT_DELAY": "0"}, "mimalloc decommitting at once"),
    Config("mmap", "mmap", {}, "one mmap per allocation, munmap on free: the retention-free baseline"),
]
PRESET = {c.name: c for c in PRESETS}
DEFAULT_CONFIGS = ("glibc,glibc-arena2,glibc-mmap128k,jemalloc,jemalloc-eager,tcmalloc,"
                   "tcmalloc-aggressive,mimalloc,mmap")
METRICS = (("peak_rss", "peak RSS"), ("final_rss", "RSS at exit"), ("retained", "retained"),
           ("given_back", "given back"), ("wall_s", "wall"), ("cpu_s", "CPU"),
           ("minor_faults", "minor faults"))


def add_arguments(p) -> None:
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help=f"comma-separated configurations (default: {DEFAULT_CONFIGS}); see --list")
    p.add_argument("--config", action="append", default=[], metavar="NAME:ALLOC[:ENV=VAL,...]",
                   help="add your own: ALLOC is glibc, jemalloc, tcmalloc, mimalloc, mmap, or the "
                        "path of an allocator library; ENV=VAL pairs are set for the program")
    p.add_argument("--repeat", type=int, default=3, help="runs per configuration (default 3)")
    p.add_argument("--json", metavar="FILE", help="the comparison as JSON ('-' for stdout)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="save every run (summaries and timelines) for reports "
                        "(default heapsight-compare-PROG.PID.json.gz)")
    p.add_argument("--no-save", action="store_true", help="do not save the runs")
    p.add_argument("--html", metavar="FILE",
                   help="also write the comparison as a self-contained HTML page")
    p.add_argument("--show-output", action="store_true",
                   help="let the program's stdout through (default: discarded)")
    p.add_argument("--list", action="store_true", help="list the built-in configurations and exit")
    p.add_argument("command", nargs="*", metavar="COMMAND [ARGS...]")


def parse_user_config(text: str) -> Config:
    parts = text.split(":", 2)
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise HeapsightError(f"--config {text!r}: expected NAME:ALLOC[:ENV=VAL,...], "
                             "e.g. mine:jemalloc:MALLOC_CONF=narenas:2")
    name, alloc = parts[0], parts[1]
    env = {}
    if len(parts) == 3 and parts[2]:
        # values may contain ':' and ',' (MALLOC_CONF=a:1,b:2): split on ',' before NAME=
        current = None
        for piece in parts[2].split(","):
            key, eq, val = piece.partition("=")
            if eq and key.replace("_", "").isalnum() and key.upper() == key:
                current = key
                env[key] = val
            elif current:
                env[current] += "," + piece
            else:
                raise HeapsightError(f"--config {text!r}: {piece!r} is not ENV=VAL")
    if alloc in ALLOCATOR_LIBS:
        return Config(name, alloc, env, "user-defined")
    if "/" in alloc or alloc.endswith(".so") or ".so." in alloc:
        kind = next((a for a in ("jemalloc", "tcmalloc", "mimalloc") if a in os.path.basename(alloc)),
                    "unknown")
        return Config(name, kind, env, f"user-defined, {alloc}", library=alloc)
    raise HeapsightError(f"--config {text!r}: unknown allocator {alloc!r}; use glibc, jemalloc, "
                         "tcmalloc, mimalloc, mmap or a library path")


def select_configs(args) -> list:
    out = []
    for name in [n.strip() for n in args.configs.split(",") if n.strip()]:
        if name not in PRESET:
            raise HeapsightError(f"unknown configuration {name!r}; known: {', '.join(PRESET)} "
                                 "(or add one with --config)")
        out.append(PRESET[name])
    out += [parse_user_config(t) for t in args.config]
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise HeapsightError(f"configuration names repeat: {names}")
    if not out:
        raise HeapsightError("no configurations selected")
    return out


def library_for(cfg: Config) -> tuple:
    """(library or None, error or None)."""
    lib, package = (cfg.library, None) if cfg.library else ALLOCATOR_LIBS.get(cfg.allocator, (None, None))
    if lib and not os.path.exists(lib):
        how = f"install the Debian package {package} (apt-get install {package})" if package \
            else "check the path" if cfg.library else "reinstall heapsight"
        return None, f"{cfg.allocator} library {lib} is missing: {how}"
    return lib, None


def one_run(argv: list, cfg: Config, lib: str | None, show_output: bool) -> tuple:
    opts = run.Options(extra_env=cfg.env, extra_preload=(lib,) if lib else (), warn=False,
                       stdout=None if show_output else subprocess.DEVNULL)
    summary, timeline = run.measure(argv, opts)
    heap = summary.heap
    if heap is None:
        return summary, timeline, None, (f"the preload was ignored ({summary.preload_note}); "
                                         "no allocator figures")
    if cfg.allocator != "unknown" and heap.allocator != cfg.allocator:
        return summary, timeline, None, (f"asked for {cfg.allocator}, but {heap.allocator} answered "
                                         "(the program links its own allocator or drops LD_PRELOAD)")
    if summary.exit_code != 0:
        return summary, timeline, None, f"the program exited with code {summary.exit_code}"
    metrics = {
        "peak_rss": summary.peak_rss_bytes,
        "final_rss": summary.final_rss_bytes,
        "retained": summary.final.retained_bytes if summary.final else 0,
        "given_back": summary.release.gave_back_bytes,
        "wall_s": summary.duration_s,
        "cpu_s": round(summary.cpu_user_s + summary.cpu_sys_s, 4),
        "minor_faults": summary.minor_faults,
    }
    return summary, timeline, metrics, None


def stats_of(runs: list) -> dict:
    out = {}
    for key, _ in METRICS:
        vals = [r[key] for r in runs]
        out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out


def fmt(key: str, v: float | None) -> str:
    if v is None:
        return "-"
    if key in ("wall_s", "cpu_s"):
        return f"{v:.3f} s"
    if key == "minor_faults":
        return f"{v:,.0f}"
    return human(v)


def recommend(rows: list) -> str:
    base = next((r for r in rows if r["name"] == "glibc" and r["ok"]), None)
    if base is None:
        return "no recommendation: the glibc baseline did not run (add glibc to --configs)"
    b = base["stats"]
    ok = [r for r in rows if r["ok"] and r is not base]
    def change(r, key):
        return (r["stats"][key]["median"] - b[key]["median"]) / b[key]["median"] if b[key]["median"] else 0.0
    # the lowest RSS at exit among those costing at most 25% more time; else the lowest
    better = [r for r in ok if change(r, "final_rss") <= -0.10]
    if not better:
        return "keep glibc's defaults: no configuration lowered the RSS at exit by 10% or more"
    affordable = [r for r in better if change(r, "wall_s") <= 0.25] or better
    pick = min(affordable, key=lambda r: r["stats"]["final_rss"]["median"])
    return (f"{pick['name']}: {change(pick, 'final_rss') * 100:+.0f}% RSS at exit, "
            f"{change(pick, 'peak_rss') * 100:+.0f}% peak RSS, {change(pick, 'wall_s') * 100:+.0f}% "
            f"wall time against glibc's defaults ({pick['about']}); run it with: {pick['how']}")


def how_to_run(cfg: Config, lib: str | None, argv: list) -> str:
    import shlex
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in cfg.env.items())
    pre = f"LD_PRELOAD={lib} " if lib else ""
    return f"{pre}{env + ' ' if env else ''}{shlex.join(argv)}".strip()


def render(rows: list, repeat: int, out) -> None:
    base = next((r for r in rows if r["name"] == "glibc" and r["ok"]), None)
    w = out.write
    heads = ["configuration"] + [h for _, h in METRICS]
    w(f"\n{heads[0]:22}" + "".join(f"{h:>22}" for h in heads[1:]) + "\n")
    for r in rows:
        if not r["ok"]:
            w(f"{r['name']:22}  ERROR: {r['error']}\n")
            continue
        cells, spans = [], []
        for key, _ in METRICS:
            st = r["stats"][key]
            rel = ""
            if base is not None and r is not base and base["stats"][key]["median"]:
                rel = f" {100 * (st['median'] / base['stats'][key]['median'] - 1):+.0f}%"
            cells.append(f"{fmt(key, st['median']) + rel:>22}")
            spans.append(f"{'(' + fmt(key, st['min']) + '-' + fmt(key, st['max']) + ')':>22}" if repeat > 1 else f"{'':>22}")
        w(f"{r['name']:22}" + "".join(cells) + "\n")
        if repeat > 1:
            w(f"{'':22}" + "".join(spans) + "\n")
    w(f"\nmedians of {repeat} run(s), min-max below; percentages against glibc's defaults\n")


def list_configs(out) -> None:
    for c in PRESETS:
        lib, err = library_for(c)
        env = " ".join(f"{k}={v}" for k, v in c.env.items())
        state = "" if err is None else "   [missing: " + err.split(": ", 1)[1] + "]"
        out.write(f"{c.name:22}{c.about}{'  (' + env + ')' if env else ''}{state}\n")


def execute(args) -> int:
    if args.list:
        list_configs(sys.stdout)
        return 0
    if not args.command:
        raise HeapsightError("no command given: heapsight compare [options] -- COMMAND [ARGS...]")
    if not 1 <= args.repeat <= 100:
        raise HeapsightError(f"--repeat {args.repeat} is out of range: give 1 to 100")
    argv = list(args.command)
    run.resolve_command(argv)  # fail before any work when the command does not exist
    configs = select_configs(args)
    if args.html:
        report.check_output(args.html)
    rows, records = [], []
    total = len(configs) * args.repeat
    done = 0
    for i in range(args.repeat):  # interleaved: machine noise hits every configuration alike
        for cfg in configs:
            row = next((r for r in rows if r["name"] == cfg.name), None)
            if row is None:
                lib, err = library_for(cfg)
                row = {"name": cfg.name, "allocator": cfg.allocator, "about": cfg.about,
                       "env": cfg.env, "library": lib, "ok": err is None, "error": err,
                       "runs": [], "how": how_to_run(cfg, lib, argv)}
                rows.append(row)
            done += 1
            if not row["ok"]:
                continue
            print(f"heapsight compare: [{done}/{total}] {cfg.name} (run {i + 1} of {args.repeat})",
                  file=sys.stderr)
            summary, timeline, metrics, err = one_run(argv, cfg, row["library"], args.show_output)
            records.append({"config": cfg.name, "repeat": i,
                            **record.to_json_dict(summary, timeline)})
            if err:
                row["ok"], row["error"] = False, err
            else:
                row["runs"].append(metrics)
    for r in rows:
        if r["ok"]:
            r["stats"] = stats_of(r["runs"])
    rec = recommend(rows)
    render(rows, args.repeat, sys.stderr)
    sys.stderr.write(f"recommendation: {rec}\n")
    doc = {"kind": "heapsight-compare", "schema_version": 1, "command": argv,
           "repeat": args.repeat, "configs": rows, "recommendation": rec}
    if args.json:
        record.write_json(args.json, doc)
    if not args.no_save:
        out = args.output or f"heapsight-compare-{os.path.basename(argv[0])}.{os.getpid()}.json.gz"
        record.save_doc(out, {**doc, "runs": records})
        sys.stderr.write(f"runs saved to {out}\n")
    if args.html:
        report.write_html(args.html, [{**doc, "runs": records}])
        sys.stderr.write(f"page written to {args.html}\n")
    return 0 if any(r["ok"] for r in rows) else 1
