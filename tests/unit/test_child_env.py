"""What the program's environment gets from heapsight (live/measure.py's child_env): the
record of block starts the leak answer needs under another allocator than glibc is asked
for only where a copy will mark from it."""

from heapsight.live import comparison, measure


class FakeSegment:
    path = "/dev/shm/heapsight-test.seg"


def test_the_record_of_block_starts_is_off_where_nothing_marks_from_it():
    env = measure.child_env(FakeSegment(), measure.Options())
    assert "HEAPSIGHT_REACH" not in env or env["HEAPSIGHT_REACH"] != "0"
    assert measure.child_env(FakeSegment(), measure.Options(heap_maps=False))["HEAPSIGHT_REACH"] == "0"
    assert measure.child_env(FakeSegment(), measure.Options(reach=False))["HEAPSIGHT_REACH"] == "0"


def test_compare_runs_pay_for_no_record_they_do_not_use(monkeypatch):
    # compare ranks memory and time: its runs mark no reachability, so no configuration
    # pays a record of block starts per call that another does not
    seen = {}

    def fake_measure(argv, opts):
        seen["opts"] = opts
        raise RuntimeError("stop")
    monkeypatch.setattr(comparison, "measure", fake_measure)
    from heapsight.allocators import PRESET
    try:
        comparison.one_run(["true"], PRESET["jemalloc"], None, False)
    except RuntimeError:
        pass
    assert seen["opts"].reach is False
