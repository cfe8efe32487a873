"""Suggestions fitted to the run: a setting the environment already has is not suggested
again nor blamed, --follow is kept, a setting whose effect is unknown is not first, and
the settings a suggestion names are read back exactly (run --verify applies them)."""

from __future__ import annotations

from heapsight import analysis, remedies
from heapsight.model import Finding


def finding(*sugg):
    return Finding("retention", 1, "t", "d", tuple(sugg))


def test_a_setting_already_applied_is_not_suggested_again():
    settings = remedies.settings_in({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"})
    f, = analysis.fit_to_run([finding(
        "GLIBC_TUNABLES=glibc.malloc.trim_threshold=131072 heapsight run -- ./p",
        "MALLOC_ARENA_MAX=2 heapsight run -- ./p")], settings, "", ["./p"])
    assert not any("trim_threshold" in x for x in f.suggestions)
    assert remedies.dynamic_threshold_off(settings)
    assert not remedies.dynamic_threshold_off(remedies.settings_in({"MALLOC_ARENA_MAX": "2"}))


def test_follow_is_kept_in_every_command_that_runs_the_program():
    f, = analysis.fit_to_run([finding(
        remedies.setting("jemalloc-eager") + " heapsight run -- sh -c x   # (heapsight lab remedies)",
        "heapsight run --verify -- sh -c x", "heapsight compare -- sh -c x")],
        {}, "perl", ["sh", "-c", "x"])
    assert all("--follow perl -- " in x for x in f.suggestions), f.suggestions


def test_a_setting_of_unknown_effect_is_not_first():
    # no lab rule, not measured: the change in the program goes first
    f, = analysis.fit_to_run([finding(
        "GLIBC_TUNABLES=glibc.malloc.trim_threshold=131072 heapsight run -- ./p",
        "malloc_trim(0);   # in the program")], {}, "", ["./p"])
    assert f.suggestions[0].startswith("malloc_trim(0);")
    # settings only: the command that measures them goes first
    g, = analysis.fit_to_run([finding("MALLOC_ARENA_MAX=2 heapsight run -- ./p")], {}, "", ["./p"])
    assert g.suggestions[0].startswith("heapsight run --verify -- ./p")
    # the lab's rule stays first
    lab = remedies.suggestions("thread-arenas", "./p")
    h, = analysis.fit_to_run([finding(*lab)], {}, "", ["./p"])
    assert h.suggestions[0] == lab[0]


def test_the_environment_of_a_suggestion_is_read_back():
    first = remedies.suggestions("pymalloc", "python3 x.py")[0]
    env = remedies.env_of(first)
    assert env["PYTHONMALLOC"] == "malloc" and env["LD_PRELOAD"].endswith("libjemalloc.so.2")
    assert env["MALLOC_CONF"] == "dirty_decay_ms:0,muzzy_decay_ms:0"
    assert remedies.env_of("malloc_trim(0);   # in the program") is None
    assert remedies.env_of("heapsight run --verify -- ./p") is None
    # a setting whose comment names --verify is still a setting
    assert remedies.env_of("MALLOC_ARENA_MAX=2 heapsight run -- ./p   # --verify measures it") \
        == {"MALLOC_ARENA_MAX": "2"}
    assert remedies.language(["/usr/bin/python3.11", "x.py"]) == "python"
    assert remedies.language(["perl", "x.pl"]) == "perl"
    assert remedies.language(["./server"]) == "c"


def test_applied_needs_every_setting_of_the_suggestion_in_the_environment():
    lib = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    pym = remedies.suggestions("pymalloc", "python3 x.py")[0]   # PYTHONMALLOC + jemalloc
    only_malloc = remedies.settings_in({"PYTHONMALLOC": "malloc"})
    assert not remedies.applied(pym, only_malloc)
    both = remedies.settings_in({"PYTHONMALLOC": "malloc", "LD_PRELOAD": lib,
                                 "MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"})
    assert remedies.applied(pym, both)
    arena = remedies.settings_in({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
    assert remedies.applied("MALLOC_ARENA_MAX=2 heapsight run -- ./p", arena)
    assert not remedies.applied("malloc_trim(0);   # in the program", both)
