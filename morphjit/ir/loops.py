"""The loop IR of a replay plan: scalar expressions of loop bodies and the instructions over buffers.

Expressions (``Load``, ``Gather``, ``Const``, ``Apply``, ``OneHot``, ``Position``, ``Random``,
``Acc``) form a DAG; ``children`` and ``rebuild`` are the one way to walk and rebuild them, so
``walk``, ``loads`` and ``replace_loads`` need not know the node kinds. Instructions (``Gemm``,
``Lapack``, ``Nest``, ``RowNest``, ``Scatter``, ``Alias``, ``RangeCheck``) say which buffers
they write (``outs``) and read (``reads()``) and which loop nests they run (``nests()``); ``kind``
names them for counts. The consumers (codegen, the plan interpreter, the printer ``looptext``,
explain) each dispatch on the node class through one table, so a new kind is a class here plus one
handler per table.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterator, Union

import numpy as np

from .index import IndexMap
from .program import Var
from .types import Sym

# ---------------------------------------------------------------------------------------------
# Loop-body expressions


class Leaf:
    """An expression without subexpressions."""

    def children(self) -> tuple:
        return ()

    def rebuild(self, children: tuple):
        return self


@dataclass(frozen=True)
class Load(Leaf):
    var: Var
    imap: IndexMap


@dataclass(frozen=True)
class Const(Leaf):
    value: float | int | bool
    dtype: np.dtype


@dataclass(frozen=True)
class Acc(Leaf):
    """The accumulator of a reduction, in the expression that finishes it."""


@dataclass(frozen=True)
class Apply:
    op: str
    args: tuple
    params: tuple
    dtype: np.dtype

    def children(self) -> tuple:
        return self.args

    def rebuild(self, children: tuple) -> Apply:
        return Apply(self.op, tuple(children), self.params, self.dtype)

    def __hash__(self) -> int:
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        # once per node: a body is a DAG (a Newton step reads its input several times), and
        # hashing it as a tree on every dictionary lookup takes exponential time
        return hash((self.op, self.args, self.params, self.dtype))

    def __getstate__(self) -> dict:
        # without the cached hash: a string's hash differs from one process to the next
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


@dataclass(frozen=True)
class OneHot:
    """``labels == class index`` where the class index is an affine function of the loop."""
    labels: Expr
    klass: IndexMap   # one row: loop indices -> class index
    dtype: np.dtype

    def children(self) -> tuple:
        return (self.labels,)

    def rebuild(self, children: tuple) -> OneHot:
        return OneHot(children[0], self.klass, self.dtype)


@dataclass(frozen=True)
class Gather:
    """An element of ``var`` whose index along some axes is computed: axis k is read at
    ``picks[k]`` (an integer expression; a negative one counts from the end) where that is not
    None, else at the affine index of ``imap`` (whose rows for picked axes are zero).

    To the walkers it is a read of ``var`` through a map that is never the identity and never
    the same row along a picked axis, so no rewrite treats it as an element-wise read."""
    var: Var
    imap: IndexMap
    picks: tuple

    def children(self) -> tuple:
        return tuple(p for p in self.picks if p is not None)

    def rebuild(self, children: tuple) -> Gather:
        given = iter(children)
        return Gather(self.var, self.imap, tuple(None if p is None else next(given) for p in self.picks))


@dataclass(frozen=True)
class Random:
    """Element ``counter(i)`` (a flat index: one affine row of the loop indices) of draw ``stream``
    of ``dist`` in a call seeded by ``seed``; a pure function of the three (see ``native.random``), so
    any loop may compute any element, and two loops computing one element agree."""
    seed: Expr
    stream: int
    dist: str
    counter: IndexMap
    dtype: np.dtype

    def children(self) -> tuple:
        return (self.seed,)

    def rebuild(self, children: tuple) -> Random:
        return Random(children[0], self.stream, self.dist, self.counter, self.dtype)


@dataclass(frozen=True)
class Position(Leaf):
    """The integer value of an affine function of the loop indices (one row): an ``iota``'s
    element. A gather picking at a position reads along that row, with no index array."""
    imap: IndexMap
    dtype: np.dtype


Expr = Union[Load, Gather, Const, Acc, Apply, OneHot, Position, Random]


DEPTH_LIMIT = 64   # nodes nested in one another in an expression, at most: the walks of expressions recurse


def depth(expr, memo: dict | None = None) -> int:
    """How many nodes deep ``expr`` is."""
    memo = {} if memo is None else memo
    if id(expr) not in memo:
        memo[id(expr)] = 1 + max((depth(c, memo) for c in expr.children()), default=0)
    return memo[id(expr)]


def walk(expr, seen=None) -> Iterator:
    """Every node of ``expr`` once, parents before children (a body is a DAG: once per path to a
    node would be exponentially many)."""
    seen = set() if seen is None else seen
    if id(expr) in seen:
        return
    seen.add(id(expr))
    yield expr
    for child in expr.children():
        yield from walk(child, seen)


def loads(expr) -> list[Load | Gather]:
    """Every array read of ``expr`` (plain loads and gathers)."""
    return [e for e in walk(expr) if isinstance(e, (Load, Gather))]


def gathers(expr) -> list[Gather]:
    return [e for e in walk(expr) if isinstance(e, Gather)]


@functools.lru_cache(maxsize=4096)
def loop_axes(expr) -> frozenset[int] | None:
    """The loop axes (by position in the nest's domain) the value of ``expr`` depends on; None
    where it reads a reduction's accumulator."""
    if isinstance(expr, Acc):
        return None
    maps = [expr.imap] if isinstance(expr, (Load, Gather, Position)) else [expr.klass] if isinstance(expr, OneHot) else \
        [expr.counter] if isinstance(expr, Random) else []
    axes = {j for imap in maps for row in imap.coeffs for j, c in enumerate(row) if c}
    for child in expr.children():
        inner = loop_axes(child)
        if inner is None:
            return None
        axes |= inner
    return frozenset(axes)


def replace_loads(expr, var, by, done=None):
    """``expr`` with every load of ``var`` replaced by ``by`` (a shared node rebuilt once)."""
    done = {} if done is None else done
    if id(expr) not in done:
        if isinstance(expr, Load):
            done[id(expr)] = by if expr.var is var else expr
        else:
            old = expr.children()
            new = tuple(replace_loads(c, var, by, done) for c in old)
            done[id(expr)] = expr if all(a is b for a, b in zip(new, old)) else expr.rebuild(new)
    return done[id(expr)]


# ---------------------------------------------------------------------------------------------
# Instructions


@dataclass(frozen=True, eq=False)
class Gemm:
    """out[batch] = op(a[batch]) @ op(b[batch]); op is a transpose where the flag says so."""
    out: Var
    a: Var
    b: Var
    a_transposed: bool
    b_transposed: bool
    kind = "gemm"

    @property
    def outs(self) -> list[Var]:
        return [self.out]

    def reads(self):
        return [self.a, self.b]

    def nests(self) -> tuple:
        return ()


@dataclass(frozen=True)
class Store:
    """out[out_map(i)] = expr(i)."""
    out: Var
    out_map: IndexMap
    expr: Expr


@dataclass(frozen=True)
class Accumulate:
    """out[kept(i)] = finish(combine over the reduced axes of expr(i))."""
    out: Var
    op: str
    axes: tuple[int, ...]
    expr: Expr
    finish: Expr = Acc()


@dataclass(frozen=True, eq=False)
class Nest:
    """One loop nest over ``domain`` computing several stores and reductions per element."""
    domain: tuple[int, ...]
    stores: tuple[Store, ...] = ()
    accumulations: tuple[Accumulate, ...] = ()

    @property
    def outs(self) -> list[Var]:
        return [s.out for s in self.stores] + [a.out for a in self.accumulations]

    def loads(self) -> list[Load]:
        """Every array read of the nest's bodies and finishes."""
        exprs = [s.expr for s in self.stores] + [e for a in self.accumulations for e in (a.expr, a.finish)]
        return [x for e in exprs for x in loads(e)]

    def reads(self):
        mine = {id(v) for v in self.outs}
        return [x.var for x in self.loads() if id(x.var) not in mine]

    def nests(self) -> tuple[Nest, ...]:
        return (self,)

    @property
    def kind(self) -> str:
        return "reduce" if self.accumulations else "loop"


@dataclass(frozen=True, eq=False)
class RowNest:
    """Nests sharing their outer loops: for each index of ``prefix``, the parts run in order.

    A part reads what an earlier part computed for the same outer index only, so a row-wise
    chain (softmax: maximum, then exponentials and their sum, then the loss) is one pass over
    the rows while each row is in cache. A part whose domain is the prefix itself may reduce
    over all of it (the loss summed over the rows).
    """
    prefix: tuple[int, ...]
    parts: tuple[Nest, ...]

    @property
    def outs(self) -> list[Var]:
        return [v for part in self.parts for v in part.outs]

    def reads(self):
        mine = {id(v) for v in self.outs}
        return [v for part in self.parts for v in part.reads() if id(v) not in mine]

    def nests(self) -> tuple[Nest, ...]:
        return self.parts

    @property
    def kind(self) -> str:
        return "reduce" if any(part.accumulations for part in self.parts) else "loop"


@dataclass(frozen=True, eq=False)
class Scatter:
    """For every point i of ``domain``, in C order: ``at(i) += expr(i)`` (``accumulate``: repeated
    positions add up), or ``at(i) = expr(i)`` (the last point written to a position wins), where
    ``at`` addresses the output (a ``Gather`` over it). The output is filled first."""
    domain: tuple[int, ...]
    at: Gather
    expr: Expr
    accumulate: bool = True
    kind = "scatter"

    @property
    def outs(self) -> list[Var]:
        return [self.at.var]

    def reads(self):
        return [x.var for e in (self.expr,) + self.at.children() for x in loads(e)]

    def nests(self) -> tuple:
        return ()


@dataclass(frozen=True, eq=False)
class RangeCheck:
    """Raise ``error`` if an element of ``values`` is outside ``[0, extent)`` (``[-extent, extent)``
    where ``negative``), naming ``what`` it is, the value and its position: class labels read by
    a one-hot (compiled code compares them rather than indexing with them, so a bad one would
    pass unnoticed), the index arrays of a gather (a bad one would read out of bounds)."""
    values: Var
    extent: int | Sym
    what: str
    error: str = "ValueError"
    negative: bool = False
    kind = "check"

    outs = property(lambda self: [])

    def reads(self):
        return [self.values]

    def nests(self) -> tuple:
        return ()

    @property
    def low(self) -> str:
        return f"-{self.extent}" if self.negative else "0"


@dataclass(frozen=True, eq=False)
class Alias:
    """out is src reshaped: a view of src's buffer, no code beyond the reshape."""
    out: Var
    src: Var
    kind = "alias"

    @property
    def outs(self) -> list[Var]:
        return [self.out]

    def reads(self):
        return [self.src]

    def nests(self) -> tuple:
        return ()


@dataclass(frozen=True, eq=False)
class Lapack:
    """out[batch] = routine(inputs[batch], **params): one LAPACK-backed call per batch element.

    Operand k's last ``core[k]`` axes are the routine's (``core[-1]`` the output's); its leading
    axes broadcast to the output's batch axes.
    """
    out: Var
    routine: str
    inputs: tuple[Var, ...]
    params: tuple
    core: tuple[int, ...]
    kind = "lapack"

    @property
    def outs(self) -> list[Var]:
        return [self.out]

    def reads(self):
        return list(self.inputs)

    def nests(self) -> tuple:
        return ()

    @property
    def batch(self) -> tuple:
        return self.out.shape[:len(self.out.shape) - self.core[-1]]


Instruction = Union[Gemm, Nest, RowNest, Scatter, RangeCheck, Alias, Lapack]


def loop(out: Var, expr) -> Nest:
    """A nest computing ``out`` element by element."""
    return Nest(out.shape, (Store(out, IndexMap.identity(out.ndim), expr),))


def same_row(imap: IndexMap, p: int) -> bool:
    """The first ``p`` axes are read at the outer loop indices, and no other axis depends on them."""
    if len(imap.offsets) < p:
        return False
    outer = all(imap.offsets[k] == 0 and tuple(imap.coeffs[k]) == tuple(int(j == k) for j in range(imap.loop_ndim))
                for k in range(p))
    return outer and all(not any(row[:p]) for row in imap.coeffs[p:])


# ---------------------------------------------------------------------------------------------
# Buffers as the generated code and the runtime lay them out


def internal_shape(shape) -> tuple[int, ...]:
    """The shape of a value's buffer: arrays of shape () are one-element vectors."""
    return tuple(shape) or (1,)


def batched_input(inputs) -> Var | None:
    """The first input whose leading extent is the batch size, which the step reads it from."""
    return next((v for v in inputs if v.shape and isinstance(v.shape[0], Sym)), None)


def gather_indices(e: Gather, loop_vars: list[str], pick) -> list[str]:
    """The index expressions of a gather's element, ``pick(k, expr)`` spelling a picked axis."""
    affine = e.imap.render(loop_vars)
    return [affine[k] if p is None else pick(k, p) for k, p in enumerate(e.picks)]
