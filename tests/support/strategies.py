"""Hypothesis strategies: random well-typed loss programs built from the op table.

``random_programs()`` draws ``(fn, args)``: ``fn(params, data)`` is a Python function written with
``ns.*`` calls (``ns`` is ``morphjit`` for ``fn`` itself) that reduces to a scalar loss, and
``args = (params, data)`` are matching NumPy inputs: ``params`` a dict of float arrays (the
differentiated argument, ``argnums=0``), ``data`` a dict of float arrays, integer labels and
boolean masks. So::

    @given(random_programs())
    def test_something(example):
        fn, args = example
        program = mj.trace(fn, *args)                           # works
        value, grads = mj.compile_loss(fn, backend=...)(*args)  # grads mirrors args[0]

Programs are random DAGs of element-wise unary and binary ops (with broadcasting and Python
scalar literals), reductions (every axis form, keepdims), views (reshape, transpose, slicing with
steps and integer indices, expand_dims/squeeze, broadcast_to), matmul (batched, 1-D operands),
joins (concatenate, stack), where/clip, casts and the stable composites (logsumexp, softmax,
log_softmax, softmax_cross_entropy). Every value carries an interval bound, so arguments stay in
safe domains (log and sqrt of values >= 0.3, exp of values <= 4, magnitudes <= 100): the
programs are smooth almost everywhere and finite.

``fn.source`` is the program's text (shown by ``repr(fn)``); ``fn.generic(ns)`` is the same
program over another array namespace (``tests.gradcheck.AG`` for autograd, ``NP`` for NumPy).
"""
from __future__ import annotations

import itertools
import linecache
import math
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

LIMIT = 100.0        # magnitude bound on every value
POSITIVE = 0.3       # lower bound required by log, sqrt, division and pow bases
MAX_SIZE = 96        # elements per value
_counter = itertools.count()


@dataclass(frozen=True)
class Node:
    name: str
    shape: tuple
    lo: float
    hi: float

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def mag(self):
        return max(abs(self.lo), abs(self.hi))


class RandomLoss:
    """A random loss function ``fn(params, data)``; its text is ``source``."""

    def __init__(self, source: str, filename: str):
        self.source, self.filename = source, filename
        self.__name__ = "loss"
        self.__qualname__ = "loss"
        self._code = compile(source, filename, "exec")
        lines = source.splitlines(keepends=True)
        linecache.cache[filename] = (len(source), None, lines, filename)  # readable error locations
        self._mj = self.generic(_mj())

    def generic(self, ns):
        """The same program with ``ns`` standing for the array namespace."""
        scope = {"ns": ns, "np": np}
        exec(self._code, scope)
        return scope["loss"]

    def __call__(self, params, data):
        return self._mj(params, data)

    def __repr__(self):
        return self.source


def _mj():
    import morphjit
    return morphjit


class _Builder:
    def __init__(self, draw, rng, dtype, allow_cast):
        self.draw, self.rng, self.dtype = draw, rng, np.dtype(dtype)
        self.allow_cast = allow_cast
        self.params, self.data = {}, {}
        self.nodes: list[Node] = []
        self.used: set[str] = set()
        self.lines: list[str] = []
        self._names = itertools.count()

    # -- inputs ----------------------------------------------------------------------------

    def param(self, shape, lo=-1.5, hi=1.5) -> Node:
        name = f"p{len(self.params)}"
        self.params[name] = self.rng.uniform(lo, hi, shape).astype(self.dtype)
        self.lines.append(f"{name} = params[{name!r}]")
        node = Node(name, tuple(shape), lo, hi)
        self.nodes.append(node)
        return node

    def data_float(self, shape, lo=-1.5, hi=1.5, keep=True) -> Node:
        name = f"d{len(self.data)}"
        self.data[name] = self.rng.uniform(lo, hi, shape).astype(self.dtype)
        self.lines.append(f"{name} = data[{name!r}]")
        node = Node(name, tuple(shape), lo, hi)
        if keep:
            self.nodes.append(node)
        return node

    def data_array(self, prefix, array) -> str:
        name = f"{prefix}{len(self.data)}"
        self.data[name] = array
        return f"data[{name!r}]"

    # -- emitting --------------------------------------------------------------------------

    def emit(self, expr: str, shape, lo, hi, uses=()) -> Node:
        lo, hi = sorted((float(lo), float(hi)))  # monotone decreasing maps give (f(hi), f(lo))
        assert math.isfinite(lo) and math.isfinite(hi), (expr, lo, hi)
        name = f"v{next(self._names)}"
        self.lines.append(f"{name} = {expr}")
        self.used.update(n.name for n in uses)
        node = Node(name, tuple(shape), min(lo, hi), max(lo, hi))
        self.nodes.append(node)
        return node

    def pick(self, pred=lambda n: True) -> Node | None:
        candidates = [n for n in self.nodes if pred(n)]
        if not candidates:
            return None
        if self.draw(st.integers(0, 2)) == 0:
            return candidates[-1]  # favour depth
        return candidates[self.draw(st.integers(0, len(candidates) - 1))]

    def literal(self, lo=-2.0, hi=2.0) -> float:
        return float(np.round(self.rng.uniform(lo, hi), 3)) or 0.5

    def positive(self, x: Node) -> Node:
        """``x`` itself if it is bounded below by POSITIVE, else a positive function of it."""
        if x.lo >= POSITIVE:
            return x
        if self.draw(st.booleans()):
            t = self.emit(f"ns.tanh({x.name})", x.shape, math.tanh(x.lo), math.tanh(x.hi), [x])
            return self.emit(f"ns.exp({t.name})", x.shape, math.exp(t.lo), math.exp(t.hi), [t])
        s = self.emit(f"ns.sigmoid({x.name})", x.shape, _sigmoid(x.lo), _sigmoid(x.hi), [x])
        return self.emit(f"{s.name} + 0.5", x.shape, s.lo + 0.5, s.hi + 0.5, [s])

    def tame(self, x: Node, bound=1.0) -> Node:
        """``x`` if its magnitude is at most ``bound``, else ``tanh`` of it."""
        if x.mag <= bound:
            return x
        return self.emit(f"ns.tanh({x.name})", x.shape, math.tanh(x.lo), math.tanh(x.hi), [x])

    # -- op families -----------------------------------------------------------------------

    def unary(self):
        x = self.pick()
        kind = self.draw(st.sampled_from(
            ["neg", "exp", "log", "log1p", "sqrt", "abs", "sign", "sin", "cos", "tanh", "sigmoid",
             "relu", "square", "pow_int", "pow_half", "scale", "shift", "rdiv", "rsub", "rpow"]))
        lo, hi = x.lo, x.hi
        if kind == "neg":
            return self.emit(f"-{x.name}", x.shape, -hi, -lo, [x])
        if kind == "exp":
            x = x if x.hi <= 4 else self.tame(x)
            return self.emit(f"ns.exp({x.name})", x.shape, math.exp(x.lo), math.exp(x.hi), [x])
        if kind in ("log", "log1p", "sqrt", "pow_half", "rdiv"):
            x = self.positive(x)
            f = {"log": math.log, "log1p": math.log1p, "sqrt": math.sqrt, "pow_half": math.sqrt,
                 "rdiv": lambda v: 1.0 / v}[kind]
            expr = {"log": f"ns.log({x.name})", "log1p": f"ns.log1p({x.name})",
                    "sqrt": f"ns.sqrt({x.name})", "pow_half": f"{x.name} ** 0.5",
                    "rdiv": f"1.0 / {x.name}"}[kind]
            return self.emit(expr, x.shape, f(x.lo), f(x.hi), [x])
        if kind == "abs":
            return self.emit(f"ns.abs({x.name})", x.shape, *_abs_interval(lo, hi), [x])
        if kind == "sign":
            return self.emit(f"ns.sign({x.name})", x.shape, -1, 1, [x])
        if kind in ("sin", "cos"):
            return self.emit(f"ns.{kind}({x.name})", x.shape, -1, 1, [x])
        if kind == "tanh":
            return self.emit(f"ns.tanh({x.name})", x.shape, math.tanh(lo), math.tanh(hi), [x])
        if kind == "sigmoid":
            return self.emit(f"ns.sigmoid({x.name})", x.shape, _sigmoid(lo), _sigmoid(hi), [x])
        if kind == "relu":
            return self.emit(f"ns.relu({x.name})", x.shape, max(lo, 0), max(hi, 0), [x])
        if kind in ("square", "pow_int"):
            x = self.tame(x, 3.0)
            if kind == "square":
                return self.emit(f"ns.square({x.name})", x.shape, *_square_interval(x.lo, x.hi), [x])
            return self.emit(f"{x.name} ** 3", x.shape, x.lo ** 3, x.hi ** 3, [x])
        if kind == "scale":
            c = self.literal()
            return self.emit(f"{x.name} * {c!r}", x.shape, *sorted((lo * c, hi * c)), [x])
        if kind == "shift":
            c = self.literal()
            return self.emit(f"{x.name} + {c!r}", x.shape, lo + c, hi + c, [x])
        if kind == "rsub":
            c = self.literal()
            return self.emit(f"{c!r} - {x.name}", x.shape, c - hi, c - lo, [x])
        # rpow: c ** x, c > 0
        x = self.tame(x, 2.0)
        c = self.literal(0.5, 2.0)
        return self.emit(f"{c!r} ** {x.name}", x.shape, *sorted((c ** x.lo, c ** x.hi)), [x])

    def binary(self):
        a = self.pick()
        b = self.pick(lambda n: _broadcast(a.shape, n.shape) is not None
                      and _size(_broadcast(a.shape, n.shape)) <= MAX_SIZE)
        if b is None:
            return None
        if self.draw(st.booleans()):
            a, b = b, a
        kind = self.draw(st.sampled_from(["add", "sub", "mul", "div", "pow", "maximum", "minimum"]))
        if kind in ("div", "pow"):
            b = self.positive(b) if kind == "div" else self.tame(b, 2.0)
            if kind == "pow":
                a = self.positive(a)
        if kind in ("mul", "div", "pow") and max(a.mag, b.mag) > 10:
            a, b = self.tame(a, 10.0), self.tame(b, 10.0)
        shape = _broadcast(a.shape, b.shape)
        if kind in ("maximum", "minimum"):
            pick = max if kind == "maximum" else min
            return self.emit(f"ns.{kind}({a.name}, {b.name})", shape, pick(a.lo, b.lo), pick(a.hi, b.hi),
                             [a, b])
        op = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}[kind]
        f = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
             "div": lambda x, y: x / y, "pow": lambda x, y: x ** y}[kind]
        if kind == "sub":
            corners = [a.lo - b.hi, a.hi - b.lo]
        else:
            corners = [f(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        return self.emit(f"{a.name} {op} {b.name}", shape, min(corners), max(corners), [a, b])

    # The wider NumPy/SciPy surface (numpy_ext, special, numpy_reduce, einsum, custom): each op on a
    # domain where it is smooth; the piecewise-constant ones where they are constant.
    EXTENDED_UNARY = {
        "expm1": "any", "exp2": "any", "sinh": "any", "cosh": "any", "arctan": "any", "arcsinh": "any",
        "fabs": "any", "erf": "any", "erfc": "any", "cbrt": "pos", "log2": "pos",
        "log10": "pos", "gammaln": "pos", "digamma": "pos", "entr": "pos", "arccosh": "pos", "tan": "unit", "arcsin": "unit",
        "arccos": "unit", "arctanh": "unit", "erfinv": "unit", "rint": "flat", "floor": "flat", "ceil": "flat",
        "trunc": "flat",
    }
    # SciPy's kernels (morphjit/native/special.py), all in one kind (so that each is drawn often
    # enough), orders and shapes constant (their gradients are refused): (domain, calls of x = {0})
    EXTENDED_KERNELS = {
        "scipy_kernels": ("pos", "ns.i0({0}) + ns.i1({0}) + ns.j0({0}) + ns.j1({0}) + ns.y0({0}) + ns.y1({0}) "
                                 "+ ns.iv(1.5, {0}) + ns.kv(0.5, {0}) + ns.gamma({0}) + ns.gammainc(1.5, {0}) "
                                 "+ ns.gammaincc(2.5, {0}) + ns.polygamma(2, {0}) + ns.beta({0}, 1.5) "
                                 "+ ns.betaln(0.75, {0}) + ns.betainc(1.5, 2.5, 1.0 / (1.0 + {0})) "
                                 "+ ns.betaincc(0.5, 2.0, 1.0 / (1.0 + {0})) + ns.stdtr(2.5, {0} - 1.0)"),
    }
    EXTENDED_BINARY = ["hypot", "arctan2", "logaddexp", "logaddexp2", "copysign", "heaviside", "remainder", "fmod",
                       "floor_divide", "xlogy", "xlog1py"]

    def extended(self):
        # Drawn from the program's seeded generator: uniform over the many kinds (hypothesis's
        # derandomized choices favour the first few).
        kinds = (sorted(self.EXTENDED_UNARY) + self.EXTENDED_BINARY + sorted(self.EXTENDED_KERNELS)
                 + ["prod", "diagonal", "window", "max_pool"])
        kind = kinds[int(self.rng.integers(len(kinds)))]
        if kind in self.EXTENDED_UNARY:
            return self._extended_unary(kind, self.EXTENDED_UNARY[kind])
        if kind in self.EXTENDED_KERNELS:
            return self._extended_unary(kind, *self.EXTENDED_KERNELS[kind])
        if kind in ("window", "max_pool"):
            return self._windows(kind)
        if kind == "prod":
            x = self.pick(lambda n: n.ndim >= 1)
            if x is None:
                return None
            x = self.tame(x)
            axis = self.draw(st.integers(-x.ndim, x.ndim - 1))
            shape = tuple(d for i, d in enumerate(x.shape) if i != axis % x.ndim)
            return self.emit(f"ns.prod({x.name}, axis={axis})", shape, -1.0, 1.0, [x])
        if kind == "diagonal":
            x = self.pick(lambda n: n.ndim >= 2)
            if x is None:
                return None
            shape = x.shape[2:] + (min(x.shape[:2]),)
            return self.emit(f"ns.diagonal({x.name})", shape, x.lo, x.hi, [x])
        return self._extended_binary(kind)

    def _windows(self, kind):
        """A sliding window view along one axis, or 2-d max pooling over the last two axes."""
        if kind == "window":
            x = self.pick(lambda n: n.ndim >= 1)
            if x is None:
                return None
            axis = self.draw(st.integers(0, x.ndim - 1))
            k = self.draw(st.integers(1, x.shape[axis]))
            shape = x.shape[:axis] + (x.shape[axis] - k + 1,) + x.shape[axis + 1:] + (k,)
            return self.emit(f"ns.sliding_window_view({x.name}, {k}, axis={axis})", shape, x.lo, x.hi, [x])
        x = self.pick(lambda n: n.ndim >= 2)
        if x is None:
            return None
        (h, w), sizes = x.shape[-2:], (self.draw(st.integers(1, x.shape[-2])), self.draw(st.integers(1, x.shape[-1])))
        batch = _size(x.shape[:-2])
        shape = (batch, 1, h // sizes[0], w // sizes[1])
        return self.emit(f"ns.max_pool2d(ns.reshape({x.name}, {(batch, 1, h, w)!r}), {sizes!r})", shape, x.lo, x.hi, [x])

    def _extended_unary(self, kind, domain, expression=None):
        """``ns.<kind>(x)``, or ``expression`` of x (``{0}``), on the domain of its kind."""
        x = self.pick()
        if domain == "pos":
            x = self.positive(x)
        else:
            x = self.tame(x, 2.0 if domain == "any" else 1.0)
            if domain != "any":
                scale, shift = (0.9, 0.0) if domain == "unit" else (0.1, 0.25)
                x = self.emit(f"{x.name} * {scale} + {shift}", x.shape, x.lo * scale + shift, x.hi * scale + shift, [x])
        arg = f"{x.name} + 1.0" if kind == "arccosh" else x.name
        grid = np.linspace(x.lo, x.hi, 201) + (1.0 if kind == "arccosh" else 0.0)
        if expression is None:
            values = _numpy_function(kind)(grid)
            return self.emit(f"ns.{kind}({arg})", x.shape, values.min(), values.max(), [x])
        import scipy.special
        values = np.asarray(eval(expression.format("x"), {"ns": scipy.special, "x": grid}))
        return self.emit(expression.format(arg), x.shape, values.min(), values.max(), [x])

    def _extended_binary(self, kind):
        a = self.pick()
        b = self.pick(lambda n: _broadcast(a.shape, n.shape) is not None
                      and _size(_broadcast(a.shape, n.shape)) <= MAX_SIZE) or a
        a, b = self.tame(a, 2.0), self.positive(b)
        if kind in ("remainder", "fmod", "floor_divide", "heaviside"):
            a = self.positive(a)   # 0 < a < b: no wrap, no jump
            b = self.emit(f"{b.name} + {a.hi!r}", b.shape, b.lo + a.hi, b.hi + a.hi, [b])
        f = _numpy_function(kind)
        grid_a, grid_b = np.meshgrid(np.linspace(a.lo, a.hi, 41), np.linspace(b.lo, b.hi, 41))
        values = f(grid_a, 0.5 if kind == "heaviside" else grid_b)
        if kind == "heaviside":   # of a alone: its second argument is the constant 0.5
            return self.emit(f"ns.heaviside({a.name}, 0.5)", a.shape, values.min(), values.max(), [a])
        return self.emit(f"ns.{kind}({a.name}, {b.name})", _broadcast(a.shape, b.shape), values.min(), values.max(),
                         [a, b])

    def reduction(self):
        x = self.pick(lambda n: n.ndim >= 1)
        if x is None:
            return None
        kind = self.draw(st.sampled_from(["sum", "mean", "max", "min", "logsumexp", "var"]))
        axis = self.draw(_axis_forms(x.ndim))
        keep = self.draw(st.booleans())
        axes = _axes(axis, x.ndim)
        n = int(np.prod([x.shape[i] for i in axes], dtype=np.int64)) if axes else 1
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else \
            tuple(d for i, d in enumerate(x.shape) if i not in axes)
        if kind == "sum" and x.mag * n > LIMIT:
            x = self.tame(x)
        lo, hi = {"sum": (x.lo * n, x.hi * n), "mean": (x.lo, x.hi), "max": (x.lo, x.hi),
                  "min": (x.lo, x.hi), "logsumexp": (x.lo, x.hi + math.log(max(n, 1))),
                  "var": (0.0, (x.hi - x.lo) ** 2)}[kind]
        return self.emit(f"ns.{kind}({x.name}, axis={axis!r}, keepdims={keep})", shape, lo, hi, [x])

    def view(self):
        x = self.pick()
        kind = self.draw(st.sampled_from(["slice", "reshape", "ravel", "transpose", "swapaxes", "slice",
                                          "expand_dims", "squeeze", "broadcast_to", "T", "gather"]))
        if kind == "gather":
            # An integer index array (data, with repeated and negative entries) along one axis.
            if x.ndim == 0:
                return None
            axis = self.draw(st.integers(0, x.ndim - 1))
            size = x.shape[axis]
            index_shape = tuple(self.draw(st.lists(st.integers(1, 4), max_size=2)))
            index = self.data_array("idx", self.rng.integers(-size, size, index_shape))
            shape = x.shape[:axis] + index_shape + x.shape[axis + 1:]
            return self.emit(f"{x.name}[{':, ' * axis}{index}]", shape, x.lo, x.hi, [x])
        if kind == "reshape":
            shape = self.draw(_factorizations(x.size))
            return self.emit(f"ns.reshape({x.name}, {shape!r})", shape, x.lo, x.hi, [x])
        if kind == "ravel":
            return self.emit(f"{x.name}.reshape(-1)", (x.size,), x.lo, x.hi, [x])
        if kind in ("transpose", "T"):
            if kind == "T":
                return self.emit(f"{x.name}.T", x.shape[::-1], x.lo, x.hi, [x])
            perm = tuple(self.draw(st.permutations(range(x.ndim))))
            return self.emit(f"ns.transpose({x.name}, {perm!r})", tuple(x.shape[p] for p in perm),
                             x.lo, x.hi, [x])
        if kind == "swapaxes":
            if x.ndim < 2:
                return None
            i, j = self.draw(st.integers(-x.ndim, x.ndim - 1)), self.draw(st.integers(-x.ndim, x.ndim - 1))
            shape = list(x.shape)
            shape[i], shape[j] = shape[j], shape[i]
            return self.emit(f"ns.swapaxes({x.name}, {i}, {j})", shape, x.lo, x.hi, [x])
        if kind == "slice":
            if x.ndim == 0:
                return None
            key, text = self.draw(_index(x.shape))
            shape = np.empty(x.shape)[key].shape
            if _size(shape) == 0:
                return None
            return self.emit(f"{x.name}[{text}]", shape, x.lo, x.hi, [x])
        if kind == "expand_dims":
            axis = self.draw(st.integers(-x.ndim - 1, x.ndim))
            shape = list(x.shape)
            shape.insert(axis % (x.ndim + 1), 1)
            return self.emit(f"ns.expand_dims({x.name}, {axis})", shape, x.lo, x.hi, [x])
        if kind == "squeeze":
            if 1 not in x.shape:
                return None
            return self.emit(f"ns.squeeze({x.name})", tuple(d for d in x.shape if d != 1), x.lo, x.hi, [x])
        # broadcast_to: add a leading axis and stretch the size-1 axes
        lead = self.draw(st.integers(1, 3))
        shape = (lead,) + tuple(self.draw(st.integers(1, 3)) if d == 1 else d for d in x.shape)
        if _size(shape) > MAX_SIZE:
            return None
        return self.emit(f"ns.broadcast_to({x.name}, {shape!r})", shape, x.lo, x.hi, [x])

    def matmul(self):
        a = self.pick(lambda n: n.ndim >= 1 and n.size <= 48)
        if a is None:
            return None
        a = self.tame(a, 3.0)
        k = a.shape[-1]
        form = self.draw(st.sampled_from(["matrix", "vector", "batched", "left-vector", "node"]))
        if form == "node":  # two computed values whose shapes align
            b = self.pick(lambda n: n.ndim >= 2 and n.shape[-2] == k and n.size <= 48
                          and _matmul_shape(a.shape, n.shape) is not None)
            if b is None:
                return None
            b = self.tame(b, 3.0)
        elif form == "left-vector":  # a vector on the left of a new matrix or batch
            n = self.draw(st.integers(1, 4))
            b = self.param((k, n) if a.ndim > 1 or self.draw(st.booleans()) else (2, k, n))
        else:
            n = self.draw(st.integers(1, 4))
            shape = {"matrix": (k, n), "vector": (k,),
                     "batched": (self.draw(st.integers(1, 3)), 1, k, n) if a.ndim <= 2 else
                                (a.shape[-3] if self.draw(st.booleans()) else 1, k, n)}[form]
            b = self.param(shape, -1.0, 1.0)
        shape = _matmul_shape(a.shape, b.shape)
        if shape is None or _size(shape) > MAX_SIZE:
            return None
        bound = k * a.mag * b.mag
        if bound > LIMIT:
            return None
        return self.emit(f"{a.name} @ {b.name}", shape, -bound, bound, [a, b])

    def composite(self):
        x = self.pick(lambda n: n.ndim >= 1)
        if x is None:
            return None
        kind = self.draw(st.sampled_from(["softmax", "log_softmax", "logsumexp", "sce"]))
        if kind == "sce":
            classes = x.shape[-1]
            labels = self.rng.integers(0, classes, x.shape[:-1]).astype(np.int64)
            ref = self.data_array("labels", labels)
            return self.emit(f"ns.softmax_cross_entropy({x.name}, {ref})", x.shape[:-1], 0,
                             x.hi - x.lo + math.log(classes), [x])
        axis = self.draw(st.integers(-x.ndim, x.ndim - 1) | _axis_forms(x.ndim))
        if axis is None:
            axis = -1
        axes = _axes(axis, x.ndim)
        n = int(np.prod([x.shape[i] for i in axes], dtype=np.int64))
        if kind == "softmax":
            return self.emit(f"ns.softmax({x.name}, axis={axis!r})", x.shape, 0, 1, [x])
        if kind == "log_softmax":
            return self.emit(f"ns.log_softmax({x.name}, axis={axis!r})", x.shape,
                             x.lo - x.hi - math.log(n), 0, [x])
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return self.emit(f"ns.logsumexp({x.name}, axis={axis!r})", shape, x.lo, x.hi + math.log(n), [x])

    def select(self):
        a = self.pick()
        kind = self.draw(st.sampled_from(["where", "where_literal", "clip", "concatenate", "stack",
                                          "cast"]))
        if kind in ("where", "where_literal"):
            # Masks come from data, so perturbing the parameters never flips them.
            mask_shape = self.draw(_sub_shape(a.shape))
            if self.draw(st.booleans()):
                mask = self.data_array("mask", self.rng.random(mask_shape) < 0.5)
            else:
                d = self.data_float(mask_shape, keep=False)
                mask = f"{d.name} > 0"
            if kind == "where_literal":
                c = self.literal()
                args, lo, hi = (f"{a.name}, {c!r}", min(a.lo, c), max(a.hi, c)) if self.draw(st.booleans()) \
                    else (f"{c!r}, {a.name}", min(a.lo, c), max(a.hi, c))
                shape = _broadcast(mask_shape, a.shape)
                return self.emit(f"ns.where({mask}, {args})", shape, lo, hi, [a])
            b = self.pick(lambda n: _broadcast(_broadcast(a.shape, mask_shape) or (), n.shape) is not None
                          and _broadcast(a.shape, mask_shape) is not None)
            if b is None:
                return None
            shape = _broadcast(_broadcast(a.shape, mask_shape), b.shape)
            if _size(shape) > MAX_SIZE:
                return None
            return self.emit(f"ns.where({mask}, {a.name}, {b.name})", shape, min(a.lo, b.lo),
                             max(a.hi, b.hi), [a, b])
        if kind == "clip":
            lo = self.literal(-1.0, 0.5)
            hi = lo + self.literal(0.2, 1.5)
            clamp = lambda v: min(max(v, lo), hi)  # noqa: E731
            return self.emit(f"ns.clip({a.name}, {lo!r}, {hi!r})", a.shape, clamp(a.lo), clamp(a.hi), [a])
        if kind == "cast":
            if not self.allow_cast:
                return None
            other = "float32" if self.dtype == np.float64 else "float64"
            return self.emit(f"ns.astype(ns.astype({a.name}, np.{other}), np.{self.dtype.name})",
                             a.shape, a.lo - 1e-6 * a.mag, a.hi + 1e-6 * a.mag, [a])
        if a.ndim == 0:
            return None
        if kind == "stack":
            b = self.pick(lambda n: n.shape == a.shape)
            axis = self.draw(st.integers(-a.ndim - 1, a.ndim))
            shape = list(a.shape)
            shape.insert(axis % (a.ndim + 1), 2)
            if _size(shape) > MAX_SIZE:
                return None
            return self.emit(f"ns.stack([{a.name}, {b.name}], axis={axis})", shape,
                             min(a.lo, b.lo), max(a.hi, b.hi), [a, b])
        axis = self.draw(st.integers(-a.ndim, a.ndim - 1))
        ax = axis % a.ndim
        b = self.pick(lambda n: n.ndim == a.ndim and all(
            d == e for i, (d, e) in enumerate(zip(n.shape, a.shape)) if i != ax))
        shape = list(a.shape)
        shape[ax] += b.shape[ax]
        if _size(shape) > MAX_SIZE:
            return None
        return self.emit(f"ns.concatenate([{a.name}, {b.name}], axis={axis})", shape,
                         min(a.lo, b.lo), max(a.hi, b.hi), [a, b])

    # -- the loss --------------------------------------------------------------------------

    def loss_expr(self) -> str:
        inputs = set(self.params) | {k for k in self.data}
        sinks = [n for n in self.nodes if n.name not in self.used and n.name not in inputs]
        if self.nodes[-1] not in sinks:
            sinks.append(self.nodes[-1])
        terms = []
        for n in sinks:
            how = self.draw(st.sampled_from(["sum", "mean", "weighted"]))
            if how == "weighted":
                w = self.rng.standard_normal(n.shape).astype(self.dtype)
                terms.append(f"ns.sum({n.name} * {self.data_array('w', w)})")
            else:
                terms.append(f"ns.{how}({n.name})")
        return " + ".join(terms)



def _numpy_function(name):
    import scipy.special
    return getattr(np, name, None) or getattr(scipy.special, name)


def _sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


def _abs_interval(lo, hi):
    if lo <= 0 <= hi:
        return 0.0, max(-lo, hi)
    return min(abs(lo), abs(hi)), max(abs(lo), abs(hi))


def _square_interval(lo, hi):
    a, b = _abs_interval(lo, hi)
    return a * a, b * b


def _size(shape):
    return int(np.prod(shape, dtype=np.int64))


def _broadcast(a, b):
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        return None


def _matmul_shape(a, b):
    try:
        return np.matmul(np.zeros(a), np.zeros(b)).shape
    except ValueError:
        return None


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else axis
    return tuple(sorted(a % ndim for a in axes))


def _axis_forms(ndim):
    """``axis`` as NumPy takes it: None, an int (negative too) or a tuple of distinct axes."""
    ints = st.integers(-ndim, ndim - 1)
    tuples = st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True).map(
        lambda axes: tuple(a - ndim if i % 2 else a for i, a in enumerate(axes)))
    return st.none() | ints | tuples


def _sub_shape(shape):
    """A shape that broadcasts to ``shape``: a suffix of it with some axes set to 1."""
    @st.composite
    def draw_sub(draw):
        k = len(shape) if draw(st.integers(0, 2)) else draw(st.integers(0, len(shape)))
        suffix = shape[len(shape) - k:]
        return tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in suffix)
    return draw_sub()


def _factorizations(size):
    """A shape of ``size`` elements with 1 to 4 axes (ones included)."""
    @st.composite
    def draw_shape(draw):
        dims, rest = [], size
        for _ in range(draw(st.integers(0, 3))):
            divisors = [d for d in range(1, rest + 1) if rest % d == 0]
            d = draw(st.sampled_from(divisors))
            dims.append(d)
            rest //= d
        dims.append(rest)
        return tuple(draw(st.permutations(dims)))
    return draw_shape()


def _index(shape):
    """A basic index into ``shape``: slices with steps (negative too), integers, None, ...;
    returns ``(key, text)``."""
    @st.composite
    def draw_index(draw):
        key, parts = [], []
        ndim = draw(st.integers(1, len(shape)))
        for d in shape[:ndim]:
            kind = draw(st.sampled_from(["slice", "slice", "int", "all", "none"]))
            if kind == "none":
                key.append(None)
                parts.append("None")
            if kind == "int":
                i = draw(st.integers(-d, d - 1))
                key.append(i)
                parts.append(str(i))
            elif kind == "all":
                key.append(slice(None))
                parts.append(":")
            else:
                step = draw(st.sampled_from([None, 1, 2, 3, -1, -2]))
                first = draw(st.integers(0, d - 1))
                if step is None or step > 0:
                    last = draw(st.integers(first + 1, d))
                    start = None if first == 0 and draw(st.booleans()) else first - d * draw(st.booleans())
                    stop = None if last == d and draw(st.booleans()) else \
                        last - d * (last < d and draw(st.booleans()))
                else:  # a negative step runs from `first` down to just above `last`
                    last = draw(st.integers(-1, first - 1))
                    start = None if first == d - 1 and draw(st.booleans()) else first - d * draw(st.booleans())
                    stop = None if last == -1 else last - d * draw(st.booleans())
                key.append(slice(start, stop, step))
                parts.append(":".join("" if v is None else str(v) for v in (start, stop, step)))
        if draw(st.booleans()) and len(parts) < len(shape):
            key.append(Ellipsis)
            parts.append("...")
        text = ", ".join(parts)
        return tuple(key), text
    return draw_index()


FAMILIES = ("unary", "binary", "reduction", "view", "matmul", "composite", "select", "extended")
_WEIGHTS = (4, 4, 2, 3, 2, 2, 2, 3)


@st.composite
def random_programs(draw, dtype=np.float64, allow_cast: bool = True, max_ops: int = 8,
                    max_params: int = 3):
    """Draw ``(fn, (params, data))``: a random loss ``fn(params, data) -> scalar`` and inputs."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    b = _Builder(draw, rng, dtype, allow_cast)
    base = tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(0, 3)) or 2))
    for _ in range(draw(st.integers(1, max_params))):
        shape = draw(_sub_shape(base))
        if draw(st.integers(0, 3)) == 0:
            b.param(shape, POSITIVE + 0.2, 2.0)
        else:
            b.param(shape)
    for _ in range(draw(st.integers(0, 2))):
        b.data_float(draw(_sub_shape(base)))
    families = [f for f, w in zip(FAMILIES, _WEIGHTS) for _ in range(w)]
    emitted = 0
    for _ in range(draw(st.integers(1, max_ops))):
        family = draw(st.sampled_from(families))
        before = len(b.nodes)
        getattr(b, family)()
        emitted += len(b.nodes) > before
    if not emitted:
        b.unary()
    loss = b.loss_expr()
    body = "\n".join(f"    {line}" for line in b.lines)
    source = f"def loss(params, data):\n{body}\n    return {loss}\n"
    fn = RandomLoss(source, f"<random-program-{next(_counter)}>")
    return fn, (b.params, b.data)
