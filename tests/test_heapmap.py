"""The heap map (native/src/heapmap.c, heapsight.heapmap): a fork()ed copy of the program
measures what a release would give back and walks glibc's heaps page by page; the pinners
name the blocks that keep otherwise-free pages resident. Checked against hs-pin, whose
layout is known to the byte, and against the release the exit probe really makes."""

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import scenario
from heapsight import heapmap as H
from heapsight.live import heapmaps as HL
from heapsight import layout as L
from heapsight.live import segment as S
from heapsight.live import readloop
from heapsight.native import LIB

PAGE = os.sysconf("SC_PAGESIZE")
JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")


# maps asked for while the program runs (heapmap_seq) are taken by the library's thread,
# which runs only when the CLI says it will ask (snapshots)
WHILE_RUNNING = {"HEAPSIGHT_MAPS_WHILE_RUNNING": "1"}


def maps_after_exit(seg) -> dict:
    """The maps beside the segment, once the exit map's copy (which closed every fd it had
    of the program's, so the program's pipes end before it does) has written its file."""
    HL.wait_exit_map(seg)
    return HL.collect(seg.path)


def start(*command, at_exit=True, preload=(), env=None, **popen):
    """The program under the preload library (and any allocator after it) with a segment
    of this process's, asking for the map at exit when at_exit."""
    seg = S.Segment()
    if at_exit:
        HL.at_exit(seg)
    e = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    e.update(env or {})
    e.update(LD_PRELOAD=":".join([LIB, *map(str, preload)]), HEAPSIGHT_SEGMENT=seg.path)
    return subprocess.Popen(command, env=e, text=True, **popen), seg


def run(*command, timeout=60, **kw):
    p, seg = start(*command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        seg.close()
        raise
    return p.returncode, out, err, seg


def pin(*args, tmp_path, **kw):
    """hs-pin with its keepers' addresses; returns (truth, keepers, exit map, segment)."""
    addrs = tmp_path / "keepers.txt"
    rc, out, err, seg = run(scenario("hs-pin"), *args, "--addrs", str(addrs), **kw)
    assert rc == 0, err
    truth = dict(kv.split("=", 1) for kv in out.split("pin:", 1)[1].split())
    keepers = np.array([int(x, 16) for x in addrs.read_text().split()], dtype=np.int64)
    maps = maps_after_exit(seg)
    assert set(maps) == {H.EXIT}, maps
    return truth, keepers, maps[H.EXIT], seg


def real_release(seg) -> int:
    """What the exit probe's own release gave back (anonymous RSS before less after)."""
    assert seg.get("exit_probe_status") == L.PROBE_DONE
    return seg.get("exit_anon_before") - seg.get("exit_anon_after")


def keeper_pages(hm, keepers):
    """(heap index, page) of each keeper block's first byte."""
    out = set()
    for i, h in enumerate(hm.heaps):
        inside = keepers[(keepers >= h.start) & (keepers < h.end(PAGE))]
        out |= {(i, int(p)) for p in (inside - h.start) // PAGE}
    return out


def pinned_pages(hm):
    return {(i, int(p)) for i, h in enumerate(hm.heaps) for p in np.nonzero(H.pinned(h, PAGE))[0]}


@pytest.mark.parametrize("every,free_keepers", [(16384, 0), (4096, 0), (4096, 1)])
def test_the_measured_release_is_what_trim_gives_back(tmp_path, every, free_keepers):
    # GIVEN 64 MiB freed around one 40-byte keeper block every `every` bytes (or none kept)
    truth, keepers, hm, seg = pin("--mib", "64", "--every", str(every),
                                  "--free-keepers", str(free_keepers), tmp_path=tmp_path)
    try:
        assert truth["contiguous"] == "1"
        # WHEN the map at exit ran in a copy, before the exit probe's real malloc_trim
        # THEN the copy's release is the real one within 2% of the heap (or 1 MiB)
        real = real_release(seg)
        assert hm.status == "mapped" and hm.allocator == "glibc"
        assert abs(hm.release_measured_bytes - real) <= max(1 << 20, 0.02 * (64 << 20)), (hm, real)
        # and the pagemap of the heaps says the same as RSS
        assert abs(hm.released_pages * PAGE - hm.release_measured_bytes) <= 1 << 20
        pages = (64 << 20) // PAGE
        if free_keepers:
            # nothing pins: after the release (or before: glibc trims the top on a free that
            # grows it past 128 KiB) no more than a few pages of the heap stay resident
            after = sum(int(((h.flags & H.AFTER) != 0).sum()) for h in hm.heaps)
            assert after < 0.01 * pages, after
        elif every == 4096:
            assert hm.release_measured_bytes < 0.02 * (64 << 20)     # every page pinned
        else:
            # three pages of four come back: the keeper's page stays
            assert abs(hm.released_pages - pages * 3 // 4) <= 8, hm.released_pages
        assert seg.get("forks") == 0                # the map's child is not the program's
    finally:
        seg.close()


def test_pages_without_live_bytes_are_the_ones_the_release_drops(tmp_path):
    truth, keepers, hm, seg = pin("--mib", "64", "--every", "16384", tmp_path=tmp_path)
    try:
        h = hm.heaps[0]
        assert h.kind == "main" and h.walked
        was = (h.flags & H.BEFORE) != 0
        dropped = was & ((h.flags & H.AFTER) == 0)
        empty = was & (h.live == 0)
        # a page with a live byte is never dropped
        assert not (dropped & (h.live > 0)).any()
        # a page without one is dropped unless it holds bytes of the allocator's own that a
        # release keeps (a chunk header, a free chunk's links, the top's first 33 bytes) or
        # a block in a thread's tcache: then exactly those stay
        kept_for_a_reason = (h.flags & (H.ALLOC | H.TCACHE)) != 0
        assert np.array_equal(dropped, empty & ~kept_for_a_reason)
        assert dropped.sum() == hm.released_pages
    finally:
        seg.close()


@pytest.mark.parametrize("every", [4096, 16384])
def test_the_pinned_pages_are_the_keepers_pages(tmp_path, every):
    truth, keepers, hm, seg = pin("--mib", "64", "--every", str(every), tmp_path=tmp_path)
    try:
        n = int(truth["keepers"])
        assert len(keepers) == n == (64 << 20) // every
        # every keeper's page stays resident, pinned by its 40 bytes
        kp, pp = keeper_pages(hm, keepers), pinned_pages(hm)
        assert len(kp) == n and kp <= pp
        assert len(pp - kp) <= 8, sorted(pp - kp)[:10]   # the program's other small blocks
        h = hm.heaps[0]
        # usable bytes of a 40-byte request: 40; the first page also holds the last 8
        # usable bytes of the pad block before it
        first = (int(keepers.min()) - h.start) // PAGE
        assert {int(h.live[p]) for _, p in kp if p != first} == {40} and h.live[first] == 48
        # the summary entry: the arena's pinned pages, its occupancy by page
        j = H.to_json(hm, "exit", start_ns=seg.get("start_ns"))
        a0 = j["arenas"][0]
        assert a0["arena"] == 0 and a0["pinned_pages"] == len(pp) and a0["walked"]
        occ = np.frombuffer(base64.b64decode(a0["heaps"][0]["occupancy"]), np.uint8)
        fl = np.frombuffer(base64.b64decode(a0["heaps"][0]["flags"]), np.uint8)
        assert len(occ) == len(fl) == a0["heaps"][0]["pages"] == h.pages
        assert {int(occ[p]) for _, p in kp} == {-(-40 * 255 // PAGE)}
        assert 0 <= j["t_s"] < 60
        # the pinners: every keeper seen (p = 1) shares its page's free bytes alone
        blocks = [(int(a), 40, 1.0, 7) for a in keepers]
        (top,) = H.pinners(hm, blocks)
        first_share = round((PAGE - 48) * 40 / 48)
        assert top == {"stack": 7, "blocks": n, "block_bytes": 40,
                       "pinned_bytes": (n - 1) * (PAGE - 40) + first_share, "error_bytes": 0}
    finally:
        seg.close()


def test_thread_arenas_are_walked(tmp_path):
    # GIVEN 4 threads, each filling 16 MiB of its own arena around its keepers
    truth, keepers, hm, seg = pin("--mib", "16", "--every", "8192", "--threads", "4",
                                  tmp_path=tmp_path)
    try:
        assert hm.status == "mapped" and not hm.note
        threads = [h for h in hm.heaps if h.kind == "thread"]
        assert threads and all(h.walked for h in hm.heaps)
        assert sorted({h.arena for h in threads}) == [1, 2, 3, 4]
        # each thread's keepers are in one arena's heaps, each on a pinned page
        kp = keeper_pages(hm, keepers)
        assert len(kp) == len(keepers) == int(truth["keepers"]) == 4 * (16 << 20) // 8192
        assert kp <= pinned_pages(hm)
        by_arena = {}
        for i, _ in kp:
            by_arena[hm.heaps[i].arena] = by_arena.get(hm.heaps[i].arena, 0) + 1
        assert sorted(by_arena.values()) == [2048] * 4
        # glibc trims a thread arena's top only on free(), never in malloc_trim: the map
        # and the real release agree on that too
        assert abs(hm.release_measured_bytes - real_release(seg)) <= 1 << 20
        j = H.to_json(hm)
        assert [a["arena"] for a in j["arenas"]] == [0, 1, 2, 3, 4]
        assert all(a["pinned_pages"] >= 2048 for a in j["arenas"][1:])
    finally:
        seg.close()


def test_jemalloc_is_mapped_from_the_hooks_record_and_its_size_classes_pin_nothing(tmp_path):
    if not JEMALLOC.exists():
        pytest.fail(f"{JEMALLOC} is missing: `make test` installs the allocators (scripts/install-deps)")
    # GIVEN hs-pin's layout (a 40-byte keeper, then a 16,344-byte filler, 4,096 times; the
    # fillers freed), decay off: jemalloc returns nothing by itself, the purge the fillers
    truth, keepers, hm, seg = pin("--mib", "64", "--every", "16384", tmp_path=tmp_path,
                                  preload=[JEMALLOC],
                                  env={"MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"})
    try:
        # THEN its pages are mapped: its mappings, as the hooks recorded them
        assert hm.allocator == "jemalloc" and hm.status == "mapped", hm.status
        assert hm.heaps and {h.kind for h in hm.heaps} == {"allocator"}
        # the release measured in the copy is the one the program's own exit made
        real = real_release(seg)
        assert real > 32 << 20
        assert abs(hm.release_measured_bytes - real) <= max(1 << 20, 0.02 * real)
        # every keeper is on a page whose live bytes hold it (48 bytes: its size class)
        starts = np.array([h.start for h in hm.heaps])
        for k in keepers:
            h = hm.heaps[int(np.searchsorted(starts, k, side="right")) - 1]
            assert h.start <= k < h.end(PAGE)
            assert h.live[(k - h.start) // PAGE] >= 48, hex(k)
        # the live bytes are the keepers' and the few others': glibc's keepers each pin a
        # page (test_the_pinned_pages_are_the_keepers_pages), jemalloc's sit together in
        # 48-byte slabs, apart from the fillers: nothing is pinned, the fillers' pages went
        live = sum(h.live_bytes for h in hm.heaps)
        assert 48 * len(keepers) <= live <= 48 * len(keepers) + (512 << 10), live
        assert sum(int(H.pinned(h, PAGE).sum()) for h in hm.heaps) * PAGE < 256 << 10
        assert H.to_json(hm)["arenas"][0]["live_bytes"] == live
    finally:
        seg.close()


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc", "mimalloc"])
def test_other_allocators_pages_pinned_by_one_small_block_each_are_named(tmp_path, allocator):
    # GIVEN 64 MiB of 64-byte blocks on 2 threads, one block in 64 kept (about one per 4
    # KiB page: each allocator packs a size class together; the scenario counts the pages
    # its kept blocks are on, as tcmalloc's caches now and then put two on one page)
    from test_allocators import allocator_lib
    js = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "heapsight", "run", "--no-save", "--json", str(js),
                        "--", scenario("hs-retention"), "--mb", "64", "--threads", "2",
                        "--block", "64", "--keep-every", "64"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "LD_PRELOAD": allocator_lib(allocator)})
    assert r.returncode == 0, r.stderr
    s = json.loads(js.read_text())
    (hm,) = [m for m in s["heapmaps"] if m["moment"] == "exit"]
    truth = dict(kv.split("=") for kv in r.stdout.split()[1:])
    kept_pages = int(truth["kept_pages"])
    assert 8192 <= kept_pages <= 16384, truth   # tcmalloc: 14,300-16,384 here
    # THEN the exit's map is the allocator's pages, and the kept blocks' pages are pinned,
    # every one (but a few the runtime's own blocks fill past a quarter), which no release
    # returns
    assert hm["allocator"] == allocator and hm["status"] == "mapped", hm["status"]
    pinned = sum(a["pinned_pages"] for a in hm["arenas"])
    assert kept_pages - 20 <= pinned <= kept_pages + 20, (pinned, kept_pages)
    # the pinners name the code that allocated the kept blocks
    assert hm["pinners"] and hm["pinners"][0]["site"].startswith("worker (retention.c:"), hm["pinners"][:2]
    assert hm["pinners"][0]["pinned_bytes"] > 32 << 20, hm["pinners"][0]
    # and the reason says so, measured, before the allocator's own mechanism
    from heapsight.fmt import human
    assert f"{human(pinned * PAGE)} of heap pages hold only a few live bytes each" in \
        " ".join(r.stderr.split()), r.stderr[-3000:]


def test_a_map_at_a_snapshot_through_heapmap_seq(tmp_path):
    # GIVEN hs-pin holding its freed heap, no map asked for at exit
    p, seg = start(scenario("hs-pin"), "--mib", "32", "--every", "16384", "--hold", "1",
                   at_exit=False, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, env=WHILE_RUNNING)
    try:
        for line in p.stdout:
            if line.startswith("pin: ready"):
                break
        # WHEN the CLI asks for map 1, then map 2, and pokes: the program's next allocator
        # call (one per line it reads) takes each
        t0 = time.monotonic_ns()
        for n in (1, 2):
            HL.request(seg, n)
            readloop.poke(seg)
            time.sleep(0.2)
            assert int(seg.header["heapmap_ack"]) == n - 1, "answered with no allocator call"
            p.stdin.write("go\n")
            p.stdin.flush()
            assert HL.wait_ack(seg, n, timeout_s=30, alive=lambda: p.poll() is None)
            assert HL.wait_written(seg.path, n, timeout_s=30)
        # THEN each is written and answered; no child of the map is left behind
        names = sorted(os.path.basename(x) for x in Path(seg.path).parent.glob(Path(seg.path).name + ".map.*"))
        assert names == [Path(seg.path).name + ".map.1", Path(seg.path).name + ".map.2"]
        # (a thread of the program's made it: each thread's children are listed apart)
        def children():
            return [c for t in Path(f"/proc/{p.pid}/task").iterdir()
                    for c in (t / "children").read_text().split()]
        deadline = time.monotonic() + 5   # the file is whole a moment before the copy ends
        while children() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert children() == [], "a map's process is still the program's child (a zombie?)"
        maps = maps_after_exit(seg)
        assert sorted(maps) == [1, 2]
        for hm in maps.values():
            assert hm.status == "mapped" and hm.time_ns >= t0
            assert hm.release_measured_bytes > 16 << 20        # 3/4 of 32 MiB come back
        assert maps[1].heaps[0].live_bytes == maps[2].heaps[0].live_bytes
        p.stdin.close()
        assert p.wait(timeout=30) == 0
        # the program itself kept its memory: the exit probe's release still finds it
        assert real_release(seg) > 16 << 20
        assert seg.get("forks") == 0
        assert maps_after_exit(seg) == {}                        # none at exit: not asked
        assert not list(Path(seg.path).parent.glob(Path(seg.path).name + ".map*"))
    finally:
        if p.poll() is None:
            p.kill()
        seg.close()


def test_the_program_output_and_exit_status_are_unchanged():
    code = ("import sys; blocks = [bytearray(100) for _ in range(20000)]; del blocks[::2]; "
            "print('out', len(blocks)); sys.stderr.write('err'); sys.exit(7)")
    bare = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    rc, out, err, seg = run(sys.executable, "-c", code)
    try:
        assert (rc, out, err) == (bare.returncode, bare.stdout, bare.stderr) == (7, "out 10000\n", "err")
        (hm,) = maps_after_exit(seg).values()
        assert hm.status == "mapped"
        # the copy's CPU time is its own: it outlives the program (which does not wait
        # for it), so none of it is in the program's
        assert hm.child_cpu_ns > 0
        assert not list(Path(seg.path).parent.glob(Path(seg.path).name + ".map.*"))
    finally:
        seg.close()


@pytest.mark.parametrize("code", [
    "import signal; heard = []; signal.signal(signal.SIGCHLD, lambda *a: heard.append(1))",
    "import subprocess; child = subprocess.Popen(['sleep', '30'])",
])
def test_a_map_is_taken_where_a_child_process_could_disturb_the_program(code):
    # a program's SIGCHLD handler, or its wait for any child, never meets the map's copy:
    # it is made with no exit signal, invisible to wait() without __WALL; each line the
    # program reads makes an allocator call, where a map asked for is taken
    code += ("; import os, sys; print('ready', flush=True); "
             "[bytearray(4096) for line in sys.stdin]; "
             "c = globals().get('child'); r = os.waitpid(-1, os.WNOHANG) if c else (0, 0); "
             "c and (c.kill(), c.wait()); "
             "print('heard', len(globals().get('heard', [])), 'waited', r[0], flush=True)")
    p, seg = start(sys.executable, "-c", code, at_exit=False, env=WHILE_RUNNING, stdin=subprocess.PIPE,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline() == "ready\n"
        for n in (1, 2, 3):
            HL.request(seg, n)
            readloop.poke(seg)
            p.stdin.write("go\n")
            p.stdin.flush()
            assert HL.wait_ack(seg, n, timeout_s=30)
            assert HL.wait_written(seg.path, n, timeout_s=30)
        maps = maps_after_exit(seg)
        assert sorted(maps) == [1, 2, 3]
        assert all(hm.status == "mapped" and hm.heaps for hm in maps.values()), maps
        out, err = p.communicate(input="", timeout=30)
        # no SIGCHLD reached the handler, and waitpid(-1) found nothing to reap
        assert p.returncode == 0 and out == "heard 0 waited 0\n", (out, err)
        assert seg.get("exit_probe_status") == L.PROBE_DONE   # the exit figures all the same
    finally:
        if p.poll() is None:
            p.kill()
        seg.close()


def test_exit_from_a_signal_handler_inside_malloc_still_ends(tmp_path):
    # the exit probe's map and release each give up on an arena lock that stays taken
    seen = set()
    for _ in range(10):
        rc, out, err, seg = run(scenario("hs-exit-signal"), "--after-ms", "20", timeout=60)
        try:
            assert rc == 0, err
            (hm,) = maps_after_exit(seg).values()
            seen.add(hm.status.split(":")[0])
            # the map gives up on a lock held for 0.2 s (its copy takes them), saying so; the
            # release after it then finds the lock held too
            if seg.get("exit_probe_status") == L.PROBE_ALLOCATOR_LOCKED:
                assert hm.status.startswith("not mapped: ") and "lock" in hm.status, hm.status
            else:
                assert hm.status == "mapped" or "kept the main arena's lock" in hm.status, hm.status
        finally:
            seg.close()
    assert seen


# -- the pinners, on maps whose answer is known -------------------------------------------
def synthetic(live, flags, start=0x10000):
    h = H.Heap(start, 0, "main", True, 0, int(np.sum(live)), 0, 0, 0,
               np.array(live, dtype=np.uint32), np.array(flags, dtype=np.uint8))
    return H.HeapMap("mapped", "glibc", PAGE, 0, 0, 0, 0, 0, 0, 0, 0, 0, True, 0, 0, 0, "", [h])


def test_pinners_share_each_pinned_page_among_its_blocks():
    R = H.BEFORE | H.AFTER
    start = 0x10000
    # page 0: two blocks, 100 and 300 bytes: pinned (400 live < a quarter)
    # page 1: a 2000-byte block: resident but not pinned (half live)
    # page 2: a 64-byte block, released (not resident after): not pinned
    # page 3: a block of 200 bytes straddling into page 4 (100 + 100), both pinned
    hm = synthetic([400, 2000, 64, 100, 100], [R, R, H.BEFORE, R, R], start)
    blocks = np.array([(start + 0, 100, 1.0, 1), (start + 200, 300, 1.0, 2),
                       (start + PAGE, 2000, 1.0, 3), (start + 2 * PAGE, 64, 1.0, 4),
                       (start + 4 * PAGE - 100, 200, 1.0, 5)],
                      dtype=[("addr", "<i8"), ("size", "<i8"), ("p", "<f8"), ("stack", "<i8")])
    got = {e["stack"]: e for e in H.pinners(hm, blocks)}
    free0, free3 = PAGE - 400, PAGE - 100
    assert set(got) == {1, 2, 5}
    assert got[1]["pinned_bytes"] == round(free0 * 100 / 400)
    assert got[2]["pinned_bytes"] == round(free0 * 300 / 400)
    assert got[5]["pinned_bytes"] == 2 * free3          # alone on both of its pages
    assert [e["stack"] for e in H.pinners(hm, blocks)] == [5, 2, 1]
    assert all(e["error_bytes"] == 0 and e["blocks"] == 1 for e in got.values())


def test_a_sampled_block_stands_for_1_over_p():
    R = H.BEFORE | H.AFTER
    hm = synthetic([64] * 10, [R] * 10)
    # one block of 64 B seen per page, each sampled with p = 0.25: 40 blocks, 4 times the bytes
    blocks = [(0x10000 + i * PAGE, 64, 0.25, 9) for i in range(10)]
    # on two of the pages: 2 blocks seen stand for 8, 4 times the bytes (still under what
    # the map measured on its 10 pinned pages)
    (e,) = H.pinners(hm, blocks[:2])
    assert e["blocks"] == 8 and e["block_bytes"] == 64
    assert e["pinned_bytes"] == 2 * (PAGE - 64) * 4
    # variance: sum of share^2 (1 - p) / p^2
    assert e["error_bytes"] == round(1.96 * np.sqrt(2 * (PAGE - 64) ** 2 * 0.75 / 0.0625))
    # on every page they would stand for 4 times what the map measured: scaled down to it,
    # blocks and error alike
    (e,) = H.pinners(hm, blocks)
    assert e["pinned_bytes"] == 10 * (PAGE - 64) and e["blocks"] == 10
    assert e["error_bytes"] == round(1.96 * np.sqrt(10 * (PAGE - 64) ** 2 * 0.75 / 0.0625) / 4)
    # an unwalked heap pins nothing it can name
    hm.heaps[0].walked = False
    assert H.pinners(hm, blocks) == []


def test_a_cut_short_map_is_refused_and_removed(tmp_path):
    seg_path = str(tmp_path / "x.seg")
    good = H.HEADER_DTYPE.itemsize + 8
    head = np.zeros((), H.HEADER_DTYPE)
    head["magic"], head["version"], head["header_bytes"] = H.MAGIC, H.VERSION, H.HEADER_DTYPE.itemsize
    head["file_bytes"], head["status"], head["why"] = good, 1, b"because"
    Path(seg_path + ".map.exit").write_bytes(head.tobytes() + np.uint64(H.END).tobytes())
    head["file_bytes"] = good + 100
    Path(seg_path + ".map.3").write_bytes(head.tobytes() + np.uint64(H.END).tobytes())
    maps = HL.collect(seg_path)
    assert list(maps) == [H.EXIT] and maps[H.EXIT].status == "not mapped: because"
    assert not list(tmp_path.glob("x.seg.map.*"))
