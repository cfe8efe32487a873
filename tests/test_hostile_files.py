"""No one else can redirect what heapsight writes: a link another user plants at an output
path in a shared directory while root's run goes on is neither followed nor replaced (the
record goes beside it, and the file the link points to is untouched or never made);
default names in a directory anyone can write are not predictable; and a record that
cannot be written where asked (a full file system) is saved in a private directory
instead, the program's exit code kept."""

from __future__ import annotations

import glob
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


@pytest.mark.parametrize("victim", ["a file of root's", "no file yet", "a device"])
def test_a_link_planted_at_the_output_is_not_followed(shared, victim):
    d, private = shared
    target = private / "secret" if victim != "a device" else Path("/dev/null")
    if victim == "a file of root's":
        target.write_text("root's own\n")
        os.chmod(target, 0o600)
    out = d / "r.hsrun.json.gz"
    # GIVEN root's run with -o in the shared directory (checked: nothing there yet)
    p = subprocess.Popen([*HS, "run", "-q", "-o", str(out), "--", "sleep", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    # WHEN another user plants a link there, to a file of root's (or to where one would be)
    as_user(nobody(), ["ln", "-s", str(target), str(out)])
    _, err = p.communicate(timeout=120)
    # THEN the file the link points to is untouched (or never made; a device is not written
    # through it), the link stays, and the record is beside it, saying so
    assert p.returncode == 0, err
    if victim == "a file of root's":
        assert target.read_text() == "root's own\n"
    elif victim == "no file yet":
        assert not target.exists()
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


def _segment_of(pid: int, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = glob.glob(f"/dev/shm/heapsight-{pid}-*.seg")
        if found:
            return found[0]
        time.sleep(0.01)
    raise AssertionError("heapsight made no segment")


@pytest.mark.parametrize("plant", ["fifo", "zero", "forged"])
def test_a_file_another_user_puts_beside_the_segment_neither_hangs_nor_feeds_the_run(
        shared, tmp_path, plant):
    # GIVEN root's run, and another user who puts a FIFO, a link to /dev/zero or a file of
    # their own where the program's copy will write its exit map (/dev/shm is anyone's)
    rec = tmp_path / "r.hsrun.json.gz"
    p = subprocess.Popen([*HS, "run", "-q", "-o", str(rec), "--", "sleep", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    target = _segment_of(p.pid) + ".map.exit"
    argv = {"fifo": ["mkfifo", target], "zero": ["ln", "-s", "/dev/zero", target],
            "forged": ["sh", "-c", f"head -c 4096 /dev/urandom > {target}"]}[plant]
    as_user(nobody(), argv)
    # WHEN the program ends: THEN heapsight ends too (it waited forever on the FIFO, and
    # read /dev/zero until it ran out of memory), its record saved, nothing of theirs read
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "Traceback" not in err, err
    summary = json.loads(gzip.open(rec).read())["summary"]
    # (as root the copy's rename replaces what they put there: the map is the copy's own)
    exits = [m for m in summary.get("heapmaps") or [] if m["moment"] == "exit"]
    assert all(m["status"] == "mapped" and m["allocator"] == "glibc" for m in exits), exits
    os.unlink(target) if os.path.lexists(target) else None


def test_attach_never_waits_on_a_segment_name_the_process_gives():
    # GIVEN a process whose HEAPSIGHT_SEGMENT names a FIFO (a process may set any name)
    d = Path(tempfile.mkdtemp(prefix="hs-fifo-"))
    fifo = d / "seg"
    os.mkfifo(fifo)
    target = subprocess.Popen(["sleep", "30"], env=dict(os.environ, HEAPSIGHT_SEGMENT=str(fifo)))
    try:
        # WHEN root attaches without gdb: THEN it answers from /proc at once
        t0 = time.monotonic()
        r = subprocess.run([*HS, "attach", "--no-gdb", str(target.pid)], capture_output=True,
                           text=True, timeout=60)
        assert time.monotonic() - t0 < 30
        assert r.returncode == 0, r.stderr
    finally:
        target.kill()
        target.wait()
        shutil.rmtree(d, ignore_errors=True)


def test_malloc_info_is_parsed_in_linear_time():
    from heapsight.live import attach
    # 260 KB of heaps that never close: a lazy regular expression took 54 s on it
    xml = "<malloc>" + '<heap nr="1">' * 20000 + "</malloc>"
    t0 = time.monotonic()
    got = attach.parse_malloc_info(xml)
    assert time.monotonic() - t0 < 1.0
    assert got["arenas"] == []
    good = ('<malloc version="1"><heap nr="0"><sizes></sizes><total type="fast" count="1" '
            'size="32"/><total type="rest" count="2" size="4096"/><system type="current" '
            'size="135168"/></heap><total type="mmap" count="3" size="393216"/></malloc>')
    got = attach.parse_malloc_info(good)
    assert got["arenas"][0]["system_bytes"] == 135168 and got["arenas"][0]["free_bytes"] == 4128
    assert (got["mmapped_chunks"], got["mmapped_bytes"]) == (3, 393216)


def test_a_small_dev_shm_leaves_the_program_the_room_it_has_bare(tmp_path):
    # GIVEN a 24 MiB /dev/shm (in a mount namespace of the test's own) and a program that
    # puts 20 MiB in it: heapsight's 13 MiB segment made it die of SIGBUS
    prog = ("from multiprocessing import shared_memory as s; m = s.SharedMemory(create=True, "
            "size=20 << 20); m.buf[:] = b'x' * (20 << 20); print('filled'); m.close(); m.unlink()")
    script = (f"mount -t tmpfs -o size=24m none /dev/shm || exit 77; "
              f"{sys.executable} -c \"{prog}\" && "
              f"{sys.executable} -m heapsight run --no-save -- {sys.executable} -c \"{prog}\"")
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs on /dev/shm needs root")
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=120)
    if p.returncode == 77:
        pytest.skip(f"no tmpfs could be mounted here: {p.stderr.strip()}")
    # THEN it fills its 20 MiB under heapsight as bare, and heapsight says what it gave up
    assert p.returncode == 0, p.stderr
    assert p.stdout == "filled\nfilled\n", (p.stdout, p.stderr)
    assert "to leave the program its room" in p.stderr, p.stderr
    assert "VERDICT" in p.stderr
