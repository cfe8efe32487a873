"""Command line entry point: parses the subcommand and reports errors in one place."""

from __future__ import annotations

import argparse
import sys

from heapsight import __version__
from heapsight.commands import attach, compare, env, lab, report, run
from heapsight.errors import HeapsightError

COMMANDS = {"run": run, "attach": attach, "compare": compare, "lab": lab, "report": report,
            "env": env}

DESCRIPTION = """\
heapsight tells you why a process's memory did not go back to the OS after free(),
and what would bring it back. It runs a program under a preload library and a /proc
sampler and splits its RSS into live bytes, rounding waste, allocator metadata, memory
freed but retained by the allocator, and non-heap memory.

start with:  heapsight run -- ./your_program args
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="heapsight", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-V", "--version", action="version", version=f"heapsight {__version__}")
    p.add_argument("--print-man", action="store_true",
                   help="print the man page (roff) and exit: heapsight --print-man > heapsight.1")
    try:   # shell completion: heapsight --print-completion bash > /etc/bash_completion.d/heapsight
        import shtab
        shtab.add_argument_to(p, ["--print-completion"], help="print a shell completion script "
                              "(bash, zsh, tcsh) and exit")
    except ImportError:
        pass
    sub = p.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name, mod in COMMANDS.items():
        doc = mod.__doc__ or ""
        sp = sub.add_parser(name, help=doc.splitlines()[0], description=doc,
                            usage=getattr(mod, "USAGE", None),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(sp)
        sp.set_defaults(module=mod)
    return p


def main(argv: list | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.print_man:
        from heapsight import manpage
        sys.stdout.write(manpage.render(parser, __version__))
        return 0
    if not getattr(args, "module", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.module.execute(args)
    except HeapsightError as e:
        print(f"heapsight: error: {e.message}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
