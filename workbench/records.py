"""`Record`: the plain value class of every object that travels to an NDIF server.

Plans, interventions, captures, model inputs and results are pickled by value into remote jobs
(see `workbench.backends.remote`), and NDIF unpickles and runs them inside a module whitelist
(torch, numpy, collections, typing, math, time, enum, operator, nnsight; the lists in
ndif-team/ndif at 028db44, src/services/ray/src/ray/nn/security/protected_environment.py). `dataclasses` is not on it, nor is the `_thread` that a dataclass's generated
`__repr__` imports: a dataclass instance is refused while the job is unpickled. A `Record` gives
what those classes used from `dataclass` (keyword/positional construction with defaults, frozen
or not, equality, hash, the same repr, `replace`) with builtins only. Why not a library
(attrs, pydantic): they are not on the server's whitelist either.

A subclass lists ALL its fields in order (inherited ones first) in `_fields`, defaults in
`_defaults`, fresh-per-instance defaults (a dict) in `_factories`, fields left out of repr and
equality in `_hidden`; `_mutable = True` allows assignment.
"""

from __future__ import annotations

from typing import Any


class Record:
    _fields: tuple = ()
    _defaults: dict = {}
    _factories: dict = {}
    _hidden: tuple = ()
    _mutable: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        if len(args) > len(cls._fields):
            raise TypeError(f"{cls.__name__}() takes {len(cls._fields)} arguments, got {len(args)}")
        values = dict(zip(cls._fields, args))
        for name, value in kwargs.items():
            if name not in cls._fields:
                raise TypeError(f"{cls.__name__}() got an unexpected argument {name!r}")
            if name in values:
                raise TypeError(f"{cls.__name__}() got multiple values for argument {name!r}")
            values[name] = value
        for name in cls._fields:
            if name in values:
                value = values[name]
            elif name in cls._factories:
                value = cls._factories[name]()
            elif name in cls._defaults:
                value = cls._defaults[name]
            else:
                raise TypeError(f"{cls.__name__}() missing argument {name!r}")
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if not type(self)._mutable:
            raise AttributeError(f"cannot assign to field {name!r} of a frozen {type(self).__name__}")
        object.__setattr__(self, name, value)

    def _compared(self) -> tuple:
        return tuple(getattr(self, f) for f in type(self)._fields if f not in type(self)._hidden)

    def __eq__(self, other: Any) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._compared() == other._compared()

    def __hash__(self) -> int:
        if type(self)._mutable:
            raise TypeError(f"unhashable type: {type(self).__name__!r}")
        return hash((type(self).__name__,) + self._compared())

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in type(self)._fields if f not in type(self)._hidden)
        return f"{type(self).__qualname__}({shown})"

    def replace(self, **changes: Any) -> Any:
        """A copy with `changes` applied (as `dataclasses.replace`)."""
        values = {f: getattr(self, f) for f in type(self)._fields}
        values.update(changes)
        return type(self)(**values)
