"""Names for sampled addresses (heapsight.symbolize): function and file:line where there is
debug info, the function where a stripped binary exports it, object+offset otherwise, and
never a wrong name; a missing tool only loses the names."""

from __future__ import annotations

import random
import re
import subprocess
import time
from pathlib import Path

import pytest

from heapsight import symbolize

ROOT = Path(__file__).resolve().parents[1]
SITES_C = ROOT / "scenarios" / "sites.c"
FUNCTIONS = ("load_rows", "build_index", "keep_cache", "leak_names")
PYTHON = Path("/usr/bin/python3.11")


@pytest.fixture(scope="module")
def sites_g(tmp_path_factory):
    """hs-sites with its debug info: built here with the scenarios' flags (-O2 -g), as the
    installed copy is stripped."""
    out = tmp_path_factory.mktemp("g") / "hs-sites"
    subprocess.run(["cc", "-O2", "-g", "-Wall", "-Wextra", "-I", str(ROOT / "scenarios"),
                    "-o", str(out), str(SITES_C)], check=True, timeout=120)
    return out


def malloc_returns(binary: Path) -> dict:
    """Per function: the return address of its call to malloc, read from the disassembly."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(binary)], check=True,
                          capture_output=True, text=True, timeout=60).stdout
    out, fn, call = {}, None, False
    for line in text.splitlines():
        m = re.match(r"^[0-9a-f]+ <(\w+)>:", line)
        if m:
            fn, call = m.group(1), False
            continue
        m = re.match(r"^\s+([0-9a-f]+):", line)
        if m and call:
            out.setdefault(fn, int(m.group(1), 16))   # the instruction after the call
            call = False
        if "call" in line and "<malloc@plt>" in line:
            call = True
    return out


def source_line(needle: str) -> int:
    return next(i for i, text in enumerate(SITES_C.read_text().splitlines(), 1) if needle in text)


def test_a_call_site_in_a_binary_with_debug_info_is_function_file_and_line(sites_g):
    # GIVEN the return address of each function's call to malloc (as a stack holds it)
    returns = malloc_returns(sites_g)
    assert set(FUNCTIONS) <= returns.keys(), returns
    # WHEN the byte before each is looked up
    found = symbolize.symbolize([(str(sites_g), returns[f] - 1) for f in FUNCTIONS])
    assert found.tool == "llvm-symbolizer" and not found.note
    # THEN each is its function, in sites.c, at the line of its allocation
    needles = {"load_rows": "ALLOC_MIXED(&rows", "build_index": "ALLOC_MIXED(&index_",
               "keep_cache": "ALLOC_MIXED(&cache", "leak_names": "ALLOC_MIXED(&names"}
    for f in FUNCTIONS:
        frame = found.frames[(str(sites_g), returns[f] - 1)][-1]
        assert (frame.function, Path(frame.file).name, frame.line) == (f, "sites.c", source_line(needles[f]))
        assert frame.name() == f"{f} (sites.c:{source_line(needles[f])})"


def test_inlined_code_is_a_frame_of_its_own_innermost_first(sites_g):
    # GIVEN main, into which -O2 inlines hs_parse (scenario.h): an address inside the
    # inlined option parsing
    syms = subprocess.run(["nm", "-S", "--defined-only", str(sites_g)], capture_output=True,
                          text=True, check=True).stdout
    start, size = next((int(a, 16), int(s, 16)) for a, s, _, name in
                       (line.split() for line in syms.splitlines() if len(line.split()) == 4)
                       if name == "main")
    addrs = [(str(sites_g), a) for a in range(start, start + size)]
    found = symbolize.symbolize(addrs)
    chains = [found.frames[k] for k in addrs]
    # THEN some addresses give a chain that ends in main, with hs_parse inside it
    inlined = [c for c in chains if len(c) > 1 and c[-1].function == "main"]
    assert inlined, "no inlined frame reported in main"
    assert any(f.function == "hs_parse" and Path(f.file).name == "scenario.h"
               for c in inlined for f in c[:-1])


def _exported(binary: Path) -> list:
    """(start, size, name) of the functions a stripped binary exports (.dynsym)."""
    out = []
    text = subprocess.run(["nm", "-D", "-S", "--defined-only", str(binary)], capture_output=True,
                          text=True, check=True).stdout
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "TtWi":
            out.append((int(parts[0], 16), int(parts[1], 16), parts[3]))
    return out


def _has_separate_debug_info(binary: Path) -> bool:
    notes = subprocess.run(["readelf", "-n", str(binary)], capture_output=True, text=True).stdout
    m = re.search(r"Build ID: ([0-9a-f]{2})([0-9a-f]+)", notes)
    return bool(m) and Path(f"/usr/lib/debug/.build-id/{m.group(1)}/{m.group(2)}.debug").exists()


def test_a_stripped_debian_binary_gives_its_exported_functions_and_never_a_wrong_name():
    if not PYTHON.exists():
        pytest.skip(f"{PYTHON} is not installed (Debian package python3.11-minimal)")
    if _has_separate_debug_info(PYTHON):
        pytest.skip(f"{PYTHON}'s debug info is installed (python3.11-dbg): it is not stripped "
                    "for the symbolizer, so the unexported functions would be named rightly")
    funcs = sorted(_exported(PYTHON))
    names_at = {}
    for start, size, name in funcs:
        names_at.setdefault(start, set()).add(name)
    rng = random.Random(12)
    # GIVEN addresses inside exported functions, and addresses past a function's end in
    # the gap before the next one (static code no exported symbol covers)
    inside = [(s + rng.randrange(1, size), s) for s, size, _ in rng.sample(funcs, 300) if size > 1]
    gaps = []
    for (s, size, _), (nxt, _, _) in zip(funcs, funcs[1:]):
        if nxt - (s + size) > 64:
            gaps.append(s + size + rng.randrange(16, nxt - s - size - 16))
    gaps = rng.sample(gaps, min(300, len(gaps)))
    assert len(gaps) > 50
    found = symbolize.symbolize([(str(PYTHON), a) for a, _ in inside] + [(str(PYTHON), a) for a in gaps])
    # THEN inside a function: that function; in a gap: no function, shown as object+offset
    for a, start in inside:
        frame = found.frames[(str(PYTHON), a)][-1]
        assert frame.function in names_at[start], (hex(a), frame)
    for a in gaps:
        frame = found.frames[(str(PYTHON), a)][-1]
        assert frame.function is None, (hex(a), frame)
        assert frame.name() == f"python3.11+{a:#x}"


def test_without_the_tool_every_frame_is_object_plus_offset_with_a_note(monkeypatch, sites_g):
    monkeypatch.setenv("HEAPSIGHT_SYMBOLIZER", "")
    found = symbolize.symbolize([(str(sites_g), 0x1234), ("/no/such/lib.so", 0x10)])
    assert found.tool == "none" and "llvm-symbolizer not found" in found.note
    assert found.frames[(str(sites_g), 0x1234)][0].name() == "hs-sites+0x1234"
    # a tool that fails is the same: names lost, the run goes on
    monkeypatch.setenv("HEAPSIGHT_SYMBOLIZER", "/bin/false")
    found = symbolize.symbolize([(str(sites_g), 0x1234)])
    assert found.tool == "none" and "failed" in found.note
    assert found.frames[(str(sites_g), 0x1234)][0].function is None


def test_objects_that_are_gone_or_oddly_named_keep_their_offsets(tmp_path, sites_g):
    spaced = tmp_path / "with space" / "hs sites"
    spaced.parent.mkdir()
    spaced.write_bytes(Path(sites_g).read_bytes())
    ret = malloc_returns(sites_g)["load_rows"] - 1
    found = symbolize.symbolize([(str(spaced), ret), ("/gone/libx.so", 0x40), ('/a"b', 0x40)])
    assert found.frames[(str(spaced), ret)][-1].function == "load_rows"
    assert found.frames[("/gone/libx.so", 0x40)][0].name() == "libx.so+0x40"
    assert found.frames[('/a"b', 0x40)][0].function is None


def test_thousands_of_frames_take_well_under_a_second():
    if not PYTHON.exists():
        pytest.skip(f"{PYTHON} is not installed")
    rng = random.Random(3)
    addrs = []
    # GIVEN 3,400 addresses in three objects, one with debug info (libc, libc6-dbg)
    for obj, n in ((PYTHON, 1400), (Path("/usr/bin/perl"), 1000),
                   (Path("/lib/x86_64-linux-gnu/libc.so.6"), 1000)):
        funcs = [f for f in _exported(obj) if f[1] > 1]
        addrs += [(str(obj), s + rng.randrange(1, size)) for s, size, _ in rng.sample(funcs, n)]
    t = time.monotonic()
    found = symbolize.symbolize(addrs)
    took = time.monotonic() - t
    assert found.tool == "llvm-symbolizer"
    named = sum(1 for k in addrs if found.frames[k][-1].function)
    assert named == len(addrs)
    # measured 0.13-0.2 s for this on a quiet machine, 0.5-1.3 s on a slow day of this VM and
    # 1.58 s beside a full suite's other worker; a process per address (what this guards
    # against) would take 10 s or more
    assert took < 3.0, f"{len(addrs)} addresses took {took:.2f} s"


def test_addresses_sent_ahead_are_answered_once_and_the_same(sites_g, monkeypatch):
    # GIVEN the four call sites sent ahead (as a run sends them while its program runs;
    # the names cache off: the tests before kept their answers, and this is the session's)
    monkeypatch.setenv("HEAPSIGHT_NAMES_CACHE", "0")
    symbolize._close_all()
    returns = malloc_returns(sites_g)
    keys = [(str(sites_g), returns[f] - 1) for f in FUNCTIONS]
    symbolize.prefetch(keys)
    session = symbolize._SESSIONS[symbolize.find_tool()]
    # WHEN they are asked for at the end, with them again and a new one
    more = keys + keys[:1] + [(str(sites_g), returns["main"] - 1 if "main" in returns else 0x1234)]
    found = symbolize.symbolize(more)
    # THEN the session was the same, each address was sent once, and the names are the
    # ones a fresh session gives
    assert symbolize._SESSIONS[symbolize.find_tool()] is session
    assert len(session.sent) == len(set(more))
    symbolize._close_all()
    fresh = symbolize.symbolize(more)
    assert found.frames == fresh.frames
    assert [found.frames[k][-1].function for k in keys] == list(FUNCTIONS)


def test_an_object_rebuilt_at_the_same_path_is_read_again(tmp_path):
    # GIVEN a program built, looked up, then built again at the same path with its
    # function renamed (a test suite rebuilds its binaries between runs)
    src = tmp_path / "p.c"
    out = tmp_path / "p"

    def build(name):
        src.write_text(f"#include <stdlib.h>\nvoid *{name}(int n) {{ return malloc(n); }}\n"
                       f"int main(void) {{ free({name}(8)); return 0; }}\n")
        subprocess.run(["cc", "-O0", "-g", "-o", str(out), str(src)], check=True, timeout=60)
        start, size, _ = next(f for f in _symbols(out) if f[2] == name)
        return (str(out), start + 1)
    first = build("first_name")
    assert symbolize.symbolize([first]).frames[first][-1].function == "first_name"
    time.sleep(0.01)   # a new modification time, whatever the filesystem's resolution
    second = build("second_name")
    # WHEN the same session is asked about the new file
    found = symbolize.symbolize([second])
    # THEN it answers from the new file (the tool keeps what it read per path: the
    # session is started again), not with the old name
    assert found.frames[second][-1].function == "second_name"


def _symbols(binary: Path) -> list:
    """(start, size, name) of a binary's functions (.symtab)."""
    text = subprocess.run(["nm", "-S", "--defined-only", str(binary)], capture_output=True,
                          text=True, check=True).stdout
    return [(int(p[0], 16), int(p[1], 16), p[3]) for p in (line.split() for line in text.splitlines())
            if len(p) == 4 and p[2] in "Tt"]
