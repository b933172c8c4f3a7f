"""Random numbers drawn inside the compiled step (``mj.random``, ``mj.dropout``).

A ``np.random.Generator`` or ``np.random.RandomState`` argument of a loss is not data. While the
loss is traced it receives a stand-in (`TracedGenerator`, `TracedRandomState`), whose methods
(``normal``, ``random``, ``integers``, ``randn``, ...) bind the ``random`` op: a standard normal
or uniform array drawn from a counter-based generator, scaled and shifted by ordinary traced
arithmetic (so a gradient flows through ``loc + scale * eps``, never into ``eps``). Their
arguments are checked as NumPy checks them (``draw_checks``). Each call of the compiled step
takes one 64-bit draw from the user's generator as its seed (advancing it: consecutive calls
differ, two runs from the same seed agree), passed to the step in the generator's place;
inspecting a step (``explain``) runs it on a copy of the generator, and the rows of a Hessian
replay one seed from copies.

Element ``n`` of draw number ``s`` of a call is a pure function of (seed, s, n): SplitMix64's
output mixer over ``key(seed, s) + n * golden gamma``. Any loop can therefore compute any
element on its own, in any order: a draw fuses into the loops that read it (recomputed in the
forward and the backward loop alike, identical in both), no noise array is allocated, and the
reference executor draws the very same numbers with NumPy.
"""
from __future__ import annotations

import copy
import math

import numpy as np

from . import core as A
from ..util import pytree
from ..tracing import tracer as tracing
from . import draw_checks as checks
from ..util.errors import ArgumentError, UnsupportedError, user_location
from ..ir.index import IndexMap
from ..ir.program import DTYPES_BY_NAME, TensorType, Var, dtype_name
from ..ir.loop import Random
from ..ops.core import SOURCE, defop

GENERATORS = (np.random.Generator, np.random.RandomState)
RAW_64_BITS = (np.random.PCG64, np.random.PCG64DXSM, np.random.Philox, np.random.SFC64)   # random_raw() widths

GOLDEN = 0x9E3779B97F4A7C15      # SplitMix64's increment: consecutive elements of a draw
STREAM = 0xD1B54A32D192ED03      # separates the draws of one call
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
UNIFORM_BITS = {np.dtype(np.float64): 53, np.dtype(np.float32): 24}
DISTRIBUTIONS = ("uniform", "normal")   # [0, 1) and N(0, 1); the others are formulas of them


def seed_of(generator) -> np.ndarray:
    """The seed of one call: 64 random bits taken from (and advancing) the user's generator,
    whatever its bit generator, as the int64 array of one element the step takes in its place.
    The raw output of most bit generators has 64 bits; NumPy's full-range uint64 draw (slower)
    joins two of MT19937's, which have 32, and serves any other kind."""
    if isinstance(generator, np.random.Generator):
        bits = generator.bit_generator
        if type(bits) in RAW_64_BITS:
            return np.array([bits.random_raw()], np.uint64).view(np.int64)
        return np.array([generator.integers(2 ** 64, dtype=np.uint64)]).view(np.int64)
    return np.array([generator.randint(2 ** 64, dtype=np.uint64)]).view(np.int64)


def with_copied_generators(tree):
    """``tree`` with each random generator among its leaves replaced by a copy in the same state:
    a step given the copy draws the seed the generator would give next, and leaves it as it was."""
    leaves, treedef = pytree.flatten(tree)
    if not any(isinstance(x, GENERATORS) for x in leaves):
        return tree
    return pytree.unflatten(treedef, [copy.deepcopy(x) if isinstance(x, GENERATORS) else x for x in leaves])


def replaying_generators(tree):
    """A function returning ``tree`` with each random generator among its leaves replaced by a
    copy, put back at every call into the generator's present state: each step given it draws
    the seed the generator would give next, and the generator stays as it was."""
    copied = with_copied_generators(tree)
    copies = [x for x in pytree.flatten(copied)[0] if isinstance(x, GENERATORS)]
    states = [_state(g) for g in copies]

    def replayed():
        for generator, state in zip(copies, states):
            _set_state(generator, state)
        return copied
    return replayed


def _state(generator):
    return generator.bit_generator.state if isinstance(generator, np.random.Generator) else generator.get_state()


def _set_state(generator, state) -> None:
    if isinstance(generator, np.random.Generator):
        generator.bit_generator.state = state
    else:
        generator.set_state(state)


def as_input(x, dtype) -> np.ndarray:
    """An argument leaf as a program input for the reference executor (a generator: its seed)."""
    return seed_of(x).reshape(()) if isinstance(x, GENERATORS) else np.asarray(x, dtype)


# ---------------------------------------------------------------------------------------------
# The numbers, in NumPy (the reference) and as generated source (the compiled step)

def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
    return z ^ (z >> np.uint64(31))


def _bits(seed, stream: int, counter: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        key = _mix(np.asarray(seed).astype(np.uint64) + np.uint64((stream + 1) * STREAM % 2 ** 64))
        return _mix(key + (counter.astype(np.uint64) + np.uint64(1)) * np.uint64(GOLDEN))


def draw(seed, stream: int, dist: str, dtype, counter: np.ndarray) -> np.ndarray:
    """Elements ``counter`` (flat indices) of draw ``stream`` of distribution ``dist``."""
    dtype = np.dtype(dtype)
    if dist == "uniform":
        bits = UNIFORM_BITS[dtype]
        return ((_bits(seed, stream, counter) >> np.uint64(64 - bits)).astype(np.float64) * 2.0 ** -bits).astype(dtype)
    # Box-Muller on two uniforms of 53 bits: u1 in (0, 1], u2 in [0, 1).
    u1 = ((_bits(seed, stream, 2 * counter) >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0 ** -53
    u2 = (_bits(seed, stream, 2 * counter + 1) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)).astype(dtype)


def _u64(value: int) -> str:
    return f"np.uint64({value % 2 ** 64})"


def render(bind, seed: str, stream: int, dist: str, dtype, counter: str, call) -> str:
    """The source of one element, as ``draw`` computes it: ``bind(code)`` names a step in a new
    local, ``call(fn, x)`` renders a transcendental function."""
    def mix(z: str) -> str:
        z = bind(f"({z} ^ ({z} >> {_u64(30)})) * {_u64(MIX1)}")
        z = bind(f"({z} ^ ({z} >> {_u64(27)})) * {_u64(MIX2)}")
        return bind(f"{z} ^ ({z} >> {_u64(31)})")

    key = mix(bind(f"np.uint64({seed}) + {_u64((stream + 1) * STREAM)}"))   # loop-invariant: LLVM hoists it

    def bits(n: str) -> str:
        return mix(bind(f"{key} + (np.uint64({n}) + {_u64(1)}) * {_u64(GOLDEN)}"))

    dtype = np.dtype(dtype)
    if dist == "uniform":
        width = UNIFORM_BITS[dtype]
        return f"np.{dtype.name}(np.float64({bits(counter)} >> {_u64(64 - width)}) * {2.0 ** -width!r})"
    u1 = bind(f"(np.float64({bits(f'2 * ({counter})')} >> {_u64(11)}) + 1.0) * {2.0 ** -53!r}")
    u2 = bind(f"np.float64({bits(f'2 * ({counter}) + 1')} >> {_u64(11)}) * {2.0 ** -53!r}")
    radius = f"np.sqrt(-2.0 * {call('log', u1)})"
    return f"np.{dtype.name}({radius} * {call('cos', f'{2.0 * math.pi!r} * {u2}')})"


# ---------------------------------------------------------------------------------------------
# The op

def _random_rule(types, shape, dtype, dist, stream):
    (seed,) = types
    assert seed.dtype == np.int64 and seed.shape == (), seed
    return TensorType(shape, DTYPES_BY_NAME[dtype])


def _random_impl(seed, shape, dtype, dist, stream):
    counter = np.arange(math.prod(shape), dtype=np.uint64).reshape(shape)
    return draw(seed, stream, dist, DTYPES_BY_NAME[dtype], counter)


def flat_counter(imap: IndexMap, shape) -> IndexMap:
    """The flat (C-order) index in an array of ``shape`` of the element ``imap`` addresses."""
    strides, stride = [], 1
    for extent in reversed(shape):
        strides.insert(0, stride)
        stride = stride * extent
    offset = sum((s * o for s, o in zip(strides, imap.offsets)), 0)
    row = tuple(sum((s * row[j] for s, row in zip(strides, imap.coeffs)), 0) for j in range(imap.loop_ndim))
    return IndexMap((offset,), (row,))


def _random_body(expr, b, imap: IndexMap) -> Random:
    kw = b.kwargs
    seed = expr(b.inputs[0], IndexMap((), ()))
    return Random(seed, kw["stream"], kw["dist"], flat_counter(imap, b.out.shape), b.out.dtype)


defop("random", SOURCE, _random_rule, _random_impl, body=_random_body)


# ---------------------------------------------------------------------------------------------
# The generators a traced loss receives

class TracedDraws:
    """What a loss receives for a random generator argument while it is traced: the methods of
    ``kind``, each a draw made inside the compiled step on every call, its arguments checked as
    NumPy checks them (``draw_checks``). The methods both kinds have alike are here."""

    kind: type

    def __init__(self, t: tracing.Trace, path: str):
        self.trace, self.path = t, path
        self.operand = Var(TensorType((), np.int64))   # the seed of the call
        self.draws = 0

    def _draw(self, dist: str, shape: tuple, dtype=np.float64):
        stream, self.draws = self.draws, self.draws + 1
        seed = tracing.Tracer(self.trace, self.operand)
        return self.trace.bind("random", (seed,), shape=shape, dtype=dtype_name(np.dtype(dtype)),
                               dist=dist, stream=stream)

    def _method(self, name: str) -> str:
        return f"{self.path}.{name}"

    def _size(self, size, method: str) -> tuple:
        return checks.shape_of_size(size, self._method(method)) or ()

    def _shape(self, method: str, size, **params) -> tuple:
        return checks.draw_shape(self._method(method), checks.shape_of_size(size, self._method(method)), **params)

    def normal(self, loc=0.0, scale=1.0, size=None):
        method = self._method("normal")
        loc, scale = checks.checked(loc, method, "loc"), checks.checked(scale, method, "scale", checks.NON_NEGATIVE)
        return _location_scale(self._draw("normal", self._shape("normal", size, loc=loc, scale=scale)), loc, scale)

    def exponential(self, scale=1.0, size=None):
        scale = checks.checked(scale, self._method("exponential"), "scale", checks.NON_NEGATIVE)
        u = self._draw("uniform", self._shape("exponential", size, scale=scale))
        return _location_scale(_exponential(u), 0.0, scale)

    def _uniform(self, low, high, size, ordered: bool):
        """``low + (high - low) * u``; ``ordered``: ``high < low`` is refused (Generator's rule)."""
        method = self._method("uniform")
        low, high = checks.checked(low, method, "low"), checks.checked(high, method, "high")
        constraints = (checks.FINITE, checks.ORDERED) if ordered else (checks.FINITE,)
        span = checks.checked(high - low, method, "high - low", *constraints)
        return _location_scale(self._draw("uniform", self._shape("uniform", size, low=low, high=high)), low, span)

    def _integers(self, method: str, low, high, size, dtype, closed: bool):
        """``floor(low + u * n)``, exact for ranges up to 2**53 values."""
        name = self._method(method)
        low, high = (0, low) if high is None else (low, high)
        low, high = checks.integer_bound(low, name, "low"), checks.integer_bound(high, name, "high")
        dtype = checks.integer_dtype(dtype, name)
        low, count = checks.integer_range(low, high, dtype, closed, name)
        offset = A.astype(np.floor(self._draw("uniform", self._size(size, method)) * float(count)), np.int64)
        return A.astype(offset + low if low else offset, dtype)   # in int64, which holds every value of the range

    def binomial(self, n, p, size=None):
        """Bernoulli masks (``n = 1``): ``u < p`` as integers."""
        method = self._method("binomial")
        n = checks.integer_bound(n, method, "n")
        if n < 0:
            raise ArgumentError(f"{method}: n < 0 (n is {n})", user_location())
        if n != 1:
            raise UnsupportedError(f"{method}: only n=1 (a Bernoulli mask, e.g. for dropout) is drawn inside a "
                                   f"compiled loss", user_location())
        p = checks.checked(p, method, "p", checks.PROBABILITY)
        return A.astype(self._draw("uniform", self._shape("binomial", size, p=p)) < p, np.int64)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if not hasattr(self.kind, name):
            raise AttributeError(f"{self.kind.__name__!r} object has no attribute {name!r}")
        methods = sorted(name for name in dir(type(self)) if not name.startswith("_"))
        raise UnsupportedError(f"{self.path}.{name} is not drawn inside a compiled loss; supported: "
                               f"{', '.join(methods)}", user_location())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path})"


class TracedGenerator(TracedDraws):
    """What a loss receives for a ``np.random.Generator`` argument while it is traced."""

    kind = np.random.Generator

    def random(self, size=None, dtype=np.float64, out=None):
        _no_out(self._method("random"), out)
        return self._draw("uniform", self._size(size, "random"), checks.float_dtype(dtype, self._method("random")))

    def standard_normal(self, size=None, dtype=np.float64, out=None):
        method = self._method("standard_normal")
        _no_out(method, out)
        return self._draw("normal", self._size(size, "standard_normal"), checks.float_dtype(dtype, method))

    def uniform(self, low=0.0, high=1.0, size=None):
        return self._uniform(low, high, size, ordered=True)

    def standard_exponential(self, size=None, dtype=np.float64, method="zig", out=None):
        name = self._method("standard_exponential")
        _no_out(name, out)
        return _exponential(self._draw("uniform", self._size(size, "standard_exponential"),
                                       checks.float_dtype(dtype, name)))

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):
        return self._integers("integers", low, high, size, dtype, endpoint)


class TracedRandomState(TracedDraws):
    """What a loss receives for a legacy ``np.random.RandomState`` argument while it is traced."""

    kind = np.random.RandomState

    def randn(self, *dims):
        return self._draw("normal", tuple(checks.dimension(d, self._method("randn"), dims) for d in dims))

    def rand(self, *dims):
        return self._draw("uniform", tuple(checks.dimension(d, self._method("rand"), dims) for d in dims))

    def random_sample(self, size=None):
        return self._draw("uniform", self._size(size, "random_sample"))

    def random(self, size=None):
        return self._draw("uniform", self._size(size, "random"))

    def standard_normal(self, size=None):
        return self._draw("normal", self._size(size, "standard_normal"))

    def uniform(self, low=0.0, high=1.0, size=None):
        return self._uniform(low, high, size, ordered=False)

    def standard_exponential(self, size=None):
        return _exponential(self._draw("uniform", self._size(size, "standard_exponential")))

    def randint(self, low, high=None, size=None, dtype=int):
        return self._integers("randint", low, high, size, dtype, False)


def _exponential(u):
    """A standard exponential from a uniform on [0, 1)."""
    return -np.log1p(-u)


def _no_out(method: str, out) -> None:
    if out is not None:
        raise UnsupportedError(f"{method}(out=...) is not supported inside a compiled loss: use the "
                               f"array it returns", user_location())


def _location_scale(x, shift, scale):
    """``shift + scale * x``, leaving out a literal shift of 0 and scale of 1."""
    if not (isinstance(scale, (int, float)) and scale == 1):
        x = scale * x
    if not (isinstance(shift, (int, float)) and shift == 0):
        x = shift + x
    return x


def traced_generator(t: tracing.Trace, generator, path: str) -> TracedDraws:
    kind = TracedGenerator if isinstance(generator, np.random.Generator) else TracedRandomState
    return kind(t, path)


for _kind in GENERATORS:
    tracing.LEAF_TRACERS[_kind] = traced_generator


# ---------------------------------------------------------------------------------------------
# mj.random: the draws as functions of a generator (traced or not), and dropout

def normal(rng, loc=0.0, scale=1.0, size=None):
    """``rng.normal(loc, scale, size)``: inside a compiled loss, drawn in the step on every call."""
    return rng.normal(loc, scale, size)


def standard_normal(rng, size=None):
    return rng.standard_normal(size)


def uniform(rng, low=0.0, high=1.0, size=None):
    return rng.uniform(low, high, size)


def random(rng, size=None):
    """Uniform on [0, 1)."""
    return rng.random(size)


def integers(rng, low, high=None, size=None):
    return rng.integers(low, high, size) if hasattr(rng, "integers") else rng.randint(low, high, size)


def bernoulli(rng, p, size=None):
    """A boolean mask, True with probability ``p`` (in [0, 1], broadcasting to ``size``)."""
    method = "mj.random.bernoulli"
    p = checks.checked(p, method, "p", checks.PROBABILITY)
    return rng.random(checks.draw_shape(method, checks.shape_of_size(size, method), p=p)) < p


def dropout(x, rate, rng):
    """Inverted dropout: each element of ``x`` zeroed with probability ``rate`` (in [0, 1), known or
    traced), the others scaled by ``1 / (1 - rate)`` (so the expected value is ``x``); the mask is
    drawn from ``rng``."""
    rate = checks.checked(rate, "mj.dropout", "rate", checks.KEEP_RATE)
    shape = checks.draw_shape("mj.dropout", A.shape_of(A.as_value(x)), rate=rate)
    if not isinstance(rate, tracing.Tracer) and not np.any(rate):
        return x
    keep = rng.random(shape) < 1.0 - rate
    return A.where(keep, x * (1.0 / (1.0 - rate)), 0.0)
