"""The text form of the loop IR (a replay plan's instructions and loop bodies), written as the
code is rendered: the same index and constant spelling. One handler per kind in `DESCRIBE` and
`DESCRIBE_EXPR`."""
from __future__ import annotations

from .index import element, loop_vars
from .literals import literal
from .loops import (Acc, Alias, Apply, Const, Gather, Gemm, Instruction, Lapack, Load, Nest, OneHot, Position,
                    Random, RangeCheck, RowNest, Scatter, gather_indices)
from .program import Namer


def describe_instructions(instructions: list[Instruction], names: Namer, target, in_place=frozenset()) -> list[str]:
    """One or more lines per instruction; ``target(v)`` spells a value an instruction writes."""
    lines = []
    for ins in instructions:
        flag = " in-place" if id(ins) in in_place else ""
        lines += DESCRIBE[type(ins)](ins, names, target, flag)
    return lines


def _describe_gemm(ins: Gemm, names, target, flag) -> list[str]:
    a = names.use(ins.a) + (".T" if ins.a_transposed else "")
    b = names.use(ins.b) + (".T" if ins.b_transposed else "")
    return [f"  gemm {target(ins.out)} = {a} @ {b}"]


def _describe_lapack(ins: Lapack, names, target, flag) -> list[str]:
    params = "".join(f" {k}={v}" for k, v in ins.params)
    return [f"  lapack {target(ins.out)} = {ins.routine}({', '.join(names.use(v) for v in ins.inputs)}{params})"]


def _describe_alias(ins: Alias, names, target, flag) -> list[str]:
    return [f"  alias {target(ins.out)} = reshape {names.use(ins.src)}"]


def _describe_range_check(ins: RangeCheck, names, target, flag) -> list[str]:
    return [f"  check {ins.low} <= {names.use(ins.values)} < {ins.extent}"]


def _describe_scatter(ins: Scatter, names, target, flag) -> list[str]:
    idx = loop_vars(len(ins.domain))
    at = describe_expr(ins.at, names, idx).replace(names.use(ins.at.var), target(ins.at.var), 1)
    combine = "+=" if ins.accumulate else "="
    return [f"  scatter over {list(ins.domain)}", f"    {at} {combine} {describe_expr(ins.expr, names, idx)}"]


def _describe_rows(ins: RowNest, names, target, flag) -> list[str]:
    lines = [f"  rows over {list(ins.prefix)}{flag}"]
    for part in ins.parts:
        lines.append(f"    nest over {list(part.domain)}")
        lines += ["  " + line for line in describe_nest(part, names, target)]
    return lines


def _describe_nest(ins: Nest, names, target, flag) -> list[str]:
    return [f"  nest over {list(ins.domain)}{flag}"] + describe_nest(ins, names, target)


DESCRIBE = {Gemm: _describe_gemm, Alias: _describe_alias, RangeCheck: _describe_range_check,
            RowNest: _describe_rows, Nest: _describe_nest, Scatter: _describe_scatter, Lapack: _describe_lapack}


def describe_nest(ins: Nest, names: Namer, target) -> list[str]:
    idx = loop_vars(len(ins.domain))
    lines = []
    for s in ins.stores:
        where = "" if s.out_map.is_identity() else f"[{', '.join(s.out_map.render(idx))}] "
        lines.append(f"    {target(s.out)} {where}= {describe_expr(s.expr, names, idx)}")
    kept = [k for k in range(len(ins.domain)) if not ins.accumulations or k not in ins.accumulations[0].axes]
    for a in ins.accumulations:
        over = ",".join(idx[k] for k in a.axes)
        total = f"{a.op}[{over}] {describe_expr(a.expr, names, idx)}"
        finish = describe_expr(a.finish, names, [idx[k] for k in kept]).replace("acc", f"({total})") \
            if a.finish != Acc() else total
        lines.append(f"    {target(a.out)} = {finish}")
    return lines


def describe_expr(e, names: Namer, idx) -> str:
    return DESCRIBE_EXPR[type(e)](e, names, idx)


def _describe_apply(e: Apply, names, idx) -> str:
    params = "".join(f" {k}={v}" for k, v in e.params)
    return f"{e.op}({', '.join(describe_expr(a, names, idx) for a in e.args)}{params})"


def _describe_gather(e: Gather, names, idx) -> str:
    indices = gather_indices(e, idx, lambda k, p: "{" + describe_expr(p, names, idx) + "}")
    return f"{names.use(e.var)}[{', '.join(indices)}]"


DESCRIBE_EXPR = {
    Acc: lambda e, names, idx: "acc",
    Gather: _describe_gather,
    Const: lambda e, names, idx: literal(e.value, e.dtype).replace("np.", ""),
    Load: lambda e, names, idx: element(names.use(e.var), e.imap, idx),
    OneHot: lambda e, names, idx: f"({describe_expr(e.labels, names, idx)} == {e.klass.render(idx)[0]})",
    Position: lambda e, names, idx: e.imap.render(idx)[0],
    Apply: _describe_apply,
    Random: lambda e, names, idx: f"{e.dist}#{e.stream}({describe_expr(e.seed, names, idx)}, {e.counter.render(idx)[0]})",
}
