"""allocators: the catalogue, the preset configurations compare and lab run, and a user's
--config NAME:ALLOC[:ENV=VAL,...], parsed without running anything."""

import re
from pathlib import Path

import pytest

from heapsight import allocators
from heapsight.allocators import ALLOCATORS, DEFAULT_CONFIGS, PRESETS, Config, library_for, \
    parse_config, presets
from heapsight.errors import HeapsightError

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


# presets ------------------------------------------------------------------------------

def test_presets_come_in_the_order_named():
    got = presets("jemalloc-eager,glibc,mmap")
    assert [c.name for c in got] == ["jemalloc-eager", "glibc", "mmap"]
    assert got[0].allocator == "jemalloc"
    assert got[0].env == {"MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}
    assert got[1].env == {} and got[2].allocator == "mmap"


def test_presets_ignore_blanks_and_spaces():
    assert [c.name for c in presets(" glibc , ,glibc-arena2,")] == ["glibc", "glibc-arena2"]
    assert presets("") == [] and presets(" , ") == []


def test_unknown_preset_names_the_option_and_the_known_ones():
    with pytest.raises(HeapsightError) as e:
        presets("glibc,jemalloc-fast", option="--with")
    msg = e.value.message
    assert msg.startswith("--with: unknown configuration 'jemalloc-fast'")
    assert "glibc-arena2" in msg and "mimalloc-eager" in msg and e.value.exit_code == 2


def test_catalogue_is_consistent():
    # every preset uses a catalogue allocator, names are unique, the default list resolves
    assert all(c.allocator in ALLOCATORS for c in PRESETS)
    assert len({c.name for c in PRESETS}) == len(PRESETS)
    assert [c.name for c in presets(DEFAULT_CONFIGS)] == DEFAULT_CONFIGS.split(",")
    assert allocators.header_bytes("glibc") == 8 and allocators.header_bytes("mmap") == 16
    assert allocators.header_bytes("jemalloc") == 0 and allocators.header_bytes("hoard") == 0
    assert allocators.release_call("glibc") == "malloc_trim(0)"
    assert allocators.release_call("hoard") == "none"


# parse_config -------------------------------------------------------------------------

def test_catalogue_allocator_without_env():
    assert parse_config("base:glibc") == Config("base", "glibc", {}, "user-defined")
    assert parse_config("base:glibc:").env == {}


@pytest.mark.parametrize("text, env", [
    # a value with ':' (MALLOC_CONF's own separator)
    ("mine:jemalloc:MALLOC_CONF=narenas:2", {"MALLOC_CONF": "narenas:2"}),
    # ',' inside a value stays in it until the next NAME=
    ("mine:jemalloc:MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0",
     {"MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}),
    ("mine:jemalloc:MALLOC_CONF=narenas:2,background_thread:true,JE_X=1,MY_VAR2=",
     {"MALLOC_CONF": "narenas:2,background_thread:true", "JE_X": "1", "MY_VAR2": ""}),
    # '=' and ':' inside a value (GLIBC_TUNABLES lists name=value pairs joined by ':')
    ("t:glibc:GLIBC_TUNABLES=glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=0",
     {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=0"}),
    # a lower-case piece after a variable is part of its value
    ("t:glibc:GLIBC_TUNABLES=glibc.malloc.arena_max=2,glibc.malloc.tcache_count=0",
     {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2,glibc.malloc.tcache_count=0"}),
])
def test_env_values_keep_their_colons_and_commas(text, env):
    cfg = parse_config(text)
    assert cfg.env == env and cfg.library is None


@pytest.mark.parametrize("text, says", [
    ("", "expected NAME:ALLOC[:ENV=VAL,...]"),
    ("mine", "expected NAME:ALLOC[:ENV=VAL,...]"),
    (":glibc", "expected NAME:ALLOC[:ENV=VAL,...]"),
    ("mine:", "expected NAME:ALLOC[:ENV=VAL,...]"),
    ("mine:glibc:MALLOC_ARENA_MAX", "'MALLOC_ARENA_MAX' is not ENV=VAL"),
    ("mine:glibc:malloc_arena_max=2", "'malloc_arena_max=2' is not ENV=VAL"),
    ("mine:glibc:=2", "'=2' is not ENV=VAL"),
    ("mine:glibc:,A=1", "'' is not ENV=VAL"),
    ("mine:hoard", "unknown allocator 'hoard'; use glibc, jemalloc, tcmalloc, mimalloc, mmap"),
])
def test_bad_forms_are_refused_with_the_form_expected(text, says):
    with pytest.raises(HeapsightError) as e:
        parse_config(text)
    assert e.value.message.startswith(f"--config {text!r}: ")
    assert says in e.value.message, e.value.message


def test_library_path_kind_comes_from_its_name():
    cfg = parse_config(f"je:{JEMALLOC}:MALLOC_CONF=narenas:1")
    assert cfg == Config("je", "jemalloc", {"MALLOC_CONF": "narenas:1"},
                         f"user-defined, {JEMALLOC}", library=JEMALLOC)
    assert library_for(cfg) == (JEMALLOC, None)


@pytest.mark.parametrize("path, says", [
    ("/etc/passwd", "is not a shared library (not a 64-bit ELF shared object)"),
    ("/usr/lib/x86_64-linux-gnu/libz.so.1", "is a shared library that does not define malloc and free"),
    ("/usr/lib/x86_64-linux-gnu", "is a directory"),
])
def test_existing_file_that_is_no_allocator_is_refused_before_running(path, says):
    with pytest.raises(HeapsightError) as e:
        parse_config(f"x:{path}")
    assert f"{path} {says}; give the path of an allocator's shared library" in e.value.message


def test_missing_library_is_accepted_and_its_row_fails_later(tmp_path):
    # GIVEN a path that does not exist (yet): a missing library fails only its own row
    lib = str(tmp_path / "build" / "libtcmalloc_debug.so")
    cfg = parse_config(f"dbg:{lib}")
    assert (cfg.allocator, cfg.library) == ("tcmalloc", lib)
    # WHEN compare asks for the library to preload THEN it says what is wrong
    assert library_for(cfg) == (None, f"tcmalloc library {lib} is missing: check the path")


@pytest.mark.parametrize("alloc", ["libmine.so", "libmine.so.3", "./libmine"])
def test_anything_that_looks_like_a_library_is_taken_as_a_path(alloc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # relative, missing: accepted, kind unknown
    cfg = parse_config(f"m:{alloc}")
    assert (cfg.allocator, cfg.library) == ("unknown", alloc)
    assert library_for(cfg) == (None, f"unknown library {alloc} is missing: check the path")


def test_library_for_catalogue_allocators(monkeypatch):
    assert library_for(Config("g", "glibc")) == (None, None)       # the C library's own
    assert library_for(Config("j", "jemalloc")) == (JEMALLOC, None)
    mmap = ALLOCATORS["mmap"].library
    assert Path(mmap).name == "libheapsight_mmap.so" and library_for(Config("m", "mmap")) == (mmap, None)
    # a catalogue library that is not installed names its Debian package
    gone = allocators.Allocator("jemalloc", 2, "/nonexistent/libjemalloc.so.2", "libjemalloc2", "x")
    monkeypatch.setitem(ALLOCATORS, "jemalloc", gone)
    assert library_for(Config("j", "jemalloc")) == (
        None, "jemalloc library /nonexistent/libjemalloc.so.2 is missing: install the Debian "
              "package libjemalloc2 (apt-get install libjemalloc2)")


def test_the_catalogue_identities_are_the_native_librarys():
    # GIVEN the identities the library writes in the segment (native/include/heapsight.h)
    header = (Path(__file__).resolve().parents[2] / "native" / "include" / "heapsight.h").read_text()
    native_ids = {m.group(1).lower(): int(m.group(2))
                  for m in re.finditer(r"HS_ALLOC_([A-Z]+) = (\d+)", header)}
    # THEN each catalogue entry carries the same one, and only "unknown" is not an allocator
    assert {a.name: a.segment_id for a in ALLOCATORS.values()} == \
        {k: v for k, v in native_ids.items() if k != "unknown"}
    assert allocators.BY_SEGMENT_ID[0] == "unknown"
    # and each one whose release attach --trim can make names it in its release call
    assert all(a.trim_call is None or a.release_call.split("(")[0] == a.trim_call[0]
               for a in ALLOCATORS.values())


def test_every_lab_experiment_has_its_share_of_the_labs_time():
    # the lab's ETA weighs the experiments to come by these (a mean over those done said
    # 15 s with 100 s to go: the first is the shortest)
    from heapsight import lab
    shares = {n: lab.experiment(n).QUICK_SECONDS for n in lab.NAMES}
    assert all(isinstance(v, int) and v > 0 for v in shares.values()), shares
    assert shares["release"] < shares["perl"]
