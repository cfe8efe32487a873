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


def _options(p: argparse.ArgumentParser) -> list:
    out = []
    for a in p._actions:
        if a.help == argparse.SUPPRESS or isinstance(a, argparse._SubParsersAction):
            continue
        names = ", ".join(a.option_strings) or (a.metavar or a.dest)
        if a.option_strings and a.nargs != 0:
            names += f" {a.metavar or a.dest.upper()}"
        out += [".TP", f"\\fB{_roff(names)}\\fR", _roff(a.help % {"default": a.default}
                                                       if a.help and "%(" in a.help else a.help or "")]
    return out


def render(parser: argparse.ArgumentParser, version: str) -> str:
    today = datetime.date.today().isoformat()
    out = [f'.TH HEAPSIGHT 1 "{today}" "heapsight {version}" "User Commands"', ".SH NAME",
           "heapsight \\- why a process's memory did not go back to the OS after free()",
           ".SH SYNOPSIS", "\\fBheapsight\\fR \\fICOMMAND\\fR [\\fIoptions\\fR] ...",
           ".SH DESCRIPTION", _roff(parser.description or ""), ".SH OPTIONS", *_options(parser)]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out.append(".SH COMMANDS")
    for name, sp in sub.choices.items():
        out += [f".SS heapsight {name}", _roff(sp.format_usage().strip()), ".PP",
                _roff(sp.description or ""), *_options(sp)]
    out += [".SH EXIT STATUS", "run: the program's own (128+N when it died from signal N); 90 when "
            "a \\-\\-fail\\-if gate tripped; 2 bad input; 127 program not found. compare: 1 when "
            "a configuration failed. attach: 3 when it cannot attach. 130 after Ctrl\\-C.",
            ".SH SEE ALSO", "heaptrack(1), valgrind(1), mallopt(3), malloc_trim(3), malloc_info(3)"]
    return "\n".join(out) + "\n"
