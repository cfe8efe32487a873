"""CPython's objects in use, read from outside in pymalloc's pools (native/src/pools.c), and
what the hold rule does with them: a script that keeps its objects is not holding memory;
one that dropped them while its arenas stayed is."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np

from heapsight import analysis
from heapsight.fmt import human
from heapsight.live import procfs, readloop
from heapsight.live.segment import open_pagemap

MiB = 1 << 20
PYTHON = "/usr/bin/python3"   # Debian's CPython 3.11 (pymalloc, 16 KiB pools)
# builds objects, prints CPython's own count of pymalloc's blocks in use, then waits
KEEPS = ("import sys, time\nxs = [{'a': i, 'b': str(i)} for i in range(300000)]\n"
         "keep = xs[::{step}]\n{drop}\nsys._debugmallocstats()\nsys.stderr.flush()\n"
         "time.sleep(30)\n")


def pools_of(script: str) -> tuple:
    """(heapsight's reading of the pools, CPython's bytes in allocated blocks) of a script
    waiting after it printed its own statistics."""
    p = subprocess.Popen([PYTHON, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        err, deadline = "", time.monotonic() + 60
        while "# bytes in allocated blocks" not in err:
            assert time.monotonic() < deadline and p.poll() is None, err
            err += p.stderr.readline()
        # the statistics end with their total line: read through it
        while not re.search(r"^Total\s*=", err, re.M):
            err += p.stderr.readline()
        anon = [(m.start, m.end) for m in procfs.smaps(p.pid) if m.kind in ("anon", "arena")]
        fd = open_pagemap(p.pid)
        got = readloop.read_pools(p.pid, fd, anon)
    finally:
        p.kill()
        p.wait()
    truth = int(re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", err).group(1).replace(",", ""))
    return got, truth


def test_the_objects_in_use_are_cpythons_own_count():
    # GIVEN a script holding 300k dicts, and one that kept 1 in 500 of them
    for step, drop in ((1, ""), (500, "del xs")):
        got, truth = pools_of(KEEPS.replace("{step}", str(step)).replace("{drop}", drop))
        objects, pooled, pools = got
        # THEN the pools' headers give CPython's own figure (the script is waiting: exact)
        assert objects == truth, (got, truth)
        assert pools > 0 and pooled >= objects
    # and after the drop the pools are mostly free space
    assert pooled > 20 * objects


def run_json(tmp_path, script):
    """The run's summary (--json) and what the terminal showed of it."""
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "--no-save", "--json",
                        str(out), "--", PYTHON, "-c", script], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120, env={**os.environ, "COLUMNS": "100"})
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text()), p.stdout + p.stderr


def test_a_script_that_keeps_its_objects_holds_nothing(tmp_path):
    # GIVEN a script that builds 700k dicts (200 MiB of pymalloc's arenas) and keeps them
    s, shown = run_json(tmp_path, "import time\nxs = [{'a': i, 'b': str(i)} for i in range(700000)]\n"
                                  "time.sleep(2.0)\n")
    # THEN its arenas were objects in use: no hold, and the verdict does not say one
    assert s["peak_rss_bytes"] > 150 * MiB
    assert s["holds"] == [], s["holds"]
    assert not s["verdict"].startswith("HELD"), s["verdict"]
    # AND the moment it sat at shows them (at least, between two readings of the pools):
    # most of its other anonymous memory, and never more than it
    (held,) = [m["breakdown"] for m in s["moments"] if m["name"] == "held"]
    assert 0.8 * held["other_anon_bytes"] <= held["objects_bytes"] <= held["other_anon_bytes"]
    # the terminal's table has them under non-heap, in the held moment's column
    (row,) = [line for line in shown.splitlines() if "of it CPython objects, at least" in line]
    assert human(held["objects_bytes"]) in row, row
    # the end, after the last reading: not known (a script may drop its objects as its work
    # ends); the exit, from the copy at exit, after CPython's teardown freed them: few
    (end,) = [m["breakdown"] for m in s["moments"] if m["name"] == "end"]
    (at_exit,) = [m["breakdown"] for m in s["moments"] if m["name"] == "exit"]
    assert end["objects_bytes"] is None
    assert at_exit["objects_bytes"] is not None and at_exit["objects_bytes"] < 8 * MiB


def test_the_exit_copy_reads_the_pools_after_cpythons_teardown(tmp_path):
    # GIVEN a script that imports a few hundred modules (their objects live in pymalloc's
    # arenas) and exits: CPython's teardown frees most of its objects, and keeps each arena
    # an object still lives in
    s, _ = run_json(tmp_path, "import pydoc, email.parser, http.client, xml.dom.minidom, "
                              "argparse, unittest, asyncio, json, decimal, sqlite3\n")
    (exit_map,) = [m for m in s["heapmaps"] if m["moment"] == "exit"]
    objects, pools = exit_map["py_objects_bytes"], exit_map["py_pool_bytes"]
    # THEN the copy at exit read the pools: free space mostly, a few objects
    assert pools is not None and pools >= 4 * MiB and 0 < objects < pools / 2, exit_map
    (at_exit,) = [m["breakdown"] for m in s["moments"] if m["name"] == "exit"]
    assert at_exit["objects_bytes"] == min(objects, at_exit["other_anon_bytes"])
    # AND what the teardown left in pymalloc's arenas is no finding: the verdict says it
    assert not any(f["kind"] == "non-heap" for f in s["findings"]), s["findings"]
    free = human(pools - objects)
    assert f"pymalloc kept {free} free in its arenas after CPython's teardown" in s["verdict"], \
        (s["verdict"], free)


def test_the_rule_takes_the_larger_of_the_free_space_around_each_sample():
    t = np.arange(10) / 10.0
    other = np.full(10, 100.0)
    # readings at 0.2 s (90 of 100 objects) and at 0.6 s (10: a drop between them)
    objects = analysis.pool_objects(t, other, [(0.2, 90, 100), (0.6, 10, 100)])
    # before the first reading nothing is known; between the two the drop counts from the
    # first (free space 90 from 0.2 s); after the last it stays
    assert list(objects) == [0, 0, 10, 10, 10, 10, 10, 10, 10, 10]
    # growth between two readings is objects (free space 0 at both)
    grow = np.linspace(10, 100, 10)
    objects = analysis.pool_objects(t, grow, [(0.0, 10, 10), (0.9, 100, 100)])
    assert np.allclose(objects, grow)
    # a reading after the end (the teardown's) is not used; none at all: not known
    assert analysis.pool_objects(t, other, [(0.95, 0, 100)], end_s=0.9) is None


def attached(script: str, tmp_path) -> tuple:
    """(heapsight attach's --json, CPython's bytes in allocated blocks, what the terminal
    showed) of a script waiting after it printed its own statistics."""
    p = subprocess.Popen([PYTHON, "-c", script], stderr=subprocess.PIPE, text=True)
    out = tmp_path / "a.json"
    try:
        err, deadline = "", time.monotonic() + 60
        while not re.search(r"^Total\s*=", err, re.M):
            assert time.monotonic() < deadline and p.poll() is None, err
            err += p.stderr.readline()
        r = subprocess.run([sys.executable, "-m", "heapsight", "attach", "--json", str(out),
                            str(p.pid)], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "COLUMNS": "100"})
        assert r.returncode == 0, r.stderr
    finally:
        p.kill()
        p.wait()
    truth = int(re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", err).group(1).replace(",", ""))
    return json.loads(out.read_text()), truth, r.stdout + r.stderr


def test_attach_reads_the_objects_in_use_in_a_running_process(tmp_path):
    # GIVEN a running script holding 300k dicts (60 MiB of pymalloc's arenas)
    a, truth, shown = attached(KEEPS.replace("{step}", "1").replace("{drop}", ""), tmp_path)
    # THEN attach reads CPython's own count from outside, and the process is healthy (it
    # read "NON-HEAP MEMORY: 83.6 MiB of anonymous memory the allocator did not give")
    assert a["py_objects_bytes"] == truth, (a["py_objects_bytes"], truth)
    assert a["verdict"].startswith("healthy"), a["verdict"]
    assert f"{human(truth)} of CPython's objects in pymalloc's pools" in a["verdict"], a["verdict"]
    # the table's row under other anonymous memory says the same
    (row,) = [x for x in shown.splitlines() if "of it CPython objects (pymalloc's pools)" in x]
    assert human(truth) in row, row
    # AND one that kept 1 in 500 of them: pymalloc's free space is named, with its size
    a, truth, _ = attached(KEEPS.replace("{step}", "500").replace("{drop}", "del xs"), tmp_path)
    assert a["py_objects_bytes"] == truth
    assert a["verdict"].startswith("NON-HEAP MEMORY"), a["verdict"]
    free = a["py_pool_bytes"] - a["py_objects_bytes"]
    assert free > 20 * truth, a
    assert f"{human(min(free, a['non_heap']['other anonymous'] - truth))} of it free in " \
        "pymalloc's arenas" in a["verdict"], a["verdict"]


TRIMMED = """
import ctypes, sys, time
keep, objs = [], []
for i in range(100000):
    objs.append(bytes(1000))
    if i % 100 == 0:
        keep.append(bytes(1000))
del objs
ctypes.CDLL("libc.so.6").malloc_trim(0)
sys._debugmallocstats()
time.sleep(60)
"""


def test_attach_offers_no_release_where_a_release_gives_back_little(tmp_path):
    # GIVEN a running script that kept 1 in 100 of its 1000-byte objects and trimmed its
    # heap itself: 3 KiB free beside each one kept, on every page
    a, _, shown = attached(TRIMMED, tmp_path)
    # THEN it is fragmentation, and the verdict says why a release gives back little rather
    # than offer one (it read "heapsight attach PID --trim makes it": 0 B)
    assert a["verdict"].startswith("FRAGMENTATION: "), a["verdict"]
    assert "--trim" not in a["verdict"], a["verdict"]
    assert "(live blocks share the pages of the rest)" in a["verdict"], a["verdict"]
