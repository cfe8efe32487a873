"""heapsight attach through its own injector (native/src/inject.c, no gdb): --leaks finds a
running service's lost blocks in a copy of it, --trim makes the allocator's release on one
of its threads; the process is left exactly as it was (its threads, fds, signals,
children, mappings, output and exit code), the pause is measured, and where it cannot be
done the refusal is clear and the process untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest


from conftest import scenario

MiB = 1 << 20
HS = [sys.executable, "-m", "heapsight"]
LIBDIR = "/usr/lib/x86_64-linux-gnu"
JEMALLOC = f"{LIBDIR}/libjemalloc.so.2"
PRELOADS = {"glibc": None, "jemalloc": JEMALLOC, "tcmalloc": f"{LIBDIR}/libtcmalloc_minimal.so.4",
            "mimalloc": f"{LIBDIR}/libmimalloc.so.2"}
LEAK_BLOCK = 16384


def hs(*args, timeout=120, **kw):
    return subprocess.run([*HS, *args], capture_output=True, text=True, timeout=timeout, **kw)


def start_service(*opts, env=None, user=None):
    """hs-service, serving until its stdin ends, once its leak is complete."""
    cmd = [scenario("hs-service"), *opts]
    if user:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, **(env or {})})
    line = p.stdout.readline()
    assert line.startswith("leaked "), line
    return p, int(line.split()[1]), int(line.split()[4])


def state(pid: int) -> dict:
    """What the process is, as far as another process can see."""
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
    fds = {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    maps = open(f"/proc/{pid}/maps").read()
    return {"threads": status["Threads"].strip(), "tasks": sorted(os.listdir(f"/proc/{pid}/task")),
            "signals": [status[k].strip() for k in ("SigBlk", "SigIgn", "SigCgt")],
            "fds": fds, "children": children(pid),
            "libheapsight": [line for line in maps.splitlines() if "libheapsight" in line],
            "tracer": status["TracerPid"].strip()}


def children(pid: int) -> list:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(d)
    return out


def finish(p) -> tuple:
    """The service's end: stdin closed; (exit code, stdout, stderr)."""
    out, err = p.communicate(input="", timeout=30)
    return p.returncode, out, err


def test_leaks_finds_the_lost_blocks_and_leaves_the_service_as_it_was(tmp_path):
    # GIVEN a service with three worker threads that lost 8 MiB in 16 KiB request buffers,
    # keeps a cache and allocates transiently, its main thread blocked in read()
    p, leaked, blocks = start_service("--leak-kib", "8192")
    try:
        before = state(p.pid)
        # WHEN heapsight looks for its leaks
        out = tmp_path / "a.json"
        r = hs("attach", str(p.pid), "--leaks", "--json", str(out))
        after = state(p.pid)
        time.sleep(0.3)
        alive = p.poll() is None
    finally:
        rc, stdout, stderr = finish(p)
    assert r.returncode == 0, r.stderr
    k = json.loads(out.read_text())["leaks"]
    reach = k["reach"]
    # THEN the lost bytes are the leak's, block for block, found from the service's roots
    assert reach["definitely_lost_blocks"] == blocks == 512
    assert abs(reach["definitely_lost_bytes"] - leaked) <= 0.05 * leaked, reach
    assert reach["still_reachable_bytes"] >= 0.5 * MiB      # the cache
    assert k["lost_by_size"][0] == {"bytes": LEAK_BLOCK + 8, "blocks": 512}
    assert "buffer never freed" in k["largest_lost"][0]["starts"]
    assert "LEAK: 8.0 MiB" in r.stderr and "never freed" in r.stderr
    # AND the pause is measured and said
    assert 0 < k["pause_ms"] < 2000 and k["threads"] == 4 and k["reaped"]
    assert f"the process stopped {k['pause_ms']:.1f} ms, 4 threads" in " ".join(r.stderr.split())
    # AND the service is as it was: same threads, fds, signals, no child left, nothing of
    # heapsight's mapped, no tracer; its read() and sleeps went on (a call the stop broke
    # would end it early with its errno)
    assert after == before
    assert alive
    assert rc == 0, stderr
    assert stderr == ""
    assert stdout.startswith("served ") and stdout.count("\n") == 1


def test_leaks_of_a_service_with_a_large_main_heap(tmp_path):
    # GIVEN a service whose main heap holds 100 MiB in 64 KiB blocks (the copy's own loading
    # of its library then moves the copy's break: the kernel lists its [heap] in two parts)
    p, leaked, blocks = start_service("--leak-kib", "1024", "--threads", "1", "--hold-mib", "100")
    try:
        r = hs("attach", str(p.pid), "--leaks", "--json", str(tmp_path / "a.json"))
    finally:
        rc, _, stderr = finish(p)
    # THEN every heap is walked and the held blocks are still reachable, the lost ones lost
    assert r.returncode == 0, r.stderr
    reach = json.loads((tmp_path / "a.json").read_text())["leaks"]["reach"]
    assert reach["definitely_lost_blocks"] == blocks == 64
    assert reach["still_reachable_bytes"] >= 100 * MiB
    assert rc == 0 and stderr == ""


def test_leaks_of_another_users_service(tmp_path):
    # GIVEN the service running as another user (nobody)
    p, leaked, blocks = start_service("--leak-kib", "2048", "--threads", "1", user="65534")
    try:
        # WHEN root looks for its leaks (the copy, running as nobody, writes its map in a
        # directory made for it)
        r = hs("attach", str(p.pid), "--leaks", "--json", str(tmp_path / "a.json"))
    finally:
        rc, _, stderr = finish(p)
    # THEN the answer is the same
    assert r.returncode == 0, r.stderr
    reach = json.loads((tmp_path / "a.json").read_text())["leaks"]["reach"]
    assert reach["definitely_lost_blocks"] == blocks == 128
    assert rc == 0 and stderr == ""


def test_leaks_refused_where_it_cannot_be_done():
    # GIVEN a statically linked program, one running on jemalloc, and a service of root's
    static = subprocess.Popen([scenario("hs-static"), "--hold-ms", "20000"], stdout=subprocess.DEVNULL)
    je, _, _ = start_service("--leak-kib", "1024", env={"LD_PRELOAD": JEMALLOC})
    svc, _, _ = start_service("--leak-kib", "1024", "--threads", "1")
    try:
        time.sleep(0.3)
        before = {q.pid: state(q.pid) for q in (static, je, svc)}
        # WHEN --leaks is asked of each (of root's service, by another user)
        r_static = hs("attach", str(static.pid), "--leaks", "--no-gdb")
        r_je = hs("attach", str(je.pid), "--leaks", "--no-gdb")
        r_user = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                 *HS, "attach", str(svc.pid), "--leaks"],
                                capture_output=True, text=True, timeout=120,
                                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        after = {q.pid: state(q.pid) for q in (static, je, svc)}
    finally:
        static.kill()
        static.wait()
        rc_je = finish(je)[0]
        rc_svc = finish(svc)[0]
    # THEN each is refused in one line naming the reason, and no process changed
    assert r_static.returncode == 3 and "no glibc loaded (a static binary" in r_static.stderr
    assert r_je.returncode == 3 and "allocator is jemalloc" in r_je.stderr
    assert r_user.returncode == 3 and "another user" in r_user.stderr, r_user.stderr
    for r in (r_static, r_je, r_user):
        assert "Traceback" not in r.stderr
    assert after == before
    assert rc_je == 0 and rc_svc == 0


def test_leaks_of_a_process_that_ends():
    # GIVEN a process that ends before heapsight can copy it
    p = subprocess.Popen(["true"])
    p.wait()
    # WHEN --leaks is asked of it
    r = hs("attach", str(p.pid), "--leaks")
    # THEN it says so
    assert r.returncode == 3 and "no process" in r.stderr


def holding(preload=None):
    """hs-retention holding 256 MiB of freed memory for 8 s (its workers come and gone, its
    main thread asleep), then printing its line and exiting 0."""
    p = subprocess.Popen([scenario("hs-retention"), "--hold-ms", "8000"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, **({"LD_PRELOAD": preload} if preload else {})})
    deadline = time.time() + 30
    while time.time() < deadline:
        threads = int(open(f"/proc/{p.pid}/status").read().split("Threads:")[1].split()[0])
        call = open(f"/proc/{p.pid}/syscall").read().split()[0]
        if threads == 1 and call in ("230", "35"):
            return p
        time.sleep(0.02)
    p.kill()
    raise AssertionError("hs-retention did not reach its hold")


# what the release gives back of hs-retention's 256 MiB held, each allocator's way: glibc's
# and tcmalloc's release nearly all of it; jemalloc's purge its dirty pages (30 MiB);
# mimalloc's mi_collect only the calling thread's own pages (about 6 MiB: the freed blocks
# were the workers')
GIVES_BACK = {"glibc": 200 * MiB, "jemalloc": 20 * MiB, "tcmalloc": 200 * MiB, "mimalloc": 2 * MiB}


@pytest.mark.parametrize("allocator", sorted(PRELOADS))
def test_trim_makes_the_release_and_leaves_the_process_as_it_was(tmp_path, allocator):
    # GIVEN a process holding 256 MiB it freed, on each allocator
    p = holding(PRELOADS[allocator])
    try:
        before = state(p.pid)
        # WHEN heapsight makes the allocator's release in it (no gdb)
        out = tmp_path / "t.json"
        r = hs("attach", str(p.pid), "--trim", "--no-gdb", "--json", str(out))
        after = state(p.pid)
    finally:
        out_text, err_text = p.communicate(timeout=60)
    assert r.returncode == 0, r.stderr
    t = json.loads(out.read_text())["trim"]
    # THEN RSS fell by what that allocator's release gives back, measured
    assert t["gave_back_bytes"] >= GIVES_BACK[allocator], t
    # AND the stop is said: one thread, for the call
    assert 0 < t["pause_ms"] < 5000 and t["threads"] == 1
    text = " ".join(r.stderr.split())
    assert f"stopped {t['pause_ms']:.1f} ms for it" in text
    assert "made now gave back" in text and "--trim does it" not in text
    # AND the process is as it was, and ends its sleep and exits as it would have
    assert after == before
    assert p.returncode == 0 and out_text.startswith("retention: ") and err_text == ""
