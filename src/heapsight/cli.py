"""Command line entry point: parses the subcommand and reports errors in one place."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import textwrap
import sys

from heapsight import __version__
from heapsight.errors import HeapsightError

# The commands in the order --help lists them; a command's module is imported (with numpy
# and the rest of what it needs) only when that command runs, so --version and --help
# answer at once.
COMMAND_NAMES = ("run", "attach", "compare", "lab", "report", "diff", "env", "demo")

DESCRIPTION = """\
heapsight tells you why a process's memory did not go back to the OS after free(),
and what would bring it back. It runs a program under a preload library and a /proc
sampler and splits its RSS into live bytes, rounding waste, allocator metadata, memory
freed but retained by the allocator, and non-heap memory.

start with:  heapsight run -- ./your_program args
"""


def _first_line(name: str) -> str:
    """A command's one-line help: its module docstring's first line, read from the source
    (the module itself is imported only when its command runs)."""
    path = os.path.join(os.path.dirname(__file__), "commands", name + ".py")
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(4096)
    except OSError:
        head = ""
    m = re.search(r'"""(.*)', head)
    return m.group(1).strip() if m else ""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Prose wrapped to the terminal's width; indented lines (examples, lists: commands to
    copy) kept as written."""

    def _fill_text(self, text, width, indent):
        out, para = [], []

        def flush():
            if para:
                out.append(textwrap.fill(" ".join(para), width, initial_indent=indent,
                                         subsequent_indent=indent))
                para.clear()
        for line in text.splitlines():
            if not line.strip():
                flush()
                out.append("")
            elif line.startswith((" ", "\t")):
                flush()
                out.append(indent + line)
            else:
                para.append(line.strip())
        flush()
        return "\n".join(out)


class _Completion(argparse.Action):
    """--print-completion SHELL: shtab, imported only when asked (it takes 25 ms)."""

    def __call__(self, parser, namespace, values, option_string=None):
        import shtab
        full = build_parser(full=True)
        _complete_values(full, shtab)
        try:
            sys.stdout.write(shtab.complete(full, shell=values) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:   # a reader that stopped early (| head) is not an error
            pass
        parser.exit(0)


def _complete_values(parser: argparse.ArgumentParser, shtab) -> None:
    """Values the shells complete beyond choices: the configurations (compare and lab's
    --configs, one name at a time) and the lab's experiments."""
    from heapsight import allocators, lab
    words = {"--configs": [p.name for p in allocators.PRESETS], "experiments": list(lab.NAMES)}
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for sp in sub.choices.values():
        for a in sp._actions:
            key = a.option_strings[0] if a.option_strings else a.dest
            if key in words:
                a.complete = shtab.cmd("printf '%s\\n' " + " ".join(words[key]))


def build_parser(full: bool = False, command: str | None = None) -> argparse.ArgumentParser:
    """The parser. Only the command named (or all of them when full: the man page, shell
    completion) is imported and given its options; with no command named, the others are
    listed by name and their one-line help (for --help)."""
    p = argparse.ArgumentParser(prog="heapsight", description=DESCRIPTION,
                                formatter_class=_Formatter)
    p.add_argument("-V", "--version", action="version", version=f"heapsight {__version__}")
    p.add_argument("--print-man", action="store_true",
                   help="print the man page (roff) and exit: heapsight --print-man > heapsight.1")
    p.add_argument("--print-completion", choices=("bash", "zsh", "tcsh", "fish"),
                   action=_Completion, metavar="SHELL",
                   help="print a completion script for SHELL (bash, zsh, tcsh or fish) and exit")
    sub = p.add_subparsers(dest="subcommand", metavar="COMMAND")
    for name in COMMAND_NAMES:
        if not full and command is not None and name != command:
            continue   # (their parsers only list them, in --help: a millisecond each)
        if not full and name != command:
            sub.add_parser(name, help=_first_line(name), add_help=False)
            continue
        mod = importlib.import_module(f"heapsight.commands.{name}")
        doc = mod.__doc__ or ""
        sp = sub.add_parser(name, help=doc.splitlines()[0], description=doc,
                            usage=getattr(mod, "USAGE", None),
                            formatter_class=_Formatter)
        mod.add_arguments(sp)
        sp.set_defaults(module=mod)
    return p


def _command_of(argv: list) -> str | None:
    """The command named on the command line: its first word that is not an option."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMAND_NAMES else None
    return None


class BestEffort:
    """heapsight's stderr: what cannot be written there (2>/dev/full, a pipe nobody reads,
    a closed fd 2) is dropped, so the exit code still says how the program ended."""

    def __init__(self, stream):
        self._stream = stream if stream is not None else open(os.devnull, "w")
        self._failed = False

    def write(self, text):
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            self._give_up()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except (OSError, ValueError):
            self._give_up()

    def _give_up(self):
        # what is left in the old stream's buffer would fail again at exit (exit code 120)
        self._stream = open(os.devnull, "w")
        self._failed = True

    def usable(self) -> bool:
        return not self._failed

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _finish_stdout() -> None:
    """Flushes stdout now: a failure here was reported already (or cannot be), and must
    not fail again at exit and change the exit code."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except (OSError, ValueError):
        sys.stdout = open(os.devnull, "w")


def main(argv: list | None = None) -> int:
    given = sys.stderr
    sys.stderr = errors = BestEffort(given)
    try:
        return _main(argv)
    finally:
        _finish_stdout()
        errors.flush()
        if sys.stderr is errors and errors.usable():   # else a stream that fails stays away
            sys.stderr = given


def _unknown_options(parser: argparse.ArgumentParser, args, extra: list) -> None:
    """An option the command does not have: say which, the one meant when one is close,
    and exit 2."""
    options = [o for a in parser._actions for o in a.option_strings]
    command = getattr(args, "subcommand", None)
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if command and sub is not None and command in sub.choices:
        options = [o for a in sub.choices[command]._actions for o in a.option_strings]
    for word in extra:
        if not word.startswith("-") or word == "--":
            continue
        import difflib
        name = word.split("=", 1)[0]
        close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
        where = f"heapsight {command}" if command else "heapsight"
        print(f"{where}: error: unknown option {name!r}"
              + (f": did you mean {close[0]}?" if close else "")
              + f" ({where} --help lists them)", file=sys.stderr)
        raise SystemExit(2)


def _main(argv: list | None) -> int:
    if (sys.argv[1:] if argv is None else argv) in (["-V"], ["--version"]):
        print(f"heapsight {__version__}")   # before the commands are imported
        return 0
    words = sys.argv[1:] if argv is None else argv
    first = words[0] if words and not words[0].startswith("-") else None
    if first is not None and first not in COMMAND_NAMES:
        import difflib
        close = difflib.get_close_matches(first, COMMAND_NAMES, n=1, cutoff=0.5)
        print(f"heapsight: error: unknown command {first!r}"
              + (f": did you mean `heapsight {close[0]}`?" if close else "")
              + f" (commands: {', '.join(COMMAND_NAMES)}; heapsight --help says what each does)",
              file=sys.stderr)
        return 2
    parser = build_parser(full="--print-man" in words, command=_command_of(words))
    args, extra = parser.parse_known_args(argv)
    if extra:
        _unknown_options(parser, args, extra)
        args = parser.parse_args(argv)   # anything else: argparse's own message
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
    except BrokenPipeError:   # a reader that stopped early (| head): not an error
        return 0
