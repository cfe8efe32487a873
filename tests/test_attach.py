"""heapsight attach on real long-running processes: the split agrees with `heapsight run`
on the same program at the same phase, the release estimate with the measured release,
and the process is alive and behaves the same afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import scenario

MiB = 1 << 20
HS = [sys.executable, "-m", "heapsight"]
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def hs(*args, cwd=None, timeout=120):
    return subprocess.run([*HS, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def holder(env=None):
    """The retention scenario holding 256 MiB of freed memory for a minute."""
    p = subprocess.Popen([scenario("hs-retention"), "--hold-ms", "60000"], stdout=subprocess.PIPE,
                         text=True, env={**os.environ, **(env or {})})
    deadline = time.time() + 30
    while time.time() < deadline:   # wait for the hold: its 8 workers have come and gone
        time.sleep(0.02)
        threads = int(open(f"/proc/{p.pid}/status").read().split("Threads:")[1].split()[0])
        try:   # the main thread in its sleep (clock_nanosleep, nanosleep): the frees are done
            call = open(f"/proc/{p.pid}/syscall").read().split()[0]
        except (OSError, IndexError):
            continue
        if call in ("230", "35") and threads <= 2:   # main, and heapsight's helper when preloaded
            return p
    p.kill()
    raise AssertionError("the scenario did not reach its hold phase")


def attach_json(pid, *extra, cwd):
    out = os.path.join(cwd, f"a{time.monotonic_ns()}.json")
    p = hs("attach", str(pid), "--json", out, *extra, cwd=cwd)
    assert p.returncode == 0, p.stderr
    return json.load(open(out)), p.stderr


@pytest.mark.parametrize("allocator", ["glibc", pytest.param("jemalloc", marks=pytest.mark.gdb_calls)])
def test_attach_agrees_with_run_and_trim_with_its_estimate(tmp_path, allocator):
    env = {"LD_PRELOAD": JEMALLOC} if allocator == "jemalloc" else {}
    # GIVEN what `heapsight run` says of the same program at exit (before its release)
    ran = hs("run", "-q", "--no-save", "--json", str(tmp_path / "r.json"), "--",
             scenario("hs-retention"), cwd=tmp_path) if allocator == "glibc" else None
    p = holder(env)
    try:
        a, err = attach_json(p.pid, cwd=tmp_path)
        assert a["allocator"] == allocator
        assert a["retained_bytes"] > 30 * MiB and "RETENTION" in a["verdict"]
        if ran is not None:
            assert ran.returncode == 0, ran.stderr
            r = json.load(open(tmp_path / "r.json"))["final"]
            assert abs(a["retained_bytes"] - r["retained_bytes"]) <= 0.05 * r["retained_bytes"]
            in_use = r["live_bytes"] + r["waste_bytes"] + r["metadata_bytes"]
            assert abs(a["in_use_bytes"] - in_use) <= 0.05 * in_use + 256 * 1024
        # WHEN asked to trim THEN the measured release is what the estimate said (10%)
        t, _ = attach_json(p.pid, "--trim", cwd=tmp_path)
        given = t["trim"]["gave_back_bytes"]
        assert given > 20 * MiB
        assert abs(given - a["release_estimate_bytes"]) <= 0.1 * given
        # and the process is alive, and not stopped
        state = open(f"/proc/{p.pid}/stat").read().split(")")[1].split()[0]
        assert state in ("S", "R"), state
    finally:
        p.kill()
        p.wait()


ECHO = {"perl": ["perl", "-e", '$|=1; my @keep; while (my $l = <STDIN>) { push @keep, "x" x 1000 '
                               'for 1..2000; print "echo:$l" }'],
        "python3": ["/usr/bin/python3", "-u", "-c",
                    "import sys\nkeep=[]\nfor l in sys.stdin:\n    keep.append([dict(a=i) for i in "
                    "range(20000)])\n    print('echo:' + l, end='')\n"]}


@pytest.mark.parametrize("runtime", ["perl", "python3"])
def test_a_runtime_keeps_answering_after_attach(tmp_path, runtime):
    p = subprocess.Popen(ECHO[runtime], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        p.stdin.write("one\n")
        p.stdin.flush()
        assert p.stdout.readline() == "echo:one\n"
        a, err = attach_json(p.pid, cwd=tmp_path)
        assert a["allocator"] == "glibc" and a["in_use_bytes"] > 0
        assert sum(a["non_heap"].values()) + a["in_use_bytes"] + a["retained_bytes"] \
            == pytest.approx(a["rss_bytes"], rel=0.02)
        p.stdin.write("two\n")
        p.stdin.flush()
        assert p.stdout.readline() == "echo:two\n"   # alive and the same after attach
    finally:
        p.kill()
        p.wait()


def test_refusals_are_one_line_with_exit_3(tmp_path):
    p = hs("attach", "999999", cwd=tmp_path)
    assert p.returncode == 3 and "no process 999999" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("allocator", ["glibc", pytest.param("jemalloc", marks=pytest.mark.gdb_calls)])
def test_watch_ends_on_ctrl_c_and_keeps_its_record(tmp_path, allocator):
    target = holder({"LD_PRELOAD": JEMALLOC} if allocator == "jemalloc" else None)
    out = tmp_path / "w.hsrun.json.gz"
    try:
        w = subprocess.Popen([*HS, "attach", str(target.pid), "--watch", "--interval", "0.2",
                              "--stats-every", "0.5", "-o", str(out), "--openmetrics-port", "0"],
                             stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        time.sleep(2.5)
        w.send_signal(signal.SIGINT)
        _, err = w.communicate(timeout=60)
        assert w.returncode == 130, err
        assert "stopped by Ctrl-C" in err
        rep = hs("report", str(out), "-o", str(tmp_path / "w.html"), cwd=tmp_path)
        assert rep.returncode == 0, rep.stderr
        doc = json.loads(__import__("gzip").open(out).read())
        assert doc["summary"]["samples"] >= 5 and len(doc["attach"]) >= 2
        assert os.path.exists(f"/proc/{target.pid}")
    finally:
        target.kill()
        target.wait()


@pytest.mark.parametrize("allocator", ["glibc", pytest.param("jemalloc", marks=pytest.mark.gdb_calls)])
def test_the_exporter_serves_prometheus_metrics(tmp_path, allocator):
    from heapsight.live import attach
    from heapsight.reporters import openmetrics
    target = holder({"LD_PRELOAD": JEMALLOC} if allocator == "jemalloc" else None)
    try:
        a = attach.inspect(target.pid)
        ex = openmetrics.serve("127.0.0.1", 0)
        try:
            ex.update(a)
            port = ex.server.server_port
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        finally:
            ex.close()
    finally:
        target.kill()
        target.wait()
    line = next(x for x in text.splitlines()
                if x.startswith("heapsight_memory_bytes{") and 'kind="retained"' in x)
    assert f'pid="{target.pid}"' in line and f'allocator="{allocator}"' in line
    assert float(line.split()[-1]) > (200 if allocator == "glibc" else 20) * MiB
    assert "heapsight_release_estimate_bytes{" in text


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.gdb_calls
def test_a_real_prometheus_scrapes_heapsight(tmp_path):
    # GIVEN heapsight watching a process and serving /metrics, and Prometheus scraping it
    target = holder()
    port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: heapsight\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
    watch = subprocess.Popen([*HS, "attach", str(target.pid), "--watch", "--interval", "0.5",
                              "--stats-every", "5", "-o", str(tmp_path / "w.hsrun.json.gz"),
                              "--openmetrics-port", str(port)], stderr=subprocess.PIPE,
                             text=True, cwd=tmp_path)
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        # WHEN Prometheus has scraped a few times THEN its API gives heapsight's series back
        query = (f"http://127.0.0.1:{prom_port}/api/v1/query?query="
                 "heapsight_memory_bytes%7Bkind%3D%22retained%22%7D")
        result, deadline = [], time.time() + 150   # Prometheus starts slowly on a busy machine
        while not result and time.time() < deadline:
            time.sleep(1)
            try:
                result = json.loads(urllib.request.urlopen(query, timeout=5).read())["data"]["result"]
            except OSError:
                continue
        assert result, "Prometheus never scraped the series"
        (series,) = result
        assert series["metric"]["pid"] == str(target.pid)
        assert series["metric"]["allocator"] == "glibc" and series["metric"]["job"] == "heapsight"
        assert float(series["value"][1]) > 200 * MiB
    finally:
        prom.terminate()
        watch.send_signal(signal.SIGINT)
        watch.communicate(timeout=60)
        prom.wait(timeout=30)
        target.kill()
        target.wait()


@pytest.mark.gdb_calls
def test_a_service_started_with_heapsight_env_gives_exact_figures_and_a_page(tmp_path):
    # GIVEN a program started with the environment `heapsight env` prints
    env_lines = subprocess.run([*HS, "env"], capture_output=True, text=True, timeout=60).stdout
    env = dict(os.environ)
    for line in env_lines.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.split("${")[0].strip("'")
    assert env["HEAPSIGHT_SEGMENT"] == "auto" and env["LD_PRELOAD"].endswith("libheapsight.so")
    p = holder(env)
    try:
        seg = f"/dev/shm/heapsight-{p.pid}-auto.seg"
        assert os.path.exists(seg)
        # WHEN attached THEN live bytes and waste are the library's exact counters
        a, err = attach_json(p.pid, "--html", str(tmp_path / "a.html"), cwd=tmp_path)
        assert a["preloaded"] is True and "exact counters" in err
        truth = 4 * MiB   # 4,096 blocks of 1 KiB kept
        assert abs(a["live_bytes"] - truth) < 0.01 * truth
        assert "RETENTION" in a["verdict"]
        page = (tmp_path / "a.html").read_text()
        assert f"attach {p.pid}" in page and "Where the RSS went" in page
    finally:
        p.kill()
        p.wait()
        if os.path.exists(seg):   # killed: its clean-up at exit did not run
            os.unlink(seg)


def test_run_serves_its_split_to_prometheus_while_the_program_runs(tmp_path):
    port = free_port()
    p = subprocess.Popen([*HS, "run", "-q", "--no-save", "--openmetrics-port", str(port), "--",
                          scenario("hs-retention"), "--hold-ms", "2500"], cwd=tmp_path,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        text, deadline = "", time.time() + 60
        while 'kind="retained"' not in text and time.time() < deadline:
            time.sleep(0.3)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                continue
        line = next(x for x in text.splitlines()
                    if x.startswith("heapsight_memory_bytes{") and 'kind="retained"' in x)
        assert 'command="hs-retention"' in line
        assert p.wait(timeout=60) == 0, p.stderr.read()
    finally:
        p.kill()
        p.wait()


def test_a_python_process_s_own_heap_is_named_with_what_to_try(tmp_path):
    # GIVEN python3 that made 300,000 small objects and kept 1 in 500 (pymalloc's arenas,
    # outside malloc, stay: an arena goes back only when every object in it is gone)
    prog = ("import sys, time\nx = [bytes(100) for _ in range(300000)]\nx = x[::500]\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen(["python3", "-c", prog], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        # WHEN heapsight attaches
        got, err = attach_json(p.pid, cwd=tmp_path)
        # THEN the memory malloc did not give is put on the runtime the process runs, with
        # the rule it keeps memory by and what to try
        assert got["non_heap"]["other anonymous"] >= 30 * MiB, got["non_heap"]
        assert got["runtime"] == "the CPython object allocator (pymalloc arenas)"
        assert got["verdict"].startswith("NON-HEAP MEMORY") and "PYTHONMALLOC=malloc" in got["verdict"]
        # (its pools read: what of it is free in pymalloc's arenas, beside the objects)
        assert "free in pymalloc's arenas" in got["verdict"], got["verdict"]
        assert 0 < got["py_objects_bytes"] < got["non_heap"]["other anonymous"] / 10, got
        # (wrapped to the terminal, as run's verdict is)
        verdict = err[err.index("VERDICT"):].split("\n\n")[0].splitlines()
        assert len(verdict) > 1 and max(len(line) for line in verdict) <= 100, verdict
        assert p.poll() is None   # and it is still running
    finally:
        p.kill()
        p.wait()


def test_a_thread_heaps_free_top_is_retention_not_fragmentation(tmp_path):
    from test_thread_tops import TOPS
    src, exe = tmp_path / "tops.c", tmp_path / "tops"
    # GIVEN the program of test_thread_tops, holding its thread heap's 24 MiB free top
    src.write_text(TOPS.replace("return 0;\n}", 'puts("ready"); fflush(stdout); sleep(60); return 0;\n}')
                   .replace("#include <string.h>", "#include <string.h>\n#include <stdio.h>\n#include <unistd.h>"))
    subprocess.run(["cc", "-O1", "-fno-builtin", "-pthread", "-o", str(exe), str(src)], check=True)
    p = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        got, _ = attach_json(p.pid, cwd=tmp_path)
        # THEN the verdict puts it on the top of the thread's heap, which malloc_trim leaves,
        # with the start-up setting that returns it
        assert got["retained_bytes"] >= 20 * MiB, got
        assert got["verdict"].startswith("RETENTION") and "free top of the threads' heaps" in got["verdict"]
        assert "trim_threshold=131072" in got["verdict"]
        # and --trim confirms malloc_trim gives back little of it
        trimmed, _ = attach_json(p.pid, "--trim", cwd=tmp_path)
        assert trimmed["trim"]["gave_back_bytes"] < 2 * MiB, trimmed["trim"]
    finally:
        p.kill()
        p.wait()


MERGED_CHUNK = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
int main(void) {
  /* room for both, then a mapping of the program's own at its top: glibc's mapping for the
   * block goes right below it (the kernel maps top-down), with the same flags, and the
   * kernel merges the two into one mapping, the chunk at its start */
  size_t n = 10u << 20, own = 1u << 20;
  char *room = mmap(NULL, 64u << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (room == MAP_FAILED) return 2;
  munmap(room, 64u << 20);
  char *q = mmap(room + (64u << 20) - own, own, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (q == MAP_FAILED) return 3;
  memset(q, 2, own);
  char *p = malloc(n);                 /* glibc maps it: an mmapped chunk */
  memset(p, 1, n);
  char *chunk = p - 16;
  size_t size = ((size_t *)chunk)[1] & ~(size_t)7;
  printf("chunk=%p size=%zu own=%p\n", (void *)chunk, size, (void *)q);
  fflush(stdout);
  pause();
  return 0;
}
"""


def test_an_mmapped_chunk_merged_with_the_next_mapping_is_in_use(tmp_path):
    # GIVEN a process whose 10 MiB malloc'd block (an mmapped chunk) shares one mapping with
    # a mapping of its own the kernel merged after it
    from conftest import compile_c
    from heapsight.live import attach, procfs
    exe = compile_c(tmp_path, "merged_chunk", MERGED_CHUNK)
    p = subprocess.Popen([exe], stdout=subprocess.PIPE, text=True)
    try:
        said = dict(kv.split("=") for kv in p.stdout.readline().split())
        chunk, size = int(said["chunk"], 16), int(said["size"])
        assert chunk + size == int(said["own"], 16), said   # the kernel put them side by side
        maps = procfs.smaps(p.pid)
        m = next(m for m in maps if m.start == chunk)
        assert m.size > size, m   # merged: the mapping is more than the chunk
        # THEN the chunk is found (in use, not "other anonymous")
        n, total = attach._mmapped_chunks(p.pid, maps)
        assert (n, total) == (1, size)
    finally:
        p.kill()
        p.wait()
