"""Which frame of a stack is its call site (sites.py): past the allocator and its wrappers,
and past unnamed frames of a stripped binary when a named frame of the same object follows."""

from heapsight import sites
from heapsight.symbolize import Frame

PY = "/usr/bin/python3.11"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


def f(function, obj, address=0x1000):
    return Frame(function, None, None, obj, address)


def site(frames):
    doc = {"frames": [{"function": x.function, "file": x.file, "line": x.line,
                       "object": x.object, "address": f"{x.address:#x}"} for x in frames],
           "stacks": [list(range(len(frames)))]}
    return sites.site_of_stack(doc, 0)


def test_an_unnamed_wrapper_gives_way_to_the_named_function_of_its_object():
    # CPython with PYTHONMALLOC=malloc: malloc <- _PyMem_RawMalloc (static: unnamed) <-
    # PyUnicode_New <- the interpreter
    stack = [f("malloc", LIBC), f(None, PY, 0x5a7184), f("PyUnicode_New", PY),
             f("_PyEval_EvalFrameDefault", PY)]
    assert site(stack) == "PyUnicode_New (python3.11)"


def test_an_unnamed_frame_stays_when_nothing_named_follows_in_its_object():
    # a stripped program (git): every frame of it is unnamed; libc's start is named but in
    # another object
    stack = [f(None, "/usr/bin/git", 0x28961b), f(None, "/usr/bin/git", 0x12), f("__libc_start_main", LIBC)]
    assert site(stack) == "git+0x28961b"


def test_a_named_site_is_taken_as_it_is():
    stack = [f("operator new(unsigned long)", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"),
             f("parse_row", "/opt/app"), f(None, "/opt/app"), f("main", "/opt/app")]
    assert site(stack) == "parse_row (app)"


def test_largest_sites_in_a_stripped_object_say_how_to_name_them():
    # GIVEN the peak's sites: git's unnamed frames hold most, libz's named one the rest
    git, libz = "/usr/bin/git", "/usr/lib/x86_64-linux-gnu/libz.so.1"
    frames = [f(None, git, 0x28961b), f(None, git, 0x289718), f("inflate", libz)]
    moment = {"sites": [{"frame": 0, "share": 0.91}, {"frame": 1, "share": 0.08},
                        {"frame": 2, "share": 0.01}]}
    note = sites.unnamed_note(frames, [moment])
    # THEN the note names the object and the way to its symbols, once
    assert note.startswith("git has no symbols (stripped), so its sites are addresses"), note
    assert "`dpkg -S /usr/bin/git`" in note and "/usr/lib/debug by build-id" in note
    # and says nothing where the unnamed sites are small, or named
    moment["sites"][0]["share"] = 0.05
    assert sites.unnamed_note(frames, [moment]) == ""
    assert sites.unnamed_note([f("xmalloc_caller", git)] + frames[1:], [
        {"sites": [{"frame": 0, "share": 0.9}]}]) == ""


def test_gits_allocation_wrappers_are_stepped_over():
    # git's wrapper.c (named with its debug symbols): malloc <- do_xmalloc <- xmallocz <- caller
    git = "/usr/bin/git"
    stack = [f("malloc", LIBC), f("do_xmalloc", git), f("xmallocz_gently", git),
             f("xmallocz", git), f("read_object_file_extended", git)]
    assert site(stack) == "read_object_file_extended (git)"
    assert not sites.is_allocator(f("xmalloc_caller", git))
