"""Random well-typed programs (tests/support/strategies.py): values and gradients against oracles.

The forward value of the compiled loss is checked against the same function run eagerly on NumPy
arrays (``mj.*`` computes eagerly), against a plain-NumPy rendering of the program and against
autograd; the gradients against central finite differences in a random direction and against
autograd.
"""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis.errors import NoSuchExample

import morphjit as mj

from support.gradcheck import (AG, NP, assert_same_structure, check_against_autograd, check_loss_grads_fd,
                       flat_leaves, unflatten_like)
from support.strategies import random_programs

BACKEND = "interp"
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _flat_loss(fn, params, data, ns=None):
    """The loss as a function of the flat list of parameter leaves."""
    f = fn if ns is None else fn.generic(ns)
    return lambda leaves: f(unflatten_like(params, leaves), data)


def _compile_and_run(fn, args):
    params, data = args
    before = [np.copy(x) for x in flat_leaves(args)]
    step = mj.compile_loss(fn, backend=BACKEND)
    value, grads = step(*args)
    for x, b in zip(flat_leaves(args), before):
        np.testing.assert_array_equal(x, b, err_msg="the compiled loss modified its inputs")
    assert_same_structure(grads, params)
    return value, grads


@SETTINGS
@given(random_programs(allow_cast=False))
def test_random_program_gradients_f64(example):
    fn, args = example
    params, data = args
    value, grads = _compile_and_run(fn, args)
    leaves, grad_leaves = flat_leaves(params), flat_leaves(grads)

    assert type(value) is np.float64
    np.testing.assert_allclose(value, fn(*args), rtol=1e-12, atol=1e-12, err_msg=fn.source)
    np.testing.assert_allclose(value, fn.generic(NP)(*args), rtol=1e-10, atol=1e-10, err_msg=fn.source)

    rng = np.random.default_rng(len(fn.source))
    check_loss_grads_fd(_flat_loss(fn, params, data, NP), leaves, grad_leaves, rng=rng, eps=1e-6,
                        rtol=1e-6, retries=2, what=fn.source)
    scale = 1.0 + max((float(np.max(np.abs(g))) for g in grad_leaves if g.size), default=0.0)
    check_against_autograd(_flat_loss(fn, params, data, AG), leaves, value, grad_leaves,
                           rtol=1e-7, atol=1e-9 * scale, what=fn.source)


@SETTINGS
@given(random_programs(allow_cast=True))
def test_random_program_with_casts_against_autograd(example):
    fn, args = example
    params, data = args
    value, grads = _compile_and_run(fn, args)
    np.testing.assert_allclose(value, fn(*args), rtol=1e-12, atol=1e-12, err_msg=fn.source)
    grad_leaves = flat_leaves(grads)
    scale = 1.0 + max((float(np.max(np.abs(g))) for g in grad_leaves if g.size), default=0.0)
    # Casts round to float32 on the way: autograd (which does not) agrees to float32 precision.
    check_against_autograd(_flat_loss(fn, params, data, AG), flat_leaves(params), value, grad_leaves,
                           rtol=1e-4, atol=1e-5 * scale, what=fn.source)


@SETTINGS
@given(random_programs(dtype=np.float32))
def test_random_program_f32_matches_f64(example):
    """The float32 program computes in float32 and agrees with the same program in float64."""
    fn, args = example
    params, data = args
    value, grads = _compile_and_run(fn, args)
    assert type(value) is np.float32
    for g in flat_leaves(grads):
        assert g.dtype == np.float32
    as64 = lambda tree: unflatten_like(tree, [x.astype(np.float64) if x.dtype == np.float32 else x  # noqa: E731
                                              for x in flat_leaves(tree)])
    value64, grads64 = mj.compile_loss(fn, backend=BACKEND)(as64(params), as64(data))
    scale = 1.0 + abs(value64)
    np.testing.assert_allclose(value, value64, rtol=1e-3, atol=1e-3 * scale, err_msg=fn.source)
    for g, g64 in zip(flat_leaves(grads), flat_leaves(grads64)):
        gscale = 1.0 + float(np.max(np.abs(g64), initial=0.0))
        np.testing.assert_allclose(g, g64, rtol=1e-3, atol=1e-3 * gscale, err_msg=fn.source)


@SETTINGS
@given(random_programs())
def test_random_program_traces_to_a_valid_joint_program(example):
    fn, args = example
    params, _ = args
    forward = mj.trace(fn, *args).verify()
    assert len(forward.inputs) == len(flat_leaves(args))
    assert [v.type.shape for v in forward.inputs] == [np.shape(x) for x in flat_leaves(args)]
    (loss,) = forward.outputs
    assert loss.shape == ()
    joint = mj.grad_program(fn, *args).verify()
    assert len(joint.outputs) == 1 + len(flat_leaves(params))
    for v, p in zip(joint.outputs[1:], flat_leaves(params)):
        assert v.shape == p.shape and v.dtype == p.dtype
    # The joint program holds no dead binding: every value feeds an output.
    used = {id(v) for v in joint.outputs}
    for b in reversed(joint.bindings):
        assert id(b.out) in used, f"dead binding {b.op} in\n{joint}"
        used.update(id(x) for x in b.inputs)
    # Its text form reads back to the same text.
    assert str(mj.parse(str(joint))) == str(joint)


def _ops_of(example) -> set[str]:
    fn, args = example
    return {b.op for b in mj.trace(fn, *args).bindings}


def test_strategy_reaches_every_op_family():
    """The strategy produces every differentiable primitive (so the properties above cover them).

    Which programs a derandomized run draws depends on the process (hypothesis mixes in constants
    of the modules loaded so far), so an op the first 1,500 programs miss is searched for alone.
    """
    from morphjit.ir import LINALG, OPS
    seen: set[str] = set()
    quick = settings(deadline=None, database=None, derandomize=True, phases=[Phase.generate],
                     suppress_health_check=list(HealthCheck))

    @settings(quick, max_examples=1500)
    @given(random_programs())
    def collect(example):
        seen.update(_ops_of(example))

    collect()
    # unslice, scatter_add and unwindow, the transposes of slicing, gathering and windowing, occur
    # in gradients only;
    # linear algebra needs well-conditioned matrices: test_linalg, test_grad and test_ops cover it;
    # check_parameter checks a traced parameter of a draw: test_random, test_grad and test_ops;
    # scatter and update_slice are in-place writes, which autograd (the oracle here) cannot run:
    # test_write_programs draws them, against NumPy; branch_gate gates the inputs of a path through
    # tests of traced values: test_branches draws programs with tests, against NumPy; identity is
    # the point a derivative inside a traced function is taken at: test_nested.
    from morphjit.api.custom import is_user_op
    linalg = {name for name, op in OPS.items() if op.kind == LINALG}
    wanted = ({name for name, op in OPS.items() if op.vjp is not None and not is_user_op(name)}
              - {"unslice", "scatter_add", "unwindow", "stop_gradient", "check_parameter", "scatter", "update_slice",
                 "branch_gate", "identity"}
              - linalg)
    missing = set()
    for op in sorted(wanted - seen):
        try:
            find(random_programs(), lambda example: op in _ops_of(example), settings=settings(quick, max_examples=6000))
        except NoSuchExample:
            missing.add(op)
    assert not missing, f"random programs never use {sorted(missing)}"
