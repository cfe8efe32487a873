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
    out += [".SH EXIT STATUS", "run: the program's own (128+N when it died from signal N); 90 when "
            "a \\-\\-fail\\-if gate tripped; 2 bad input; 127 program not found. compare: 1 when "
            "a configuration failed. attach: 3 when it cannot attach. 130 after Ctrl\\-C.",
            ".SH SEE ALSO", "heaptrack(1), valgrind(1), mallopt(3), malloc_trim(3), malloc_info(3)"]
    return "\n".join(out) + "\n"
