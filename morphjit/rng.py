"""Random numbers drawn inside the compiled step (``mj.random``, ``mj.dropout``).

A ``np.random.Generator`` or ``np.random.RandomState`` argument of a loss is not data. While the
loss is traced it receives a `TracedGenerator`, whose methods (``normal``, ``random``,
``integers``, ``randn``, ...) bind the ``random`` op: a standard normal or uniform array drawn
from a counter-based generator, scaled and shifted by ordinary traced arithmetic (so a gradient
flows through ``loc + scale * eps``, never into ``eps``). Each call of the compiled step takes
one 64-bit draw from the user's generator as its seed (advancing it: consecutive calls differ,
two runs from the same seed agree), passed to the step in the generator's place.

Element ``n`` of draw number ``s`` of a call is a pure function of (seed, s, n): SplitMix64's
output mixer over ``key(seed, s) + n * golden gamma``. Any loop can therefore compute any
element on its own, in any order: a draw fuses into the loops that read it (recomputed in the
forward and the backward loop alike, identical in both), no noise array is allocated, and the
reference executor draws the very same numbers with NumPy.
"""
from __future__ import annotations

import math

import numpy as np

from . import array_api as A
from . import trace as tracing
from .errors import UnsupportedError, user_location
from .indexing import IndexMap
from .ir import DTYPES_BY_NAME, Sym, TensorType, Var, dtype_name
from .loopir import Random
from .ops import SOURCE, broadcast_shapes, defop

GENERATORS = (np.random.Generator, np.random.RandomState)

GOLDEN = 0x9E3779B97F4A7C15      # SplitMix64's increment: consecutive elements of a draw
STREAM = 0xD1B54A32D192ED03      # separates the draws of one call
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
UNIFORM_BITS = {np.dtype(np.float64): 53, np.dtype(np.float32): 24}
DISTRIBUTIONS = ("uniform", "normal")   # [0, 1) and N(0, 1); the others are formulas of them


def seed_of(generator) -> np.ndarray:
    """The seed of one call, taken from (and advancing) the user's generator: the int64 array
    of one element the step takes in the generator's place."""
    if isinstance(generator, np.random.Generator):
        return np.array([generator.bit_generator.random_raw()], np.uint64).view(np.int64)
    return np.array([generator.tomaxint()], np.int64)   # 63 bits; the fastest draw RandomState has


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
# The generator a traced loss receives

def _size(size) -> tuple:
    if size is None:
        return ()
    if isinstance(size, (int, np.integer, Sym)):
        return (size,)
    return tuple(size)


def _float_dtype(dtype, method: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in UNIFORM_BITS:
        raise UnsupportedError(f"{method}: dtype must be float32 or float64, got {dtype}", user_location())
    return dtype


def _no_out(method: str, out) -> None:
    if out is not None:
        raise UnsupportedError(f"{method}(out=...) is not supported inside a compiled loss: use the "
                               f"array it returns", user_location())


class TracedGenerator:
    """What a loss receives for a ``np.random.Generator`` argument while it is traced: the same
    methods, each a draw made inside the compiled step on every call."""

    def __init__(self, t: tracing.Trace, path: str):
        self.trace, self.path = t, path
        self.operand = Var(TensorType((), np.int64))   # the seed of the call
        self.draws = 0

    def _draw(self, dist: str, size, dtype=np.float64):
        shape = _size(size)
        stream, self.draws = self.draws, self.draws + 1
        seed = tracing.Tracer(self.trace, self.operand)
        return self.trace.bind("random", (seed,), shape=shape, dtype=dtype_name(np.dtype(dtype)),
                               dist=dist, stream=stream)

    @staticmethod
    def _shape_of(size, *params) -> tuple:
        """``size``, or the broadcast shape of the distribution's parameters."""
        if size is not None:
            return _size(size)
        return broadcast_shapes("random", *(A.shape_of(A.as_value(p)) for p in params))

    # Generator's methods
    def random(self, size=None, dtype=np.float64, out=None):
        _no_out("random", out)
        return self._draw("uniform", size, _float_dtype(dtype, "random"))

    def standard_normal(self, size=None, dtype=np.float64, out=None):
        _no_out("standard_normal", out)
        return self._draw("normal", size, _float_dtype(dtype, "standard_normal"))

    def normal(self, loc=0.0, scale=1.0, size=None):
        return _location_scale(self._draw("normal", self._shape_of(size, loc, scale)), loc, scale)

    def uniform(self, low=0.0, high=1.0, size=None):
        return _location_scale(self._draw("uniform", self._shape_of(size, low, high)), low, high - low)

    def standard_exponential(self, size=None, dtype=np.float64, method="zig", out=None):
        _no_out("standard_exponential", out)
        return -np.log1p(-self._draw("uniform", size, _float_dtype(dtype, "standard_exponential")))

    def exponential(self, scale=1.0, size=None):
        return _location_scale(-np.log1p(-self._draw("uniform", self._shape_of(size, scale))), 0.0, scale)

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):
        """``floor(low + u * n)``: uniform for ranges far below 2**53."""
        low, high = (0, low) if high is None else (low, high)
        if not all(isinstance(v, (int, np.integer)) for v in (low, high)):
            raise UnsupportedError("integers: low and high must be Python integers inside a compiled loss",
                                   user_location())
        count = high - low + bool(endpoint)
        if count <= 0:
            raise ValueError(f"integers: low >= high ({low} >= {high})")
        u = self._draw("uniform", size)
        return A.astype(np.floor(u * float(count)), np.dtype(dtype)) + int(low)

    def binomial(self, n, p, size=None):
        """Bernoulli masks (``n = 1``): ``u < p`` as integers."""
        if not (isinstance(n, (int, np.integer)) and n == 1):
            raise UnsupportedError("binomial: only n=1 (a Bernoulli mask, e.g. for dropout) is drawn inside a "
                                   "compiled loss", user_location())
        return A.astype(self._draw("uniform", self._shape_of(size, p)) < p, np.int64)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        methods = sorted(name for name in dir(type(self)) if not name.startswith("_"))
        raise UnsupportedError(f"{self.path}.{name} is not drawn inside a compiled loss; supported: "
                               f"{', '.join(methods)}", user_location())

    def __repr__(self) -> str:
        return f"TracedGenerator({self.path})"


class TracedRandomState(TracedGenerator):
    """What a loss receives for a legacy ``np.random.RandomState`` argument while it is traced."""

    def randn(self, *dims):
        return self._draw("normal", dims)

    def rand(self, *dims):
        return self._draw("uniform", dims)

    def random_sample(self, size=None):
        return self._draw("uniform", size)

    def random(self, size=None):
        return self._draw("uniform", size)

    def standard_normal(self, size=None):
        return self._draw("normal", size)

    def randint(self, low, high=None, size=None, dtype=int):
        return self.integers(low, high, size, dtype)


def _location_scale(x, shift, scale):
    """``shift + scale * x``, leaving out a literal shift of 0 and scale of 1."""
    if not (isinstance(scale, (int, float)) and scale == 1):
        x = scale * x
    if not (isinstance(shift, (int, float)) and shift == 0):
        x = shift + x
    return x


def traced_generator(t: tracing.Trace, generator, path: str) -> TracedGenerator:
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
    """A boolean mask, True with probability ``p``."""
    return rng.random(size) < p


def dropout(x, rate: float, rng):
    """Inverted dropout: each element of ``x`` zeroed with probability ``rate``, the others scaled
    by ``1 / (1 - rate)`` (so the expected value is ``x``); the mask is drawn from ``rng``."""
    if not 0 <= rate < 1:
        raise ValueError(f"dropout: rate must lie in [0, 1), got {rate}")
    if rate == 0:
        return x
    keep = bernoulli(rng, 1.0 - rate, A.shape_of(A.as_value(x)))
    return A.where(keep, x * (1.0 / (1.0 - rate)), 0.0)
