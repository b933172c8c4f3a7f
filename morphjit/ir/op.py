"""The op record and the registry every op is declared into (``defop``), with the op kinds.

An op declares, in one paragraph of the op table (``morphjit.ops``), its shape/dtype rule
(``infer(input types, **params) -> TensorType``), its NumPy reference implementation, its scalar
code template (element-wise ops), its VJP rule and what fusion and selection need.

A VJP rule is ``vjp(g, ans, *inputs, **params)``: ``g`` is the cotangent of the output, ``ans``
the output and ``inputs`` the operands, all traced values, so a rule is written with the same
array functions a user writes. It returns one cotangent per input (``None`` where an input is
not differentiable, a `NoDerivative` where the op's derivative in it is not available: refused
where that input is differentiated). A cotangent may have the broadcast output's shape: the VJP driver sums it to
the input's shape, so rules never undo broadcasting themselves.

A scalar template ``scalar(K, *operands)`` renders the op on scalar operand expressions; ``K(c)``
renders the constant ``c`` in the op's dtype (so float32 loops stay float32). The record also
holds what fusion and selection need (recompute ``cost``, a view's ``index_map``, the ``body`` or
``nests`` rule of an op selected specially).

The registry is here, below the tracer and every stage, which look ops up by name (``OPS``); the
declarations are in ``morphjit.ops``, whose one list of families fills it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .index import IndexMap
from .types import TensorType

ELEMENTWISE = "elementwise"   # scalar function applied over broadcast operands
REDUCE = "reduce"             # accumulates over `axes` (output drops them)
VIEW = "view"                 # an index function over one operand; owns no buffer
MATMUL = "matmul"             # batched GEMM
STRUCTURAL = "structural"     # moves data: concatenate, unslice
COMPOSITE = "composite"       # numerically stable row-wise ops (softmax family)
SOURCE = "source"             # creates data from parameters only
LINALG = "linalg"             # a LAPACK routine over the last axes, batched over the leading ones
EXPENSIVE = 8   # the recompute cost of a transcendental function or a division


@dataclass(frozen=True)
class Op:
    name: str
    kind: str
    infer: Callable[..., TensorType]
    impl: Callable[..., np.ndarray]
    vjp: Callable | None
    scalar: Callable[..., str] | None = None
    # Reductions: the accumulator's start value and its update, as a template.
    init: float | None = None
    combine: Callable[[str, str], str] | None = None
    # Composites: the same function in simpler ops (traced values in, traced value out), used
    # by the backends that compile loops; the reference executor runs `impl`.
    lower: Callable | None = None
    # Element-wise ops: what recomputing one element costs, in arithmetic ops (fusion recomputes
    # a cheap value in each of its consumers rather than storing it).
    cost: int = 1
    # Views: index_map(operand shape, output shape, **params) is the IndexMap by which the output
    # reads its operand.
    index_map: Callable[..., IndexMap] | None = None
    # Ops the loop backends select by a rule of their own: body(expr, b, imap) is the loop-body
    # expression of binding b at the loop point imap addresses (expr(v, imap) gives an operand's);
    # nests(expr, b) are the loop nests of a structural op.
    body: Callable | None = None
    nests: Callable[..., list] | None = None
    # Operands the op's loops read from buffers (never inlined): buffered(b, producer) lists
    # them for binding b (``producer`` maps value ids to the bindings computing them).
    buffered: Callable[..., list] | None = None
    # LAPACK ops: the core rank of each operand and then of the output (the leading axes batch).
    core: tuple[int, ...] | None = None
    # Exact comparisons (eq, ne): of two values, those computed by arithmetic are stored, never
    # recomputed. Fast-math lets LLVM round a recomputation differently in another loop, and the
    # gradient of a max or min finds the elements that attain it by comparing them with the
    # stored result. (A comparison with a constant is left alone: its ties are not by design.)
    exact: bool = False

    @property
    def differentiable(self) -> bool:
        return self.vjp is not None

    def start(self, dtype) -> float | int | bool:
        """A reduction's first accumulator value in ``dtype``: an infinite ``init`` (max, min) is
        the dtype's extreme value where it has no infinity (integers, booleans)."""
        dtype = np.dtype(dtype)
        if dtype.kind == "f" or np.isfinite(self.init):
            return self.init
        if dtype == np.bool_:
            return bool(self.init > 0)
        info = np.iinfo(dtype)
        return int(info.max) if self.init > 0 else int(info.min)


@dataclass(frozen=True)
class NoDerivative:
    """A VJP rule's answer for an operand whose derivative it does not know (``what`` names it, as
    in "the order v of scipy.special.iv"): the gradient is refused where that operand is
    differentiated, never taken as 0."""
    what: str


OPS: dict[str, Op] = {}


def defop(name: str, kind: str, infer, impl, vjp=None, **extra) -> Op:
    """Declare the op ``name`` (see `Op` for the rules ``extra`` may give) into `OPS`."""
    op = Op(name, kind, infer, impl, vjp, **extra)
    OPS[name] = op
    return op
