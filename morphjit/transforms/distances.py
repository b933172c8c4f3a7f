"""Pairwise squared distances as GEMMs: an algebraic rewrite of a traced program, before reverse mode.

``sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1)`` (``a`` of shape ``(n, d)``, ``b`` of shape
``(m, d)``) is a loop nest of ``n * m * d`` steps, and so is its gradient, which accumulates
``d`` lanes of ``b``'s gradient over every row of ``a``. Expanded as

    maximum(|a|^2[:, None] + |b|^2[None, :] - 2 a b^T, 0)

the work is one GEMM, and reverse mode, which runs after this rewrite, makes the gradients GEMMs
too: ``2 (rowsum(G) a - G b)`` for ``a`` and ``2 (colsum(G) b - G^T a)`` for ``b``.

The expansion rounds differently. Its error is bounded by a few ulp of ``|a_i|^2 + |b_j|^2``
rather than of the distance itself, so a distance much smaller than the points' norms (points
close together, far from the origin) loses relative accuracy, in float32 most: two equal points
of norm 4 come out up to about 1e-5 apart rather than 0. The ``maximum`` keeps every distance
non-negative (a ``sqrt`` of it is never NaN), and NaN propagates through it; an infinite
coordinate may give NaN where the difference form gives inf. The rewrite is
made only where the contracted axis is long enough (`MIN_DEPTH`) for the GEMM to pay.
"""
from __future__ import annotations

from .. import api as A
from ..ir import Binding, Lit, Program, Var, is_float
from ..tracing import Trace, Tracer
from .passes import dce
from .rewrites import rebuild, substitute

MIN_DEPTH = 8   # the shortest contracted axis rewritten: below it the loop nest is as fast


def as_gemms(program: Program) -> Program:
    """``program`` with its pairwise squared distances computed through GEMMs (`MIN_DEPTH` and
    longer); ``program`` itself when it has none."""
    producer: dict[int, Binding] = {}   # of the bindings as rewritten so far
    t = Trace()
    t.consts = list(program.consts)
    rename: dict[int, Var] = {}
    for b in program.bindings:
        b = substitute(b, rename)
        producer[id(b.out)] = b
        points = pairwise_operands(b, producer)
        if points is None:
            t.bindings.append(b)
            continue
        t.loc = b.loc
        rename[id(b.out)] = squared_distances(*(Tracer(t, p) for p in points)).operand
    if not rename:
        return program
    return dce(rebuild(program, t.bindings, rename).replace(consts=tuple(t.consts)))


def squared_distances(a: Tracer, b: Tracer) -> Tracer:
    """``maximum(|a_i|^2 + |b_j|^2 - 2 a_i . b_j, 0)`` for the rows ``a_i`` of ``a`` and ``b_j`` of ``b``."""
    norms_a = A.expand_dims(A.sum(A.square(a), axis=1), 1)
    norms_b = A.expand_dims(A.sum(A.square(b), axis=1), 0)
    return A.maximum(norms_a + norms_b - 2 * A.matmul(a, A.transpose(b)), 0)


def pairwise_operands(total: Binding, producer: dict) -> tuple[Var, Var] | None:
    """``(a, b)`` when ``total`` is ``sum((a[:, None, :] - b[None, :, :]) ** 2, axis=2)`` (either
    order of the difference; ``b`` may broadcast implicitly), of float dtype, ``MIN_DEPTH`` deep or
    more."""
    if total.op != "sum" or total.kwargs["axes"] != (2,) or not is_float(total.out.dtype):
        return None
    diff = squared_operand(producer.get(id(total.inputs[0])))
    sub = producer.get(id(diff)) if diff is not None else None
    if sub is None or sub.op != "sub" or not all(isinstance(x, Var) for x in sub.inputs):
        return None
    depth = diff.shape[2]
    if not isinstance(depth, int) or depth < MIN_DEPTH:
        return None
    for rows, cols in (sub.inputs, sub.inputs[::-1]):
        a, c = unexpanded(rows, 1, producer), unexpanded(cols, 0, producer)
        if (a is not None and c is not None and (a.shape[0], c.shape[0]) == total.out.shape
                and a.shape[1] == c.shape[1] == depth and a.dtype == c.dtype == total.out.dtype):
            return a, c
    return None


def squared_operand(b: Binding | None) -> Var | None:
    """``x`` when ``b`` is ``x ** 2``, ``square(x)`` or ``x * x``."""
    if b is None:
        return None
    if b.op == "square" or (b.op == "mul" and b.inputs[0] is b.inputs[1]):
        return b.inputs[0]
    if b.op == "pow" and isinstance(b.inputs[1], Lit) and b.inputs[1].value == 2:
        return b.inputs[0]
    return None


def unexpanded(x: Var, axis: int, producer: dict) -> Var | None:
    """The matrix ``x`` is, with a unit axis inserted at ``axis`` (0 also by broadcasting)."""
    if axis == 0 and x.ndim == 2:
        return x
    b = producer.get(id(x))
    if b is None or b.op != "reshape" or x.ndim != 3 or b.inputs[0].ndim != 2:
        return None
    source = b.inputs[0]
    return source if x.shape == source.shape[:axis] + (1,) + source.shape[axis:] else None
