"""The buffer planner's invariants, checked on any plan."""
from morphjit.backend.codegen.kernel import KernelWriter
from morphjit.backend.codegen.step import StepWriter, in_kernel
from morphjit.backend.memory import writes_reach_one_pointer
from morphjit.ir import DEPTH_LIMIT, Alias, depth


def check_plan_invariants(plan) -> None:
    """Reads follow writes; live values never share a slot (but for in-place loops); outputs are
    private; no loop body is deeper than `ir.DEPTH_LIMIT`."""
    defined = {id(v) for v in plan.inputs} | {id(v) for v, _ in plan.consts}
    first_write, last_touch = {}, {}
    for t, ins in enumerate(plan.instructions):
        for v in ins.reads():
            assert id(v) in defined, f"instruction {t} reads a value before it is written"
            last_touch[id(plan.buffer_of(v))] = t
        for out in ins.outs:
            defined.add(id(out))
            first_write.setdefault(id(out), t)
            last_touch[id(plan.buffer_of(out))] = t
    outputs = {id(v) for v in plan.outputs}
    assert not outputs & set(plan.slot_of), "an output was given a pool slot"
    writers = {}
    for ins in plan.instructions:
        for out in ins.outs:
            writers.setdefault(id(out), []).append(ins)
    for v in plan.outputs:
        assert all(not isinstance(i, Alias) for i in writers[id(v)]), "an output aliases another buffer"
    pooled = [(first_write[k], last_touch[k], k, s) for k, s in plan.slot_of.items()]
    in_place_outs = {id(v) for i in plan.instructions if id(i) in plan.in_place for v in i.outs}
    for a_start, a_end, a, slot in pooled:
        for b_start, b_end, b, other in pooled:
            if a == b or slot != other or not a_start <= b_start <= a_end:
                continue
            handover = b_start == a_end and b in in_place_outs
            assert handover, f"two live values share slot {slot} (lifetimes {a_start}-{a_end} and {b_start}-{b_end})"
    for s in plan.slots:
        assert s.size >= 1
    for nest in (n for ins in plan.instructions for n in ins.nests()):
        for e in [s.expr for s in nest.stores] + [e for a in nest.accumulations for e in (a.expr, a.finish)]:
            assert depth(e) <= DEPTH_LIMIT, f"an expression {depth(e)} deep (walks of it recurse)"
    for ins, arrays in kernel_arrays(plan):
        assert writes_reach_one_pointer(plan, ins, arrays), f"a kernel writes memory two of its pointers reach: {ins}"


def kernel_arrays(plan):
    """Each instruction a kernel runs, with the arrays of its kernel (each a pointer of its own)."""
    step = StepWriter(plan)
    for ins in plan.instructions:
        if in_kernel(ins):
            writer = KernelWriter()
            step.alias_outputs(writer.names)
            writer.write(ins)
            yield ins, writer.names.order
