"""Memory the allocator never saw, named by whose it is: the library hooks mmap and counts
anonymous mappings by the object whose code asked for them (CPython's pymalloc, the JVM,
V8), checked on the runtimes installed here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

MiB = 1 << 20


def run(tmp_path, *command):
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "--no-save", "--json",
                        str(out), "--", *command], capture_output=True, text=True, cwd=tmp_path,
                       timeout=180)
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text())


def top(s) -> dict:
    assert s["mapped_by"], "nothing was mapped outside malloc"
    return s["mapped_by"][0]


def test_cpython_pymalloc_arenas_are_named_in_the_hold(tmp_path):
    s = run(tmp_path, "/usr/bin/python3", "-c",
            "import time\nl = [{'a': i} for i in range(400000)]\nkeep = l[::500]\ndel l\ntime.sleep(0.8)\n")
    owner = top(s)
    assert "pymalloc" in owner["owner"] and owner["peak_bytes"] > 60 * MiB
    assert owner["mappings"] >= 60            # 1 MiB arenas
    hold = next(f for f in s["findings"] if f["kind"] == "hold")
    assert "pymalloc" in hold["detail"] and "every object in it is gone" in hold["detail"]
    assert any(x.startswith("PYTHONMALLOC=malloc") for x in hold["suggestions"])


def test_the_mappings_stacks_name_the_code_that_needed_the_arenas(tmp_path):
    # GIVEN python3 building strings and dicts (pymalloc maps its 1 MiB arenas itself)
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "--no-save", "--json", str(out),
                        "--", "/usr/bin/python3", "-c",
                        "d = {}\nfor i in range(300000): d[i] = str(i) * 5\n"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=180,
                       env=dict(os.environ, COLUMNS="200"))
    assert p.returncode == 0, p.stderr
    s = json.loads(out.read_text())
    owner = top(s)
    m = {x["name"]: x for x in s["mapped_sites"]["moments"]}
    # THEN every mapping was recorded with its stack: the peak of the recorded mappings is
    # the owners table's peak, exactly, and the stacks add up to it
    peak = m["peak mapped"]
    assert peak["live_bytes"] == peak["estimated_bytes"] == owner["peak_bytes"]
    assert sum(x["bytes"] for x in peak["sites"]) == peak["estimated_bytes"]
    assert all(x["error_bytes"] == 0 for x in peak["sites"])   # recorded, not sampled
    assert m["exit"]["estimated_bytes"] == owner["mapped_bytes"]
    # AND the call site is the named code past pymalloc's unnamed arena functions: the
    # program's own line that needed the objects (its Python frame, where the interpreter's
    # frames are read: tests/test_interp_frames.py), else the interpreter's functions
    named = [x["site"] for x in peak["sites"] if x["site"].startswith("<module> (<string>:2)")
             or ("python3" in x["site"] and "+0x" not in x["site"])]
    assert named and sum(x["bytes"] for x in peak["sites"] if x["site"] in named) >= 0.9 * peak["estimated_bytes"]
    # AND the terminal names the largest under "mapped outside malloc"
    line = next(x for x in p.stderr.splitlines() if "mapped for (at" in x)
    assert peak["sites"][0]["site"] in line


@pytest.mark.skipif(shutil.which("java") is None, reason="no JVM here (Debian package openjdk-17-jre-headless)")
def test_the_jvm_heap_is_named(tmp_path):
    src = tmp_path / "Hold.java"
    src.write_text("public class Hold { public static void main(String[] a) throws Exception {"
                   " java.util.List<byte[]> l = new java.util.ArrayList<>();"
                   " for (int i = 0; i < 150; i++) l.add(new byte[1 << 20]);"
                   " Thread.sleep(300); System.out.println(l.size()); } }")
    s = run(tmp_path, "java", "-Xmx512m", str(src))
    jvm = next(o for o in s["mapped_by"] if "JVM" in o["owner"])
    assert jvm["peak_bytes"] > 150 * MiB
    # THEN what it uses is told from what it reserved: the 150 MiB of arrays still held at
    # exit are resident, within the other anonymous memory read at the same moment, and far
    # below the address space it mapped
    kinds = s["resident_by_kind"]
    assert jvm["resident_at_s"] == kinds["at_s"]
    assert 140 * MiB < jvm["resident_bytes"] <= kinds["anon"] + MiB
    assert jvm["resident_bytes"] < jvm["mapped_bytes"]


@pytest.mark.skipif(shutil.which("node") is None, reason="no Node.js here (Debian package nodejs)")
def test_the_v8_heap_is_named(tmp_path):
    s = run(tmp_path, "node", "-e", "const a = []; for (let i = 0; i < 1e6; i++) a.push({i});"
            "setTimeout(() => {}, 800);")
    assert any("V8" in o["owner"] and o["peak_bytes"] > 50 * MiB for o in s["mapped_by"])
    # THEN what is said of its memory is V8's: no advice to send objects to malloc
    words = " ".join(f["title"] + " " + f["detail"] + " ".join(f["suggestions"])
                     for f in s["findings"])
    assert "PYTHONMALLOC" not in words and "malloc makes it visible" not in words
    for f in s["findings"]:
        if f["kind"] in ("non-heap", "hold") and "outside malloc" in f["title"] + f["detail"]:
            assert "V8" in f["detail"], f
    # AND V8's heap kept live while it ran is not said to be held: whether it is live
    # objects or garbage cannot be told from outside
    (hold,) = [f for f in s["findings"] if f["kind"] == "hold"]
    assert "outside malloc" in hold["title"] and hold["word"] == "NON-HEAP WHILE RUNNING", hold
    assert "HELD" not in s["verdict"].split(":")[0], s["verdict"]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler here (Debian package gcc)")
def test_the_compilers_own_heap_is_named_with_its_rule(tmp_path):
    # GIVEN cc1 compiling a file big enough for its garbage-collected heap to grow (gcc
    # starts it: --follow cc1 measures the compiler proper)
    src = tmp_path / "big.c"
    src.write_text("".join(f"int f{i}(int x) {{ int a[64]; for (int j = 0; j < 64; j++) a[j] = x * j "
                           f"+ {i}; int s = 0; for (int j = 0; j < 64; j++) s += a[j] * a[(j * 7) % 64];"
                           " return s; }\n" for i in range(1500)))
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "--no-save", "--json",
                        str(out), "--follow", "cc1", "--", "gcc", "-O1", "-c", str(src), "-o",
                        os.devnull], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    s = json.loads(out.read_text())
    ggc = next(o for o in s["mapped_by"] if "ggc" in o["owner"])
    # THEN the memory it mapped is named, with its resident part, and the non-heap finding
    # names it and its own rule rather than thread stacks and pymalloc
    assert 0 < ggc["resident_bytes"] <= ggc["mapped_bytes"] + MiB
    f = next(f for f in s["findings"] if f["kind"] == "non-heap")
    assert "GCC's garbage-collected heap (ggc)" in f["detail"] and "ggc-min-expand" in f["detail"]
    assert "pymalloc" not in f["detail"] and "Thread stacks" not in f["detail"]


def test_perl_maps_nothing_of_its_own(tmp_path):
    # Debian's perl uses the system malloc: its memory is malloc's, not "mapped outside"
    s = run(tmp_path, "perl", "-e", "my @a = map { 'x' x 100 } 1 .. 200000;")
    assert sum(o["peak_bytes"] for o in s["mapped_by"]) < 4 * MiB
    assert s["heap"]["peak_live_requested_bytes"] > 20 * MiB


TRIMMED_HEAD = r"""
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
/* 600 pages of 16 KiB, each the rest of a 32 KiB mapping whose head was unmapped (half of
 * them their tail too), as Ruby's heap pages are made aligned: 9.4 MiB kept and written */
int main(void) {
  for (int i = 0; i < 600; i++) {
    char *p = mmap(NULL, 32768, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *kept = p + (i % 2 ? 8192 : 16384);
    munmap(p, (size_t)(kept - p));
    if (i % 2) munmap(kept + 16384, 8192);
    memset(kept, 1, 16384);
  }
  usleep(800000);
  return 0;
}
"""


def test_a_mapping_whose_head_is_unmapped_keeps_its_rest_named(tmp_path):
    from conftest import compile_c
    # GIVEN a program that maps twice what it needs and unmaps the unaligned head and tail
    # (Ruby's heap pages, PHP's chunks: Ruby's object heap read "did not come from malloc, no
    # object heapsight saw mapping memory accounts for it"),
    # started by another name (php is /usr/bin/php8.2: its pages read 0 B resident, the
    # name it was started by not meeting its file's)
    exe = compile_c(tmp_path, "trimmed_head", TRIMMED_HEAD)
    alias = tmp_path / "started-as"
    alias.symlink_to(exe)
    s = run(tmp_path, str(alias))
    owner = top(s)
    # THEN the rest of each mapping is still the program's, resident where the pages are
    assert owner["object"] == exe, owner
    assert owner["resident_bytes"] >= 8 * MiB and owner["mapped_bytes"] >= 9 * MiB, owner
    f = next((f for f in s["findings"] if f["kind"] == "non-heap"), None)
    assert f is None or "trimmed_head" in f["detail"], f
