"""Which image was measured, and the processes a program starts: an exec into an image
without the library gives /proc figures (never the old image's counters), and children
started by fork, vfork or posix_spawn are named with their peak RSS as not counted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from conftest import scenario

MiB = 1 << 20


def run(tmp_path, *command):
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "--no-save", "--json", str(out),
                        "--", *command], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text()), p.stderr


def test_an_exec_into_a_static_binary_is_said_and_not_counted_as_the_old_image(tmp_path):
    # GIVEN a script that allocates in its shell, then execs a static binary (after 0.3 s: on
    # a loaded machine the sampler's first reading of the image may come 10 ms late, after
    # an exec that soon)
    script = tmp_path / "wrap.sh"
    script.write_text(f"#!/bin/sh\nx=$(seq 1 20000)\nsleep 0.3\nexec {scenario('hs-static')}\n")
    script.chmod(0o755)
    s, err = run(tmp_path, str(script))
    # THEN the summary names the image and gives /proc figures, not the shell's counters
    assert s["preload"] == "not-attached" and s["heap"] is None
    assert "exec'd into" in s["preload_note"] and "hs-static" in s["preload_note"]
    assert [exe.rsplit("/", 1)[-1] for _, exe in s["images"]][-1] == "hs-static"
    assert len(s["images"]) == 2 and s["images"][1][0] > 0
    assert "NEVER FREED" not in s["verdict"] and "exec'd into" in err
    assert s["final"]["rss_bytes"] >= 10 * MiB   # hs-static touches 10 MiB


def test_children_that_ran_beside_it_are_named_with_their_peaks(tmp_path):
    # GIVEN a shell whose child (posix_spawn'd or forked and exec'd) holds 80 MiB
    s, err = run(tmp_path, "/bin/sh", "-c",
                 "/usr/bin/python3 -c 'import time; x = bytearray(80 << 20); time.sleep(0.8)'")
    kids = {c["name"]: c["peak_rss_bytes"] for c in s["children"]}
    assert kids.get("python3", 0) >= 80 * MiB, s["children"]
    assert "not counted" in s["preload_note"] and "python3" in err
    # the parent's own figures do not include the child's 80 MiB
    assert s["peak_rss_bytes"] < 40 * MiB


def test_only_the_process_that_samples_loads_the_unwinder_and_before_its_main(tmp_path):
    # GIVEN a run of sh that starts cat, with the loader saying what it loads (LD_DEBUG)
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "--no-save", "--",
                        "sh", "-c", "cat /proc/self/maps"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120, env=dict(os.environ, LD_DEBUG="files"))
    assert p.returncode == 0, p.stderr[-2000:]
    events = {}   # pid: what the loader did, in order
    for pid, what in re.findall(r"^\s*(\d+):\s*(.*)$", p.stderr, re.M):
        events.setdefault(pid, []).append(what)
    started = {what.split(": ", 1)[1]: pid for pid, whats in events.items() for what in whats
               if what.startswith("transferring control: ")}
    sh, cat = events[started["sh"]], events[started["cat"]]
    # THEN sh (the program, which samples) loaded libgcc_s, its unwinder, before its main
    loaded = [i for i, what in enumerate(sh) if what.startswith("calling init:") and "libgcc_s" in what]
    assert loaded and loaded[0] < sh.index("transferring control: sh")
    # AND cat (a process of the run that samples nothing) never loads it, nor maps it
    assert not any("libgcc_s" in what for what in cat)
    assert "libheapsight.so" in p.stdout and "libgcc_s" not in p.stdout
