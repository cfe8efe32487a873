"""The command line documents itself: a man page made from the parser, shell completion,
help that agrees with the README."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HS = [sys.executable, "-m", "heapsight"]
README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def out(*args) -> str:
    p = subprocess.run([*HS, *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_the_man_page_has_every_command_and_renders_cleanly(tmp_path):
    page = out("--print-man")
    assert page.startswith(".TH HEAPSIGHT 1")
    for cmd in ("run", "attach", "compare", "lab", "report"):
        assert f".SS heapsight {cmd}" in page
    assert "fail\\-if\\-retained" in page   # options are there, escaped for roff
    if shutil.which("man") is None:
        pytest.skip("man is not installed (Debian package man-db): the page was not rendered")
    (tmp_path / "heapsight.1").write_text(page)
    p = subprocess.run(["man", "--warnings", "-l", str(tmp_path / "heapsight.1")],
                       capture_output=True, text=True, timeout=60, env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and "heapsight attach" in p.stdout
    assert "warning" not in p.stderr.lower(), p.stderr


def test_shell_completion_knows_the_commands():
    script = out("--print-completion", "bash")
    for cmd in ("run", "attach", "compare", "lab", "report"):
        assert re.search(rf"\b{cmd}\b", script)


def test_lab_help_and_readme_agree_on_the_quick_labs_time():
    helptext = out("lab", "--help")
    assert "about 1 minute" in helptext and "about 1 minute" in README
    # and with the estimate the lab prints as it starts, within 20% (bench/lab-time holds
    # that estimate against the time the lab really takes)
    from heapsight import lab
    quick = sum(lab.experiment(n).QUICK_SECONDS for n in lab.NAMES)
    assert abs(quick - 60) <= 0.2 * 60, quick
    assert f"about {quick} s in all" in README


def test_every_help_and_list_fits_80_columns():
    # GIVEN an 80-column terminal: prose is wrapped to it, and the examples are written to fit
    env = dict(os.environ, COLUMNS="80")
    for words in ([], ["run"], ["attach"], ["compare"], ["lab"], ["report"], ["diff"], ["env"],
                  ["demo"], ["compare", "--list"], ["lab", "--list"]):
        args = words if "--list" in words else [*words, "--help"]
        p = subprocess.run([sys.executable, "-m", "heapsight", *args],
                           capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        wide = [line for line in p.stdout.splitlines() if len(line) > 80]
        assert not wide, (words, wide)
        if words == ["compare", "--list"]:   # a name never runs into its description
            from heapsight.allocators import PRESETS
            firsts = [line.split()[0] for line in p.stdout.splitlines() if line[:1] != " "]
            assert firsts == [c.name for c in PRESETS], p.stdout


def test_completion_offers_configurations_and_experiments_in_bash_and_fish(tmp_path):
    # GIVEN the bash script, asked as bash asks it while typing
    script = tmp_path / "c.bash"
    script.write_text(out("--print-completion", "bash"))

    def bash_complete(line: str) -> list:
        words = line.split(" ")
        probe = (f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
                 f"COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; "
                 f"_shtab_heapsight heapsight {words[-1]} {words[-2]}; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        p = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        return sorted(p.stdout.split())
    # THEN the configurations' names and the lab's experiments complete
    assert bash_complete("heapsight compare --configs jem") == ["jemalloc", "jemalloc-bg",
                                                                "jemalloc-eager"]
    assert bash_complete("heapsight lab --configs python-") == ["python-malloc",
                                                               "python-malloc-jemalloc-eager"]
    assert bash_complete("heapsight lab re") == ["release", "remedies"]
    # AND fish gets a script with the same names (fish itself is not installed here: its
    # syntax is shtab's)
    fish = out("--print-completion", "fish")
    assert "complete -c heapsight" in fish and "python-malloc-jemalloc-eager" in fish


def test_the_man_page_names_the_environment():
    page = out("--print-man")
    env = page.split(".SH ENVIRONMENT", 1)[1].split(".SH EXIT STATUS", 1)[0]
    for name in ("HEAPSIGHT_SAMPLE_BYTES", "HEAPSIGHT_SYMBOLIZER", "HEAPSIGHT_CHROMIUM",
                 "NO_COLOR", "MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "MALLOC_CONF", "PYTHONMALLOC"):
        assert name in env, name
    # every allocator variable a configuration sets is explained there
    from heapsight.allocators import PRESETS
    for c in PRESETS:
        for var in c.env:
            assert var in env, (c.name, var)
