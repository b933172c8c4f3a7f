"""Codegen: render a replay plan as the Python source of one numba function.

Loop nests carry their fused scalar expressions as loop bodies, GEMMs go through
``np.dot(a, b, out)`` into planned C-contiguous buffers (transposed operands as ``.T`` views,
which BLAS takes as flags), reductions are loops with accumulators. Values are named
``v0, v1, ...`` in order of definition, so a plan always renders to the same text. Arrays of
shape () are passed as one-element vectors.
"""
from __future__ import annotations

import math

import numpy as np

from .indexing import IndexMap, broadcast_map
from .ir import Namer, Var, dtype_name
from .ops import OPS
from .plan import Alias, Apply, Const, Gemm, Load, Loop, OneHot, Plan, Reduce

# No nnan/ninf: a NaN or inf in the data must reach the loss. `reassoc` lets LLVM vectorise
# reductions (4-12x on sums), `contract` allows fused multiply-add.
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}
ENTRY = "step"


def internal_shape(shape) -> tuple[int, ...]:
    return tuple(shape) or (1,)


def literal(value, dtype) -> str:
    """A constant of ``dtype`` as source text (so float32 loops stay in float32)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return str(bool(value))
    if dtype.kind in "iu":
        return f"np.{dtype.name}({int(value)})"
    value = float(value)
    text = repr(value) if math.isfinite(value) else ("np.nan" if math.isnan(value) else
                                                     ("np.inf" if value > 0 else "-np.inf"))
    return text if dtype == np.float64 else f"np.{dtype.name}({text})"


class Emitter:
    """An indented source buffer."""

    def __init__(self):
        self.lines: list[str] = []
        self.depth = 0

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class Body:
    """Renders a loop-body expression DAG as local assignments, each subexpression once."""

    def __init__(self, out: Emitter, names: Namer, loop_vars: list[str]):
        self.out, self.names, self.loop_vars = out, names, loop_vars
        self.memo: dict = {}

    def value(self, e) -> str:
        if isinstance(e, Const):
            return literal(e.value, e.dtype)
        if e in self.memo:
            return self.memo[e]
        code = self.code(e)
        name = self.memo[e] = f"t{len(self.memo)}"
        self.out.line(f"{name} = {code}")
        return name

    def code(self, e) -> str:
        if isinstance(e, Load):
            return element(self.names.name(e.var), e.imap, self.loop_vars)
        if isinstance(e, OneHot):
            (klass,) = e.klass.render(self.loop_vars)
            test = f"{self.value(e.labels)} == {klass}"
            return f"({test})" if e.dtype == np.bool_ else \
                f"({literal(1, e.dtype)} if {test} else {literal(0, e.dtype)})"
        args = [self.value(a) for a in e.args]
        return OPS[e.op].scalar(lambda c: literal(c, e.dtype), *args, **dict(e.params))


def element(name: str, imap: IndexMap, loop_vars: list[str]) -> str:
    return f"{name}[{', '.join(imap.render(loop_vars)) or '0'}]"


def loop_vars(n: int, start: int = 0) -> list[str]:
    return [f"i{k}" for k in range(start, start + n)]


def open_loops(out: Emitter, domain, names: list[str]) -> None:
    for name, extent in zip(names, domain):
        out.line(f"for {name} in range({extent}):")
        out.depth += 1


class StepWriter:
    """Renders the instructions of a plan into the body of the step function."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.names = Namer()
        self.out = Emitter()

    def arguments(self) -> list[Var]:
        """Inputs, constants, the pooled buffers (as views) and the outputs, in that order."""
        plan = self.plan
        pooled = [i.out for i in plan.instructions if id(i.out) in plan.slot_of]
        unique = list({id(v): v for v in pooled}.values())
        return list(plan.inputs) + [v for v, _ in plan.consts] + unique + list(plan.outputs)

    def source(self) -> str:
        args = self.arguments()
        arg_names = [self.names.name(v) for v in args]
        counts = ", ".join(f"{n} {k}" for k, n in self.plan.counts().items())
        out = self.out
        out.line(f"# morphjit step for program {self.plan.program.name!r}: {counts}; "
                 f"{len(self.plan.slots)} pool slots, {self.plan.workspace_bytes} workspace bytes")
        out.line("import numpy as np")
        out.line("import numba")
        out.line("")
        out.line("")
        flags = "{" + ", ".join(map(repr, sorted(FASTMATH))) + "}"
        out.line(f"@numba.njit(fastmath={flags}, error_model='numpy', boundscheck=False, nogil=True)")
        out.line(f"def {ENTRY}({', '.join(arg_names)}):")
        out.depth += 1
        for ins in self.plan.instructions:
            getattr(self, type(ins).__name__.lower())(ins)
        out.line("return 0")
        return out.text()

    def alias(self, ins: Alias) -> None:
        shape = internal_shape(ins.out.shape)
        self.out.line(f"{self.names.name(ins.out)} = {self.names.name(ins.src)}.reshape({shape!r})")

    def gemm(self, ins: Gemm) -> None:
        batch = ins.out.shape[:-2]
        idx = loop_vars(len(batch))
        operands = [self.operand(v, t, batch, idx) for v, t in ((ins.a, ins.a_transposed), (ins.b, ins.b_transposed))]
        open_loops(self.out, batch, idx)
        target = self.names.name(ins.out) + (f"[{', '.join(idx)}]" if idx else "")
        self.out.line(f"np.dot({operands[0]}, {operands[1]}, {target})")
        self.out.depth -= len(batch)

    def operand(self, v: Var, transposed: bool, batch, idx) -> str:
        name = self.names.name(v)
        if len(v.shape) > 2:
            rows = broadcast_map(v.shape[:-2], batch).render(idx)
            name = f"{name}[{', '.join(rows)}]"
        return name + (".T" if transposed else "")

    def loop(self, ins: Loop) -> None:
        idx = loop_vars(len(ins.domain))
        open_loops(self.out, ins.domain, idx)
        value = Body(self.out, self.names, idx).value(ins.body)
        self.out.line(f"{element(self.names.name(ins.out), ins.out_map, idx)} = {value}")
        self.out.depth -= len(ins.domain)

    def reduce(self, ins: Reduce) -> None:
        op, n = OPS[ins.op], len(ins.domain)
        kept = [k for k in range(n) if k not in ins.axes]
        idx = loop_vars(n)
        init = literal(op.init, ins.out.dtype)
        target = element(self.names.name(ins.out), IndexMap.identity(len(kept)), [idx[k] for k in kept])
        if kept == list(range(len(kept))):  # reduced axes innermost: accumulate in a register
            open_loops(self.out, [ins.domain[k] for k in kept], [idx[k] for k in kept])
            self.out.line(f"acc = {init}")
            open_loops(self.out, [ins.domain[k] for k in ins.axes], [idx[k] for k in ins.axes])
            x = Body(self.out, self.names, idx).value(ins.body)
            self.out.line(f"acc = {op.combine('acc', x)}")
            self.out.depth -= len(ins.axes)
            self.out.line(f"{target} = acc")
            self.out.depth -= len(kept)
            return
        open_loops(self.out, [ins.domain[k] for k in kept], [idx[k] for k in kept])
        self.out.line(f"{target} = {init}")
        self.out.depth -= len(kept)
        open_loops(self.out, ins.domain, idx)
        x = Body(self.out, self.names, idx).value(ins.body)
        self.out.line(f"{target} = {op.combine(target, x)}")
        self.out.depth -= n


def render(plan: Plan) -> tuple[str, list[Var]]:
    """The module source of the step and the order of its arguments."""
    writer = StepWriter(plan)
    return writer.source(), writer.arguments()


# ---------------------------------------------------------------------------------------------
# The plan's text form


def describe_plan(plan: Plan) -> str:
    names = Namer()
    for v in list(plan.inputs) + [v for v, _ in plan.consts]:
        names.name(v)
    counts = ", ".join(f"{n} {k}" for k, n in plan.counts().items())
    lines = [f"plan: {len(plan.instructions)} instructions ({counts}); {len(plan.slots)} slots, "
             f"workspace {plan.workspace_bytes} B (naive {plan.naive_bytes} B)",
             "in " + " ".join(names.declare(v) for v in plan.inputs)]
    for ins in plan.instructions:
        target = names.declare(ins.out) if ins.out not in [i.out for i in plan.instructions[:plan.instructions.index(ins)]] \
            else names.name(ins.out)
        where = f"s{plan.slot_of[id(ins.out)]}" if id(ins.out) in plan.slot_of else ""
        flag = " in-place" if id(ins) in plan.in_place else ""
        lines.append(f"  {type(ins).__name__.lower():7} {target} = {describe(ins, names)}"
                     + (f"    [{where}{flag}]" if where else ""))
    lines.append("out " + " ".join(names.use(v) for v in plan.outputs))
    return "\n".join(lines) + "\n"


def describe(ins, names: Namer) -> str:
    if isinstance(ins, Gemm):
        a = names.use(ins.a) + (".T" if ins.a_transposed else "")
        b = names.use(ins.b) + (".T" if ins.b_transposed else "")
        return f"{a} @ {b}"
    if isinstance(ins, Alias):
        return f"reshape {names.use(ins.src)}"
    idx = loop_vars(len(ins.domain))
    body = describe_expr(ins.body, names, idx)
    if isinstance(ins, Reduce):
        return f"{ins.op}[{','.join(idx[k] for k in ins.axes)}] {body}  over {list(ins.domain)}"
    dest = "" if ins.out_map.is_identity() else f"at [{', '.join(ins.out_map.render(idx))}] "
    return f"{dest}{body}  over {list(ins.domain)}"


def describe_expr(e, names: Namer, idx) -> str:
    if isinstance(e, Const):
        return literal(e.value, e.dtype).replace("np.", "")
    if isinstance(e, Load):
        return element(names.use(e.var), e.imap, idx)
    if isinstance(e, OneHot):
        return f"({describe_expr(e.labels, names, idx)} == {e.klass.render(idx)[0]})"
    params = "".join(f" {k}={v}" for k, v in e.params)
    return f"{e.op}({', '.join(describe_expr(a, names, idx) for a in e.args)}{params})"


__all__ = ["render", "describe_plan", "literal", "dtype_name"]
