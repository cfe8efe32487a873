"""Allocation failures under the preload library behave as without it: NULL with errno
ENOMEM or EINVAL (never a small block for a size that wrapped), and C++ operator new runs
the new_handler before it gives up, nothrow forms included."""

import os
import subprocess
from pathlib import Path

import pytest

from conftest import scenario
from heapsight.native import LIB, lib_path

MiB = 1024 * 1024
SYSTEM_LIBS = Path("/usr/lib/x86_64-linux-gnu")
UNDERNEATH = {
    "glibc": None,
    "jemalloc": SYSTEM_LIBS / "libjemalloc.so.2",
    "tcmalloc": SYSTEM_LIBS / "libtcmalloc_minimal.so.4",
    "mimalloc": SYSTEM_LIBS / "libmimalloc.so.2",
    "mmap": Path(lib_path("libheapsight_mmap.so")),
}


def preloaded(allocator: str) -> dict:
    lib = UNDERNEATH[allocator]
    if lib is not None and not lib.exists():
        pytest.fail(f"{lib} is missing: `make test` installs the allocators (scripts/install-deps)")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "HEAPSIGHT_SEGMENT")}
    env["LD_PRELOAD"] = ":".join(str(x) for x in (LIB, lib) if x is not None)
    return env


@pytest.mark.parametrize("allocator", list(UNDERNEATH))
def test_failed_allocations_return_null_and_set_errno(allocator):
    # pvalloc(SIZE_MAX - 100) once came back as a 4 KiB block (the page rounding wrapped)
    p = subprocess.run([scenario("hs-alloc-errors")], env=preloaded(allocator),
                       capture_output=True, text=True, timeout=30)
    assert "alloc-errors: failed=0" in p.stdout, p.stdout + p.stderr
    assert p.returncode == 0


@pytest.mark.parametrize("allocator", ["glibc", "jemalloc", "tcmalloc", "mimalloc"])
def test_operator_new_runs_the_new_handler_before_giving_up(allocator):
    # GIVEN malloc fails for a 64 MiB block until a new_handler frees a 64 MiB reserve
    p = subprocess.run([scenario("hs-new-handler")], env=preloaded(allocator),
                       capture_output=True, text=True, timeout=30)
    # THEN nothrow and throwing new both call it once and their retry succeeds, and
    # nothrow new with no handler gives NULL
    assert "handler_calls=2 nothrow_ok=1 throwing_ok=1 null_ok=1" in p.stdout, p.stdout + p.stderr
    assert p.returncode == 0


def test_the_block_new_handler_made_room_for_is_counted(hs):
    r = hs(scenario("hs-new-handler"))
    assert r.rc == 0, r.stderr
    kept = int(r.truth("new-handler")["kept_bytes"])
    h = r.summary["heap"]
    assert kept <= h["live_requested_bytes"] <= kept + 256 * 1024
    assert h["live_blocks"] >= 1
