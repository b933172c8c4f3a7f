"""``loss.explain(*args)``: a report on one compiled step, as text and as notebook HTML.

The report holds the forward program, the joint program after the passes, the fusion groups (which
bindings of the lowered program each instruction of the plan computes), the buffer plan against the
naive plan (one buffer per value), the generated source, and the time each compilation stage took.
``str(report)`` is the terminal form; ``report._repr_html_()`` the notebook form (collapsible
sections; the source highlighted when Pygments is installed). Everything shown is escaped.
"""
from __future__ import annotations

import html
import os
from dataclasses import dataclass, field

from ..backend import Fusion, Plan
from ..ir import (OPS, VIEW, Alias, Binding, Gemm, Lapack, Namer, Nest, Program, RangeCheck, RowNest, Scatter,
                  Var, batch_size, evaluate, format_binding)
from ..native import vecmath, with_copied_generators
from ..runtime import NativeStep, kernels
from ..util import config
from . import feedback, pipeline

STAGE_LABELS = {stage.name: stage.label for stage in pipeline.NATIVE}
NUMBA_LABELS = {feedback.COMPILED: "numba compile", feedback.DISK: "numba disk-cache load",
                feedback.MEMORY: "numba (already in memory)", None: "numba"}


@dataclass
class FusionGroup:
    """One instruction of the plan and the bindings of the lowered program it computes."""
    index: int
    kind: str                     # "gemm", "loop", "reduce", "rows", "alias", "check", "copy"
    domain: tuple[int, ...]
    outputs: list[Var]
    bindings: list[Binding] = field(default_factory=list)


@dataclass
class Explanation:
    """What ``loss.explain(*args)`` returns. Its fields are the raw objects; ``str()`` and
    ``_repr_html_()`` render them."""
    name: str
    backend: str
    signature: str
    forward: Program
    joint: Program
    timings: feedback.Timings | None
    origin: str | None            # feedback.COMPILED / DISK / MEMORY, None for the interp backend
    plan: Plan | None = None
    batch: int | None = None      # the batch size of the arguments, for a polymorphic step
    groups: list[FusionGroup] = field(default_factory=list)
    source: str | None = None
    module_file: str | None = None
    vector_math: str | None = None   # which transcendental calls vectorised (vecmath.describe)

    # -- numbers

    @property
    def workspace_bytes(self) -> int:
        return evaluate(self.plan.workspace_bytes, self.batch) if self.plan is not None else 0

    @property
    def naive_bytes(self) -> int:
        return evaluate(self.plan.naive_bytes, self.batch) if self.plan is not None else 0

    @property
    def naive_buffers(self) -> int:
        if self.plan is None:
            return 0
        outs = {id(v) for v in self.plan.outputs}
        return sum(OPS[b.op].kind != VIEW and id(b.out) not in outs for b in self.plan.program.bindings)

    # -- sections shared by both renderings: (title, kind, content)

    def headline(self) -> str:
        batch = "" if self.batch is None else f", batch size B = {self.batch}"
        return f"morphjit step for {self.name!r} at ({self.signature}){batch}"

    def facts(self) -> list[tuple[str, str]]:
        rows = [("backend", self.backend)]
        if self.plan is not None:
            counts = ", ".join(f"{n} {k}" for k, n in self.plan.counts().items() if n)
            rows.append(("plan", f"{len(self.plan.instructions)} instructions ({counts})"))
            rows.append(("workspace", f"{len(self.plan.slots)} slots, {_bytes(self.workspace_bytes)} "
                                      f"(naive plan: {self.naive_buffers} buffers, {_bytes(self.naive_bytes)})"))
            rows.append(("machine code", feedback.ORIGIN_TEXT.get(self.origin, "not compiled yet")))
            rows.append(("cache entry", self.module_file or "none (compiled in memory only)"))
            rows.append(("vector math", self.vector_math or "not inspected"))
        else:
            rows.append(("programs", f"forward {len(self.forward.bindings)} bindings, "
                                     f"joint {len(self.joint.bindings)} bindings"))
        if self.timings is not None:
            rows.append(("compilation", f"{self.timings.total * 1e3:.1f} ms"))
        return rows

    def timing_rows(self) -> list[tuple[str, str, str]]:
        if self.timings is None:
            return []
        total = self.timings.total or 1.0
        rows = []
        for stage, seconds in self.timings.stages.items():
            label = NUMBA_LABELS[self.origin] if stage == "numba" else STAGE_LABELS.get(stage, stage)
            rows.append((label, f"{seconds * 1e3:.1f} ms", f"{100 * seconds / total:.0f}%"))
        rows.append(("total", f"{self.timings.total * 1e3:.1f} ms", ""))
        return rows

    def sections(self) -> list[tuple[str, str, object]]:
        out = [(f"timings ({self.timings.total * 1e3:.1f} ms)" if self.timings else "timings",
                "table", (("stage", "time", "share"), self.timing_rows())),
               (f"forward program ({len(self.forward.bindings)} bindings)", "pre", str(self.forward)),
               (f"joint program after the passes ({len(self.joint.bindings)} bindings)", "pre", str(self.joint))]
        if self.plan is None:
            return out
        out.append((f"fusion groups ({len(self.groups)} instructions over "
                    f"{len(self.plan.program.bindings)} bindings of the lowered program)", "pre",
                    describe_groups(self.groups, self.plan.program)))
        out.append((f"buffer plan ({len(self.plan.slots)} slots, {_bytes(self.workspace_bytes)}; "
                    f"naive {_bytes(self.naive_bytes)})", "pre", self.plan_text()))
        out.append((f"generated source ({self.source.count(chr(10))} lines)", "source", self.source))
        return out

    def plan_text(self) -> str:
        holders: dict[int, int] = {}
        for slot in self.plan.slot_of.values():
            holders[slot] = holders.get(slot, 0) + 1
        lines = [f"naive plan: one buffer per computed value, {self.naive_buffers} buffers, "
                 f"{_bytes(self.naive_bytes)}",
                 f"this plan: {len(self.plan.slots)} pool slots shared by liveness, "
                 f"{_bytes(self.workspace_bytes)} ({_saving(self.workspace_bytes, self.naive_bytes)}); "
                 f"inputs and outputs are not pooled", "",
                 "slot  dtype      elements        bytes  values"]
        for k, slot in enumerate(self.plan.slots):
            lines.append(f"s{k:<4} {str(slot.dtype):<8} {slot.size:>10} {slot.nbytes:>12}  {holders.get(k, 0)}")
        return "\n".join(lines) + "\n\n" + str(self.plan)

    # -- renderings

    def __str__(self) -> str:
        lines = [self.headline()]
        width = max(len(k) for k, _ in self.facts())
        lines += [f"  {k:<{width}}  {v}" for k, v in self.facts()]
        for title, kind, content in self.sections():
            lines += ["", f"== {title} =="]
            if kind == "table":
                header, rows = content
                widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
                for r in (header, *rows):
                    lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                                  for i, (c, w) in enumerate(zip(r, widths))).rstrip())
            else:
                lines.append(content.rstrip("\n"))
        return "\n".join(lines) + "\n"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        e = html.escape
        parts = ["<div class='morphjit-explain'>",
                 f"<p><b>{e(self.headline())}</b></p>",
                 "<table>" + "".join(f"<tr><th style='text-align:left'>{e(k)}</th><td style='text-align:left'>"
                                     f"{e(v)}</td></tr>" for k, v in self.facts()) + "</table>"]
        for title, kind, content in self.sections():
            parts.append(f"<details><summary>{e(title)}</summary>{_html_body(kind, content)}</details>")
        parts.append("</div>")
        return "\n".join(parts)


def _html_body(kind: str, content) -> str:
    e = html.escape
    if kind == "table":
        header, rows = content
        head = "".join(f"<th>{e(c)}</th>" for c in header)
        body = "".join("<tr>" + "".join(f"<td style='text-align:{'left' if i == 0 else 'right'}'>{e(c)}</td>"
                                        for i, c in enumerate(r)) + "</tr>" for r in rows)
        return f"<table><tr>{head}</tr>{body}</table>"
    if kind == "source":
        highlighted = highlight_python(content)
        if highlighted is not None:
            return highlighted
    return f"<pre>{e(content)}</pre>"


def highlight_python(source: str) -> str | None:
    """``source`` as HTML with inline styles, or None without Pygments."""
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer
    except ImportError:
        return None
    return highlight(source, PythonLexer(), HtmlFormatter(noclasses=True))


def _bytes(n: int) -> str:
    if n < 10 * 1024:
        return f"{n} B"
    if n < 10 * 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 1024 / 1024:.1f} MiB"


def _saving(planned: int, naive: int) -> str:
    if not naive:
        return "no temporaries"
    return f"{100 * (1 - planned / naive):.0f}% less than naive"


# ---------------------------------------------------------------------------------------------
# Fusion groups


def fusion_groups(plan: Plan) -> list[FusionGroup]:
    """For each instruction of ``plan``, the bindings of ``plan.program`` whose values it computes:
    the bindings of the values it writes, and of every value inlined into its loop bodies."""
    program = plan.program
    fusion = Fusion(program)

    def inlined(v: Var, into: list, seen: set) -> None:
        b = fusion.producer.get(id(v))
        if b is None or id(b) in seen:
            return
        seen.add(id(b))
        for x in b.inputs:
            if isinstance(x, Var) and not fusion.is_root(x):
                inlined(x, into, seen)
        into.append(b)

    groups = [FusionGroup(k, *GROUP_OF[type(ins)](ins), list(ins.outs)) for k, ins in enumerate(plan.instructions)]
    group_of: dict[int, int] = {}          # id(root value) -> group index
    for g in groups:
        for v in g.outputs:
            group_of[id(v)] = g.index
    # Values a merge made private to their nest (or a finish folded into an accumulator) are no longer
    # written: they belong to the group of the value that reads them.
    consumers: dict[int, list[Binding]] = {}
    for b in program.bindings:
        for x in b.inputs:
            if isinstance(x, Var):
                consumers.setdefault(id(x), []).append(b)
    pending = [b.out for b in program.bindings if fusion.is_root(b.out) and id(b.out) not in group_of]
    while pending:
        progress = False
        for v in list(pending):
            readers = [group_of.get(id(r)) for r in _reading_roots(v, consumers, fusion)]
            home = next((r for r in readers if r is not None), None)
            if home is not None:
                group_of[id(v)] = home
                pending.remove(v)
                progress = True
        if not progress:
            break
    roots_of: dict[int, list[Var]] = {}
    for b in program.bindings:
        if fusion.is_root(b.out) and id(b.out) in group_of:
            roots_of.setdefault(group_of[id(b.out)], []).append(b.out)
    for g in groups:
        seen: set = set()
        for v in roots_of.get(g.index, []):
            inlined(v, g.bindings, seen)
        order = {id(b): k for k, b in enumerate(program.bindings)}
        g.bindings.sort(key=lambda b: order[id(b)])
    return groups


def _reading_roots(v: Var, consumers: dict, fusion: Fusion) -> list[Var]:
    """Root values whose loop bodies read ``v``, directly or through inlined (non-root) values."""
    found, stack, seen = [], [v], set()
    while stack:
        for b in consumers.get(id(stack.pop()), []):
            if id(b) not in seen:
                seen.add(id(b))
                (found if fusion.is_root(b.out) else stack).append(b.out)
    return found


# Each kind of instruction as a fusion group: its label and the domain of its loops.
GROUP_OF = {
    Gemm: lambda ins: ("gemm", ins.out.shape),
    Lapack: lambda ins: ("lapack", ins.out.shape),
    Alias: lambda ins: ("alias", ()),
    RangeCheck: lambda ins: ("check", ()),
    Scatter: lambda ins: ("scatter", ins.domain),
    RowNest: lambda ins: ("rows", ins.prefix),
    Nest: lambda ins: ("reduce" if ins.accumulations else "loop", ins.domain),
}


def describe_groups(groups: list[FusionGroup], program: Program) -> str:
    names = Namer.of_program(program)
    count: dict[int, int] = {}
    for g in groups:
        for b in g.bindings:
            count[id(b)] = count.get(id(b), 0) + 1
    lines = ["Each instruction of the plan and the bindings it computes (values named as in the",
             "lowered program below; * = recomputed in several instructions instead of stored;",
             "plan:<type> = a buffer the plan adds: an output's copy, the block of a short-row call).", ""]
    for g in groups:
        where = f" over {list(g.domain)}" if g.domain else ""
        if g.kind == "check":
            lines.append(f"#{g.index} range check")
            continue
        writes = ", ".join(names.use(v) if id(v) in names.names else f"plan:{v.type}" for v in g.outputs)
        lines.append(f"#{g.index} {g.kind}{where} -> {writes}"
                     + (f"  ({len(g.bindings)} bindings fused)" if len(g.bindings) > 1 else ""))
        for b in g.bindings:
            mark = "*" if count[id(b)] > 1 else " "
            loc = f"    # {os.path.basename(b.loc.filename)}:{b.loc.lineno}" if b.loc else ""
            lines.append(f"   {mark} {format_binding(b, names)}{loc}")
    lines += ["", "lowered program:", str(program).rstrip("\n")]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Entry points


def explain(compiled, args) -> Explanation:
    """The report for ``compiled`` (a `CompiledLoss`) at ``args``; compiles and runs it once if the
    step's machine code is not there yet, so that every stage has its time (on copies of the
    random generators among ``args``: an inspection consumes no random numbers)."""
    __tracebackhide__ = True  # noqa: F841
    step, leaves = compiled._step_for(tuple(args), {})   # args with the captured generators
    native = step.run if isinstance(step.run, NativeStep) else None
    if native is not None and step.timings is not None and step.timings.origin is None:
        step.run(*with_copied_generators(leaves))   # the user's generators do not advance
    signature = ", ".join(str(v.type) for v in step.program.inputs)
    report = Explanation(compiled.__name__, compiled.backend, signature, step.forward, step.program,
                         step.timings, step.timings.origin if step.timings else None)
    report.batch = batch_size(step.program.inputs, leaves)
    if native is not None:
        report.plan = step.plan
        report.groups = fusion_groups(step.plan)
        report.source = step.source
        report.module_file = module_file(native)
        own = [] if native.table else [native.kernel]   # a table step is no numba function
        report.vector_math = vecmath.describe(own + kernels.called_by(namespace(native)))
    return report


def namespace(native: NativeStep) -> dict:
    """The namespace of the step's module."""
    return native.kernel.namespace if native.table else native.kernel.py_func.__globals__


def module_file(native: NativeStep) -> str | None:
    """The cache file the step's module was loaded from, or None (compiled in memory)."""
    filename = namespace(native).get("__file__")
    return filename if filename and os.path.exists(filename) else None


def summary(compiled) -> str:
    """The body of ``repr(loss)``: signatures, instructions, where the machine code lives."""
    steps = compiled.steps()
    n = len(steps)
    parts = []
    if compiled.backend == "interp":
        parts.append("not called yet" if not n else _plural(n, "signature"))
        if n:
            parts.append(_counts([len(s.program.bindings) for s in steps], "binding"))
        parts.append("interp backend")
        return ", ".join(parts)
    if not n:
        parts.append("not called yet")
    else:
        parts.append(_plural(n, "signature"))
        parts.append(_counts([len(s.plan.instructions) if s.plan is not None else 0 for s in steps], "instruction"))
    if not (compiled.cache and config.caching()):
        parts.append("disk cache off")
    elif n:
        on_disk = [module_file(s.run) is not None for s in steps if isinstance(s.run, NativeStep)]
        parts.append("cached on disk" if all(on_disk) else "in memory only" if not any(on_disk)
                     else f"{sum(on_disk)} of {n} cached on disk")
    return ", ".join(parts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _counts(values: list[int], word: str) -> str:
    lo, hi = min(values), max(values)
    return _plural(lo, word) if lo == hi else f"{lo}-{hi} {word}s"
