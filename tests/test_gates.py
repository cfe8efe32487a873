"""`heapsight run`'s CI gates: a figure above its limit fails the run with exit 90, only
when the program itself succeeded; a bad SIZE is refused before the program runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import scenario

HS = [sys.executable, "-m", "heapsight", "run", "-q", "--no-save"]


def hs(*args, cwd):
    return subprocess.run([*HS, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize("gate,limit,fails", [
    ("--fail-if-retained", "64M", True),      # 256 MiB retained at exit
    ("--fail-if-retained", "1G", False),
    ("--fail-if-rss", "100MiB", True),        # ~260 MiB peak
    ("--fail-if-rss", "2GB", False),
    ("--fail-if-never-freed", "1M", True),    # 4 MiB kept on purpose
    ("--fail-if-never-freed", "8M", False),
])
def test_a_gate_fails_the_run_with_exit_90(tmp_path, gate, limit, fails):
    p = hs(gate, limit, "--", scenario("hs-retention"), cwd=tmp_path)
    assert p.returncode == (90 if fails else 0), p.stderr
    assert ("gate failed" in p.stderr) == fails


def test_the_programs_own_failure_wins_over_a_gate(tmp_path):
    p = hs("--fail-if-rss", "1K", "--", "sh", "-c", "sleep 0.2; exit 3", cwd=tmp_path)
    assert p.returncode == 3 and "gate failed: peak RSS" in p.stderr


def test_a_bad_size_is_refused_before_the_program_runs(tmp_path):
    marker = tmp_path / "ran"
    p = hs("--fail-if-rss", "lots", "--", "touch", str(marker), cwd=tmp_path)
    assert p.returncode == 2 and "'lots' is not a size" in p.stderr
    assert not marker.exists()


def test_the_lost_gate_tells_a_leak_from_data_kept_until_exit(tmp_path):
    # a program that drops 5 MiB fails --fail-if-lost 1M; one that keeps 50 MiB reachable in
    # a global list until exit passes it (where --fail-if-never-freed trips on both)
    leak = hs("--fail-if-lost", "1M", "--", scenario("hs-leak"), "--mb", "5", cwd=tmp_path)
    assert leak.returncode == 90, leak.stderr
    assert "gate failed: lost at exit 5.0 MiB" in leak.stderr
    kept = [scenario("hs-reach"), "--kept", "51200", "--lost", "0", "--list", "0"]
    p = hs("--fail-if-lost", "1M", "--", *kept, cwd=tmp_path)
    assert p.returncode == 0 and "gate" not in p.stderr, p.stderr
    p = hs("--fail-if-never-freed", "1M", "--", *kept, cwd=tmp_path)
    assert p.returncode == 90 and "never freed at exit 50" in p.stderr, p.stderr


def test_a_lost_gate_that_cannot_be_judged_fails_with_the_reason(tmp_path):
    # without the exit's heap map nothing says which blocks are lost: exit 2, never 0
    p = hs("--no-heap-map", "--fail-if-lost", "1M", "--", scenario("hs-leak"), "--mb", "5",
           cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "gate not judged: --fail-if-lost" in p.stderr and "no heap map at exit" in p.stderr
    # nor with the record of the blocks turned off, under another allocator
    from test_allocators import allocator_lib
    p = subprocess.run([*HS, "--fail-if-lost", "1M", "--", scenario("hs-leak"), "--mb", "5"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**__import__("os").environ, "LD_PRELOAD": allocator_lib("jemalloc"),
                            "HEAPSIGHT_REACH": "0"})
    assert p.returncode == 2 and "gate not judged" in p.stderr, p.stderr
    # while under jemalloc with the record on, the leak is judged: 90
    p = subprocess.run([*HS, "--fail-if-lost", "1M", "--", scenario("hs-leak"), "--mb", "5"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**__import__("os").environ, "LD_PRELOAD": allocator_lib("jemalloc")})
    assert p.returncode == 90 and "gate failed: lost at exit" in p.stderr, p.stderr
