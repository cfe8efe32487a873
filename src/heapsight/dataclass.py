"""dataclass: heapsight's dataclasses, without writing their methods at import.

dataclasses.dataclass writes each class's __init__, __repr__ and __eq__ (for a frozen one
also __setattr__, __delattr__ and __hash__) as source text and compiles it: about 1 ms a
class here, 30 ms for the analysis' classes, which a run waits for before its summary
(docs/numbers.md, "What a short run costs"). This dataclass makes the same class with those
methods written once, below, for every class: its fields and their defaults and default
factories, dataclasses.fields, asdict, replace and is_dataclass, and the equality, hashing,
repr and freezing that @dataclass gives. Making an instance loops over the fields (a few
microseconds more); no class is made more than some thousands of times a run.

    from heapsight.dataclass import dataclass    in place of dataclasses' dataclass:
    @dataclass, @dataclass(frozen=True)          (no other parameter is taken)
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, FrozenInstanceError


def dataclass(cls=None, *, frozen: bool = False):
    def make(c):
        # the fields, their defaults and dataclasses' functions; no method written
        c = dataclasses.dataclass(c, init=False, repr=False, eq=False)
        fields = dataclasses.fields(c)
        c._fields_init = tuple((f.name, f.default, f.default_factory)
                                  for f in fields if f.init)
        c._fields_repr = tuple(f.name for f in fields if f.repr)
        c._fields_compare = tuple(f.name for f in fields if f.compare)
        c.__init__, c.__repr__, c.__eq__ = _init, _repr, _eq
        if frozen:
            c.__setattr__, c.__delattr__, c.__hash__ = _frozen_set, _frozen_del, _hash
        else:
            c.__hash__ = None   # as dataclasses': equal by value, so not hashable
        return c
    return make if cls is None else make(cls)


def _init(self, *args, **kwargs) -> None:
    spec = type(self)._fields_init
    name = type(self).__name__
    if len(args) > len(spec):
        raise TypeError(f"{name}() takes {len(spec)} positional arguments but {len(args)} "
                        "were given")
    for i, (field, default, factory) in enumerate(spec):
        if i < len(args):
            if field in kwargs:
                raise TypeError(f"{name}() got multiple values for argument '{field}'")
            value = args[i]
        elif field in kwargs:
            value = kwargs.pop(field)
        elif default is not MISSING:
            value = default
        elif factory is not MISSING:
            value = factory()
        else:
            raise TypeError(f"{name}() missing required argument: '{field}'")
        object.__setattr__(self, field, value)
    if kwargs:
        raise TypeError(f"{name}() got an unexpected keyword argument '{sorted(kwargs)[0]}'")
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


def _values(self, names: tuple) -> tuple:
    return tuple(getattr(self, n) for n in names)


def _repr(self) -> str:
    return (f"{type(self).__qualname__}("
            + ", ".join(f"{n}={getattr(self, n)!r}" for n in type(self)._fields_repr) + ")")


def _eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = type(self)._fields_compare
    return _values(self, names) == _values(other, names)


def _hash(self) -> int:
    return hash(_values(self, type(self)._fields_compare))


def _frozen_set(self, name, value):
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_del(self, name):
    raise FrozenInstanceError(f"cannot delete field {name!r}")
