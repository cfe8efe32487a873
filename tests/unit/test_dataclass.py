"""heapsight.dataclass: a class made by it behaves as dataclasses' makes it, for what
heapsight uses (fields with defaults and factories, frozen or not, fields/asdict/replace,
equality, hashing, repr), without its methods written at import."""

import dataclasses

import pytest

from heapsight.dataclass import dataclass


def pair(frozen: bool):
    """The same class made by both."""
    def body():
        class Point:
            """a point"""
            x: int
            y: int = 2
            tags: list = dataclasses.field(default_factory=list)
        return Point
    std = dataclasses.dataclass(frozen=frozen)(body())
    ours = dataclass(frozen=frozen)(body())
    return std, ours


@pytest.mark.parametrize("frozen", [False, True])
def test_it_is_made_and_compared_as_dataclasses_make_it(frozen):
    std, ours = pair(frozen)
    for args, kwargs in [((1,), {}), ((1, 5), {}), ((), {"x": 1, "tags": [3]}), ((1,), {"y": 7})]:
        a, b = std(*args, **kwargs), ours(*args, **kwargs)
        assert dataclasses.asdict(a) == dataclasses.asdict(b)
        assert repr(a) == repr(b)
        assert (a == std(*args, **kwargs)) and (b == ours(*args, **kwargs))
        assert b != ours(99) and (b == a) is False   # another class is never equal
    assert [f.name for f in dataclasses.fields(ours)] == ["x", "y", "tags"]
    assert dataclasses.is_dataclass(ours) and ours(1).tags is not ours(1).tags
    r = dataclasses.replace(ours(1, 5), y=6)
    assert (r.x, r.y) == (1, 6) and type(r) is ours


@pytest.mark.parametrize("call", [lambda c: c(), lambda c: c(1, 2, [], 4), lambda c: c(1, x=1),
                                  lambda c: c(1, z=1)])
def test_wrong_arguments_are_refused_as_by_dataclasses(call):
    std, ours = pair(False)
    with pytest.raises(TypeError):
        call(std)
    with pytest.raises(TypeError):
        call(ours)


def test_frozen_is_frozen_and_hashable_and_the_other_is_neither():
    _, frozen = pair(True)
    p = frozen(1, tags=())
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.y
    assert hash(p) == hash(frozen(1, tags=())) and len({p, frozen(1, tags=())}) == 1
    _, plain = pair(False)
    q = plain(1)
    q.x = 3
    assert q.x == 3
    with pytest.raises(TypeError):
        hash(q)


def test_post_init_runs_and_subclasses_take_their_bases_fields():
    @dataclass
    class Base:
        a: int
        seen: list = dataclasses.field(default_factory=list)

        def __post_init__(self):
            self.seen.append("post")

    @dataclass(frozen=False)
    class Sub(Base):
        b: int = 0

    s = Sub(1, [], 2)
    assert (s.a, s.b, s.seen) == (1, 2, ["post"])
    assert [f.name for f in dataclasses.fields(Sub)] == ["a", "seen", "b"]
