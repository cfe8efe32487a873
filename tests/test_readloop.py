"""The sampler's fast tick in C (heapsight.live.readloop): the same figures as the Python reads,
at the rate asked, and it hands back at once on a signal, a snapshot request or the
program's exit."""

import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

import ctypes
import re

import c_mirror
from conftest import scenario
from heapsight import native
from heapsight.live import procfs, readloop
from heapsight.live.segment import Segment


@pytest.fixture
def idle_program():
    """hs-idle holding 8 MiB for 3 s under the library, its segment attached."""
    seg = Segment()
    env = dict(os.environ, LD_PRELOAD=native.LIB, HEAPSIGHT_SEGMENT=seg.path)
    p = subprocess.Popen([scenario("hs-idle"), "--ms", "3000", "--mb", "8"], env=env,
                         stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 5
    while not (seg.attached() and seg.counters().live_usable_bytes >= 8 << 20):
        assert time.monotonic() < deadline, "the program never attached"
        time.sleep(0.01)
    statm = procfs.Statm(p.pid)
    yield p, seg, statm
    statm.close()
    p.kill()
    p.wait()
    seg.close()


# C parameter types as ctypes gives them
C_TYPES = {"int": ctypes.c_int, "uint64_t": ctypes.c_uint64, "double": ctypes.c_double,
           "const char *": ctypes.c_char_p, "void": None}


def declared(header: str) -> dict:
    """name -> (return type, [parameter types]) of each function readloop.h declares."""
    text = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    out = {}
    for ret, name, params in re.findall(r"^(int|void)\s+(\w+)\(([^)]*)\);", text, re.M):
        types = [re.sub(r"\s*\b\w+$", "", p.strip()).replace("*", " *").replace("  ", " ")
                 for p in params.split(",")]
        out[name] = (ret, [re.sub(r"\s+\*", " *", t) for t in types])
    return out


def ctype_matches(c: str, t) -> bool:
    if c in C_TYPES:
        return C_TYPES[c] is t
    assert c.endswith(" *"), c
    base = C_TYPES.get(c[:-2].replace("const ", ""))
    # a pointer: to a scalar as POINTER(that scalar), to anything as void * (numpy's buffers)
    return t is ctypes.c_void_p or (base is not None and t is ctypes.POINTER(base))


def mismatches(found: dict, signatures: dict) -> list:
    """Where ctypes' signatures differ from the header's declarations."""
    out = [f"{n}: declared in only one" for n in set(found) ^ set(signatures)]
    for name in set(found) & set(signatures):
        (ret, params), (restype, argtypes) = found[name], signatures[name]
        if C_TYPES[ret] is not restype:
            out.append(f"{name}: returns {ret}")
        if len(params) != len(argtypes):
            out.append(f"{name}: {len(params)} parameters, ctypes gives {len(argtypes)}")
        out += [f"{name}: parameter {i} is {c}" for i, (c, t) in enumerate(zip(params, argtypes))
                if not ctype_matches(c, t)]
    return out


def test_the_ctypes_signatures_are_readloop_hs():
    found = declared((c_mirror.ROOT / "native" / "src" / "readloop.h").read_text())
    assert mismatches(found, readloop.SIGNATURES) == []
    # and the check finds two arguments swapped, and one missing
    restype, args = readloop.SIGNATURES["hs_read_loop"]
    swapped = args[:-2] + [args[-1], args[-2]]
    assert mismatches(found, {**readloop.SIGNATURES, "hs_read_loop": (restype, swapped)}) == [
        "hs_read_loop: parameter 18 is int", "hs_read_loop: parameter 19 is uint64_t"]
    assert mismatches(found, {**readloop.SIGNATURES, "hs_read_loop": (restype, args[:-1])}) == [
        "hs_read_loop: 20 parameters, ctypes gives 19"]


def test_the_loops_constants_are_the_compilers(tmp_path):
    rc, out, n = c_mirror.run(readloop.C_HEADER, {}, readloop.C_CONSTANTS, tmp_path)
    assert rc == 0 and out.strip() == f"0 of {n} differ", out


def test_ticks_read_what_python_reads_at_the_rate_asked(idle_program):
    # GIVEN a program that holds 8 MiB and sleeps
    p, seg, statm = idle_program
    fast = readloop.FastReader(seg, time.monotonic_ns(), 0.001, set())
    # WHEN the C loop ticks at 1 kHz for 0.2 s
    now = time.monotonic_ns()
    rows, why, nxt = fast.loop(statm.fd, now, now + 200_000_000, 0)
    # THEN it returned at the deadline with ~200 rows (the machine may be slow: at least half)
    assert why == readloop.UNTIL
    assert 100 <= len(rows) <= 201
    col = {c: [r[i] for r in rows] for i, c in enumerate(readloop.COLUMNS)}
    # AND the counters are exactly the Python reader's (the program does not allocate now)
    c = seg.counters()
    assert set(col["live_usable"]) == {c.live_usable_bytes}
    assert set(col["live_req"]) == {c.live_requested_bytes}
    assert set(col["n_alloc"]) == {c.n_alloc}
    # AND RSS and anonymous RSS are statm's, less heapsight's private memory (its tables)
    st, private = statm.read(), seg.get("own_private_bytes")
    assert private > 0
    assert abs(col["rss"][-1] - (st["rss"] - private)) <= 64 << 10
    assert abs(col["anon"][-1] - (st["anon"] - private)) <= 64 << 10
    # AND the ticks are 1 ms apart, and the next one is due after the last
    gaps = [b - a for a, b in zip(col["t"], col["t"][1:])]
    assert 0.0009 <= float(sorted(gaps)[len(gaps) // 2]) <= 0.002
    assert nxt > now


def test_a_pending_signal_returns_at_once_and_stays_pending(idle_program):
    p, seg, statm = idle_program
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        fast = readloop.FastReader(seg, time.monotonic_ns(), 0.001, {signal.SIGUSR2})
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR2)
        now = time.monotonic_ns()
        t0 = time.monotonic()
        rows, why, _ = fast.loop(statm.fd, now, now + 2_000_000_000, 0)
        assert why == readloop.SIGNAL
        assert time.monotonic() - t0 < 0.5
        # the Python side still takes it, with its siginfo
        info = signal.sigtimedwait({signal.SIGUSR2}, 0)
        assert info is not None and info.si_signo == signal.SIGUSR2
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def test_the_programs_exit_and_snapshot_requests_return(idle_program):
    p, seg, statm = idle_program
    fast = readloop.FastReader(seg, time.monotonic_ns(), 0.001, set())
    # a heapsight_snapshot() request newer than the last one taken returns at once
    asked = int(seg.header["snapshot_seq"])
    seg.header["snapshot_seq"] = asked + 1   # as the program's call would
    now = time.monotonic_ns()
    rows, why, _ = fast.loop(statm.fd, now, now + 2_000_000_000, asked)
    assert why == readloop.ASKED and len(rows) == 1
    seg.header["snapshot_seq"] = asked
    # the program's exit: statm of a zombie reads 0, the loop says it is gone
    p.send_signal(signal.SIGKILL)
    now = time.monotonic_ns()
    t0 = time.monotonic()
    rows, why, _ = fast.loop(statm.fd, now, now + 5_000_000_000, asked)
    assert why == readloop.GONE
    assert time.monotonic() - t0 < 1.0


def test_rss_that_moved_while_the_counters_were_read_is_read_again_with_them(idle_program, tmp_path):
    p, seg, statm = idle_program
    page = os.sysconf("SC_PAGE_SIZE")
    # GIVEN a statm that reads 10,000 pages resident, 1,000 of them shared
    fake = tmp_path / "statm"
    fake.write_text("20000 10000 1000 1 0 500 0\n")
    fd = os.open(fake, os.O_RDONLY)
    try:
        lib, row = readloop._load(), (ctypes.c_double * len(readloop.COLUMNS))()
        for before, again in ((10000, 0), (10000 + (1 << 20) // page, 0), (2000, 1)):
            rss, shared = ctypes.c_uint64(before), ctypes.c_uint64(0)
            # WHEN the tick read `before` pages ahead of the counters
            n = lib.hs_read_steady(fd, seg.address(), float(page), ctypes.byref(rss),
                                   ctypes.byref(shared), row)
            # THEN a reading within 1 MiB (and 1%) of the one after them stands; one further
            # off is read again with the counters once (then the two agree)
            assert n == again, (before, n)
            assert (rss.value, shared.value) == (10000, 1000)
        # AND the counters are the program's; the Python side gives RSS and anonymous RSS
        counts, after = readloop.steady_counters(seg, fd, 2000 * page)
        assert counts == readloop.counters(seg)
        assert after == (10000 * page, 9000 * page)
        # AND without a statm to read after them, the counters and no RSS (the row keeps its)
        counts, after = readloop.steady_counters(seg, -1, 2000 * page)
        assert counts == readloop.counters(seg) and after is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("other", ["/bin/sleep", "copy of the shell"])
def test_an_exec_returns_whether_or_not_the_images_code_size_changed(tmp_path, other):
    # GIVEN a shell that execs, after 0.3 s, another image: sleep (other code: statm's code
    # size changes) or a copy of the shell itself at another path (the same code size: only
    # the link read every EXE_EVERY ticks sees it)
    shell = os.path.realpath("/bin/sh")
    then = f"exec {other} 1"
    if other != "/bin/sleep":
        other = str(tmp_path / "sh-copy")
        shutil.copy(shell, other)
        then = f"exec {other} -c 'sleep 1; true'"
    p = subprocess.Popen([shell, "-c", f"sleep 0.3; {then}"])
    statm = procfs.Statm(p.pid)
    try:
        fast = readloop.FastReader(None, time.monotonic_ns(), 0.001, set())
        now = time.monotonic_ns()
        t0 = time.monotonic()
        # WHEN the C loop ticks at 1 kHz, told the image it runs is the shell
        rows, why, _ = fast.loop(statm.fd, now, now + 2_000_000_000, 0, pid=p.pid, exe=shell)
        # THEN it returns for the exec, after the shell's 0.3 s and well before the program ends
        assert why == readloop.EXEC, readloop.WHY[why]
        assert 0.25 < time.monotonic() - t0 < 1.0
        assert os.path.realpath(f"/proc/{p.pid}/exe") == os.path.realpath(other)
    finally:
        statm.close()
        p.kill()
        p.wait()
