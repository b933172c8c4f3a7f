"""The ``@mj.compile_loss`` decorator (interp backend): call forms, argnums, pytrees, dtypes,
the signature cache, the joint program's economy, and errors that name the argument or the line.
"""
from __future__ import annotations

import collections
import inspect
import re

import numpy as np
import pytest

import morphjit as mj

from support.gradcheck import assert_same_structure, check_loss_grads_fd, flat_leaves, unflatten_like

BACKEND = "interp"
HERE = __file__.rsplit("/", 1)[-1]


def _line_of(fragment: str) -> int:
    """The line number of the (unique) source line of this file containing ``fragment``."""
    lines = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if fragment in line and "_line_of" not in line]
    assert len(hits) == 1, (fragment, hits)
    return hits[0]


def _quadratic(params, x):
    return mj.sum((x @ params["W"] + params["b"]) ** 2)


def _quadratic_grads(params, x):
    r = x @ params["W"] + params["b"]
    return {"W": 2 * x.T @ r, "b": 2 * r.sum(0)}


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    return {"W": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}, rng.standard_normal((4, 3))


# ---------------------------------------------------------------------------------------------
# Call forms and results

def test_three_usage_forms_agree(problem, tmp_path, monkeypatch):
    params, x = problem
    monkeypatch.setenv("MORPHJIT_CACHE_DIR", str(tmp_path))  # the bare form uses the default backend

    @mj.compile_loss
    def bare(params, x):
        return _quadratic(params, x)

    @mj.compile_loss(argnums=0, backend=BACKEND)
    def configured(params, x):
        return _quadratic(params, x)

    called = mj.compile_loss(_quadratic, argnums=0, backend=BACKEND)
    expected = _quadratic_grads(params, x)
    for step in (bare, configured, called):
        assert isinstance(step, mj.CompiledLoss)
        value, grads = step(params, x)
        np.testing.assert_allclose(value, _quadratic(params, x), rtol=1e-14)
        assert_same_structure(grads, params)
        for k in params:
            np.testing.assert_allclose(grads[k], expected[k], rtol=1e-13)
    assert bare.__name__ == "bare" and called.__name__ == "_quadratic"
    assert bare.backend == inspect.signature(mj.compile_loss).parameters["backend"].default
    assert configured.backend == called.backend == BACKEND


def test_value_is_a_numpy_scalar_of_the_loss_dtype(problem):
    params, x = problem
    step = mj.compile_loss(_quadratic, backend=BACKEND)
    value, _ = step(params, x)
    assert type(value) is np.float64
    p32 = {k: v.astype(np.float32) for k, v in params.items()}
    value, grads = step(p32, x.astype(np.float32))
    assert type(value) is np.float32
    assert all(g.dtype == np.float32 for g in grads.values())
    # A float64 loss of float32 parameters: float64 value, float32 gradients.
    value, grads = mj.compile_loss(lambda p: mj.sum(mj.astype(p, np.float64) ** 2), backend=BACKEND)(
        np.ones(3, np.float32))
    assert type(value) is np.float64 and grads.dtype == np.float32
    np.testing.assert_array_equal(grads, np.full(3, 2.0, np.float32))


def test_argnums_int_and_tuple():
    rng = np.random.default_rng(1)
    a, b, c = rng.standard_normal(3), rng.standard_normal(3), rng.standard_normal(3)

    def f(a, b, c):
        return mj.sum(a * b * c)

    _, g = mj.compile_loss(f, argnums=1, backend=BACKEND)(a, b, c)
    assert isinstance(g, np.ndarray)
    np.testing.assert_allclose(g, a * c)
    _, g = mj.compile_loss(f, argnums=-1, backend=BACKEND)(a, b, c)
    np.testing.assert_allclose(g, a * b)
    _, g = mj.compile_loss(f, argnums=(2, 0), backend=BACKEND)(a, b, c)
    assert isinstance(g, tuple) and len(g) == 2
    np.testing.assert_allclose(g[0], a * b)
    np.testing.assert_allclose(g[1], b * c)
    _, g = mj.compile_loss(f, argnums=(1,), backend=BACKEND)(a, b, c)
    assert isinstance(g, tuple) and len(g) == 1
    np.testing.assert_allclose(g[0], a * c)


Dense = collections.namedtuple("Dense", ["W", "b"])


def test_pytrees_are_mirrored_by_grads():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3))
    params = {
        "layers": [Dense(rng.standard_normal((3, 3)), rng.standard_normal(3)),
                   Dense(rng.standard_normal((3, 2)), np.array(0.5))],
        "scale": (np.array(1.5), {"z": rng.standard_normal(2)}),
        "a_first": rng.standard_normal(2),  # sorts before "layers": flat order is by key
    }

    def loss(params, x):
        h = x
        for layer in params["layers"]:
            h = mj.tanh(h @ layer.W + layer.b)
        s, rest = params["scale"]
        return mj.sum(h * s * rest["z"] + params["a_first"])

    value, grads = mj.compile_loss(loss, backend=BACKEND)(params, x)
    assert_same_structure(grads, params)
    assert type(grads["layers"][0]) is Dense and type(grads["scale"]) is tuple
    assert type(grads["layers"]) is list and type(grads["scale"][1]) is dict
    assert grads["layers"][1].b.shape == ()
    # The leaves line up with the right parameters: compare each against a finite difference.
    leaves = flat_leaves(params)
    for i, (leaf, g) in enumerate(zip(leaves, flat_leaves(grads))):
        assert g.shape == leaf.shape
        e = np.zeros_like(leaf)
        e.flat[0] = 1e-6
        plus = unflatten_like(params, [l + e if j == i else l for j, l in enumerate(leaves)])
        minus = unflatten_like(params, [l - e if j == i else l for j, l in enumerate(leaves)])
        fd = (loss(plus, x) - loss(minus, x)) / 2e-6
        np.testing.assert_allclose(g.flat[0], fd, rtol=1e-6, atol=1e-9)


def test_zero_dimensional_parameters():
    step = mj.compile_loss(lambda p, x: mj.sum((p["a"] * x + p["c"]) ** 2), backend=BACKEND)
    x = np.array([1.0, 2.0, 3.0])
    p = {"a": np.array(2.0), "c": np.array(-1.0)}
    value, g = step(p, x)
    r = 2.0 * x - 1.0
    assert g["a"].shape == () and g["c"].shape == () and isinstance(g["a"], np.ndarray)
    np.testing.assert_allclose(value, np.sum(r ** 2))
    np.testing.assert_allclose(g["a"], np.sum(2 * r * x))
    np.testing.assert_allclose(g["c"], np.sum(2 * r))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_unused_parameters_get_zero_gradients(dtype):
    p = {"used": np.ones(3, dtype), "unused": np.ones((2, 5), dtype), "scalar": np.array(1.0, dtype)}
    _, g = mj.compile_loss(lambda p: mj.sum(p["used"] * 3.0), backend=BACKEND)(p)
    assert_same_structure(g, p)
    np.testing.assert_array_equal(g["unused"], np.zeros((2, 5), dtype))
    np.testing.assert_array_equal(g["scalar"], np.zeros((), dtype))
    np.testing.assert_array_equal(g["used"], np.full(3, 3.0, dtype))
    # A parameter used only through non-differentiable ops (a mask) has a zero gradient too.
    _, g = mj.compile_loss(lambda p: mj.sum(mj.where(p["unused"] > 0, 1.0, 0.0)) + mj.sum(p["used"]),
                           backend=BACKEND)(p)
    np.testing.assert_array_equal(g["unused"], np.zeros((2, 5), dtype))


def test_inputs_are_not_modified_and_grads_do_not_alias_them(problem):
    params, x = problem
    saved = {k: v.copy() for k, v in params.items()}, x.copy()
    flags = [a.flags.writeable for a in (*params.values(), x)]

    def loss(p, x):  # grads["b"] is x's column sums; grads["W"] would be x itself for a linear loss
        return mj.sum(p["W"] * x[:3, :2]) + mj.sum(p["b"])

    step = mj.compile_loss(loss, backend=BACKEND)
    _, g = step(params, x)
    for k in params:
        np.testing.assert_array_equal(params[k], saved[0][k])
    np.testing.assert_array_equal(x, saved[1])
    assert [a.flags.writeable for a in (*params.values(), x)] == flags
    for grad in g.values():
        for a in (*params.values(), x):
            assert not np.shares_memory(grad, a)
    g["W"][...] = 0.0  # writing to a gradient changes nothing the caller owns
    np.testing.assert_array_equal(x, saved[1])
    _, g2 = step(params, x)
    np.testing.assert_array_equal(g2["W"], x[:3, :2])


# ---------------------------------------------------------------------------------------------
# The signature cache

def test_cache_hits_do_not_trace_again(problem):
    params, x = problem
    traces = []

    @mj.compile_loss(backend=BACKEND)
    def loss(params, x):
        traces.append(1)  # twice per compile: the second trace checks the first (frozen.py)
        return _quadratic(params, x)

    v1, _ = loss(params, x)
    info = loss.cache_info()
    assert (info.hits, info.misses, len(traces) / 2) == (0, 1, 1)
    v2, g2 = loss({k: v * 2 for k, v in params.items()}, x + 1)   # same signature, new values
    info = loss.cache_info()
    assert (info.hits, info.misses, len(traces) / 2) == (1, 1, 1)
    np.testing.assert_allclose(v2, _quadratic({k: v * 2 for k, v in params.items()}, x + 1))
    assert v1 != v2

    loss(params, x[:2])                                            # another batch size: same step
    assert (loss.cache_info().misses, len(traces) / 2) == (1, 1)
    loss({"W": params["W"][:2], "b": params["b"]}, x[:, :2])       # new feature shape
    assert (loss.cache_info().misses, len(traces) / 2) == (2, 2)
    loss({k: v.astype(np.float32) for k, v in params.items()}, x.astype(np.float32))  # new dtype
    assert (loss.cache_info().misses, len(traces) / 2) == (3, 3)
    loss(params, x.astype(np.float32))                             # one leaf's dtype differs
    assert (loss.cache_info().misses, len(traces) / 2) == (4, 4)
    loss(params, x)                                                # back to the first signature
    info = loss.cache_info()
    assert (info.hits, info.misses, len(traces) / 2) == (3, 4, 4)
    assert len(info.signatures) == 4 and len(set(info.signatures)) == 4


def test_cache_distinguishes_tree_structure():
    traces = []

    @mj.compile_loss(backend=BACKEND)
    def loss(params):
        traces.append(1)  # twice per compile: the second trace checks the first (frozen.py)
        return sum(mj.sum(v) for v in flat_leaves(params))

    loss({"a": np.ones(2), "b": np.ones(2)})
    loss({"a": np.ones(2), "c": np.ones(2)})   # same leaves, other keys
    loss([np.ones(2), np.ones(2)])             # same leaves, a list
    _, g = loss([np.ones(2), np.ones(2)])
    assert isinstance(g, list)
    assert (loss.cache_info().hits, loss.cache_info().misses, len(traces) / 2) == (1, 3, 3)


# ---------------------------------------------------------------------------------------------
# The joint program computes only what the outputs need

def _dead_bindings(program):
    live = {id(v) for v in program.outputs}
    dead = []
    for b in reversed(program.bindings):
        if id(b.out) in live:
            live.update(id(x) for x in b.inputs)
        else:
            dead.append(b.op)
    return dead


def test_joint_program_has_no_unneeded_values():
    w, x = np.ones(3), np.linspace(-1, 1, 3)

    def loss(w, x):
        forward_only = mj.exp(w) * mj.log1p(x * x)   # computed, never used: a dead branch
        data_only = mj.sum(mj.sin(x))                 # in the loss, but no gradient flows into it
        return mj.sum(w * x) + data_only

    joint = mj.grad_program(loss, w, x)
    text = str(joint)
    assert _dead_bindings(joint) == [], text
    ops = [b.op for b in joint.bindings]
    assert "exp" not in ops and "log1p" not in ops, text      # the dead branch is gone
    assert "cos" not in ops, text                              # no gradient for the data argument
    assert ops.count("sin") == 1, text
    assert len(joint.outputs) == 2

    # Only the requested argument is differentiated: nothing computes the cotangent of w
    # (it would read x), and exp(w) is computed once, for the loss and x's gradient.
    joint_x = mj.grad_program(lambda w, x: mj.sum(mj.exp(w) * x), w, x, argnums=1)
    x_var = joint_x.inputs[1]
    assert sum(any(v is x_var for v in b.inputs) for b in joint_x.bindings) == 1, str(joint_x)
    assert [b.op for b in joint_x.bindings].count("exp") == 1, str(joint_x)
    assert _dead_bindings(joint_x) == [], str(joint_x)


def test_where_branch_gradients_do_not_flow_into_data():
    w, mask = np.ones(4), np.array([True, False, True, False])
    joint = mj.grad_program(lambda w, m, x: mj.sum(mj.where(m, w * 2.0, mj.tanh(x))), w, mask, np.ones(4))
    ops = [b.op for b in joint.bindings]
    assert ops.count("tanh") == 1 and _dead_bindings(joint) == [], str(joint)
    assert ops.count("where") == 2, str(joint)  # the forward one and the cotangent of w's branch


def test_loss_seed_is_a_literal():
    from morphjit.transforms import vjp

    w = np.linspace(0.5, 2.0, 4)
    step = mj.compile_loss(lambda w: 3.0 * mj.sum(w * w), backend=BACKEND)
    forward = mj.trace(step.fn, w)
    for joint in (vjp(forward, [0]), step.program(w)):  # as emitted by reverse mode, and as run
        text = str(joint)
        assert not joint.consts and "const" not in text, text
        (loss, *_) = joint.outputs
        # Nothing reads the loss: no `add(loss, zero)` or similar keeps it alive.
        assert all(loss is not x for b in joint.bindings for x in b.inputs), text
        # No zero array is made to be added to anything.
        assert not [b for b in joint.bindings if b.op == "fill" and b.kwargs["value"] == 0.0], text
    np.testing.assert_allclose(step(w)[1], 6.0 * w)


# ---------------------------------------------------------------------------------------------
# Errors name the argument path or the user's line

def _message(excinfo) -> str:
    return str(excinfo.value)


def test_error_non_scalar_loss():
    def loss(params, x):
        return params["W"] * x  # not reduced: LINE-NON-SCALAR

    with pytest.raises(mj.ShapeError) as e:
        mj.compile_loss(loss, backend=BACKEND)({"W": np.ones(3)}, np.ones(3))
    msg = _message(e)
    assert "scalar" in msg and "f64[3]" in msg, msg
    assert f"{HERE}:{_line_of('LINE-NON-SCALAR')}" in msg, msg


def test_error_non_float_loss():
    with pytest.raises(mj.DtypeError, match="float loss"):
        mj.compile_loss(lambda w, n: mj.sum(n) + mj.sum(w > 0), argnums=0, backend=BACKEND)(
            np.ones(2), np.ones(2, np.int64))


@pytest.mark.parametrize("leaf,dtype_text", [(np.array([1, 2], np.int64), "int64"),
                                             (np.array([True, False]), "bool"),
                                             (np.array(3, np.int32), "int32")])
def test_error_integer_or_bool_differentiated_leaf(leaf, dtype_text):
    params = {"W1": leaf, "b1": np.ones(2)}
    with pytest.raises(mj.DtypeError) as e:
        mj.compile_loss(lambda params: mj.sum(params["b1"]), backend=BACKEND)(params)
    msg = _message(e)
    assert "params['W1']" in msg and dtype_text in msg, msg


def test_error_path_in_nested_and_namedtuple_trees():
    layers = [Dense(np.ones((2, 2)), np.ones(2)), Dense(np.ones((2, 2)), np.arange(2))]
    with pytest.raises(mj.DtypeError) as e:
        mj.compile_loss(lambda layers, x: mj.sum(x), backend=BACKEND)(layers, np.ones(2))
    assert "layers[1].b" in _message(e), _message(e)
    with pytest.raises(mj.DtypeError) as e:
        mj.compile_loss(lambda p, x: mj.sum(x), argnums=(0, 1), backend=BACKEND)(np.ones(2), 3)
    assert re.search(r"\bx\b", _message(e)) and "int" in _message(e), _message(e)


@pytest.mark.parametrize("argnums", [2, -3, (0, 5), "0", 1.0, (0, 1.0), True])
def test_error_argnums_that_do_not_fit(argnums):
    with pytest.raises(mj.MorphjitError) as e:
        mj.compile_loss(lambda a, b: mj.sum(a * b), argnums=argnums, backend=BACKEND)(np.ones(2), np.ones(2))
    msg = _message(e)
    assert "argnums" in msg and "2 positional arguments" in msg, msg


def test_error_python_control_flow_on_a_traced_array_of_many_elements():
    def loss(w):
        if w > 0:  # LINE-IF
            return mj.sum(w)
        return -mj.sum(w)

    with pytest.raises(mj.ShapeError) as e:
        mj.compile_loss(loss, backend=BACKEND)(np.ones(2))
    msg = _message(e)
    assert "ambiguous" in msg and "a.any()" in msg, msg
    assert f"{HERE}:{_line_of('LINE-IF')}" in msg and "if w > 0" in msg, msg


def test_error_float_of_a_traced_value():
    with pytest.raises(mj.TracingError) as e:
        mj.compile_loss(lambda w: mj.sum(w) * float(w[0]), backend=BACKEND)(np.ones(2))  # LINE-FLOAT
    assert f"{HERE}:{_line_of('LINE-FLOAT')}" in _message(e), _message(e)


def test_error_traced_value_escaping():
    leaked = []

    def loss(w, x):
        if not leaked:
            leaked.append(w * 2.0)  # LINE-ESCAPE
        return mj.sum(leaked[0] * x)

    step = mj.compile_loss(loss, backend=BACKEND, static_shapes=True)
    with pytest.raises(mj.TracingError) as e:
        step(np.ones(2), np.ones(2))
    msg = _message(e)
    assert "leaves a traced value in the closure variable leaked[0]" in msg, msg
    assert f"{HERE}:{_line_of('LINE-ESCAPE')}" in msg, msg


def test_error_traced_value_used_after_the_call():
    leaked = []

    def loss(w):
        leaked.append(w)
        return mj.sum(w)

    with pytest.raises(mj.TracingError, match="leaves a traced value in the closure variable leaked"):
        mj.compile_loss(loss, backend=BACKEND)(np.ones(2))
    with pytest.raises(mj.TracingError, match="escaped") as e:
        mj.exp(leaked[0])  # LINE-LATE
    assert f"{HERE}:{_line_of('LINE-LATE')}" in _message(e), _message(e)


def test_keyword_arguments_bind_to_parameters():
    def loss(w, x, scale=2.0):
        return mj.sum((x @ w) ** 2) * scale

    step = mj.compile_loss(loss, backend="interp")
    w, x = np.ones(3), np.arange(6.0).reshape(2, 3)
    positional = step(w, x, 2.0)
    assert step(w, x=x)[0] == positional[0]
    assert step(x=x, w=w, scale=2.0)[0] == positional[0]
    with pytest.raises(TypeError, match="loss: .*unexpected keyword argument 'y'"):
        step(w, x, y=1.0)


# ---------------------------------------------------------------------------------------------
# None in the arguments: part of their structure (lifelines' ``loss(params, (durations, None))``)


def _weibull_nll(params, data):
    durations, weights = data
    log_lambda, log_rho = params["scale"], params["shape"]
    z = (durations / np.exp(log_lambda)) ** np.exp(log_rho)
    terms = z - (log_rho - log_lambda + (np.exp(log_rho) - 1) * (np.log(durations) - log_lambda))
    return np.sum(terms) if weights is None else np.sum(terms * weights)


@pytest.mark.parametrize("backend", ["interp", "numba"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_none_in_a_data_argument_is_passed_through(backend, dtype):
    rng = np.random.default_rng(3)
    params = {"scale": np.array(0.3, dtype), "shape": np.array(-0.2, dtype), "unused": None}
    durations, weights = rng.uniform(0.5, 2.0, 8).astype(dtype), rng.uniform(0.5, 1.5, 8).astype(dtype)
    step = mj.compile_loss(_weibull_nll, backend=backend)
    value, grads = step(params, (durations, None))
    assert grads["unused"] is None
    np.testing.assert_allclose(value, _weibull_nll(params, (durations, None)), rtol=1e-5 if dtype == np.float32 else 1e-12)
    keys = ["scale", "shape"]
    check_loss_grads_fd(lambda xs: _weibull_nll(dict(zip(keys, xs)), (durations.astype(np.float64), None)),
                        [params[k].astype(np.float64) for k in keys], [grads[k].astype(np.float64) for k in keys],
                        rng=rng, rtol=1e-3 if dtype == np.float32 else 1e-6)
    weighted, _ = step(params, (durations, weights))
    np.testing.assert_allclose(weighted, _weibull_nll(params, (durations, weights)), rtol=1e-5 if dtype == np.float32 else 1e-12)
    step(params, (durations[:5] * 2, None))
    info = step.cache_info()
    assert info.misses == 2 and info.hits == 1, info   # None and an array are two signatures; the batch size is not


# ---------------------------------------------------------------------------------------------
# A flat list of Python ints in the arguments: one int64 array input


def test_a_list_of_ints_is_one_integer_input_read_as_python_ints():
    seen = []

    def fn(p, k):
        seen.append(type(k))
        return np.sum(p[k] * k[0]) + np.sum(p[k[1:]])

    p = np.arange(1.0, 5.0, dtype=np.float32)
    step = mj.compile_loss(fn)
    for k in ([3, 1, 2], [0, 0, 3], [1, 2, 3]):
        value, grad = step(p, k)
        np.testing.assert_allclose(value, fn(p, k), rtol=1e-6)
        assert value.dtype == fn(p, k).dtype == np.float32      # k[0] promotes as a Python int
    info = step.cache_info()
    assert info.misses == 1 and info.hits == 2 and info.signatures == ("f32[4] i64[3]",), info
    assert issubclass(seen[0], list)    # the function still gets a list
    step(p, [1, True, 2])               # not ints only: its numbers traced one by one, another step
    step(p, [1, 2])                     # another length, another step
    assert step.cache_info().misses == 3
