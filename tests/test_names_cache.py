"""The symbolizer's answers are kept between runs ($XDG_CACHE_HOME/heapsight/names): a
second run of the same program names its call sites the same without asking the tool again
(libc's debug information alone is 90 ms of the tool's CPU), an object rebuilt at the same
path is asked again, so is one whose debug information came since (an answer without a file
and line is kept until then), and HEAPSIGHT_NAMES_CACHE=0 turns the cache off. The tool is a wrapper that logs what it is
asked and passes it to llvm-symbolizer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import compile_c

PROGRAM = r"""
#include <stdlib.h>
#include <string.h>
void *keep[20000];
__attribute__((noinline)) void FUNC(int n) {
  for (int i = 0; i < n; i++) { keep[i] = malloc(2000); memset(keep[i], 1, 2000); }
}
int main(void) { FUNC(20000); return 0; }
"""


@pytest.fixture
def setup(tmp_path):
    tool = shutil.which("llvm-symbolizer")
    assert tool, "llvm-symbolizer is installed by make setup"
    wrapper = tmp_path / "symbolizer"
    log = tmp_path / "asked"
    wrapper.write_text(f"#!/bin/sh\ntee -a {log} | {tool} \"$@\"\n")
    wrapper.chmod(0o755)
    return tmp_path, wrapper, log


def build(tmp_path, func: str):
    compile_c(tmp_path, "prog", PROGRAM.replace("FUNC", func), "-g")


def run(tmp_path, wrapper, log, **env) -> tuple:
    """(the run's frames' names, the lines the tool was asked)"""
    log.write_text("")
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "--no-save",
                        "--sample-bytes", "4K", "--json", str(out), "--", str(tmp_path / "prog")],
                       env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"),
                            "HEAPSIGHT_SYMBOLIZER": str(wrapper), **env},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    frames = json.loads(out.read_text())["sites"]["frames"]
    names = {(f["object"], f["address"]): (f["function"], f["file"], f["line"]) for f in frames}
    return names, log.read_text().splitlines()


def libc_lines(asked: list) -> list:
    return [a for a in asked if "/libc.so" in a]


def test_a_second_run_names_its_sites_the_same_without_asking_again(setup):
    tmp_path, wrapper, log = setup
    build(tmp_path, "fill_the_table")
    first, asked_first = run(tmp_path, wrapper, log)
    assert any(n[0] == "fill_the_table" and n[2] for n in first.values()), first
    assert libc_lines(asked_first), asked_first   # libc's debug information was read
    second, asked_second = run(tmp_path, wrapper, log)
    assert second == first
    # what the first run's answers said completely is not asked again: libc's (libc6-dbg)
    # and the program's own (-g); what is left is only what had no file and line
    assert not libc_lines(asked_second), asked_second
    assert not [a for a in asked_second if "prog " in a and a.split()[-1] in
                {addr for (obj, addr), n in first.items() if obj.endswith("/prog") and n[2]}]


def test_an_object_rebuilt_at_the_same_path_is_asked_again(setup):
    tmp_path, wrapper, log = setup
    build(tmp_path, "fill_the_table")
    first, _ = run(tmp_path, wrapper, log)
    assert any(n[0] == "fill_the_table" for n in first.values())
    os.unlink(tmp_path / "prog")   # a new file: another inode, even within the same tick
    build(tmp_path, "fill_another_table")
    second, asked = run(tmp_path, wrapper, log)
    assert any(n[0] == "fill_another_table" for n in second.values()), second
    assert not any(n[0] == "fill_the_table" for n in second.values()), second
    assert [a for a in asked if "prog " in a], asked


def test_the_cache_can_be_turned_off(setup):
    tmp_path, wrapper, log = setup
    build(tmp_path, "fill_the_table")
    first, _ = run(tmp_path, wrapper, log, HEAPSIGHT_NAMES_CACHE="0")
    second, asked = run(tmp_path, wrapper, log, HEAPSIGHT_NAMES_CACHE="0")
    assert second == first and libc_lines(asked), asked
    assert not (tmp_path / "cache" / "heapsight").exists()


def test_answers_without_debug_information_are_kept_until_it_comes(setup):
    # GIVEN a program whose debug information is split into a file of its own, which its
    # .gnu_debuglink names, and which is not installed yet (a stripped interpreter: python3,
    # perl without their -dbg packages)
    tmp_path, wrapper, log = setup
    build(tmp_path, "fill_the_table")
    prog, debug, aside = tmp_path / "prog", tmp_path / "prog.debug", tmp_path / "aside"
    subprocess.run(["objcopy", "--only-keep-debug", str(prog), str(debug)], check=True)
    subprocess.run(["strip", "--strip-debug", str(prog)], check=True)
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", str(prog)], check=True)
    aside.mkdir()
    debug.rename(aside / "prog.debug")
    # WHEN it runs twice
    first, asked_first = run(tmp_path, wrapper, log)
    ours = {k: n for k, n in first.items() if k[0].endswith("/prog")}
    assert any(n[0] == "fill_the_table" for n in ours.values()), first   # its symbols
    assert not any(n[2] for n in ours.values()), ours                     # no line
    assert [a for a in asked_first if "prog " in a], asked_first
    second, asked = run(tmp_path, wrapper, log)
    # THEN the second names it the same without asking the tool about it
    assert second == first
    assert not [a for a in asked if "prog " in a], asked
    # WHEN its debug information comes (installed beside it)
    (aside / "prog.debug").rename(debug)
    third, asked = run(tmp_path, wrapper, log)
    # THEN it is asked again, and its frames have their file and line
    assert [a for a in asked if "prog " in a], asked
    assert any(n[0] == "fill_the_table" and n[2] for k, n in third.items()
               if k[0].endswith("/prog")), third


def test_a_cache_folder_others_can_write_is_not_used(setup):
    # GIVEN a cache folder that another user could write names into (an XDG_CACHE_HOME
    # shared with others)
    tmp_path, wrapper, log = setup
    build(tmp_path, "fill_the_table")
    names = tmp_path / "cache" / "heapsight" / "names"
    names.mkdir(parents=True)
    names.chmod(0o777)
    # WHEN the program runs twice
    first, _ = run(tmp_path, wrapper, log)
    second, asked = run(tmp_path, wrapper, log)
    # THEN nothing was kept there, nor read: libc is asked again
    assert second == first and libc_lines(asked), asked
    assert not list(names.iterdir())


def test_a_fifo_planted_where_the_answers_go_blocks_nothing(setup):
    tmp_path, wrapper, log = setup
    build(tmp_path, "fill_the_table")
    first, asked = run(tmp_path, wrapper, log)   # (the folder is made, libc's file kept)
    libc = next(a.split()[0] for a in libc_lines(asked))
    from heapsight import symbolize
    os.environ["XDG_CACHE_HOME"], old = str(tmp_path / "cache"), os.environ["XDG_CACHE_HOME"]
    try:
        kept = symbolize._cache_file(str(wrapper), libc)
    finally:
        os.environ["XDG_CACHE_HOME"] = old
    os.unlink(kept)
    os.mkfifo(kept)
    second, asked = run(tmp_path, wrapper, log)   # (run() bounds it: 120 s)
    assert second == first and libc_lines(asked), asked
    assert os.path.exists(kept)


def test_a_fifo_in_an_objects_place_blocks_nothing(tmp_path):
    # GIVEN a FIFO where a library was (put there after the program mapped it): reading
    # where its debug information may be must not wait for a writer
    from heapsight import symbolize
    fifo = tmp_path / "libgone.so"
    os.mkfifo(fifo)
    # THEN it is no ELF file (its answers, if any, kept only when complete), at once
    assert symbolize._debug_sources(str(fifo)) is None
