"""Which allocator versions heapsight reads, and what it says of another (the catalogue)."""

from heapsight import allocators


def test_a_known_version_or_none_has_no_note():
    assert allocators.version_note("glibc", "2.36") == ""
    assert allocators.version_note("jemalloc", "5.3.0-0-g54eaed1d8b56b1aa528be3") == ""
    assert allocators.version_note("tcmalloc", "gperftools 2.10") == ""
    assert allocators.version_note("mimalloc", "") == ""          # it gave none
    assert allocators.version_note("unknown", "1.0") == ""


def test_another_version_says_what_depends_on_it():
    note = allocators.version_note("glibc", "2.38")
    assert note.startswith("glibc 2.38 is not a version heapsight knows (2.36): the heap map's walk")
    assert "the hooks' counts, the sampled call sites and RSS do not depend on it" in note
    assert allocators.version_note("jemalloc", "5.2.1").startswith("jemalloc 5.2.1 is not")
