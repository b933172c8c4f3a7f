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

The numbers come from a counter-based generator (``morphjit.native.random``): a draw fuses into
the loops that read it, no noise array is allocated, and the reference executor draws the very
same numbers with NumPy. `traced_generator` makes the stand-ins (``morphjit.api.methods`` installs
it as the tracer of generator arguments).
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType, Var, dtype_name
from ..tracing import tracer as tracing
from ..util import ArgumentError, UnsupportedError, user_location
from . import core as A, draw_checks as checks

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

    def rewind(self) -> None:
        """Draw again from the first stream: each path through the function's tests draws alike."""
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


# NumPy's global draws (``np.random.randn(...)``) that a traced global generator makes instead
GLOBAL_DRAWS = frozenset({"rand", "randn", "random_sample", "standard_normal", "normal", "uniform", "randint",
                          "exponential", "standard_exponential", "binomial"})


def global_draws() -> list[tuple[object, str, object]]:
    """``(np.random, name, substitute)``: each global draw, made by the traced global generator
    of the current trace where it has one (`Trace.global_generator`), else by NumPy."""
    def substitute(name, original):
        def draw(*args, **kwargs):
            t = tracing.current_trace()
            traced = None if t is None else t.global_generator
            return original(*args, **kwargs) if traced is None else getattr(traced, name)(*args, **kwargs)
        draw.__name__ = name
        return draw
    return [(np.random, name, substitute(name, getattr(np.random, name))) for name in sorted(GLOBAL_DRAWS)]


def traced_generator(t: tracing.Trace, generator, path: str) -> TracedDraws:
    kind = TracedGenerator if isinstance(generator, np.random.Generator) else TracedRandomState
    return kind(t, path)


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
