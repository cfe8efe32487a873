"""The preload library writes only into a segment heapsight made for a live run; the CLI
leaves other users' files alone. HEAPSIGHT_SEGMENT naming anything else changes nothing."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np

from heapsight import layout as L
from heapsight.live import segment as S
from heapsight.native import LIB


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def under_preload(seg_path, cwd):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(LD_PRELOAD=LIB, HEAPSIGHT_SEGMENT=str(seg_path))
    p = subprocess.run(["/bin/true"], env=env, capture_output=True, text=True, cwd=cwd, timeout=30)
    assert p.returncode == 0, p.stderr


def made_segment(path, creator: int, mode: int = 0o600) -> None:
    """A file laid out as the CLI makes one (S.Segment), with the given creator."""
    head = np.zeros((), L.HEADER_DTYPE)
    head["magic"], head["version"], head["size_bytes"] = L.CREATED, L.VERSION, L.SEGMENT_BYTES
    head["creator_pid"] = creator
    with open(path, "wb") as f:
        f.truncate(L.SEGMENT_BYTES)
        f.write(head.tobytes())
    os.chmod(path, mode)


def test_a_file_that_is_no_segment_is_never_written(tmp_path):
    # GIVEN files of the segment's size that heapsight did not make
    victims = []
    plain = tmp_path / "data.bin"
    plain.write_bytes(os.urandom(L.SEGMENT_BYTES))
    os.chmod(plain, 0o600)
    victims.append(plain)
    big = tmp_path / "big.bin"                      # 3 MB and more: today's only check
    big.write_bytes(b"\x01" * (3 << 20))
    victims.append(big)
    for v in victims:
        before = digest(v)
        under_preload(v, tmp_path)
        assert digest(v) == before, v.name


def test_a_segment_reached_through_a_symlink_or_too_open_is_not_attached(tmp_path):
    real = tmp_path / "seg"
    made_segment(real, os.getpid())
    link = tmp_path / "link.seg"
    link.symlink_to(real)
    before = digest(real)
    under_preload(link, tmp_path)                   # O_NOFOLLOW
    assert digest(real) == before
    made_segment(real, os.getpid(), mode=0o644)     # group/other may read it
    before = digest(real)
    under_preload(real, tmp_path)
    assert digest(real) == before


def test_a_leftover_segment_whose_heapsight_is_gone_is_not_attached(tmp_path):
    # a daemon that outlives the run (and inherited HEAPSIGHT_SEGMENT) writes nothing
    dead = subprocess.run(["/bin/sh", "-c", "echo $$"], capture_output=True, text=True)
    seg = tmp_path / "seg"
    made_segment(seg, int(dead.stdout))
    before = digest(seg)
    under_preload(seg, tmp_path)
    assert digest(seg) == before


def test_a_segment_made_for_a_live_run_is_attached(tmp_path):
    seg = tmp_path / "seg"
    made_segment(seg, os.getpid())
    under_preload(seg, tmp_path)
    head = np.frombuffer(open(seg, "rb").read(L.HEADER_DTYPE.itemsize), L.HEADER_DTYPE)[0]
    assert int(head["magic"]) == L.MAGIC and int(head["owner_pid"]) != 0


def test_another_users_leftover_segment_does_not_stop_a_run(tmp_path):
    # GIVEN a dead process's segment in /dev/shm that belongs to someone else
    if os.geteuid() != 0:
        import pytest
        pytest.skip("needs root to make a file owned by another user")
    other = os.path.join(S._shm_dir(), "heapsight-999999-deadbeef0000.seg")
    with open(other, "wb") as f:
        f.write(b"x" * 64)
    os.chown(other, 65534, 65534)
    try:
        p = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "--no-save", "--", "true"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert p.returncode == 0, p.stderr
        assert os.path.exists(other)                # not ours: left alone
    finally:
        os.unlink(other)
