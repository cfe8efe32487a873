"""The release counted (native/src/heapmap.c: count_release; heapwalk.c: _hs_walk_fastbins):
where glibc's fastbins hold 65k chunks or more, running malloc_trim in the heap map's copy
merges each of them first (0.7 s of a perl that emptied a 1.5M-entry hash), so the copy
counts what it would give back from the pages by malloc_trim's own rule instead. Checked
page by page against the release run in the same copy (HEAPSIGHT_MAP_RELEASE=check), at
the exit and at a snapshot, and against the program's own malloc_trim at its exit."""

import os
import re
import subprocess
import sys

from conftest import compile_c
from test_heapmap import PAGE, maps_after_exit, real_release, run
from heapsight import heapmap as H
from heapsight import record

# Every kind of free chunk malloc_trim meets: fastbin chunks between live blocks, runs of
# them across pages and beside large free chunks, a run next to the top; in two thread
# arenas too, whose threads' tcaches are emptied into the fastbins as the threads end.
MIX = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static void churn(int n, unsigned r) {
  void **p = malloc(sizeof *p * n);
  for (int i = 0; i < n; i++) {
    r = r * 1103515245 + 12345;
    size_t sz = i % 97 == 0 ? 5000 + (r >> 16) % 20000 : 16 + (r >> 16) % 110;
    p[i] = malloc(sz);
    memset(p[i], 'a' + i % 26, sz);
  }
  for (int i = 0; i < n; i++) {
    int third = (i / 1000) % 3;
    int keep = i < n - 3000 && (third == 0 ? i % 2 : third == 1 ? i % 50 == 0 : 0);
    if (!keep) free(p[i]);
  }
}
static void *thread(void *a) { churn(150000, (unsigned)(long)a); return 0; }
int main(void) {
  churn(300000, 1);
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], 0, thread, (void *)(i + 7));
  for (int i = 0; i < 2; i++) pthread_join(t[i], 0);
  puts("mixed");
  return 0;
}
"""


def mixed(tmp_path, mode: str):
    exe = compile_c(tmp_path, "mixed", MIX, "-pthread")
    rc, out, err, seg = run(exe, env={"HEAPSIGHT_MAP_RELEASE": mode, "HEAPSIGHT_RELEASE_AT_EXIT": "1"})
    assert rc == 0 and out == "mixed\n", err
    hm = maps_after_exit(seg)[H.EXIT]
    return hm, seg


def check_note(hm) -> dict:
    """The check's figures: given back counted and run, pages whose flags differ, pages whose
    live bytes differ, heaps whose counts differ, the fastbins' chunks."""
    m = re.fullmatch(r"release check: counted and run (agree|differ): pages given back (\d+) and "
                     r"(\d+), pages whose flags differ (\d+), live bytes (\d+), heaps' counts "
                     r"(\d+); fastbin chunks (\d+)", hm.note)
    assert m, hm.note
    return dict(zip(("verdict", "counted", "run", "flags", "live", "heaps", "fast"),
                    (m[1], *map(int, m.groups()[1:]))))


def test_the_counted_release_is_the_run_one_page_by_page(tmp_path):
    # GIVEN a heap of fastbin chunks among live blocks, beside free chunks and the top, in
    # the main arena and two thread arenas
    # WHEN the copy counts the release, then runs it, and walks the heaps after each
    hm, seg = mixed(tmp_path, "check")
    try:
        c = check_note(hm)
        # THEN every page reads the same: given back or kept, its flags and its live bytes
        assert c["verdict"] == "agree" and c["counted"] == c["run"] == hm.released_pages, c
        assert c["flags"] == c["live"] == c["heaps"] == 0, c
        assert c["fast"] > 200_000 and hm.released_pages * PAGE > 40 << 20, c
        assert [h.kind for h in hm.heaps] == ["main", "thread", "thread"] and all(h.walked for h in hm.heaps)
    finally:
        seg.close()


def test_past_65k_fastbin_chunks_the_release_is_counted_and_is_what_the_program_then_gives_back(tmp_path):
    # GIVEN the same heap, the copy left to choose (HEAPSIGHT_MAP_RELEASE unset: auto)
    hm, seg = mixed(tmp_path, "auto")
    try:
        # THEN it counted (its fastbins held more than 65k chunks), and what it counted is
        # what the program's own malloc_trim at exit, after the copy, gave back
        assert hm.counted_fast_chunks > 200_000, hm
        real = real_release(seg)
        assert abs(hm.release_measured_bytes - real) <= max(1 << 20, 0.02 * real), (hm, real)
        assert hm.released_pages * PAGE == hm.release_measured_bytes
    finally:
        seg.close()


def test_few_fastbin_chunks_leave_the_release_run(tmp_path):
    # GIVEN a heap whose fastbins hold a few chunks (all 40-byte blocks kept)
    exe = compile_c(tmp_path, "few", r"""
#include <stdlib.h>
#include <string.h>
int main(void) {
  void *big[64], *small[1000];
  for (int i = 0; i < 64; i++) { big[i] = malloc(100000); memset(big[i], 1, 100000); }
  for (int i = 0; i < 1000; i++) small[i] = malloc(40);
  for (int i = 0; i < 64; i += 2) free(big[i]);
  for (int i = 0; i < 20; i++) free(small[i * 7]);
  return small[1] == 0;
}
""")
    rc, out, err, seg = run(exe)
    try:
        assert rc == 0, err
        hm = maps_after_exit(seg)[H.EXIT]
        # THEN the release was run, as ever: its time measured, nothing counted
        assert hm.counted_fast_chunks == 0 and hm.release_ns > 0, hm
        assert hm.released_pages > (32 * 100000 * 0.9) // PAGE, hm
    finally:
        seg.close()


def test_a_real_programs_counted_release_is_its_run_one(tmp_path):
    # GIVEN perl deleting two thirds of a 300k-entry hash of arrays: 400k fastbin chunks,
    # and blocks in use whose first word still holds the link they had in a fastbin or a
    # tcache (malloc leaves it), which look like fastbin chunks
    rc, out, err, seg = run("perl", "-e", "my %h; $h{$_} = [1..3] for 1..300000; "
                            "delete $h{$_} for grep { $_ % 3 } 1..300000;",
                            env={"HEAPSIGHT_MAP_RELEASE": "check"})
    try:
        assert rc == 0, err
        c = check_note(maps_after_exit(seg)[H.EXIT])
        # THEN they are told apart: the counted release is the run one, page by page
        assert c["verdict"] == "agree" and c["fast"] > 300_000, c
        assert c["flags"] == c["live"] == c["heaps"] == 0 and c["counted"] == c["run"], c
    finally:
        seg.close()


def test_the_summary_says_the_release_was_counted(hs):
    # GIVEN perl emptying a 400k-entry hash (800k fastbin chunks at exit)
    r = hs("perl", "-e", 'my %h; $h{$_} = "x" x 100 for 1..400000; undef %h;')
    assert r.rc == 0, r.stderr
    rel = r.summary["release"]
    # THEN the release at exit was counted, and the terminal says so, and how many chunks
    assert rel["measured"] and rel["where"] == "copy" and rel["counted_fast_chunks"] > 700_000, rel
    assert rel["rss_before_bytes"] - rel["rss_after_bytes"] > 20 << 20, rel
    text = " ".join((r.stdout + r.stderr).split())
    assert "counted page by page in a copy of the program at its exit, by malloc_trim's own rule" in text
    assert f"merge the {rel['counted_fast_chunks']:,} chunks of its fastbins" in text


def test_under_glibcs_huge_pages_the_release_is_run(tmp_path):
    # GIVEN the same heap with glibc.malloc.hugetlb=1: systrim then gives back whole huge
    # pages of the top, another rule (counted, 282 pages of 20,932 differed)
    exe = compile_c(tmp_path, "mixed", MIX, "-pthread")
    rc, out, err, seg = run(exe, env={"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
                                      "HEAPSIGHT_MAP_RELEASE": "check"})
    try:
        assert rc == 0, err
        hm = maps_after_exit(seg)[H.EXIT]
        # THEN the release is run, and the check says why it was not counted
        assert hm.counted_fast_chunks == 0 and hm.note == "release check: run only: glibc.malloc.hugetlb is set", hm.note
        assert hm.released_pages * PAGE > 40 << 20
    finally:
        seg.close()


def test_among_many_blocks_in_use_fewer_fastbin_chunks_leave_the_release_run(tmp_path):
    # GIVEN 800k blocks in use and 100k fastbin chunks among them: counting would walk the
    # 900k chunks once more, running merges the 100k
    exe = compile_c(tmp_path, "many", r"""
#include <stdlib.h>
int main(void) {
  static void *p[900000];
  for (int i = 0; i < 900000; i++) p[i] = malloc(40);
  for (int i = 0; i < 900000; i += 9) free(p[i]);
  return 0;
}
""")
    rc, out, err, seg = run(exe)
    try:
        assert rc == 0, err
        hm = maps_after_exit(seg)[H.EXIT]
        # THEN the release was run (more than 65k fastbin chunks, but not a quarter of the blocks)
        assert hm.counted_fast_chunks == 0 and hm.release_ns > 0, hm
    finally:
        seg.close()
    # and with a tenth of them in use, the same frees are counted
    exe = compile_c(tmp_path, "few_in_use", r"""
#include <stdlib.h>
int main(void) {
  static void *p[900000];
  for (int i = 0; i < 900000; i++) p[i] = malloc(40);
  for (int i = 0; i < 900000; i++) if (i % 10) free(p[i]);
  return 0;
}
""")
    rc, out, err, seg = run(exe)
    try:
        assert rc == 0, err
        hm = maps_after_exit(seg)[H.EXIT]
        assert hm.counted_fast_chunks > 700_000, hm
    finally:
        seg.close()


def test_a_snapshots_counted_release_is_its_run_one(tmp_path):
    # GIVEN perl that empties a 300k-entry hash (600k fastbin chunks), asks heapsight for a
    # snapshot (SIGUSR1 to its parent: a snapshot at a time, 0.6 s, came before the hash
    # was emptied on a loaded machine), then allocates and frees small strings for 2 s: the
    # snapshot's map is taken while the program runs, not at its exit
    out = tmp_path / "run.hsrun.json.gz"
    p = subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "-o", str(out),
                        "--snapshot-on", "USR1",
                        "--", "perl", "-e", 'my %h; $h{$_} = "x" x 100 for 1..300000; undef %h; '
                        'kill "USR1", getppid(); '
                        'my @a; my $t = time; while (time - $t < 2) { push @a, "y" x 20; '
                        'shift @a if @a > 10; }'],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HEAPSIGHT_MAP_RELEASE": "check"})
    assert p.returncode == 0, p.stderr
    maps = dict(record.load(str(out))["capture"]["maps"])
    # THEN the snapshot's map, as the exit's, counts the release as running it gives back
    assert len(maps) == 2 and "exit" in maps, set(maps)
    for name, m in maps.items():
        c = check_note(H.HeapMap(**{**m, "heaps": [], "reach": None}))
        assert c["verdict"] == "agree" and c["fast"] > 500_000, (name, c)
        assert c["flags"] == c["live"] == c["heaps"] == 0 and c["counted"] == c["run"] > 1000, (name, c)
