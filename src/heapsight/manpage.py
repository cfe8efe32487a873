"""The man page, made from the command line parser itself (so it never disagrees with
--help): `heapsight --print-man > heapsight.1`, then `man ./heapsight.1`."""

from __future__ import annotations

import argparse
import datetime


def _roff(text: str) -> str:
    lines = []
    for line in text.replace("\\", "\\\\").splitlines():
        line = line.replace("-", "\\-")
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def _text(text: str) -> list:
    """Prose as roff: blank lines part paragraphs; indented lines (examples, lists) are
    kept as written, in a block of their own, never filled into the prose around them."""
    out, pre = [], False
    for line in (text or "").splitlines():
        indented = line.startswith((" ", "\t")) and line.strip()
        if pre and not indented:
            out += [".fi", ".RE"] + ([".PP"] if line.strip() else [])   # prose after a list
            pre = False
        if not line.strip():
            out.append(".PP")
        elif indented:
            if not pre:
                out += [".RS 2", ".nf"]
                pre = True
            out.append(_roff(line[2:] if line.startswith("  ") else line.strip()))
        else:
            out.append(_roff(line))
    if pre:
        out += [".fi", ".RE"]
    while out and out[-1] == ".PP":
        out.pop()
    return out


def _option(a) -> list:
    names = ", ".join(a.option_strings) or (a.metavar or a.dest)
    if a.option_strings and a.nargs != 0:
        names += f" {a.metavar or a.dest.upper()}"
    text = a.help % {"default": a.default} if a.help and "%(" in a.help else a.help or ""
    return [".TP", f"\\fB{_roff(names)}\\fR", _roff(text)]


def _options(p: argparse.ArgumentParser) -> list:
    """The options by the parser's groups, each group under its own title."""
    out = []
    for group in p._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS
                   and not isinstance(a, argparse._SubParsersAction)]
        if not actions:
            continue
        if group.title not in ("options", "optional arguments", "positional arguments"):
            out += [".PP", f"\\fI{_roff(group.title)}\\fR"]
        for a in actions:
            out += _option(a)
    return out


# What heapsight reads from the environment, then the allocators' own variables its advice
# and compare's configurations set (set them in front: VAR=... heapsight run -- ./app).
ENVIRONMENT = (
    ("HEAPSIGHT_SAMPLE_BYTES", "the call sites' sampling mean in bytes, as run --sample-bytes "
     "(default 512K; 0: no call sites); read by the library, so heapsight env's programs "
     "take it too"),
    ("HEAPSIGHT_SYMBOLIZER", "the llvm-symbolizer to name frames with (a path; empty: none, "
     "frames stay object+offset); default: llvm-symbolizer on PATH"),
    ("HEAPSIGHT_NAMES_CACHE", "0: do not keep the symbolizer's answers between runs (by "
     "default its complete answers, function, file and line, are kept per object file under "
     "$XDG_CACHE_HOME/heapsight/names, else ~/.cache/heapsight/names, and a rebuilt object "
     "is asked again)"),
    ("HEAPSIGHT_CHROMIUM", "the Chromium that report --png and the page's tests drive; "
     "default: chromium on PATH"),
    ("HEAPSIGHT_INTERP_FRAMES", "0: do not read Python's and Perl's own frames at the "
     "sampled allocations (the call sites are then the interpreter's C functions)"),
    ("HEAPSIGHT_REACH", "0: do not mark which blocks the program can still reach at exit "
     "(no leak classes; --fail-if-lost then cannot be judged)"),
    ("HEAPSIGHT_REACH_INDEX", "0: mark without the index of the blocks (a binary search "
     "over them all for each word: the same classes, slower; bench/reach compares them)"),
    ("HEAPSIGHT_REACH_WORKERS", "1: one process marks at exit; 2: two whatever the heap's "
     "size; auto (the default): two once the blocks hold 16 MiB, where the program is the "
     "command heapsight started (it is gone then, and both cores are free; the same "
     "classes: bench/reach compares them)"),
    ("HEAPSIGHT_UNWIND_CHECK", "1: walk every sampled stack both with heapsight's cached "
     "rules and with libgcc's, and count where they differ (a check, slower)"),
    ("NO_COLOR", "set: no colour, even on a terminal"),
    ("COLUMNS", "the width to fit the output to (default: the terminal's, else 100 for a pipe)"),
    ("LD_PRELOAD", "heapsight puts its library first and keeps yours after it: "
     "LD_PRELOAD=libjemalloc.so.2 heapsight run -- ./app measures the program on jemalloc"),
    ("MALLOC_ARENA_MAX, MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_, "
     "GLIBC_TUNABLES", "glibc's malloc settings (glibc.malloc.arena_max, trim_threshold, "
     "mmap_threshold, ...: mallopt(3), tunables(7)); the findings suggest them and "
     "compare's glibc-* configurations set them"),
    ("MALLOC_CONF", "jemalloc's settings (dirty_decay_ms, muzzy_decay_ms, "
     "background_thread: the jemalloc-* configurations)"),
    ("TCMALLOC_AGGRESSIVE_DECOMMIT", "true: tcmalloc (gperftools) returns free pages at "
     "once (the tcmalloc-aggressive configuration)"),
    ("MIMALLOC_DECOMMIT_DELAY", "0: mimalloc 2.0 returns free pages at once (the "
     "mimalloc-eager configuration)"),
    ("PYTHONMALLOC", "malloc: CPython's objects from the C allocator instead of its pymalloc "
     "arenas (the python-malloc configurations; with jemalloc returning pages at once, the "
     "remedy heapsight measures first for pymalloc's arenas)"),
)


def render(parser: argparse.ArgumentParser, version: str) -> str:
    today = datetime.date.today().isoformat()
    out = [f'.TH HEAPSIGHT 1 "{today}" "heapsight {version}" "User Commands"', ".SH NAME",
           "heapsight \\- why a process's memory did not go back to the OS after free()",
           ".SH SYNOPSIS", "\\fBheapsight\\fR \\fICOMMAND\\fR [\\fIoptions\\fR] ...",
           ".SH DESCRIPTION", *_text(parser.description), ".SH OPTIONS", *_options(parser)]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out.append(".SH COMMANDS")
    for name, sp in sub.choices.items():
        out += [f".SS heapsight {name}", ".nf", _roff(sp.format_usage().strip()), ".fi", ".PP",
                *_text(sp.description), *_options(sp)]
    out += [".SH ENVIRONMENT"]
    for name, text in ENVIRONMENT:
        out += [".TP", f"\\fB{_roff(name)}\\fR", _roff(text)]
    out += [".SH EXIT STATUS", "run: the program's own (128+N when it died from signal N); 90 when "
            "a \\-\\-fail\\-if gate tripped; 2 bad input; 127 program not found. compare: 1 when "
            "a configuration failed. attach: 3 when it cannot attach. 130 after Ctrl\\-C.",
            ".SH SEE ALSO", "heaptrack(1), valgrind(1), mallopt(3), malloc_trim(3), malloc_info(3)"]
    return "\n".join(out) + "\n"
