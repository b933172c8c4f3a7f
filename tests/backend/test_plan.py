"""The replay plan: invariants of the buffer planner, its meaning on the plan executor, its effect."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import morphjit as mj
from morphjit.backend.memory import storage, writes_reach_one_pointer
from morphjit.jit.pipeline import compile_plan
from morphjit.runtime.interp import run_plan
from morphjit.backend import make_plan

from support.models import MODELS
from support.strategies import random_programs
from support.gradcheck import central_difference
from support.plans import check_plan_invariants, kernel_arrays


def flat_args(args):
    from morphjit.util import pytree
    return pytree.flatten(tuple(args))[0]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_plan_matches_program(name):
    fn, args = MODELS[name](np.float64)
    joint = mj.grad_program(fn, *args)
    plan = compile_plan(joint)
    check_plan_invariants(plan)
    expected = mj.run(joint, *flat_args(args))
    actual = run_plan(plan, *flat_args(args))
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-10, atol=1e-12)
    assert plan.workspace_bytes <= plan.naive_bytes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs())
def test_random_plans_match_program(example):
    fn, args = example
    joint = mj.grad_program(fn, *args)
    plan = compile_plan(joint)
    check_plan_invariants(plan)
    expected = mj.run(joint, *flat_args(args))
    for a, e in zip(run_plan(plan, *flat_args(args)), expected):
        np.testing.assert_allclose(a, e, rtol=1e-9, atol=1e-9)


def test_squared_error_is_one_reduction_loop():
    def sse(x, y):
        return mj.sum((x - y) * (x - y))

    x, y = np.ones(5), np.zeros(5)
    plan = make_plan(mj.trace(sse, x, y))
    assert plan.counts() == {"gemm": 0, "loop": 0, "reduce": 1, "alias": 0}
    assert plan.workspace_bytes == 0
    assert "v2:f64[] = sum[i0] mul(sub(v0[i0], v1[i0]), sub(v0[i0], v1[i0]))" in str(plan)


def test_gemm_epilogue_runs_in_place_and_transposes_go_to_blas():
    fn, args = MODELS["mlp2"](np.float64)
    plan = compile_plan(mj.grad_program(fn, *args))
    text = str(plan)
    assert "relu(add(" in text  # bias add and activation fused into one loop after the GEMM
    assert any(i.a_transposed or i.b_transposed for i in plan.instructions if hasattr(i, "a_transposed"))
    assert "transpose" not in text  # transposes are BLAS flags or index maps, never copies
    assert plan.in_place, "no loop wrote over a dying input"


def test_a_kernel_writing_in_place_reaches_the_buffer_through_one_pointer():
    fn, args = MODELS["mlp2"](np.float64)
    plan = compile_plan(mj.grad_program(fn, *args))
    [(ins, arrays)] = [(i, a) for i, a in kernel_arrays(plan) if id(i) in plan.in_place][:1]
    assert writes_reach_one_pointer(plan, ins, arrays)
    out = ins.outs[0]
    donor = next(v for v in ins.reads() if v is not out and storage(plan, v) == storage(plan, out))
    assert not writes_reach_one_pointer(plan, ins, [donor, out])   # two names for the buffer written


def test_broadcast_reads_compose_into_one_loop():
    def f(a, b):
        return mj.sum(mj.exp(a.T + b[None, :]) * 2.0)

    a, b = np.ones((3, 4)), np.ones(3)
    plan = make_plan(mj.trace(f, a, b))
    assert len(plan.instructions) == 1
    assert "v0[i1, i0]" in str(plan) and "v1[i1]" in str(plan)


SOFTMAX_PLAN = """\
plan: 1 instructions (0 gemm, 0 loop, 1 reduce, 0 alias); 3 slots, workspace 432 B (naive 1635 B)
in v0:f64[3,16] v1:f64[3,16]
  rows over [3]
    nest over [3, 16]
      v2:f64[3] [s0] = max[i1] v0[i0, i1]
    nest over [3, 16]
      v3:f64[3,16] [s1] = exp(sub(v0[i0, i1], where(ne(abs(v2[i0]), inf), v2[i0], 0.0)))
      v4:f64[3] [s2] = sum[i1] v3[i0, i1]
    nest over [3, 16]
      v5:f64[] = sum[i0,i1] mul(div(v3[i0, i1], v4[i0]), v1[i0, i1])
out v5
"""

# Rows shorter than selection.SHORT_ROW: the exponentials run as one flat loop over the block.
SHORT_SOFTMAX_PLAN = """\
plan: 5 instructions (0 gemm, 1 loop, 2 reduce, 2 alias); 3 slots, workspace 216 B (naive 483 B)
in v0:f64[3,4] v1:f64[3,4]
  rows over [3]
    nest over [3, 4]
      v2:f64[3] [s0] = max[i1] v0[i0, i1]
    nest over [3, 4]
      v3:f64[3,4] [s1] = sub(v0[i0, i1], where(ne(abs(v2[i0]), inf), v2[i0], 0.0))
  alias v4:f64[12] = reshape v3
  nest over [12]
    v5:f64[12] [s2] = exp(v4[i0])
  alias v6:f64[3,4] = reshape v5
  rows over [3]
    nest over [3, 4]
      v7:f64[3] [s1] = sum[i1] v6[i0, i1]
    nest over [3, 4]
      v8:f64[] = sum[i0,i1] mul(div(v6[i0, i1], v7[i0]), v1[i0, i1])
out v8
"""


MIN_GRADIENT_PLAN = """\
plan: 4 instructions (0 gemm, 2 loop, 2 reduce, 0 alias); 3 slots, workspace 88 B (naive 537 B)
in v0:f64[9]
  nest over [9]
    v1:f64[9] [s0] = mul(add(v0[i0], 1.3), 1.581)
    v2:f64[] [s1] = sum[i0] mul(v0[i0], add(v0[i0], 1.3))
    v3:f64[] [s2] = min[i0] v1[i0]
  nest over []
    v4:f64[] = add(v2[0], v3[0])
  nest over [9]
    v5:f64[] [s1] = sum[i0] cast(eq(v1[i0], v3[0]) dtype=f64)
  nest over [9]
    v6:f64[9] = add(add(mul(div(cast(eq(v1[i0], v3[0]) dtype=f64), v5[0]), 1.581), add(v0[i0], 1.3)), v0[i0])
out v4 v6
"""


def test_an_exact_comparison_reads_its_operand_from_a_buffer():
    # (x + 1.3) * 1.581, cheap enough to recompute, is stored once: the min reduces it and the
    # gradient's eq compares it with the min, both from that buffer (test_numba_backend runs it).
    def f(x):
        return mj.sum(x * (x + 1.3)) + mj.min((x + 1.3) * 1.581)

    assert str(compile_plan(mj.grad_program(f, np.ones(9)))) == MIN_GRADIENT_PLAN


def test_an_exact_comparison_of_windows_stores_what_the_windows_read():
    def f(b, x):
        return mj.sum(mj.max_pool2d(mj.relu(x * 1.5 + b), 3, stride=1) ** 2)

    text = str(compile_plan(mj.grad_program(f, np.ones((1, 2, 1, 1)), np.ones((3, 2, 6, 6)))))
    assert "v3:f64[3,2,6,6] [s0] = relu(add(mul(" in text      # the activation, once
    assert "[3,2,4,4,3,3] [" not in text                         # not a copy of its windows


def test_softmax_is_one_pass_over_the_rows():
    def f(x, y):
        return mj.sum(mj.softmax(x, axis=1) * y)

    plan = compile_plan(mj.trace(f, np.ones((3, 16)), np.ones((3, 16))))
    assert str(plan) == SOFTMAX_PLAN


def test_softmax_over_short_rows_exponentiates_the_block_in_one_loop():
    def f(x, y):
        return mj.sum(mj.softmax(x, axis=1) * y)

    x, y = np.random.default_rng(0).normal(size=(2, 3, 4))
    plan = compile_plan(mj.trace(f, x, y))
    assert str(plan) == SHORT_SOFTMAX_PLAN
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(run_plan(plan, x, y)[0], np.sum(e / e.sum(axis=1, keepdims=True) * y), rtol=1e-14)


def test_a_reduction_of_calls_over_short_rows_runs_the_calls_flat_over_the_input_itself():
    def f(x, y):
        return mj.sum(mj.log(mj.sum(mj.exp(x), axis=1)) * y[:, 0])

    x, y = np.random.default_rng(1).normal(size=(2, 3, 4))
    text = str(plan := compile_plan(mj.trace(f, x, y)))
    assert "alias v2:f64[12] = reshape v0\n  nest over [12]\n    v3:f64[12] [s0] = exp(v2[i0])\n" in text
    assert "sum[i1] v4[i0, i1]" in text                     # the row sums read the calls' block
    np.testing.assert_allclose(run_plan(plan, x, y)[0], np.sum(np.log(np.exp(x).sum(1)) * y[:, 0]), rtol=1e-14)


# Regression bounds on the fused plans of the four models: (GEMMs, loop nests). A softmax
# over short rows adds two nests: its exponentials over the block, and the row sums after them.
PLAN_SHAPES = {"mlp2": (5, 6), "mlp3_tanh_mse": (8, 6), "layernorm": (2, 4), "attention": (15, 9)}


@pytest.mark.parametrize("name", sorted(PLAN_SHAPES))
def test_model_plans_stay_fused(name):
    fn, args = MODELS[name](np.float64)
    plan = compile_plan(mj.grad_program(fn, *args))
    counts = plan.counts()
    gemms, nests = PLAN_SHAPES[name]
    assert counts["gemm"] == gemms
    assert counts["loop"] + counts["reduce"] <= nests
    assert 2 * plan.workspace_bytes <= plan.naive_bytes


def test_two_layer_mlp_has_one_loop_per_layer_and_direction():
    fn, args = MODELS["mlp2"](np.float64)
    plan = compile_plan(mj.grad_program(fn, *args))
    counts = plan.counts()
    # two layers, forward and backward, and the softmax's exponentials over its 10-wide rows
    # (selection.SHORT_ROW) in a flat loop of their own, the row sums after it
    assert counts["loop"] + counts["reduce"] <= 2 * 2 + 2


def test_make_plan_wants_a_lowered_program():
    with pytest.raises(ValueError, match="softmax must be lowered"):
        make_plan(mj.trace(lambda x: mj.sum(mj.softmax(x)), np.ones((2, 3))))


def test_loop_ir_expressions_walk_and_rebuild_one_way():
    from morphjit.ir import IndexMap
    from morphjit.ir import TensorType, Var
    from morphjit.ir import Acc, Apply, Const, Load, OneHot, loads, replace_loads
    from morphjit.ir.loops import walk

    x, labels = Var(TensorType((3,), np.float64)), Var(TensorType((3,), np.int64))
    at = IndexMap.identity(1)
    hot = OneHot(Load(labels, at), IndexMap((0,), ((1,),)), np.dtype(np.float64))
    expr = Apply("add", (Apply("exp", (Load(x, at),), (), np.dtype(np.float64)), hot), (), np.dtype(np.float64))
    assert [type(e).__name__ for e in walk(expr)] == ["Apply", "Apply", "Load", "OneHot", "Load"]
    assert [e.var for e in loads(expr)] == [x, labels]
    replaced = replace_loads(expr, x, Acc())
    assert [e.var for e in loads(replaced)] == [labels] and Acc() in list(walk(replaced))
    assert replace_loads(expr, Var(TensorType((3,), np.float64)), Const(0.0, np.float64)) == expr


def test_the_rewrites_are_a_named_list_and_dump_like_the_passes(monkeypatch, capsys):
    from morphjit.backend.selection import REWRITES

    assert [name for name, _ in REWRITES] == ["flatten_short_rows", "fold_finishes", "merge_nests",
                                              "inline_private_stores", "fuse_rows"]
    fn, args = MODELS["mlp2"](np.float64)
    joint = mj.grad_program(fn, *args)
    monkeypatch.setenv("MORPHJIT_DUMP", "merge_nests")
    compile_plan(joint)
    err = capsys.readouterr().err
    assert "before merge_nests\n" in err and "after merge_nests\n" in err and "fuse_rows" not in err
    assert err.count("gemm v") >= 2 and "nest over" in err


def test_every_op_record_says_how_the_loop_backends_select_it():
    from morphjit.ir import ELEMENTWISE, OPS, STRUCTURAL, VIEW

    for name, op in OPS.items():
        if op.kind == VIEW:
            assert op.index_map is not None, f"view {name} has no index map"
        if op.kind == STRUCTURAL:
            assert op.nests is not None, f"structural op {name} has no nests rule"
        if op.kind == ELEMENTWISE:
            assert op.scalar is not None or op.body is not None, f"{name} has no scalar template or body"
            assert op.cost >= 1
    assert OPS["exp"].cost > OPS["add"].cost


def test_a_view_reads_through_the_index_map_of_its_op_record(monkeypatch):
    from dataclasses import replace

    from morphjit.ir import transpose_map
    from morphjit.ir import OPS

    def f(a):
        return mj.sum(mj.exp(a.T))

    a = np.ones((3, 3))
    assert "exp(v0[i1, i0])" in str(make_plan(mj.trace(f, a)))
    # selection learns the map from the record alone: another map there shows in the plan
    monkeypatch.setitem(OPS, "transpose", replace(OPS["transpose"], index_map=lambda x, out, perm: transpose_map((0, 1))))
    assert "exp(v0[i0, i1])" in str(make_plan(mj.trace(f, a)))


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_a_concatenated_index_is_range_checked_once_all_its_parts_are_written(backend):
    """A concatenation is written by one nest per part: the index check runs after the last."""
    def picked(p, k):
        return np.sum(p[np.concatenate([k[0:1], k[1:3], k[3:]])] * np.arange(1.0, 7.0))

    p, k = np.linspace(1.0, 2.0, 6), np.array([5, 0, 4, 1, 3, 2])
    step = mj.compile_loss(picked, backend=backend)
    value, grad = step(p, k)
    np.testing.assert_allclose(value, picked(p, k), rtol=1e-12)
    np.testing.assert_allclose(grad, np.bincount(k, np.arange(1.0, 7.0), 6), rtol=1e-12)
    with pytest.raises(IndexError):
        step(p, np.array([0, 1, 2, 3, 4, 6]))    # out of range in the last part


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_a_computed_index_stays_a_buffer_its_range_check_reads(backend):
    """Merging the index's nest into its reader's makes the index private to that nest; the
    range check placed after selection still reads it, so it is not folded into the gather."""
    def fn(x, i):
        return x[(i + np.arange(3)) % 8] * 2.0
    picked = mj.compile(fn, backend=backend)
    x = np.arange(6.0)
    np.testing.assert_array_equal(picked(x, 1), x[[1, 2, 3]] * 2.0)
    with pytest.raises(IndexError, match=r"computed indices .* must lie in \[-6, 6\), got 6 at position \(2\)"):
        picked(x, 4)
    checks = [line for line in str(make_plan(mj.trace(fn, x, np.int64(1)))).splitlines() if "check" in line]
    assert checks and not any("?" in line for line in checks), checks   # '?': a value no instruction writes


def _builtin_sum_of_squares(v):
    return sum(v * v)          # a chain of 1,500 adds of gathered elements


def _long_elementwise_chain(x):
    for _ in range(500):       # forward and backward: a chain deeper than fusion's walks could recurse
        x = np.sin(x) * 1.0001
    return np.sum(x)


def _unrolled_rnn(p, xs):
    h = np.zeros((xs.shape[0], p["Wh"].shape[0]))
    for t in range(xs.shape[1]):
        h = np.tanh(xs[:, t] @ p["Wx"] + h @ p["Wh"])
    return np.sum(h ** 2)


def _long_program_cases():
    """name -> (function, its arguments, the argument differentiated, the backend)."""
    rng = np.random.default_rng(3)
    rnn = ({"Wx": rng.standard_normal((3, 4)) * 0.3, "Wh": rng.standard_normal((4, 4)) * 0.3},
           rng.standard_normal((2, 400, 3)))
    return {"builtin sum": (_builtin_sum_of_squares, (np.linspace(-1, 1, 1500),), "numba"),
            "element-wise chain": (_long_elementwise_chain, (np.linspace(0, 1, 5),), "interp"),
            "unrolled rnn": (_unrolled_rnn, rnn, "interp")}


@pytest.mark.parametrize("case", sorted(_long_program_cases()))
def test_programs_longer_than_pythons_recursion_limit_compile(case):
    """Each was a RecursionError (fusion's walks, the loop-IR hash); the values and gradients are
    NumPy's run of the same code and its central differences."""
    fn, args, backend = _long_program_cases()[case]
    plan = compile_plan(mj.grad_program(fn, *args))
    check_plan_invariants(plan)       # no loop body deeper than ir.DEPTH_LIMIT
    value, grad = mj.compile_loss(fn, backend=backend)(*args)
    assert value == pytest.approx(fn(*args), rel=1e-10)
    if case == "unrolled rnn":
        grad, numeric = grad["Wh"], central_difference(lambda w: fn({**args[0], "Wh": w}, args[1]), args[0]["Wh"])
    elif case == "builtin sum":
        numeric = 2 * args[0]
    else:
        numeric = central_difference(fn, args[0])
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["sin", "tanh", "add", "mul", "sub", "exp"]), st.integers(0, 3)),
                min_size=65, max_size=220))
def test_deep_element_wise_programs_are_cut_into_expressions_the_walks_can_take(ops):
    """Random element-wise programs deeper than ``ir.DEPTH_LIMIT``, each op reading the last value
    and one of the few before it: the plan keeps every body within the limit and computes what the
    program does."""
    def fn(x):
        values = [x, x * 0.5]
        for name, back in ops:
            last, other = values[-1], values[-1 - min(back, len(values) - 1)]
            if name in ("sin", "tanh"):
                values.append(getattr(np, name)(last))
            elif name == "exp":
                values.append(np.exp(-np.abs(last)))
            else:
                values.append({"add": np.add, "mul": np.multiply, "sub": np.subtract}[name](last, other) * 0.5)
        return np.sum(values[-1])
    x = np.linspace(-1, 1, 6)
    joint = mj.grad_program(fn, x)
    plan = compile_plan(joint)
    check_plan_invariants(plan)
    for a, e in zip(run_plan(plan, x), mj.run(joint, x)):
        np.testing.assert_allclose(a, e, rtol=1e-9, atol=1e-12)
