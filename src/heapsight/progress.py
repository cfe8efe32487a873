"""A progress line: one line updated in place on a terminal; elsewhere (a log, a pipe) a
line per step, or none at all for a live figure that changes every second."""

from __future__ import annotations


class Progress:
    def __init__(self, stream, prefix: str, in_place: bool = True, elsewhere: bool = True):
        """prefix: the command's name ("heapsight compare"); elsewhere: whether a stream that
        is not a terminal gets a line per step."""
        self.stream, self.prefix, self.elsewhere = stream, prefix, elsewhere
        try:
            self.tty = in_place and stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self.shown = False

    def __call__(self, msg: str) -> None:
        """msg as the line, within the terminal's width (COLUMNS first): cut on a terminal
        (a line that wrapped could not be rewritten in place), wrapped elsewhere."""
        import shutil
        import textwrap
        from heapsight.fmt import clip
        line = f"{self.prefix}: {msg}"
        width = shutil.get_terminal_size((80, 24)).columns
        if self.tty:
            self.stream.write("\r\x1b[K" + clip(line, width - 1))
            self.stream.flush()
            self.shown = True
        elif self.elsewhere:
            print(textwrap.fill(line, width, subsequent_indent="  ", break_long_words=False,
                                break_on_hyphens=False), file=self.stream)

    def done(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def say(msg: str, stream) -> None:
    """A one-off notice ("heapsight: ..."), wrapped to the terminal's width (COLUMNS first)."""
    import shutil
    import textwrap
    width = shutil.get_terminal_size((80, 24)).columns
    print(textwrap.fill(f"heapsight: {msg}", width, subsequent_indent="  ",
                        break_long_words=False, break_on_hyphens=False), file=stream)
