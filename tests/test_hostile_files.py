"""No one else can redirect what heapsight writes: a link another user plants at an output
path in a shared directory while root's run goes on is neither followed nor replaced (the
record goes beside it, and the file the link points to is untouched or never made);
default names in a directory anyone can write are not predictable; and a record that
cannot be written where asked (a full file system) is saved in a private directory
instead, the program's exit code kept."""

from __future__ import annotations

import gzip
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HS = [sys.executable, "-m", "heapsight"]


def nobody() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user 'nobody' on this machine to play the other user")


def as_user(uid: int, argv: list) -> None:
    subprocess.run(argv, check=True, preexec_fn=lambda: (os.setgid(65534), os.setuid(uid)))


@pytest.fixture
def shared(tmp_path):
    """A directory like /tmp (sticky, anyone writes), and a private one of root's beside."""
    if os.geteuid() != 0:
        pytest.skip("the other user is played by setuid: this test needs root")
    # pytest's directories are 0700: the other user must reach inside this one
    base = Path(tempfile.mkdtemp(prefix="hs-hostile-"))
    os.chmod(base, 0o755)
    d, private = base / "shared", base / "private"
    d.mkdir()
    os.chmod(d, 0o1777)
    private.mkdir(mode=0o700)
    yield d, private
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("victim_exists", [True, False])
def test_a_link_planted_at_the_output_is_not_followed(shared, victim_exists):
    d, private = shared
    victim = private / "secret"
    if victim_exists:
        victim.write_text("root's own\n")
        os.chmod(victim, 0o600)
    out = d / "r.hsrun.json.gz"
    # GIVEN root's run with -o in the shared directory (checked: nothing there yet)
    p = subprocess.Popen([*HS, "run", "-q", "-o", str(out), "--", "sleep", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    # WHEN another user plants a link there, to a file of root's (or to where one would be)
    as_user(nobody(), ["ln", "-s", str(victim), str(out)])
    _, err = p.communicate(timeout=120)
    # THEN the file the link points to is untouched (or never made), the link stays, and
    # the record is beside it, saying so
    assert p.returncode == 0, err
    if victim_exists:
        assert victim.read_text() == "root's own\n"
    else:
        assert not victim.exists()
    assert out.is_symlink()
    aside = d / "r-1.hsrun.json.gz"
    assert json.loads(gzip.open(aside).read())["summary"]["exit_code"] == 0
    assert "not followed" in err and str(aside) in err, err


def test_default_names_in_a_shared_directory_are_not_predictable(shared):
    d, _ = shared
    names = []
    for _ in range(2):
        p = subprocess.run([*HS, "run", "-q", "--", "true"], cwd=d, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr
    names = sorted(x.name for x in d.iterdir())
    assert len(names) == 2, names
    # heapsight-true.PID.<8 random hex>.hsrun.json.gz
    for n in names:
        stem = n[:-len(".hsrun.json.gz")].split(".")
        assert stem[0] == "heapsight-true" and len(stem) == 3 and len(stem[2]) == 8, n


def test_a_record_that_cannot_be_written_where_asked_is_saved_elsewhere(tmp_path):
    # GIVEN an output on a file system that fills up while the program runs (a tmpfs of
    # 64 KiB, in a mount namespace of the test's own)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = (f"mount -t tmpfs -o size=64k none {mnt} || exit 77; "
              f"{sys.executable} -m heapsight run -q -o {mnt}/r.hsrun.json.gz -- "
              f"sh -c 'head -c 100000 /dev/zero > {mnt}/fill 2>/dev/null; exit 3'")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=120, env=env)
    if p.returncode == 77:
        pytest.skip(f"no tmpfs could be mounted here: {p.stderr.strip()}")
    # THEN heapsight exits with the program's code, says where the run went, and it is there
    assert p.returncode == 3, p.stderr
    assert "the run is saved to" in p.stderr, p.stderr
    saved = p.stderr.split("the run is saved to ", 1)[1].split(" instead")[0]
    assert saved.startswith(str(tmp_path))
    assert json.loads(gzip.open(saved).read())["summary"]["exit_code"] == 3
