"""Static arguments (``static_argnums`` / ``static_argnames``, JAX's convention): Python values
baked into a compiled step rather than traced. A compiled function with static arguments keeps one
compiled function per value of them (the key, `StaticKey`: equal only for values that are the
same to the function, `exact`), each compiling the function with those values bound
(`StaticArguments.bound`); the disk cache keys on the generated source, which holds what the
values made of the program."""
from __future__ import annotations

import collections
import decimal
import functools
import inspect
import struct

import numpy as np

from ..tracing import argument_names
from ..util import TracingError, user_location


class StaticArguments:
    """The positions of a function's static arguments and how a call splits into them."""

    def __init__(self, fn, positions: tuple[int, ...]):
        self.positions = positions
        self.fn = fn
        parameters = [p for p in signature_parameters(fn) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        # A static argument left out is its default: the same key as the call passing it
        self.defaults = {i: parameters[i].default for i in positions
                         if i < len(parameters) and parameters[i].default is not parameters[i].empty}
        self.names = {i: parameters[i].name for i in positions if i < len(parameters)}

    @classmethod
    def of(cls, fn, static_argnums, static_argnames) -> StaticArguments | None:
        """The static arguments of ``fn``, or None when there are none."""
        nums = static_argnums if isinstance(static_argnums, (tuple, list)) else (static_argnums,)
        names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        for n in nums:
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise TypeError(f"static_argnums={static_argnums!r}: each must be a non-negative int "
                                f"(the position of an argument of {fn.__name__})")
        parameters = positional_names(fn)
        for name in names:
            if name not in parameters:
                raise TypeError(f"static_argnames={static_argnames!r}: {fn.__name__} has no positional "
                                f"parameter {name!r} (its parameters: {', '.join(parameters)})")
        positions = tuple(sorted(set(nums) | {parameters.index(name) for name in names}))
        return cls(fn, positions) if positions else None

    def describe(self, position: int) -> str:
        names = argument_names(self.fn, position + 1)
        return f"{names[position]} (argument {position})"

    def split(self, args) -> tuple[StaticKey, tuple]:
        """The call's key (how many traced arguments, and the static values, defaults filled in)
        and its traced arguments."""
        static = {}
        for i in self.positions:
            if i >= len(args) and i not in self.defaults:
                continue
            value = args[i] if i < len(args) else self.defaults[i]
            try:
                hash(value)
            except TypeError:
                raise TracingError(
                    f"{self.describe(i)} of {self.fn.__name__} is static, so it must be hashable (it is "
                    f"part of the cache key), but it is a {type(value).__name__}: pass a tuple or "
                    f"another hashable value, or leave it out of static_argnums/static_argnames to "
                    f"trace it", user_location()) from None
            static[i] = value
        dynamic = tuple(a for i, a in enumerate(args) if i not in self.positions)
        return StaticKey.of(len(dynamic), static), dynamic

    def bound(self, fn, key: StaticKey):
        """``fn`` with the static values of ``key`` bound: a function of the traced arguments,
        whose signature names them (as error messages and argument paths do). Static values after
        the last traced argument are passed by name."""
        n_dynamic, static = key.n_dynamic, key.values
        count = placed = 0
        while placed < n_dynamic:
            placed += count not in static
            count += 1
        while any(i >= count and i not in self.names for i in static):   # no name: positional
            count += 1
        by_name = {self.names[i]: value for i, value in static.items() if i >= count}

        @functools.wraps(fn)
        def with_static(*dynamic):
            it = iter(dynamic)
            return fn(*[static[i] if i in static else next(it) for i in range(count)], **by_name)

        names = [n if n.isidentifier() else f"args_{i}" for i, n in enumerate(argument_names(fn, count))]
        with_static.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for i, n in enumerate(names) if i not in static])
        return with_static

    def dynamic_argnums(self, argnums):
        """``argnums`` (positions among all the arguments) as positions among the traced ones."""
        shift = lambda i: i - sum(p < i for p in self.positions)   # noqa: E731
        return tuple(map(shift, argnums)) if isinstance(argnums, (tuple, list)) else shift(argnums)

    def check_traced(self, argnums, what: str) -> None:
        """Refuse ``argnums`` (the arguments that are ``what``) naming a static argument."""
        for i in argnums if isinstance(argnums, (tuple, list)) else (argnums,):
            if not isinstance(i, int) or i < 0:
                raise TypeError(f"argnums={argnums!r}: with static arguments, argnums must be "
                                f"non-negative ints")
            if i in self.positions:
                raise TypeError(f"{self.describe(i)} of {self.fn.__name__} is static, so it cannot be "
                                f"{what}; remove it from static_argnums/static_argnames or from argnums")


class StaticKey(tuple):
    """A call's static values as a dict key: how many traced arguments it has and the `exact` form
    of each static value by position, so that two keys are equal when the values are exactly the
    same, whatever ``==`` says of them; the values themselves are ``values``."""

    @classmethod
    def of(cls, n_dynamic: int, values: dict[int, object]) -> StaticKey:
        key = cls((n_dynamic, *zip(values, map(exact, values.values()))))
        key.n_dynamic, key.values = n_dynamic, values
        return key


def exact(value):
    """``value`` as a key equal to another's only when the two are the same value: each with its
    type (``True`` is not ``1``, nor ``1`` ``1.0``), recursively inside tuples (named ones too),
    frozensets and slices, floats and complex numbers by their bits (``-0.0`` is not ``0.0``, a NaN
    is itself), NumPy scalars by dtype and bytes, decimals by digits and exponent. Values of other
    classes (enum members, strings, None, the user's own) keep their own ``==`` and hash."""
    payload = payload_of(type(value))
    return (type(value), value) if payload is None else (type(value), payload(value))


@functools.lru_cache(maxsize=256)
def payload_of(kind: type):
    """What tells apart values of ``kind`` that ``==`` confuses, or None to compare them by ``==``:
    a class in `EXACT_PAYLOADS` or a subclass keeping its ``==`` and hash (a named tuple)."""
    if issubclass(kind, np.generic):
        return lambda v: (v.dtype, v.tobytes())
    for base, payload in EXACT_PAYLOADS.items():
        if issubclass(kind, base) and kind.__eq__ is base.__eq__ and kind.__hash__ is base.__hash__:
            return payload
    return None


EXACT_PAYLOADS = {   # builtin classes whose == confuses values, and what tells their values apart
    float: lambda v: struct.pack("<d", v),
    complex: lambda v: struct.pack("<dd", v.real, v.imag),
    tuple: lambda v: tuple(map(exact, v)),
    # with the number of each element: two NaNs make a set of two
    frozenset: lambda v: frozenset(collections.Counter(map(exact, v)).items()),
    slice: lambda v: exact((v.start, v.stop, v.step)),
    range: lambda v: (v.start, v.stop, v.step),
    decimal.Decimal: lambda v: v.as_tuple(),
}


def signature_parameters(fn) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def positional_names(fn) -> list[str]:
    return [p.name for p in signature_parameters(fn) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
