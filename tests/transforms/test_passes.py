"""The optimisation passes: each rewrite as golden text, and programs that keep their meaning.

Golden cases state a program in the text form, run a pass and compare the printed result.
Meaning is checked on the reference executor: the joint programs of the end-to-end models and of
random losses, and random IR programs, compute the same values before and after every pass.
"""
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import morphjit as mj
from morphjit.jit import checks, traced
from morphjit.transforms import passes, rewrites, vjp
from morphjit.util import MorphjitError
from morphjit.ir import Binding, Lit, OPS, Program, TensorType, Var, params_of, parse
from morphjit.ir.program import VerifyError

from support.models import MODELS
from support.strategies import random_programs as random_losses


@pytest.fixture(autouse=True, scope="module")
def verify_after_each_pass():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MORPHJIT_VERIFY", "1")
        yield


def text(program_text: str) -> str:
    return textwrap.dedent(program_text).strip() + "\n"


def simplified(program: Program) -> Program:
    """``simplify`` then ``dce``, so golden texts show only what is live."""
    return passes.dce(rewrites.simplify(program))


def check_golden(run_pass, before: str, after: str):
    program = parse(text(before)).verify()
    result = run_pass(program).verify()
    assert str(result) == text(after)
    assert [v.type for v in result.outputs] == [v.type for v in program.outputs]
    return result


def case(name, before, after=None):
    """A golden case; without ``after`` the program must come out unchanged."""
    return pytest.param(before, before if after is None else after, id=name)


# ---------------------------------------------------------------------------------------------
# simplify: one or more golden cases per rewrite, and cases that must stay as they are

SIMPLIFY_CASES = [
    # x * 1, 1 * x, x / 1
    case("mul-one", """
        in v0:f64[3]
          v1:f64[3] = mul v0 1.0
          v2:f64[3] = exp v1
        out v2
    """, """
        in v0:f64[3]
          v1:f64[3] = exp v0
        out v1
    """),
    case("one-mul-f32", """
        in v0:f32[2,3]
          v1:f32[2,3] = mul 1.0:f32 v0
        out v1
    """, """
        in v0:f32[2,3]
        out v0
    """),
    case("div-one", """
        in v0:f64[3]
          v1:f64[3] = div v0 1.0
        out v1
    """, """
        in v0:f64[3]
        out v0
    """),
    # the op broadcasts x: removing it would change the shape, so x is broadcast instead
    case("mul-one-broadcasting", """
        in v0:f64[3]
          v1:f64[4,3] = fill dtype=f64 shape=(4,3) value=1.0
          v2:f64[4,3] = mul v0 v1
        out v2
    """, """
        in v0:f64[3]
          v1:f64[4,3] = broadcast_to v0 shape=(4,3)
        out v1
    """),
    # x + 0, 0 + x, x - 0 (zeros of either sign)
    case("add-zero", """
        in v0:f64[3]
          v1:f64[3] = add v0 0.0
          v2:f64[3] = add -0.0 v1
          v3:f64[3] = sub v2 0.0
        out v3
    """, """
        in v0:f64[3]
        out v0
    """),
    case("add-zero-broadcasting", """
        in v0:f64[3]
          v1:f64[4,3] = fill dtype=f64 shape=(4,3) value=0.0
          v2:f64[4,3] = add v1 v0
        out v2
    """, """
        in v0:f64[3]
          v1:f64[4,3] = broadcast_to v0 shape=(4,3)
        out v1
    """),
    case("zero-minus-x-kept", """
        in v0:f64[3]
          v1:f64[3] = sub 0.0 v0
        out v1
    """),
    # x * 0 is not 0 when x is NaN or infinite
    case("mul-zero-kept", """
        in v0:f64[3]
          v1:f64[3] = mul v0 0.0
          v2:f64[3] = mul -0.0 v1
        out v2
    """),
    # negation
    case("double-neg", """
        in v0:f64[3]
          v1:f64[3] = neg v0
          v2:f64[3] = neg v1
        out v2
    """, """
        in v0:f64[3]
        out v0
    """),
    case("add-neg", """
        in v0:f64[2,3] v1:f64[3]
          v2:f64[3] = neg v1
          v3:f64[2,3] = add v0 v2
          v4:f64[2,3] = neg v0
          v5:f64[2,3] = add v4 v1
        out v3 v5
    """, """
        in v0:f64[2,3] v1:f64[3]
          v2:f64[2,3] = sub v0 v1
          v3:f64[2,3] = sub v1 v0
        out v2 v3
    """),
    case("sub-neg", """
        in v0:f64[3] v1:f64[3]
          v2:f64[3] = neg v1
          v3:f64[3] = sub v0 v2
        out v3
    """, """
        in v0:f64[3] v1:f64[3]
          v2:f64[3] = add v0 v1
        out v2
    """),
    # division by a power of two is an exact multiplication
    case("div-power-of-two", """
        in v0:f64[3] v1:f32[3]
          v2:f64[3] = div v0 4.0
          v3:f64[3] = div v0 -0.5
          v4:f32[3] = div v1 1024.0:f32
        out v2 v3 v4
    """, """
        in v0:f64[3] v1:f32[3]
          v2:f64[3] = mul v0 0.25
          v3:f64[3] = mul v0 -2.0
          v4:f32[3] = mul v1 0.0009765625:f32
        out v2 v3 v4
    """),
    # 1/3 is inexact; 1/5e-324 (the smallest subnormal) overflows
    case("div-kept", """
        in v0:f64[3]
          v1:f64[3] = div v0 3.0
          v2:f64[3] = div v1 5e-324
          v3:f64[3] = div 2.0 v2
        out v3
    """),
    # transposes
    case("transpose-transpose", """
        in v0:f64[2,3,4]
          v1:f64[3,2,4] = transpose v0 perm=(1,0,2)
          v2:f64[3,4,2] = transpose v1 perm=(0,2,1)
        out v2
    """, """
        in v0:f64[2,3,4]
          v1:f64[3,4,2] = transpose v0 perm=(1,2,0)
        out v1
    """),
    case("transpose-back", """
        in v0:f64[2,3,4]
          v1:f64[3,4,2] = transpose v0 perm=(1,2,0)
          v2:f64[2,3,4] = transpose v1 perm=(2,0,1)
          v3:f64[2,3,4] = transpose v2 perm=(0,1,2)
        out v3
    """, """
        in v0:f64[2,3,4]
        out v0
    """),
    case("square-transpose-kept", """
        in v0:f64[3,3]
          v1:f64[3,3] = transpose v0 perm=(1,0)
        out v1
    """),
    # reshapes and broadcasts
    case("reshape-reshape", """
        in v0:f64[2,3]
          v1:f64[6] = reshape v0 shape=(6,)
          v2:f64[3,2] = reshape v1 shape=(3,2)
          v3:f64[6,1] = reshape v1 shape=(6,1)
          v4:f64[2,3] = reshape v3 shape=(2,3)
        out v2 v4
    """, """
        in v0:f64[2,3]
          v1:f64[3,2] = reshape v0 shape=(3,2)
        out v1 v0
    """),
    case("same-shape-views", """
        in v0:f64[2,3]
          v1:f64[2,3] = reshape v0 shape=(2,3)
          v2:f64[2,3] = broadcast_to v1 shape=(2,3)
        out v2
    """, """
        in v0:f64[2,3]
        out v0
    """),
    case("broadcast-broadcast", """
        in v0:f64[3]
          v1:f64[2,3] = broadcast_to v0 shape=(2,3)
          v2:f64[4,2,3] = broadcast_to v1 shape=(4,2,3)
        out v2
    """, """
        in v0:f64[3]
          v1:f64[4,2,3] = broadcast_to v0 shape=(4,2,3)
        out v1
    """),
    # fills under views, and broadcasts of a scalar
    case("views-of-fill", """
        in v0:f64[2,3]
          v1:f64[] = fill dtype=f64 shape=() value=0.5
          v2:f64[1,1] = reshape v1 shape=(1,1)
          v3:f64[2,3] = broadcast_to v2 shape=(2,3)
          v4:f64[3,2] = transpose v3 perm=(1,0)
          v5:f64[3,1] = slice v4 starts=(0,0) stops=(3,1) steps=(1,1)
        out v5 v0
    """, """
        in v0:f64[2,3]
          v1:f64[3,1] = fill dtype=f64 shape=(3,1) value=0.5
        out v1 v0
    """),
    # fills as literal operands
    case("fill-to-literal", """
        in v0:f64[2,3]
          v1:f64[] = fill dtype=f64 shape=() value=3.0
          v2:f64[2,3] = fill dtype=f64 shape=(2,3) value=-inf
          v3:f64[2,3] = maximum v0 v1
          v4:f64[2,3] = maximum v3 v2
        out v4
    """, """
        in v0:f64[2,3]
          v1:f64[2,3] = maximum v0 3.0
          v2:f64[2,3] = maximum v1 -inf
        out v2
    """),
    case("shape-giving-fill-kept", """
        in v0:f64[3]
          v1:f64[2,3] = fill dtype=f64 shape=(2,3) value=3.0
          v2:f64[2,3] = maximum v0 v1
        out v2
    """),
    case("boolean-fill-condition", """
        in v0:f64[2,3] v1:f64[2,3]
          v2:bool[] = fill dtype=bool shape=() value=False
          v3:f64[2,3] = where v2 v0 v1
        out v3
    """, """
        in v0:f64[2,3] v1:f64[2,3]
        out v1
    """),
    # constant folding (NumPy computes the value)
    case("fold-constants", """
        in v0:f64[2]
          v1:f64[2] = fill dtype=f64 shape=(2,) value=0.0
          v2:f64[2] = exp v1
          v3:f64[2] = mul v2 3.0
          v4:bool[2] = gt v3 2.0
          v5:f64[2] = div 1.0 v1
          v6:f64[2] = add v5 v0
        out v3 v4 v6
    """, """
        in v0:f64[2]
          v1:f64[2] = fill dtype=f64 shape=(2,) value=3.0
          v2:bool[2] = fill dtype=bool shape=(2,) value=True
          v3:f64[2] = add inf v0
        out v1 v2 v3
    """),
    case("uniform-const-to-literal", """
        in v0:f64[2,3]
        const v1:f64[]
          v2:f64[2,3] = mul v0 v1
        out v2
    """, """
        in v0:f64[2,3]
          v1:f64[2,3] = mul v0 0.0
        out v1
    """),
    # broadcasts the op would do anyway
    case("absorb-broadcast", """
        in v0:f64[3] v1:f64[2,3]
          v2:f64[2,3] = broadcast_to v0 shape=(2,3)
          v3:f64[2,3] = mul v2 v1
        out v3
    """, """
        in v0:f64[3] v1:f64[2,3]
          v2:f64[2,3] = mul v0 v1
        out v2
    """),
    case("shape-giving-broadcast-kept", """
        in v0:f64[3]
          v1:f64[2,3] = broadcast_to v0 shape=(2,3)
          v2:f64[2,3] = mul v1 v0
        out v2
    """),
    # reductions over size-1 axes
    case("sum-unit-axes", """
        in v0:f64[4,1,1]
          v1:f64[4] = sum v0 axes=(1,2)
          v2:f64[4,1] = max v0 axes=(2,)
          v3:f64[4,1] = min v0 axes=(1,)
        out v1 v2 v3
    """, """
        in v0:f64[4,1,1]
          v1:f64[4] = reshape v0 shape=(4,)
          v2:f64[4,1] = reshape v0 shape=(4,1)
          v3:f64[4,1] = reshape v0 shape=(4,1)
        out v1 v2 v3
    """),
    case("sum-kept", """
        in v0:f64[4,1]
          v1:f64[1] = sum v0 axes=(0,)
          v2:f64[] = sum v0 axes=(0,1)
        out v1 v2
    """),
    # powers
    case("pow-one-two", """
        in v0:f64[3]
          v1:f64[3] = pow v0 1.0
          v2:f64[3] = pow v1 2.0
        out v2
    """, """
        in v0:f64[3]
          v1:f64[3] = square v0
        out v1
    """),
    case("pow-zero", """
        in v0:f64[3] v1:f64[3]
          v2:f64[3] = pow v0 0.0
          v3:f64[3] = mul v1 v2
        out v3
    """, """
        in v0:f64[3] v1:f64[3]
        out v1
    """),
    case("pow-kept", """
        in v0:f64[3]
          v1:f64[3] = pow v0 3.0
          v2:f64[3] = pow v1 0.5
          v3:f64[3] = pow 1.0 v2
        out v3
    """),
    # casts
    case("cast-same-dtype", """
        in v0:f32[3]
          v1:f32[3] = cast v0 dtype=f32
          v2:f64[3] = cast v1 dtype=f64
        out v2
    """, """
        in v0:f32[3]
          v1:f64[3] = cast v0 dtype=f64
        out v1
    """),
    # where
    case("where-literal-condition", """
        in v0:f64[3] v1:f64[2,3]
          v2:f64[2,3] = where True v0 v1
          v3:f64[2,3] = where False v1 2.0
          v4:f64[3] = where True v0 v0
        out v2 v3 v4
    """, """
        in v0:f64[3] v1:f64[2,3]
          v2:f64[2,3] = broadcast_to v0 shape=(2,3)
          v3:f64[2,3] = fill dtype=f64 shape=(2,3) value=2.0
        out v2 v3 v0
    """),
    case("where-same-operands", """
        in v0:f64[3] v1:f64[2,3]
          v2:bool[2,3] = gt v1 0.0
          v3:f64[2,3] = where v2 v0 v0
        out v3
    """, """
        in v0:f64[3] v1:f64[2,3]
          v2:f64[2,3] = broadcast_to v0 shape=(2,3)
        out v2
    """),
    case("where-kept", """
        in v0:f64[3] v1:f64[3]
          v2:bool[3] = gt v1 0.0
          v3:f64[3] = where v2 v0 0.0
          v4:f64[3] = where v2 0.0 -0.0
        out v3 v4
    """),
]


@pytest.mark.parametrize("before, after", SIMPLIFY_CASES)
def test_simplify(before, after):
    check_golden(simplified, before, after)


def test_simplify_leaves_replaced_bindings_for_dce():
    check_golden(rewrites.simplify, """
        in v0:f64[3]
          v1:f64[3] = neg v0
          v2:f64[3] = neg v1
          v3:f64[3] = exp v2
        out v3
    """, """
        in v0:f64[3]
          v1:f64[3] = neg v0
          v2:f64[3] = exp v0
        out v2
    """)


def test_simplify_reuses_untouched_bindings():
    program = parse(text("""
        in v0:f64[3]
          v1:f64[3] = exp v0
          v2:f64[3] = mul v1 1.0
          v3:f64[3] = log v2
        out v3
    """))
    result = rewrites.simplify(program)
    assert result.bindings[0] is program.bindings[0]
    assert result.bindings[1].out is program.bindings[2].out  # rebuilt, same value
    assert result.bindings[1].inputs[0] is program.bindings[0].out


def test_a_rule_that_changes_the_type_is_caught(monkeypatch):
    def sum_is_its_operand(b, producer):
        return b.inputs[0]

    monkeypatch.setitem(rewrites.RULES, "sum", (sum_is_its_operand,))
    with pytest.raises(AssertionError, match="sum_is_its_operand rewrote .* into a value of type f64\\[3\\]"):
        rewrites.simplify(parse(text("""
            in v0:f64[3]
              v1:f64[] = sum v0 axes=(0,)
            out v1
        """)))


# ---------------------------------------------------------------------------------------------
# cse and dce

CSE_CASES = [
    case("repeated-transpose-and-fill", """
        in v0:f64[2,3]
          v1:f64[3,2] = transpose v0 perm=(1,0)
          v2:f64[3,2] = transpose v0 perm=(1,0)
          v3:f64[3,2] = add v1 v2
          v4:f64[2] = fill dtype=f64 shape=(2,) value=0.0
          v5:f64[2] = fill dtype=f64 shape=(2,) value=0.0
        out v3 v4 v5
    """, """
        in v0:f64[2,3]
          v1:f64[3,2] = transpose v0 perm=(1,0)
          v2:f64[3,2] = add v1 v1
          v3:f64[2] = fill dtype=f64 shape=(2,) value=0.0
        out v2 v3 v3
    """),
    case("cascade-and-commuted", """
        in v0:f64[3] v1:f64[3]
          v2:f64[3] = exp v0
          v3:f64[3] = exp v0
          v4:f64[3] = mul v2 v1
          v5:f64[3] = mul v1 v3
          v6:f64[3] = sub v4 v5
        out v6
    """, """
        in v0:f64[3] v1:f64[3]
          v2:f64[3] = exp v0
          v3:f64[3] = mul v2 v1
          v4:f64[3] = sub v3 v3
        out v4
    """),
    case("different-kept", """
        in v0:f64[2,3] v1:f64[2,3]
          v2:f64[2,3] = sub v0 v1
          v3:f64[2,3] = sub v1 v0
          v4:f64[2,3] = add v0 0.0
          v5:f64[2,3] = add v0 -0.0
          v6:f64[2,3] = fill dtype=f64 shape=(2,3) value=0.0
          v7:f64[2,3] = fill dtype=f64 shape=(2,3) value=-0.0
          v8:f32[2,3] = fill dtype=f32 shape=(2,3) value=0.0
          v9:f64[3] = sum v0 axes=(0,)
          v10:f64[2] = sum v0 axes=(1,)
        out v2 v3 v4 v5 v6 v7 v8 v9 v10
    """),
    case("nan-fills-merged", """
        in v0:f64[2]
          v1:f64[2] = fill dtype=f64 shape=(2,) value=nan
          v2:f64[2] = fill dtype=f64 shape=(2,) value=nan
          v3:f64[2] = add v1 v2
        out v3
    """, """
        in v0:f64[2]
          v1:f64[2] = fill dtype=f64 shape=(2,) value=nan
          v2:f64[2] = add v1 v1
        out v2
    """),
]


@pytest.mark.parametrize("before, after", CSE_CASES)
def test_cse(before, after):
    check_golden(passes.cse, before, after)


def test_dce():
    check_golden(passes.dce, """
        in v0:f64[3]
          v1:f64[3] = exp v0
          v2:f64[3] = log v0
          v3:f64[3] = neg v1
        out v1
    """, """
        in v0:f64[3]
          v1:f64[3] = exp v0
        out v1
    """)


@pytest.mark.parametrize("run_pass", [rewrites.simplify, passes.cse, passes.dce, passes.optimize])
def test_pass_returns_its_argument_when_nothing_changes(run_pass):
    program = parse(text("""
        in v0:f64[2,3]
          v1:f64[2,3] = exp v0
          v2:f64[3] = sum v1 axes=(0,)
        out v2
    """))
    assert run_pass(program) is program


# ---------------------------------------------------------------------------------------------
# optimize: the pipeline, its dump and verify switches

def test_optimize_runs_to_a_fixpoint():
    # simplify makes two equal transposes, cse merges them, dce drops the rest
    check_golden(passes.optimize, """
        in v0:f64[2,3]
          v1:f64[3,2] = transpose v0 perm=(1,0)
          v2:f64[2,3] = transpose v1 perm=(1,0)
          v3:f64[3,2] = transpose v2 perm=(1,0)
          v4:f64[3,2] = mul v3 1.0
          v5:f64[3,2] = sub v1 v4
        out v5
    """, """
        in v0:f64[2,3]
          v1:f64[3,2] = transpose v0 perm=(1,0)
          v2:f64[3,2] = sub v1 v1
        out v2
    """)


def test_dump_prints_the_program_around_the_named_pass(monkeypatch, capsys):
    program = parse(text("""
        in v0:f64[3]
          v1:f64[3] = mul v0 1.0
          v2:f64[3] = exp v1
        out v2
    """))
    monkeypatch.setenv("MORPHJIT_DUMP", "simplify")
    passes.optimize(program)
    err = capsys.readouterr().err
    assert "before simplify\n" + str(program) in err
    assert "after simplify\n" in err and "before cse" not in err
    monkeypatch.setenv("MORPHJIT_DUMP", "all")
    passes.optimize(program)
    err = capsys.readouterr().err
    assert all(f"{when} {name}" in err for when in ("before", "after") for name in ("cse", "dce"))


def test_verify_switch_catches_a_broken_pass(monkeypatch):
    def drop_first_binding(program):
        return program.replace(bindings=program.bindings[1:])

    program = parse(text("""
        in v0:f64[3]
          v1:f64[3] = exp v0
          v2:f64[3] = log v1
        out v2
    """))
    monkeypatch.setattr(passes, "PIPELINE", (("broken", drop_first_binding),))
    with pytest.raises(VerifyError):
        passes.optimize(program)


# ---------------------------------------------------------------------------------------------
# Meaning: end-to-end models (tests/support/models.py) and random losses (tests/support/strategies.py)

def unoptimized_joint_program(fn, *args):
    """The joint program as ``vjp`` leaves it (dead code dropped), and the flat inputs."""
    spec, leaves = checks.arg_spec(fn, args, 0)
    return passes.dce(vjp(traced.trace_loss(fn, args, spec), spec.wrt)), leaves


def assert_same_results(before: Program, after: Program, inputs):
    """The same outputs: NaN and infinities in the same places, finite values equal up to rounding.

    Not bit for bit: NumPy's matmul and sum can round differently on a view than on a contiguous
    array (BLAS or not, another summation order), and the passes turn views into fills or drop
    them. (0.0 and -0.0 compare equal, as the passes docstring allows.)
    """
    assert [v.type for v in after.outputs] == [v.type for v in before.outputs]
    for expected, actual in zip(mj.run(before, *inputs), mj.run(after, *inputs)):
        if expected.dtype.kind != "f":
            np.testing.assert_array_equal(actual, expected)
            continue
        rtol = 1e-5 if expected.dtype == np.float32 else 1e-12
        scale = max(1.0, float(np.max(np.abs(expected[np.isfinite(expected)]), initial=0.0)))
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale, equal_nan=True)


def assert_passes_keep_meaning(program: Program, inputs):
    """Every pass (and the pipeline) verifies, keeps the results and is idempotent."""
    for run_pass in (rewrites.simplify, passes.cse, passes.dce, passes.optimize):
        after = run_pass(program).verify()
        assert_same_results(program, after, inputs)
        assert run_pass(after) is after, f"{run_pass.__name__} is not idempotent on\n{program}"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", MODELS)
def test_models_keep_their_meaning(name, dtype):
    fn, args = MODELS[name](dtype)
    assert_passes_keep_meaning(*unoptimized_joint_program(fn, *args))


@pytest.mark.parametrize("name", MODELS)
def test_models_get_smaller(name):
    fn, args = MODELS[name](np.float64)
    before, _ = unoptimized_joint_program(fn, *args)
    after = passes.optimize(before)
    print(f"{name}: {len(before.bindings)} -> {len(after.bindings)} bindings")
    assert len(after.bindings) < len(before.bindings)
    assert str(mj.grad_program(fn, *args)) == str(after)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_losses())
def test_random_losses_keep_their_meaning(example):
    fn, args = example
    assert_passes_keep_meaning(*unoptimized_joint_program(fn, *args))


def test_mlp_joint_program():
    def mlp(params, x, y):
        h = mj.relu(x @ params["W1"] + params["b1"])
        return mj.mean(mj.softmax_cross_entropy(h @ params["W2"] + params["b2"], y))

    rng = np.random.default_rng(0)
    params = dict(W1=rng.normal(size=(4, 5)), b1=np.zeros(5), W2=rng.normal(size=(5, 3)), b2=np.zeros(3))
    assert str(mj.grad_program(mlp, params, rng.normal(size=(6, 4)), np.zeros(6, np.int64))) == text("""
        in v0:f64[4,5] v1:f64[5,3] v2:f64[5] v3:f64[3] v4:f64[6,4] v5:i64[6]
          v6:f64[6,5] = matmul v4 v0
          v7:f64[6,5] = add v6 v2
          v8:f64[6,5] = relu v7
          v9:f64[6,3] = matmul v8 v1
          v10:f64[6,3] = add v9 v3
          v11:f64[6] = softmax_cross_entropy v10 v5
          v12:f64[] = sum v11 axes=(0,)
          v13:f64[] = mul v12 0.16666666666666666
          v14:f64[6,3] = one_hot v5 depth=3 dtype=f64
          v15:f64[6,3] = softmax v10 axes=(1,)
          v16:f64[6,3] = sub v15 v14
          v17:f64[6,3] = mul 0.16666666666666666 v16
          v18:f64[3] = sum v17 axes=(0,)
          v19:f64[3,5] = transpose v1 perm=(1,0)
          v20:f64[6,5] = matmul v17 v19
          v21:f64[5,6] = transpose v8 perm=(1,0)
          v22:f64[5,3] = matmul v21 v17
          v23:bool[6,5] = gt v8 0.0
          v24:f64[6,5] = where v23 v20 0.0
          v25:f64[5] = sum v24 axes=(0,)
          v26:f64[4,6] = transpose v4 perm=(1,0)
          v27:f64[4,5] = matmul v26 v24
        out v13 v27 v22 v25 v18
    """)


# ---------------------------------------------------------------------------------------------
# Meaning: random IR programs full of rewrite openings (literals of both zero signs, fills, views
# of views, size-1 reductions, recomputed bindings) and inputs with NaN, infinities and zeros

SHAPES = [(), (3,), (1, 3), (2, 3), (6,), (3, 2), (2, 1), (2, 1, 3), (4, 2, 3)]
LITERALS = [0.0, -0.0, 1.0, 2.0, 0.5, -1.0, 3.0, 4.0]
F64 = np.dtype(np.float64)
UNARY = ["neg", "exp", "tanh", "square", "abs", "relu", "sqrt", "log"]
BINARY = ["add", "sub", "mul", "maximum"]
KINDS = ["unary", "binary", "scaled", "where", "view", "view", "reduce", "fill", "cast", "compare"]
LITERAL = st.sampled_from(LITERALS).map(lambda v: Lit(v, F64))


def value(draw, values):
    """An earlier value, often the latest one, so that rewrites of chains get exercised."""
    return draw(st.one_of(st.just(values[-1]), st.sampled_from(values)))


def operand(draw, values):
    return value(draw, values) if draw(st.booleans()) else draw(LITERAL)


def random_binding(draw, values):
    """One random binding over earlier values: (op, inputs, params).

    Divisors and exponents are literals: a rewrite may turn +0.0 into -0.0 (see the passes
    docstring), which dividing by it or raising it to a negative power would make visible.
    """
    floats = [v for v in values if v.dtype == F64]
    kind = draw(st.sampled_from(KINDS))  # views twice: chains of views need several in a row
    if kind == "unary":
        return draw(st.sampled_from(UNARY)), [value(draw, floats)], {}
    if kind == "binary":
        return draw(st.sampled_from(BINARY)), [operand(draw, floats), operand(draw, floats)], {}
    if kind == "scaled":
        return draw(st.sampled_from(["div", "pow"])), [value(draw, floats), draw(LITERAL)], {}
    if kind == "where":
        masks = [v for v in values if v.dtype == np.bool_]
        condition = draw(st.sampled_from(masks + [Lit(True, np.bool_), Lit(False, np.bool_)]))
        return "where", [condition, operand(draw, floats), operand(draw, floats)], {}
    x = value(draw, floats)
    if kind == "view":
        op = draw(st.sampled_from(["transpose", "reshape", "broadcast_to"]))
        if op == "transpose":
            return op, [x], dict(perm=tuple(draw(st.permutations(range(len(x.shape))))))
        same_size = [x.shape] + [s for s in SHAPES if int(np.prod(s)) == int(np.prod(x.shape))]
        shape = draw(st.sampled_from(same_size if op == "reshape" else SHAPES))
        return op, [x], dict(shape=shape)
    if kind == "reduce":
        axes = draw(st.sets(st.integers(0, max(len(x.shape) - 1, 0)), max_size=len(x.shape)))
        return draw(st.sampled_from(["sum", "max", "min"])), [x], dict(axes=tuple(sorted(axes)))
    if kind == "fill":
        return "fill", [], dict(shape=draw(st.sampled_from(SHAPES)), dtype="f64",
                                value=draw(st.sampled_from(LITERALS)))
    if kind == "cast":
        source = draw(st.sampled_from([v for v in values if v.dtype == np.bool_] + [x]))
        return "cast", [source], dict(dtype="f64")
    return "gt", [x, draw(LITERAL)], {}


@st.composite
def rewrite_prone_programs(draw):
    """A program of float64 inputs and random bindings, most of them with rewrite openings."""
    inputs = [Var(TensorType(s, F64)) for s in draw(st.lists(st.sampled_from(SHAPES), min_size=1,
                                                               max_size=3))]
    values, bindings = list(inputs), []
    for _ in range(draw(st.integers(1, 14))):
        if bindings and draw(st.booleans()):  # recompute an earlier binding, for cse
            earlier = draw(st.sampled_from(bindings))
            op, inputs_, params = earlier.op, earlier.inputs, earlier.kwargs
        else:
            op, inputs_, params = random_binding(draw, values)
        try:
            out = Var(OPS[op].infer([x.type for x in inputs_], **params))
        except MorphjitError:
            continue
        bindings.append(Binding(out, op, tuple(inputs_), params_of(params)))
        values.append(out)
    outputs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3))
    return Program(tuple(inputs), tuple(bindings), tuple(outputs)).verify()


def random_inputs(program, seed):
    """Normal values, with zeros of both signs, infinities and NaN mixed in."""
    rng = np.random.default_rng(seed)
    arrays = []
    for v in program.inputs:
        a = rng.normal(size=v.shape) * 2.0
        special = rng.random(v.shape) < 0.2
        a = np.where(special, rng.choice([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0], v.shape), a)
        arrays.append(np.asarray(a, v.dtype))
    return arrays


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rewrite_prone_programs(), st.integers(0, 2**32 - 1))
def test_rewrite_prone_programs_keep_their_meaning(program, seed):
    assert_passes_keep_meaning(program, random_inputs(program, seed))
