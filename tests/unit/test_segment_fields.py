"""The segment read without numpy while the program runs (live/segment.py's FieldsView and
HeaderView, layout.offsets): every scalar and string field, every owner and the slots'
sums read the same as numpy's structured views of the same bytes."""

import random

import numpy as np

from heapsight import layout as L
from heapsight.live import segment as S


class _Fake(S.Segment):
    """A segment over a buffer of random bytes (no file)."""

    def __init__(self, buf: bytearray) -> None:
        self._map, self.size_bytes = buf, len(buf)
        self._views()


def random_segment(seed: int) -> tuple:
    rnd = random.Random(seed)
    buf = bytearray(rnd.getrandbits(8) for _ in range(L.SEGMENT_BASE_BYTES))
    # a few owners in use, some not; slots_used within the slots
    head = np.ndarray((), L.HEADER_DTYPE, buffer=buf)
    head["slots_used"] = rnd.randrange(1, L.MAX_SLOTS)
    for i in range(L.MAX_OWNERS):
        head["owners"][i]["base"] = rnd.choice((0, rnd.getrandbits(40)))
    return _Fake(buf), head, buf


def test_each_scalar_and_string_of_the_header_reads_as_numpys():
    for seed in range(5):
        seg, head, _ = random_segment(seed)
        for name, (_, kind, shape) in L.HEADER_AT.items():
            if shape or not isinstance(kind, str):
                continue
            want = head[name]
            want = bytes(want) if kind.startswith("S") else int(want)
            assert seg.header[name] == want, (seed, name)


def test_a_scalar_written_in_place_is_numpys_to_read():
    seg, head, _ = random_segment(7)
    seg.header["threads_seen"] = 12345
    seg.header["live_usable_bytes"] = -5
    assert int(head["threads_seen"]) == 12345 and int(head["live_usable_bytes"]) == -5


def test_the_owners_and_the_slots_sums_read_as_numpys():
    for seed in range(5):
        seg, head, buf = random_segment(seed)
        want = sorted(({"object": bytes(o["name"]).split(b"\0")[0].decode(errors="replace"),
                        "mapped_bytes": max(0, int(o["mapped_bytes"])),
                        "peak_bytes": int(o["peak_bytes"]), "mappings": int(o["mappings"])}
                       for o in head["owners"] if int(o["base"])), key=lambda o: -o["peak_bytes"])
        assert seg.owners() == want
        slots = np.ndarray((L.MAX_SLOTS,), L.SLOT_DTYPE, buffer=buf,
                           offset=L.SLOTS_OFFSET)[:seg._used()]
        net = (int(slots["mmapped_alloc_bytes"].astype(object).sum())
               - int(slots["mmapped_free_bytes"].astype(object).sum()))
        assert seg.mmapped_chunk_bytes() == max(0, net)


def test_the_layouts_offsets_are_numpys():
    for name, fields in L._STRUCTS.items():
        dt = getattr(L, name)
        assert L.itemsize(fields) == dt.itemsize, name
        for field, (at, _, _) in L.offsets(fields).items():
            assert dt.fields[field][1] == at, (name, field)
