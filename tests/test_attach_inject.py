"""heapsight attach through its own injector (native/src/inject.c, no gdb): --leaks finds a
running service's lost blocks in a copy of it, --trim makes the allocator's release on one
of its threads; the process is left exactly as it was (its threads, fds, signals,
children, mappings, output and exit code), the pause is measured, and where it cannot be
done the refusal is clear and the process untouched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
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


def start_service(*opts, env=None, user=None, leaked=True):
    """hs-service, serving until its stdin ends, once its leak is complete (leaked=False:
    once it serves, still leaking)."""
    cmd = [scenario("hs-service"), *opts]
    if user:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, **(env or {})})
    if not leaked:
        time.sleep(0.5)
        return p, 0, 0
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


def leaks_of_service(tmp_path, *opts, user=None) -> tuple:
    """attach --leaks on hs-service started with opts: (its reach, the blocks it lost); the
    service ended as it would have (exit 0, nothing on stderr)."""
    p, leaked, blocks = start_service(*opts, user=user)
    try:
        r = hs("attach", str(p.pid), "--leaks", "--json", str(tmp_path / "a.json"))
    finally:
        rc, _, stderr = finish(p)
    assert r.returncode == 0, r.stderr
    assert rc == 0 and stderr == ""
    return json.loads((tmp_path / "a.json").read_text())["leaks"]["reach"], blocks


def test_leaks_of_a_service_with_a_large_main_heap(tmp_path):
    # GIVEN a service whose main heap holds 100 MiB in 64 KiB blocks (the copy's own loading
    # of its library then moves the copy's break: the kernel lists its [heap] in two parts)
    reach, blocks = leaks_of_service(tmp_path, "--leak-kib", "1024", "--threads", "1",
                                     "--hold-mib", "100")
    # THEN every heap is walked and the held blocks are still reachable, the lost ones lost
    assert reach["definitely_lost_blocks"] == blocks == 64
    assert reach["still_reachable_bytes"] >= 100 * MiB


def test_leaks_of_another_users_service(tmp_path):
    # GIVEN the service running as another user (nobody), WHEN root looks for its leaks
    # (the copy, running as nobody, writes its map in a directory made for it)
    reach, blocks = leaks_of_service(tmp_path, "--leak-kib", "2048", "--threads", "1",
                                     user="65534")
    # THEN the answer is the same
    assert reach["definitely_lost_blocks"] == blocks == 128


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
        r_static_track = hs("attach", str(static.pid), "--track", "1", "--no-gdb")
        r_je_track = hs("attach", str(je.pid), "--track", "1", "--no-gdb")
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
    assert r_static_track.returncode == 3 and "no glibc loaded" in r_static_track.stderr
    assert r_je_track.returncode == 3 and "allocator is jemalloc" in r_je_track.stderr
    assert r_user.returncode == 3 and "another user" in r_user.stderr, r_user.stderr
    for r in (r_static, r_je, r_user, r_static_track, r_je_track):
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


def top_site(moment_or_sites: dict) -> str:
    return moment_or_sites["sites"][0]["site"]


def test_track_names_the_leaking_function_and_leaves_the_service_as_it_was(tmp_path):
    # GIVEN a service that keeps losing 16 KiB request buffers in leak_request, caches in
    # cache_put and allocates transiently in handle_transient, on three threads
    p, _, _ = start_service("--leak-kib", "4000000", leaked=False)
    try:
        before = state(p.pid)
        # WHEN heapsight follows it for 2 s, then looks for what no pointer reaches
        out, prof = tmp_path / "a.json", tmp_path / "grew.pb.gz"
        r = hs("attach", str(p.pid), "--track", "2", "--leaks", "--json", str(out),
               "--pprof", str(prof))
        after = state(p.pid)
        time.sleep(0.3)
        alive = p.poll() is None
    finally:
        rc, stdout, stderr = finish(p)
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())
    t, k = got["track"], got["leaks"]
    # THEN the leaking function comes first among the sites that grew, the transient one not
    # at all, and the lost blocks' sites are the leaking function's
    grew = t["sites"]["moments"][0]
    assert top_site(grew).startswith("leak_request (service.c:"), grew["sites"][:3]
    assert grew["sites"][0]["share"] >= 0.6
    assert not any("handle_transient" in x["site"] for x in grew["sites"])
    assert any(x["site"].startswith("cache_put (service.c:") for x in grew["sites"])
    assert top_site(k["lost_sites"]).startswith("leak_request (service.c:")
    assert k["lost_sites"]["sites"][0]["share"] >= 0.95
    assert t["counters"]["allocations"] > 1000 and t["patched"] >= 3
    # AND go tool pprof reads the same first site from the profile written
    from test_pprof import pprof_top
    top = pprof_top(prof)
    assert max(top, key=top.get).startswith("leak_request"), top
    # AND each stop is said, and the library is gone again
    assert 0 < t["load_pause_ms"] < 2000 and 0 < t["unload_pause_ms"] < 2000
    assert t["unloaded"] and not t["ended"] and t["note"] == ""
    text = " ".join(r.stderr.split())
    assert "call sites that grew" in text and "LEAK:" in text and "from leak_request" in text
    # AND the service is as it was (threads, fds, signals, children, nothing of heapsight's
    # mapped), serves on, and ends with its own output and exit code: its threads' exits
    # call nothing of the unloaded library
    assert after == before
    assert alive
    assert rc == 0 and stderr == "", stderr
    assert stdout.startswith("served ") and stdout.count("\n") == 1


GROW_PY = """import sys, time
cache = []
def remember(i):
    cache.append({"id": i, "payload": "x" * 3000})
def churn(i):
    return len([str(i)] * 100)
sys.stdout.write("ready\\n"); sys.stdout.flush()
i = 0
while True:
    remember(i); churn(i); i += 1
    if i % 500 == 0:
        time.sleep(0.01)
"""

GROW_PL = """use strict; $| = 1;
my @cache;
sub remember { my ($i) = @_; push @cache, { id => $i, payload => "x" x 3000 }; }
sub churn { my ($i) = @_; my @tmp = ($i) x 100; return scalar @tmp; }
print "ready\\n";
my $i = 0;
while (1) { remember($i); churn($i); $i++; select(undef, undef, undef, 0.01) if $i % 500 == 0; }
"""


@pytest.mark.parametrize("lang", ["python3", "perl"])
def test_track_names_a_scripts_own_function_and_line(tmp_path, lang):
    # GIVEN a script that grows a structure in remember() and churns in churn()
    name = "grow.py" if lang == "python3" else "grow.pl"
    script = tmp_path / name
    script.write_text(GROW_PY if lang == "python3" else GROW_PL)
    p = subprocess.Popen([lang, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        # WHEN heapsight follows it for 2 s
        out = tmp_path / "a.json"
        r = hs("attach", str(p.pid), "--track", "2", "--no-gdb", "--json", str(out))
        time.sleep(0.2)
        alive = p.poll() is None
    finally:
        p.kill()
        p.wait()
    # THEN the script's own function and line come first
    assert r.returncode == 0, r.stderr
    grew = json.loads(out.read_text())["track"]["sites"]["moments"][0]
    line = 4 if lang == "python3" else 3
    assert top_site(grew) == f"remember ({name}:{line})", grew["sites"][:3]
    assert alive


def test_track_of_a_process_that_ends_meanwhile_says_so(tmp_path):
    # GIVEN a service whose input ends 1 s into a 3 s track
    p, _, _ = start_service("--leak-kib", "4000000", leaked=False)
    ender = threading.Timer(1.0, p.stdin.close)
    ender.start()
    try:
        r = hs("attach", str(p.pid), "--track", "3", "--no-gdb", "--json", str(tmp_path / "a.json"))
    finally:
        ender.join()
        rc = p.wait(timeout=30)
    # THEN what it allocated meanwhile is told, with the end said; the service ended as it
    # would have
    assert r.returncode == 0, r.stderr
    t = json.loads((tmp_path / "a.json").read_text())["track"]
    assert t["ended"] and "the process ended" in t["note"]
    assert top_site(t["sites"]["moments"][0]).startswith("leak_request (service.c:")
    assert "the process ended or ran another program with it loaded" in " ".join(r.stderr.split())
    assert rc == 0


def test_track_of_a_process_that_runs_another_program_meanwhile(tmp_path):
    # GIVEN a shell that allocates, then runs sleep in its place (execve) 1 s into a 3 s track
    p = subprocess.Popen(["bash", "-c", "x=$(head -c 300000 /dev/zero | tr '\\0' a); "
                          "for i in $(seq 200); do y[$i]=$x; done; read -t 1; exec sleep 4"],
                         stdin=subprocess.PIPE, text=True)
    try:
        time.sleep(0.4)
        r = hs("attach", str(p.pid), "--track", "3", "--no-gdb", "--json", str(tmp_path / "a.json"))
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    # THEN it says so, unloads nothing from the new program, which runs on and ends as it would
    assert r.returncode == 0, r.stderr
    t = json.loads((tmp_path / "a.json").read_text())["track"]
    assert t["ended"] and "execve" in t["note"], t["note"]
    assert rc == 0


STRICT_C = r"""
#include <linux/seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    char *keep = malloc(1 << 20);
    memset(keep, 1, 1 << 20);
    write(1, "ready\n", 6);
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT);
    char b[64];
    while (syscall(SYS_read, 0, b, sizeof b) > 0) {}
    syscall(SYS_exit, keep[5]);   /* exit_group is not allowed in strict mode */
}
"""


def test_a_process_under_seccomp_gets_no_call_of_ours(tmp_path):
    # GIVEN a process in seccomp's strict mode (any system call but read, write, exit and
    # sigreturn kills it), blocked in read()
    src, exe = tmp_path / "strict.c", tmp_path / "strict"
    src.write_text(STRICT_C)
    subprocess.run(["cc", "-O1", "-o", str(exe), str(src)], check=True)
    p = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        # WHEN each of --leaks, --trim and --track is asked, and a plain attach
        rs = [hs("attach", str(p.pid), opt, *extra, "--no-gdb")
              for opt, *extra in (("--leaks",), ("--trim",), ("--track", "1"))]
        plain = hs("attach", str(p.pid))
        time.sleep(0.2)
        alive = p.poll() is None
        p.stdin.write(b"x")
        p.stdin.close()
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    # THEN each is refused in one line and the process lives on: it reads what it is given
    # and ends its own way (a call of ours would have killed it)
    for r in rs:
        assert r.returncode == 3 and "seccomp filter" in r.stderr, r.stderr
    assert plain.returncode == 0 and "seccomp filter" in " ".join(plain.stderr.split())
    assert alive and rc == 1


def test_an_interrupt_ends_the_track_and_unloads_the_library(tmp_path):
    # GIVEN a service followed for 30 s
    p, _, _ = start_service("--leak-kib", "4000000", leaked=False)
    try:
        before = state(p.pid)
        cmd = subprocess.Popen([*HS, "attach", str(p.pid), "--track", "30", "--json",
                                str(tmp_path / "a.json")], stderr=subprocess.PIPE, text=True)
        # WHEN Ctrl-C comes 1.5 s in
        time.sleep(1.5)
        cmd.send_signal(signal.SIGINT)
        err = cmd.communicate(timeout=60)[1]
        after = state(p.pid)
    finally:
        rc, _, stderr = finish(p)
    # THEN what it saw is told and saved, the library is gone from the service, which ends
    # as it would have; heapsight exits 130
    assert cmd.returncode == 130, err
    t = json.loads((tmp_path / "a.json").read_text())["track"]
    assert t["interrupted"] and t["unloaded"] and "interrupt" in t["note"]
    assert top_site(t["sites"]["moments"][0]).startswith("leak_request")
    assert after == before
    assert rc == 0 and stderr == ""
