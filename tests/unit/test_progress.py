"""The progress line (heapsight.progress): compare's, and attach --watch's live line."""

import io

from heapsight.progress import Progress


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_one_line_is_updated_in_place_and_cleared_at_the_end():
    out = Tty()
    p = Progress(out, "heapsight compare")
    p("[1/6] glibc (run 1 of 3)")
    p("[2/6] jemalloc (run 1 of 3)")
    assert "\n" not in out.getvalue()
    assert out.getvalue().count("\r\x1b[K") == 2 and out.getvalue().endswith("jemalloc (run 1 of 3)")
    p.done()
    assert out.getvalue().endswith("\r\x1b[K")


def test_elsewhere_each_step_is_a_line_of_its_own():
    out = io.StringIO()
    p = Progress(out, "heapsight compare")
    p("[1/2] glibc (run 1 of 1)")
    p("[2/2] jemalloc (run 1 of 1)")
    p.done()
    assert out.getvalue() == ("heapsight compare: [1/2] glibc (run 1 of 1)\n"
                              "heapsight compare: [2/2] jemalloc (run 1 of 1)\n")
    # and on a terminal where the program's own output is shown, lines too
    tty = Tty()
    q = Progress(tty, "heapsight compare", in_place=False)
    q("x")
    assert tty.getvalue() == "heapsight compare: x\n"


def test_a_live_line_is_shown_on_a_terminal_only():
    out = io.StringIO()
    p = Progress(out, "heapsight attach", elsewhere=False)
    p("12 s  RSS 1.0 MiB")
    assert out.getvalue() == ""
    tty = Tty()
    p = Progress(tty, "heapsight attach", elsewhere=False)
    p("12 s  RSS 1.0 MiB")
    assert tty.getvalue() == "\r\x1b[Kheapsight attach: 12 s  RSS 1.0 MiB"


WATCH = ("1234 s: RSS 123.4 MiB (peak 234.5 MiB); in use 100.0 MiB; 12345 samples, 3600 s "
         "left")


def test_a_line_wider_than_the_terminal_is_cut_in_place_and_wrapped_elsewhere(monkeypatch):
    # (a line that wraps on a terminal cannot be rewritten in place: each update would
    # leave a line behind)
    monkeypatch.setenv("COLUMNS", "80")
    tty = Tty()
    Progress(tty, "heapsight attach", elsewhere=False)(WATCH)
    line = tty.getvalue().removeprefix("\r\x1b[K")
    assert len(line) == 79 and line.endswith("\u2026") and line.startswith("heapsight attach: 1234 s")
    out = io.StringIO()
    Progress(out, "heapsight compare")("[3/4] python-malloc-jemalloc-eager (run 1 of 1, about "
                                       "2 s left)")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and all(len(x) <= 80 for x in lines), lines
    assert lines[1].startswith("  ") and "about 2 s left" in out.getvalue().replace("\n  ", " ")
