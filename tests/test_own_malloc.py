"""A program whose executable defines malloc itself (an allocator built in: Chromium's
PartitionAlloc, a binary linked with tcmalloc): its calls bind to its own malloc, which
comes before every preloaded library, so heapsight's hooks see none of them. The run says
so and gives /proc figures only; it no longer reports "0 allocations" and a leak check of
nothing. One that forwards to the next malloc (a shim) is counted, with a note."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import compile_c

HS = [sys.executable, "-m", "heapsight", "run", "--no-save"]

# a bump allocator of its own: 100,000 blocks of 100 bytes, every tenth kept, the rest
# "freed" (it never reuses): 10 MiB of its own heap written
OWN = r"""
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
static char *top, *end;
static void *bump(size_t n, size_t align) {
  if (!top) {
    top = mmap(NULL, 256 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    end = top + (256 << 20);
  }
  if (align < 16) align = 16;
  char *p = (char *)(((size_t)top + 16 + align - 1) & ~(align - 1));
  ((size_t *)p)[-1] = n;
  top = p + ((n + 15) & ~(size_t)15);
  return top <= end ? p : NULL;
}
void *malloc(size_t n) { return bump(n, 16); }
void free(void *p) { (void)p; }
void *calloc(size_t a, size_t b) { return bump(a * b, 16); }   /* fresh pages are zero */
void *realloc(void *p, size_t n) {
  void *q = bump(n, 16);
  if (p && q) { size_t old = ((size_t *)p)[-1]; memcpy(q, p, old < n ? old : n); }
  return q;
}
void *memalign(size_t a, size_t n) { return bump(n, a); }
void *aligned_alloc(size_t a, size_t n) { return bump(n, a); }
int posix_memalign(void **out, size_t a, size_t n) { *out = bump(n, a); return *out ? 0 : 12; }
size_t malloc_usable_size(void *p) { return p ? ((size_t *)p)[-1] : 0; }
static void *keep[10000];
int main(int argc, char **argv) {
  for (int i = 0; i < 100000; i++) {
    char *p = malloc(100);
    memset(p, 1, 100);
    if (i % 10 == 0) keep[i / 10] = p; else free(p);
  }
  printf("done\n");
  fflush(stdout);
  if (argc > 1) pause();   /* to be attached to */
  return 0;
}
"""

# a shim that passes every call on to the next malloc in the lookup order (heapsight's,
# under it): 20,000 blocks of 1,000 bytes kept
SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
static void *(*next_malloc)(size_t);
static void (*next_free)(void *);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static char boot[8192];   /* dlsym's own allocations, while the next ones are looked up */
static size_t boot_used;
static int resolving;
static void *boot_alloc(size_t n) {
  void *p = boot + boot_used;
  boot_used += (n + 15) & ~(size_t)15;
  return boot_used <= sizeof boot ? p : NULL;
}
static int in_boot(void *p) { return (char *)p >= boot && (char *)p < boot + sizeof boot; }
static void resolve(void) {
  resolving = 1;
  next_malloc = dlsym(RTLD_NEXT, "malloc");
  next_free = dlsym(RTLD_NEXT, "free");
  next_calloc = dlsym(RTLD_NEXT, "calloc");
  next_realloc = dlsym(RTLD_NEXT, "realloc");
  resolving = 0;
}
void *malloc(size_t n) {
  if (!next_malloc) { if (resolving) return boot_alloc(n); resolve(); }
  return next_malloc(n);
}
void *calloc(size_t a, size_t b) {
  if (!next_calloc) { if (resolving) return boot_alloc(a * b); resolve(); }
  return next_calloc(a, b);
}
void free(void *p) {
  if (!p || in_boot(p)) return;
  if (!next_free) resolve();
  next_free(p);
}
void *realloc(void *p, size_t n) {
  if (!next_realloc) resolve();
  if (in_boot(p)) { void *q = next_malloc(n); memcpy(q, p, n); return q; }
  return next_realloc(p, n);
}
static void *keep[20000];
int main(void) {
  for (int i = 0; i < 20000; i++) { keep[i] = malloc(1000); memset(keep[i], 1, 1000); }
  printf("done\n");
  return 0;
}
"""


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    d = tmp_path_factory.mktemp("own-malloc")

    def make(name: str, src: str) -> str:
        exe = compile_c(d, name, src, "-fno-builtin", "-ldl")
        # the executable exports malloc (libc refers to it): what puts it first
        nm = subprocess.run(["nm", "-D", "--defined-only", exe], capture_output=True,
                            text=True, check=True).stdout.split()
        assert "malloc" in nm, nm
        return exe
    return make


def run(tmp_path, exe: str) -> tuple:
    js = tmp_path / "s.json"
    r = subprocess.run([*HS, "--json", str(js), "--", exe], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "done\n"
    return json.loads(js.read_text()), " ".join(r.stderr.split())


def test_a_program_with_its_own_malloc_is_said_to_bypass_the_hooks(build, tmp_path):
    # GIVEN a program whose executable defines malloc (a bump allocator of its own)
    s, err = run(tmp_path, build("own", OWN))
    # THEN the run says its malloc is its own and gives /proc figures only: no heap
    # figures, no leak check, no findings from what the hooks (never called) counted
    assert s["preload"] == "bypassed", s["preload"]
    assert "its malloc is its own" in s["preload_note"] and "/own defines malloc" in s["preload_note"]
    assert s["heap"] is None and not s["heapmaps"], s["heap"]
    assert s["verdict"].startswith("heap figures unavailable (its own malloc, in own, answers"), \
        s["verdict"]
    assert "0 allocations" not in err and "reachable at exit" not in err, err
    # the /proc figures are the program's: its 10 MiB written
    assert s["peak_rss_bytes"] > 10 << 20


def test_a_shim_that_passes_malloc_on_is_counted_with_a_note(build, tmp_path):
    # GIVEN an executable that defines malloc and passes every call on to the next one
    s, _ = run(tmp_path, build("shim", SHIM))
    # THEN the calls reached heapsight's hooks and are counted (20,000 blocks of 1,000
    # bytes kept), and the note says the program defines malloc
    assert s["preload"] == "active", s["preload_note"]
    assert "shim defines malloc itself" in s["preload_note"], s["preload_note"]
    assert 20000 <= s["heap"]["live_blocks"] <= 20100, s["heap"]
    assert abs(s["heap"]["live_requested_bytes"] - 20000 * 1000) < 200_000, s["heap"]


def test_attach_names_a_running_programs_own_malloc(build):
    # GIVEN the same program, running (started bare)
    exe = build("own", OWN)
    p = subprocess.Popen([exe, "wait"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "done\n"
        r = subprocess.run([sys.executable, "-m", "heapsight", "attach", str(p.pid)],
                           capture_output=True, text=True, timeout=120)
        err = " ".join(r.stderr.split())
        # THEN attach names its allocator as its own, not glibc (whose heaps hold none of
        # its blocks: "in use 16 KiB" read as healthy), and gives /proc figures only
        assert r.returncode == 0, r.stderr
        assert "allocator: its own malloc (own)" in err, err
        assert "in use" not in err and "/proc figures only" in err, err
        # AND --leaks says why it cannot mark its blocks, without sending the user to
        # `heapsight run`, which cannot either
        r = subprocess.run([sys.executable, "-m", "heapsight", "attach", "--leaks", str(p.pid)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0
        assert "nor can `heapsight run`" in r.stderr, r.stderr
    finally:
        p.kill()
        p.wait()


# a position-dependent program that takes malloc's address: its dynamic symbol malloc is
# undefined but carries the address of a PLT entry of its own (a canonical PLT entry, as
# Debian's python3.11 has), which dlsym("malloc") returns; it defines no malloc
ADDRESS_TAKEN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
void *(*volatile alloc)(size_t);
static void *keep[20000];
int main(void) {
  alloc = malloc;   /* its address taken in code */
  for (int i = 0; i < 20000; i++) { keep[i] = alloc(1000); memset(keep[i], 1, 1000); }
  printf("done\n");
  return 0;
}
"""


def test_a_program_that_only_takes_mallocs_address_is_not_said_to_define_it(tmp_path):
    exe = compile_c(tmp_path, "taken", ADDRESS_TAKEN, "-no-pie", "-fno-pie")
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", exe], capture_output=True, text=True,
                          check=True).stdout
    line = next(x for x in syms.splitlines() if " malloc@" in x)
    assert " UND " in line and int(line.split()[1], 16) != 0, line   # the canonical PLT entry
    s, _ = run(tmp_path, exe)
    # THEN heapsight's hooks count its calls, and nothing says it defines malloc
    assert s["preload"] == "active" and "defines malloc" not in s["preload_note"], s["preload_note"]
    assert 20000 <= s["heap"]["live_blocks"] <= 20100, s["heap"]
