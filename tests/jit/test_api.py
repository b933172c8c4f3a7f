"""The API around compile_loss (issue 23, first half): has_aux, mj.compile, mj.grad and
mj.value_and_grad, static arguments, and call statistics under threads; each on both backends."""
from __future__ import annotations

import collections
import decimal
import enum
import functools
import inspect
import math
import zlib

import numpy as np
import pytest

import morphjit as mj
from morphjit.util import pytree
from support.paths import TESTS

BACKENDS = ["interp", "numba"]
HERE = __file__.rsplit("/", 1)[-1]


def line_of(fragment: str) -> int:
    """The line number of the (unique) source line of this file containing ``fragment``."""
    lines = inspect.getsource(inspect.getmodule(line_of)).splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if fragment in line and "line_of" not in line]
    assert len(hits) == 1, (fragment, hits)
    return hits[0]


def model(params, x):
    return np.tanh(x @ params["W"] + params["b"])


def loss_with_metrics(params, x, labels):
    logits = model(params, x)
    loss = np.mean(mj.softmax_cross_entropy(logits, labels))
    return loss, {"accuracy": np.mean(np.argmax(logits, axis=1) == labels), "logits": logits,
                  "terms": (np.sum(params["W"] ** 2), 2.0)}


def plain_loss(params, x, labels):
    return loss_with_metrics(params, x, labels)[0]


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    params = {"W": rng.standard_normal((4, 3)), "b": rng.standard_normal(3)}
    return params, rng.standard_normal((9, 4)), rng.integers(0, 3, 9)


def expected_aux(params, x, labels):
    """The aux values evaluated by NumPy, without morphjit."""
    logits = np.tanh(x @ params["W"] + params["b"])
    return {"accuracy": np.mean(np.argmax(logits, axis=1) == labels), "logits": logits,
            "terms": (np.sum(params["W"] ** 2), 2.0)}


def assert_trees_close(got, want, rtol=1e-12):
    got_leaves, got_tree = pytree.flatten(got)
    want_leaves, want_tree = pytree.flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        assert isinstance(g, np.ndarray | np.generic) and np.shape(g) == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-14)


# ---------------------------------------------------------------------------------------------
# has_aux


@pytest.mark.parametrize("backend", BACKENDS)
def test_has_aux_returns_the_values_of_an_uncompiled_evaluation_at_every_batch_size(problem, backend):
    params, x, labels = problem
    step = mj.compile_loss(loss_with_metrics, has_aux=True, backend=backend)
    reference = mj.compile_loss(plain_loss, backend=backend)
    out = {k: np.empty_like(v) for k, v in params.items()}
    for n in (9, 5):
        (value, aux), grads = step(params, x[:n], labels[:n])
        want_value, want_grads = reference(params, x[:n], labels[:n])
        assert value == pytest.approx(want_value, rel=1e-12)
        assert_trees_close(grads, want_grads)
        assert_trees_close(aux, expected_aux(params, x[:n], labels[:n]))
        (value_out, aux_out), written = step(params, x[:n], labels[:n], out=out)
        assert written is out and value_out == value
        assert_trees_close(out, want_grads)
        assert_trees_close(aux_out, aux)
    assert step.cache_info().misses == 1   # one step, polymorphic in the batch size
    joint = step.program(params, x, labels)
    assert len(joint.outputs) == 1 + 2 + 4   # loss, two gradients, four aux leaves: one program


@pytest.mark.parametrize("backend", BACKENDS)
def test_train_step_with_aux_returns_the_loss_and_aux_before_the_update(problem, backend):
    params, x, labels = problem
    p = {k: v.copy() for k, v in params.items()}
    step = mj.train_step(loss_with_metrics, mj.optim.sgd(0.1), has_aux=True, backend=backend)
    state = step.init(p)
    for n in (9, 6, 9):
        before = {k: v.copy() for k, v in p.items()}
        value, aux = step(p, state, x[:n], labels[:n])
        want = loss_with_metrics(before, x[:n], labels[:n])
        assert value == pytest.approx(want[0], rel=1e-12)
        assert_trees_close(aux, expected_aux(before, x[:n], labels[:n]))
        assert not np.array_equal(p["W"], before["W"])
    assert step.cache_info().misses == 1
    compiled = mj.train_step(mj.compile_loss(loss_with_metrics, has_aux=True), mj.optim.sgd(0.1), backend=backend)
    assert compiled.has_aux   # taken from the compiled loss


def test_has_aux_is_in_explain(problem):
    params, x, labels = problem
    report = mj.compile_loss(loss_with_metrics, has_aux=True).explain(params, x, labels)
    assert len(report.forward.outputs) == 1 + 4 and len(report.joint.outputs) == 1 + 2 + 4
    forward_out = next(line for line in str(report).splitlines() if line.startswith("out "))
    assert len(forward_out.split()) == 1 + 1 + 4   # the printed forward program returns aux too


def test_has_aux_refuses_a_function_that_does_not_return_a_pair(problem):
    params, x, labels = problem

    def single(params, x, labels):  # the definition line the error points at
        return plain_loss(params, x, labels)

    with pytest.raises(mj.TracingError) as info:
        mj.compile_loss(single, has_aux=True, backend="interp")(params, x, labels)
    message = str(info.value)
    assert "has_aux=True" in message and "(loss, aux)" in message and "returned a float64" not in message
    assert f"{HERE}:{line_of('def single(params, x, labels):')}" in message


@pytest.mark.parametrize("backend", BACKENDS)
def test_has_aux_refuses_aux_holding_something_other_than_arrays(problem, backend):
    params, x, labels = problem

    def named(params, x, labels):  # the definition line the error points at
        return plain_loss(params, x, labels), {"name": "accuracy", "value": np.mean(x)}

    with pytest.raises(mj.TracingError) as info:
        mj.compile_loss(named, has_aux=True, backend=backend)(params, x, labels)
    assert "aux['name']" in str(info.value) and "is a str" in str(info.value)
    assert f"{HERE}:{line_of('def named(params, x, labels):')}" in str(info.value)


# ---------------------------------------------------------------------------------------------
# mj.compile: forward only


def predict(params, x):
    z = model(params, x)
    return {"probs": mj.softmax(z, axis=1), "positive": z > 0, "total": np.sum(z), "label": np.argmax(z, axis=1)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_returns_the_uncompiled_outputs_at_every_batch_size(problem, backend):
    params, x, labels = problem
    forward = mj.compile(predict, backend=backend)
    for n in (9, 4, 9):
        got = forward(params, x[:n])
        assert_trees_close(got, predict(params, x[:n]))
        assert got["positive"].dtype == bool and got["total"].shape == () and got["label"].dtype == np.int64
    assert forward.cache_info().misses == 1 and forward.cache_info().hits == 2
    assert "vjp" not in forward.steps()[0].timings.stages   # no gradient work
    assert len(forward.program(params, x).outputs) == 4
    value = mj.compile(plain_loss, backend=backend)(params, x, labels)
    assert value == mj.compile_loss(plain_loss, backend=backend)(params, x, labels)[0]


def test_compile_of_one_argument_is_polymorphic_in_it_and_refuses_non_arrays():
    double = mj.compile(lambda x: (2 * x, x))
    for n in (3, 7):
        x = np.arange(n * 2.0).reshape(n, 2)
        twice, same = double(x)
        np.testing.assert_array_equal(twice, 2 * x)
        np.testing.assert_array_equal(same, x) and not np.shares_memory(same, x)
    assert double.cache_info().misses == 1

    def labelled(x):  # the definition line the error points at
        return {"name": "x", "x": x}

    with pytest.raises(mj.TracingError) as info:
        mj.compile(labelled, backend="interp")(np.ones(3))
    assert "output['name'] returned by labelled is a str" in str(info.value)
    assert f"{HERE}:{line_of('def labelled(x):')}" in str(info.value)


# ---------------------------------------------------------------------------------------------
# mj.grad and mj.value_and_grad


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_and_value_and_grad_agree_with_compile_loss(problem, backend):
    params, x, labels = problem
    value, grads = mj.compile_loss(plain_loss, argnums=(0, 1), backend=backend)(params, x, labels)
    got_value, got_grads = mj.value_and_grad(plain_loss, argnums=(0, 1), backend=backend)(params, x, labels)
    assert got_value == value
    assert_trees_close(got_grads, grads)
    saliency = mj.grad(plain_loss, argnums=1, backend=backend)(params, x, labels)
    np.testing.assert_allclose(saliency, grads[1], rtol=1e-12)
    assert saliency.shape == x.shape
    grads_aux, aux = mj.grad(loss_with_metrics, has_aux=True, backend=backend)(params, x, labels)
    assert_trees_close(grads_aux, grads[0])
    assert_trees_close(aux, expected_aux(params, x, labels))


def test_saliency_agrees_with_finite_differences(problem):
    params, x, labels = problem
    saliency = mj.grad(plain_loss, argnums=1)(params, x, labels)
    direction = np.random.default_rng(1).standard_normal(x.shape)
    eps = 1e-6
    numeric = (plain_loss(params, x + eps * direction, labels) - plain_loss(params, x - eps * direction, labels)) / (2 * eps)
    assert np.sum(saliency * direction) == pytest.approx(numeric, rel=1e-6)


# ---------------------------------------------------------------------------------------------
# static_argnums / static_argnames


def powered(params, x, power, mode="sum"):
    r = np.tanh(x @ params["W"]) ** power
    return np.sum(r) if mode == "sum" else np.mean(r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_static_arguments_compile_a_step_per_value_and_reuse_it(problem, backend):
    params, x, _ = problem
    loss = mj.compile_loss(powered, static_argnums=2, static_argnames="mode", backend=backend)
    for power, mode in ((2, "sum"), (3, "sum"), (2, "mean"), (2, "sum")):
        value, grads = loss(params, x, power, mode)
        assert value == pytest.approx(powered(params, x, power, mode), rel=1e-12)
        want = mj.compile_loss(lambda p, x: powered(p, x, power, mode), backend=backend)(params, x)[1]
        assert_trees_close(grads, want)
    assert loss(params, x, 2, mode="mean")[0] == loss(params, x, 2, "mean")[0]
    assert loss(params, x[:5], 3)[0] == pytest.approx(powered(params, x[:5], 3), rel=1e-12)
    stats = loss.cache_info()
    assert stats.misses == 3 and stats.hits == 4 and len(loss.steps()) == 3
    assert loss.static_argnums == (2, 3)
    forward = mj.compile(powered, static_argnums=(2, 3), backend=backend)
    assert forward(params, x, 3, "mean") == pytest.approx(powered(params, x, 3, "mean"), rel=1e-12)
    step = mj.train_step(powered, mj.optim.sgd(0.1), static_argnames=("power",), backend=backend)
    p = {k: v.copy() for k, v in params.items()}
    state = step.init(p)
    for power in (2, 3, 2):
        before = {k: v.copy() for k, v in p.items()}
        assert step(p, state, x, power) == pytest.approx(powered(before, x, power), rel=1e-12)
    assert step.cache_info().misses == 2


def test_static_arguments_refuse_unhashable_values_and_traced_positions(problem):
    params, x, _ = problem
    loss = mj.compile_loss(powered, static_argnums=2, backend="interp")
    with pytest.raises(mj.TracingError) as info:
        loss(params, x, [2])  # the call the error points at
    message = str(info.value)
    assert "power (argument 2) of powered is static" in message and "a list" in message
    assert f"{HERE}:{line_of('loss(params, x, [2])  # the call')}" in message
    with pytest.raises(TypeError, match="power .argument 2. of powered is static, so it cannot be differentiated"):
        mj.compile_loss(powered, argnums=2, static_argnums=2)
    with pytest.raises(TypeError, match="has no positional parameter 'powr'"):
        mj.compile_loss(powered, static_argnames="powr")
    with pytest.raises(TypeError, match="updated in place"):
        mj.train_step(powered, mj.optim.sgd(0.1), static_argnums=0)



class Shade(enum.IntEnum):
    DARK = 1


class Keyed:
    """Equal to every other Keyed with the same ``k``, whatever its ``note`` (its own ``==``)."""

    def __init__(self, k, note=""):
        self.k, self.note = k, note

    def __eq__(self, other):
        return isinstance(other, Keyed) and other.k == self.k

    def __hash__(self):
        return hash(self.k)


class EqualToAll:
    def __eq__(self, other):
        return True

    def __repr__(self):   # the test's id: the same in every pytest-xdist worker
        return "EqualToAll()"

    def __hash__(self):
        return 0


Pair = collections.namedtuple("Pair", "a b")


def fingerprinted(x, s):
    """A loss whose value tells apart static values that differ in any way the function can see."""
    return np.sum(x) * float(zlib.crc32(repr(s).encode()))


# Pairs that compare equal (and hash alike) but are not the same value to a function
EQUAL_BUT_DIFFERENT = [
    (0.0, -0.0), ((True,), (1,)), ((1,), (1.0,)), (1, True), (1, 1.0), (Pair(1, 2), (1, 2)),
    (((0.0, "a"),), ((-0.0, "a"),)), (frozenset({0.0}), frozenset({-0.0})), (complex(1, 0.0), complex(1, -0.0)),
    (np.float64(0.0), np.float64(-0.0)), (np.float32(1), np.float64(1)), (np.int64(1), 1), (np.float64(2), 2.0),
    (Shade.DARK, 1), (decimal.Decimal("1.0"), decimal.Decimal("1.00")), (EqualToAll(), 1),
    (frozenset({float("nan"), float("nan")}), frozenset({float("nan")})),
]


@pytest.mark.parametrize("a, b", EQUAL_BUT_DIFFERENT, ids=lambda v: repr(v))
def test_static_values_that_compare_equal_but_differ_get_steps_of_their_own(a, b):
    assert a == b or len(a) != len(b)   # what == (or a set of NaNs) says of them
    x = np.arange(1.0, 5.0)
    loss = mj.compile_loss(fingerprinted, static_argnums=1, backend="interp", cache=False)
    for s in (a, b, a, b):
        assert loss(x, s)[0] == fingerprinted(x, s), s
    assert loss.cache_info().misses == 2


def test_a_static_negative_zero_is_not_zero():
    """The example of issue 30: copysign(1, s) with s = -0.0 baked into the step after s = 0.0."""
    x = np.arange(6.0)
    scaled = lambda x, s: np.sum(x * math.copysign(1, s))   # noqa: E731
    loss = mj.compile_loss(scaled, static_argnums=1)
    forward = mj.compile(scaled, static_argnums=1)
    step = mj.train_step(scaled, mj.optim.sgd(1.0), static_argnums=1)
    w = x.copy()
    state = step.init(w)
    for s in (0.0, -0.0):
        value, grad = loss(x, s)
        assert value == scaled(x, s) == math.copysign(15.0, s) and forward(x, s) == value
        np.testing.assert_array_equal(grad, np.full(6, math.copysign(1.0, s)))
        before = w.copy()
        assert step(w, state, s) == scaled(before, s)
        np.testing.assert_array_equal(w, before - math.copysign(1.0, s))
    assert loss.cache_info().misses == forward.cache_info().misses == step.cache_info().misses == 2


@pytest.mark.parametrize("make_nan", [lambda: float("nan"), lambda: np.float64("nan"), lambda: (1, (float("nan"),)),
                                      lambda: Pair(float("nan"), "a"), lambda: complex(float("nan"), 0),
                                      lambda: decimal.Decimal("nan")], ids=["float", "float64", "nested", "namedtuple",
                                                                            "complex", "decimal"])
def test_a_nan_static_value_reuses_its_step(make_nan):
    x = np.arange(1.0, 5.0)
    loss = mj.compile_loss(fingerprinted, static_argnums=1, backend="interp", cache=False)
    for _ in range(5):
        s = make_nan()   # a new object each call, never equal to the last
        assert loss(x, s)[0] == fingerprinted(x, s)
    assert loss.cache_info().misses == 1 and loss.cache_info().hits == 4


def test_static_values_of_the_users_classes_keep_their_equality_and_their_type():
    x = np.arange(1.0, 5.0)
    loss = mj.compile_loss(lambda x, s: np.sum(x) * s.k, static_argnums=1, backend="interp", cache=False)
    assert loss(x, Keyed(2, "first"))[0] == loss(x, Keyed(2, "second"))[0] == 20.0
    assert loss.cache_info().misses == 1   # equal by their own ==
    shared = mj.compile_loss(lambda x, s: np.sum(x) * (3.0 if isinstance(s, EqualToAll) else s), static_argnums=1,
                             backend="interp", cache=False)
    assert shared(x, EqualToAll())[0] == 30.0 and shared(x, 2.0)[0] == 20.0 and shared(x, EqualToAll())[0] == 30.0
    assert shared.cache_info().misses == 2   # equal to everything, but of its own type


def test_the_exact_form_tells_apart_what_equality_confuses():
    """Also for values only hashable on newer Pythons (slices from 3.12)."""
    from morphjit.jit.static_args import exact
    assert exact(slice(0.0, 2)) != exact(slice(-0.0, 2)) and exact(slice(1, 2)) == exact(slice(1, 2))
    assert exact(range(0)) != exact(range(2, 2)) and exact(range(3)) == exact(range(0, 3, 1))
    assert exact(float("nan")) == exact(float("nan")) and exact(0.0) != exact(-0.0)


def test_dask_refuses_what_it_cannot_ship():
    pytest.importorskip("dask")
    for loss in (mj.compile_loss(loss_with_metrics, has_aux=True), mj.compile_loss(powered, static_argnums=2)):
        with pytest.raises(ValueError, match="without has_aux and static arguments"):
            mj.dask.Shipped.of(loss)


# ---------------------------------------------------------------------------------------------
# Call statistics under threads


def test_call_counts_are_exact_under_concurrent_calls(problem):
    from support.threads import run_threads
    params, x, labels = problem
    loss = mj.compile_loss(plain_loss)
    forward = mj.compile(predict)
    loss(params, x, labels), forward(params, x)
    calls = 400

    def work(i):
        for _ in range(calls):
            loss(params, x, labels)
            forward(params, x)

    run_threads(work)
    for compiled in (loss, forward):
        stats = compiled.cache_info()
        assert (stats.misses, stats.hits) == (1, 4 * calls)


def test_call_statistics_can_be_read_while_other_threads_compile():
    from support.threads import run_threads
    loss = mj.compile_loss(lambda w, x: np.sum(x * w), backend="interp", static_shapes=True)
    sizes = range(1, 121)

    def work(i):
        if i:
            for n in sizes[i - 1::3]:   # a new signature each call
                loss(np.ones(2), np.ones((n, 2)))
        else:
            for _ in range(3000):
                loss.cache_info()

    run_threads(work)
    stats = loss.cache_info()
    assert stats.misses == len(sizes) and len(stats.signatures) == len(sizes)


# ---------------------------------------------------------------------------------------------
# The disk cache

CHILD = """
import json, sys
import numpy as np
import morphjit as mj
sys.path[:0] = [{tests!r}, {tests!r} + "/jit"]
import test_api as t
rng = np.random.default_rng(0)
params, x, labels = {{"W": rng.standard_normal((4, 3)), "b": rng.standard_normal(3)}}, rng.standard_normal((9, 4)), rng.integers(0, 3, 9)
compiled = [mj.compile_loss(t.loss_with_metrics, has_aux=True), mj.compile(t.predict),
            mj.compile_loss(t.powered, static_argnums=2)]
compiled[0](params, x, labels), compiled[1](params, x), compiled[2](params, x, 3)
print(json.dumps([c.cache_info().disk_loads for c in compiled]))
"""


@pytest.mark.slow
def test_aux_forward_and_static_steps_load_from_the_disk_cache(tmp_path):
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ, MORPHJIT_CACHE_DIR=str(tmp_path))
    code = CHILD.format(tests=str(TESTS))
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    assert [json.loads(r.stdout.splitlines()[-1]) for r in runs] == [[0, 0, 0], [1, 1, 1]]


def test_a_partial_and_a_callable_object_compile_under_the_name_of_what_they_call():
    def scaled(w, x, scale):
        return mj.sum((x @ w) ** 2) * scale

    class Model:
        def __call__(self, w, x):
            return mj.sum(mj.tanh(x @ w))

    w, x = np.linspace(-1.0, 1.0, 3), np.linspace(0.0, 1.0, 12).reshape(4, 3)
    partial = mj.compile_loss(functools.partial(scaled, scale=2.0), backend="interp")
    value, grad = partial(w, x)
    np.testing.assert_allclose(value, 2 * np.sum((x @ w) ** 2))
    np.testing.assert_allclose(grad, 4 * x.T @ (x @ w))
    assert "'scaled'" in repr(partial)
    model = mj.compile_loss(Model(), backend="interp")
    np.testing.assert_allclose(model(w, x)[1], x.T @ (1 - np.tanh(x @ w) ** 2))
    assert "'Model'" in repr(model)
