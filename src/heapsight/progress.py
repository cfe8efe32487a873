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
        line = f"{self.prefix}: {msg}"
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()
            self.shown = True
        elif self.elsewhere:
            print(line, file=self.stream)

    def done(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False
