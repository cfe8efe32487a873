"""A runtime's own start-up blocks, kept for the program's life, are named as such: a C++
program's never-freed bytes are libstdc++'s emergency exception pool (72,704 bytes
allocated before main), not "(stack not unwound)" for the user to chase."""

from __future__ import annotations

import json
import subprocess
import sys

HS = [sys.executable, "-m", "heapsight", "run", "--no-save"]


def test_libstdcxx_emergency_pool_is_named(tmp_path):
    src, exe, js = tmp_path / "p.cc", tmp_path / "p", tmp_path / "s.json"
    src.write_text("#include <vector>\nint main() { std::vector<int> v(10); return v[3]; }\n")
    subprocess.run(["g++", "-O1", "-o", str(exe), str(src)], check=True)
    r = subprocess.run([*HS, "--sample-bytes", "64", "--json", str(js), "--", str(exe)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s = json.loads(js.read_text())
    never = next(m for m in s["sites"]["moments"] if m["name"] == "never freed")
    names = [x["site"] for x in never["sites"]]
    # THEN the one block never freed is the pool, named, with its size
    assert names and names[0].startswith("libstdc++'s emergency pool, kept for life"), names
    assert never["sites"][0]["bytes"] >= 72_704
    assert "(stack not unwound)" not in names
