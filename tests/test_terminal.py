"""The terminal output: fits the width, colour only on a terminal and never under NO_COLOR."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys

from conftest import scenario

ESC = re.compile(r"\x1b\[")


def hs(args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "heapsight", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd,
                          env={**{k: v for k, v in os.environ.items()
                                  if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS")},
                               **(env or {})})


def in_a_terminal(args, env) -> str:
    """What the command writes to a terminal (a pty), as bytes decoded."""
    pid, fd = pty.fork()
    if pid == 0:
        os.environ.update(env)
        os.execv(sys.executable, [sys.executable, "-m", "heapsight", *args])
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    return out.decode(errors="replace")


def test_run_and_compare_fit_in_100_columns(tmp_path):
    prog = scenario("hs-retention")
    for args in (["run", "--no-save", prog],
                 ["compare", "--no-save", "--repeat", "2", "--spread", "--configs",
                  "glibc,glibc-arena2,tcmalloc-aggressive,mimalloc", prog]):
        p = hs(args, env={"COLUMNS": "100"}, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        long = [line for line in p.stderr.splitlines()
                if len(line) > 100 and "try:" not in line and not line.startswith("heapsight: /")]
        assert long == [], long
        assert not any(line != line.rstrip() for line in p.stderr.splitlines())  # no trailing spaces
    # compare: one row per configuration (names whole, nothing cut with an ellipsis)
    rows = [line for line in p.stderr.splitlines() if line.startswith(("glibc", "tcmalloc", "mimalloc"))]
    assert [r.split()[0] for r in rows] == ["glibc", "glibc-arena2", "tcmalloc-aggressive", "mimalloc"]
    assert "\u2026" not in p.stderr
    assert "\u00b1" in p.stderr   # --spread


def test_colour_only_on_a_terminal_and_never_under_no_color(tmp_path):
    args = ["run", "--no-save", "--", scenario("hs-leak"), "--mb", "2"]
    assert ESC.search(in_a_terminal(args, {"TERM": "xterm-256color"}))
    assert not ESC.search(in_a_terminal(args, {"TERM": "xterm-256color", "NO_COLOR": "1"}))
    p = hs(args, cwd=tmp_path)   # a pipe
    assert p.returncode == 0 and not ESC.search(p.stderr)


def test_a_perl_one_liner_at_80_columns_leads_with_the_verdict_and_fits(tmp_path):
    # GIVEN perl freeing a 300k-entry hash (glibc keeps what it freed), at 80 columns
    # (a one-liner longer than the width: the header shows it cut, as typed)
    p = hs(["run", "--no-save", "--", "perl", "-e",
            'my %h; $h{$_} = "x" x 200 for 1..300000; undef %h; select(undef, undef, undef, '
            '1.0); print STDERR "done\\n";'],
           env={"COLUMNS": "80"}, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    # THEN the verdict and its first command are on the first screen
    verdict = next(i for i, line in enumerate(lines) if "VERDICT" in line)
    assert verdict < 15, lines[:20]
    assert lines[verdict + 1].lstrip().startswith("try: ")
    # AND no line is wider than the terminal (a command's note goes below it) but a command
    # that holds the one-liner itself, kept whole on its line to be copied (the terminal
    # wraps it: the settings to run it with)
    wide = [line for line in lines if len(line) > 80]
    assert wide and all(line.lstrip().startswith("try: ") and "heapsight run -- perl -e" in line
                        for line in wide), wide
    header = next(line for line in lines if line.startswith("heapsight: perl"))
    assert header.startswith("heapsight: perl -e 'my %h; $h{$_} = \"x\" x 200") and \
        header.endswith("\u2026") and len(header) == 80, header


def test_attach_and_its_watch_fit_80_and_100_columns(tmp_path):
    # GIVEN a Python process holding 30 MB, half of it freed
    target = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; x = [bytearray(1000) for i in range(30000)]; "
                               "del x[::2]; print('ready', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        for width in (80, 100):
            env = {"COLUMNS": str(width)}
            once = hs(["attach", str(target.pid)], env=env, cwd=tmp_path)
            watch = hs(["attach", "--watch", "1", "-o", str(tmp_path / f"w{width}.hsrun.json.gz"),
                        str(target.pid)], env=env, cwd=tmp_path)
            # THEN both end well, and no line is wider than the terminal
            for p in (once, watch):
                assert p.returncode == 0, p.stderr
                text = p.stdout + p.stderr
                # (a path to copy is whole, on a line of its own)
                assert [x for x in text.splitlines()
                        if len(x) > width and not x.startswith(f"  {tmp_path}")] == [], (width, text)
            assert "VERDICT" in once.stdout + once.stderr
            assert "samples over" in watch.stderr
    finally:
        target.kill()
        target.wait()


def test_compare_fits_80_columns_with_a_long_configuration_name(tmp_path):
    p = hs(["compare", "--no-save", "--repeat", "1", "--configs",
            "glibc,python-malloc-jemalloc-eager", "--", sys.executable, "-c",
            "d = [{'k': i} for i in range(50000)]; del d[::2]"], env={"COLUMNS": "80"},
           cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    # (a command to try is one line to copy whatever its length, as in run's summary: when
    # this run's figures make compare recommend a configuration, its command is longer)
    assert [x for x in p.stderr.splitlines()
            if len(x) > 80 and not x.lstrip().startswith("try: ")] == []
    # the long name whole, on its row
    assert any(x.startswith("python-malloc-jemalloc-eager ") for x in p.stderr.splitlines())


def test_a_findings_long_title_wraps_under_its_first_word(monkeypatch):
    # GIVEN a stored run whose finding has a title longer than the width (xz -T2's "kept until
    # exit ... never touched: address space, not RSS" was 104 characters)
    import dataclasses
    import io
    from pathlib import Path

    from heapsight import capture, record
    from heapsight.reporters import terminal
    doc = record.load(str(Path(__file__).parent / "data" / "captures" / "leak-v6.hsrun.json.gz"))
    s = capture.rederive(doc)
    title = "282.2 MiB kept until exit, still reachable (111.4 MiB of it never touched: " \
            "address space, not RSS)"
    s = dataclasses.replace(s, findings=(dataclasses.replace(s.findings[0], title=title),))
    monkeypatch.setenv("COLUMNS", "60")
    out = io.StringIO()
    terminal.render_run(s, out)
    lines = out.getvalue().splitlines()
    # THEN it is on lines of the width, each after the first under the title's first word
    first = next(i for i, line in enumerate(lines) if line.startswith("  * 282.2 MiB"))
    rest = lines[first + 1:first + 1 + 2]
    assert all(len(line) <= 60 for line in lines[first:first + 3]), lines[first:first + 3]
    assert " ".join(x.strip() for x in [lines[first][4:], *rest]).startswith(title), rest
    assert all(line.startswith("    ") for line in rest), rest


def test_a_table_that_fits_is_drawn_as_rich_draws_it():
    # GIVEN a table as the moment table is made (a two-line header and an empty one, a
    # column styled dim, rows styled bold and dim, cells of unequal widths), drawn line by
    # line where it fits, and by rich's Table
    import io
    from rich.console import Console
    from heapsight.reporters import terminal as T
    g = T._Grid()
    g.add_column("")
    g.add_column("peak RSS*\n1.25 s", justify="right")
    g.add_column("", justify="right", style="dim")
    g.add_column("exit\n2.00 s", justify="right")
    g.add_row("RSS", "87.5 MiB", "", "9.0 MiB", style="bold")
    g.add_row("  live (requested, not freed)", "2.8 MiB", "3%", "398.7 KiB")
    g.add_row("      of it CPython objects, at least", "-", "", "12 B", style="dim")
    # and one as the call sites' table is made: no header, widths at least, a site of two
    # lines (the second dim), the site's column at most so wide
    sites = T._Grid(show_header=False)
    sites.add_column("bytes", justify="right", min_width=9)
    sites.add_column("error", justify="right", style="dim", min_width=8)
    sites.add_column("share", justify="right", min_width=4)
    sites.add_column("site", max_width=50)
    sites.add_row("29.4 MiB", "\u00b11.6 MiB", "42%",
                  T.site_text("main (m.cc:6)" + T.CALLED_VIA + "std::_Rb_tree::_M_get_node (m)"))
    sites.add_row("1.2 KiB", "\u00b116.0 KiB", "1%", T.site_text("x" * 40))
    for g, width, color in ((g, 100, None), (g, 100, "standard"), (g, g.width() + 2, None),
                            (g, 30, None), (sites, 100, None), (sites, 100, "standard"),
                            (sites, 60, None)):   # (at 60 it does not fit: rich's)
        outs = []
        for draw in (lambda c: T._draw(c, g, 2),
                     lambda c: T._print(c, T.Padding(g.table(), (0, 0, 0, 2), expand=False))):
            buf = io.StringIO()
            c = Console(file=buf, width=width, highlight=False, soft_wrap=False, emoji=False,
                        color_system=color, force_terminal=color is not None)
            draw(c)
            outs.append(buf.getvalue())
        assert outs[0].strip(), (width, color)
        # THEN the text is the same (in colour too, once the escapes are left out: the
        # lines' styles are the columns' and the rows'), and in colour it has escapes
        plain = [re.sub(r"\x1b\[[0-9;]*m", "", o) for o in outs]
        assert [line.rstrip() for line in plain[0].splitlines()] == \
            [line.rstrip() for line in plain[1].splitlines()], (width, color, outs)
        assert (ESC.search(outs[0]) is not None) == (color is not None)
        if color is None:
            assert outs[0] == outs[1], (width, outs)
