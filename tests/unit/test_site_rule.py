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
