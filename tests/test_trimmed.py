"""Free memory in glibc's heap that is not what the program freed and glibc kept. A program
that trims its own heap (malloc_trim(0): heapsight's own advice): glibc's figure of the
memory it holds still counts the pages the trim gave back inside its free chunks, so it
bounds nothing, and anonymous memory malloc did not give was read as glibc's retention; the
exit's figures come from the heap's resident pages in the exit's copy. And free space glibc
made itself (the padding of aligned blocks) is not "freed by the program"."""

from conftest import compile_c

MiB = 1 << 20

TRIMS = r"""
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
/* 100 MiB of 1000-byte blocks, one in a hundred kept; the rest freed and trimmed; then 24
 * MiB written in a mapping of its own (as pymalloc's arenas, a JIT's code, an mmap cache) */
int main(void) {
  enum { N = 100000 };
  static char *b[N];
  for (int i = 0; i < N; i++) { b[i] = malloc(1000); memset(b[i], 1, 1000); }
  for (int i = 0; i < N; i++) if (i % 100) { free(b[i]); b[i] = NULL; }
  malloc_trim(0);
  size_t n = 24u << 20;
  char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  memset(m, 2, n);
  /* the heap's resident bytes, as the kernel counts them, just before main returns */
  FILE *f = fopen("/proc/self/smaps", "r");
  char line[512]; int in_heap = 0; long kb = 0;
  while (fgets(line, sizeof line, f)) {
    if (strchr(line, '-') && strstr(line, " rw")) in_heap = strstr(line, "[heap]") != NULL;
    else if (in_heap && sscanf(line, "Rss: %ld kB", &kb) == 1) in_heap = 0, printf("heap_rss=%ld\n", kb * 1024);
  }
  fclose(f);
  fflush(stdout);
  return m[n - 1] != 2;
}
"""


def test_after_its_own_trim_the_exits_retention_is_the_heaps_resident_free_space(hs, tmp_path):
    # GIVEN a program that keeps 1 of 100 blocks, trims, then writes 24 MiB of its own mapping
    exe = compile_c(tmp_path, "trims", TRIMS)
    r = hs(exe)
    assert r.rc == 0, r.stderr
    heap_rss = int(r.stdout.split("heap_rss=")[1].split()[0])
    final = r.summary["final"]
    # THEN what the exit calls retained is no more than the heap's resident bytes beside its
    # live blocks (it read 24 MiB more: the mapping, as glibc's, before)
    assert final["retained_bytes"] <= heap_rss - final["live_bytes"] + 256 * 1024, (final, heap_rss)
    # and the mapping is memory malloc did not give
    assert final["other_anon_bytes"] >= 23 * MiB, final
    # so does the end (main returned): nothing was allocated, freed or given back between it
    # and the exit's copy, so its heap is the exit's (it read 28.7 MiB retained beside the
    # exit's 3.9)
    end = next(m["breakdown"] for m in r.summary["moments"] if m["name"] == "end")
    assert end["retained_bytes"] <= heap_rss - end["live_bytes"] + 256 * 1024, (end, heap_rss)
    assert end["other_anon_bytes"] >= 23 * MiB, end
    assert not r.summary["verdict"].startswith(("RETENTION", "FRAGMENTATION")), r.summary["verdict"]


def test_the_reports_charts_split_the_end_as_the_summary_does(tmp_path):
    # GIVEN the same program's run saved
    import gzip
    import json
    import subprocess
    import sys

    import numpy as np
    from heapsight.report import charts
    exe = compile_c(tmp_path, "trims", TRIMS)
    record = tmp_path / "run.hsrun.json.gz"
    subprocess.run([sys.executable, "-m", "heapsight", "run", "-q", "-o", str(record), "--", exe],
                   check=True, capture_output=True, timeout=120)
    doc = json.loads(gzip.decompress(record.read_bytes()))
    # THEN the chart's split of the end sample is the summary's, the exit's heap bounding it
    end = next(m for m in doc["summary"]["moments"] if m["name"] == "end")
    cols = charts.columns(doc, ("t", "rss", "anon", "live_req", "live_usable", "n_alloc",
                                "n_free", "alloc_mapped"))
    i = int(np.flatnonzero(cols["t"] == end["at_s"])[0])
    drawn = charts.split_rows(doc, np.array([i]))
    assert doc["summary"]["heap"]["resident_at_exit_bytes"] > 0
    assert int(drawn["retained_bytes"][0]) == end["breakdown"]["retained_bytes"]
    assert int(drawn["other_anon_bytes"][0]) == end["breakdown"]["other_anon_bytes"] >= 23 * MiB


ALIGNED = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* 20,000 blocks of 100 bytes aligned to 4096, kept to the end: glibc splits the padding
 * before each off as a free chunk, and each block keeps a page */
int main(void) {
  static void *p[20000];
  for (int i = 0; i < 20000; i++) { if (posix_memalign(&p[i], 4096, 100)) return 1; memset(p[i], 1, 100); }
  usleep(300000);
  return ((char *)p[19999])[99] != 1;
}
"""


def test_the_padding_of_aligned_blocks_is_not_memory_the_program_freed(hs, tmp_path):
    # GIVEN a program that freed nothing, its blocks aligned to 4096
    exe = compile_c(tmp_path, "aligned", ALIGNED)
    r = hs(exe)
    assert r.rc == 0, r.stderr
    s = r.summary
    kept = next(f for f in s["findings"] if f["kind"] in ("retention", "fragmentation"))
    # THEN the free space is said to be glibc's own making (it read "76.0 MiB freed by the
    # program but kept by glibc"), with the change to the code first
    assert kept["bytes"] >= 60 * MiB
    assert kept["title"].endswith("never freed by the program"), kept["title"]
    assert "padding glibc splits off to align a block" in kept["detail"]
    assert kept["suggestions"][0].startswith("posix_memalign(&slab, 4096, n * size);")
    assert s["heap"]["freed_usable_bytes"] < MiB
