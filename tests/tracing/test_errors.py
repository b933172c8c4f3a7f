"""Errors at trace time point at the user's file and line, and say what went wrong.

Each offending statement below carries the marker comment ``# <- error``; the raised error's
``loc`` must be this file at that line, and its message must name the op, shapes or function.
Also: tracing and running never modify what the user passes in.
"""
from __future__ import annotations

import copy
import inspect
import os

import numpy as np
import pytest

import morphjit as mj
from morphjit.util import pytree

from support.checks import trace_checked, trace_run

HERE = os.path.abspath(__file__)
MARKER = "# <- error"

X = np.arange(12.0, dtype=np.float32).reshape(4, 3)
W = np.ones((4, 5), np.float32)
T3 = np.ones((2, 3, 4))
T3B = np.ones((5, 4, 2))
LABELS = np.array([0, 2, 1], np.int64)


def marked_line(fn, marker: str = MARKER) -> int:
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, line in enumerate(lines) if marker in line]
    assert len(hits) == 1, f"{fn.__name__} must mark exactly one line"
    return hits[0]


def assert_located(error, line: int):
    assert error.loc is not None, f"{type(error).__name__} without a location: {error}"
    assert os.path.abspath(error.loc.filename) == HERE
    assert error.loc.lineno == line, f"error located at line {error.loc.lineno}, expected {line}"
    assert f"{os.path.basename(HERE)}:{line}" in str(error)


# ---------------------------------------------------------------------------------------------
# Offending functions (one marked statement each)

def broadcast_add(x):
    y = x[:, :2]
    return x + y  # <- error


def broadcast_maximum(x):
    return np.maximum(x, x.T)  # <- error


def broadcast_where(x):
    return np.where(x > 0, x, np.ones(2, np.float32))  # <- error


def matmul_mismatch(x, w):
    h = x @ w  # <- error
    return h


def np_matmul_mismatch(x, w):
    return np.matmul(x, w)  # <- error


def dot_vector_mismatch(x):
    return np.dot(x, x[:, 0])  # <- error


def batched_matmul_mismatch(t, u):
    return t @ u  # <- error


def sum_axis(x):
    return np.sum(x, axis=2)  # <- error


def max_negative_axis(x):
    return x.max(axis=-3)  # <- error


def softmax_axis(x):
    return mj.softmax(x, axis=5)  # <- error


def concatenate_axis(x):
    return np.concatenate([x, x], axis=2)  # <- error


def expand_dims_axis(x):
    return np.expand_dims(x, 4)  # <- error


def repeated_axis(x):
    return mj.logsumexp(x, axis=(0, -2))  # <- error


def branch_shapes(x):
    if x.sum() > 0:  # <- error
        return x
    return x.sum()


def while_on_traced(x):
    while x.max() > 1:  # <- error
        x = x / 2
    return x


def and_operator(x):
    return (x > 0) and (x < 5)  # <- error


def float_call(x):
    return x * float(x.sum())  # <- error


def asarray_call(x):
    return np.asarray(x).tolist()  # <- error


def fft(x):
    return np.fft.fft(x)  # <- error


def sort(x):
    return np.sort(x, axis=0)  # <- error


def unique(x):
    return np.unique(x)  # <- error


def fft_rfft(x):
    return np.fft.rfft(x)  # <- error


def frexp_ufunc(x):
    return np.frexp(x)  # <- error


def ufunc_reduce(x):
    return np.add.reduce(x)  # <- error


def ufunc_out(x):
    return np.exp(x, out=X.copy())  # <- error


def index_array_out_of_range(x):
    return x[np.array([0, 7])]  # <- error


def index_list_out_of_range(x):
    return x[:, [0, -4]]  # <- error


def index_with_floats(x):
    return x[np.array([0.0, 2.0])]  # <- error


def index_with_float_tracer(x):
    return x[x[:, 0]]  # <- error


def index_with_mask(x):
    return x[x > 0]  # <- error


def index_out_of_range(x):
    return x[4]  # <- error


def too_many_indices(x):
    return x[0, 0, 0]  # <- error


def item_assignment(x):
    x[0] = 1.0  # <- error
    return x


def string_operand(x):
    return x + "1"  # <- error


def none_operand(x):
    return mj.exp(None) * x  # <- error


def bad_reshape(x):
    return x.reshape(5, -1)  # <- error


def bad_broadcast_to(x):
    return np.broadcast_to(x, (3, 3))  # <- error


def bad_transpose(x):
    return np.transpose(x, (0, 0))  # <- error


def bad_squeeze(x):
    return np.squeeze(x, 0)  # <- error


def sce_label_shape(x, labels):
    return mj.softmax_cross_entropy(x, labels)  # <- error


def one_hot_float_labels(x):
    return mj.one_hot(x, 3)  # <- error


def unsupported_captured_dtype(x):
    return x * np.ones(3, np.float16)  # <- error


def integer_power(x, labels):
    return x + labels ** 2  # <- error


def bitwise_on_floats(x):
    return x & x  # <- error


def shape_from_an_argument(x, n):
    return x * np.ones(n + 1)  # <- error


def slice_to_an_argument(x, n):
    return x[:n]  # <- error


def shape_from_an_entry(x, config):
    return x * np.zeros(config["width"])  # <- error


ERRORS = [
    # (function, arguments, error type, words the message must contain)
    (broadcast_add, (X,), mj.ShapeError, ["add", "(4, 3)", "(4, 2)", "broadcast"]),
    (broadcast_maximum, (X,), mj.ShapeError, ["maximum", "(4, 3)", "(3, 4)"]),
    (broadcast_where, (X,), mj.ShapeError, ["where", "(4, 3)", "(2,)"]),
    (matmul_mismatch, (X, W), mj.ShapeError, ["matmul", "(4, 3)", "(4, 5)"]),
    (np_matmul_mismatch, (X, W), mj.ShapeError, ["matmul", "(4, 3)", "(4, 5)"]),
    (dot_vector_mismatch, (X,), mj.ShapeError, ["matmul", "(4, 3)", "(4,)"]),
    (batched_matmul_mismatch, (T3, T3B), mj.ShapeError, ["matmul", "(2, 3, 4)", "(5, 4, 2)"]),
    (sum_axis, (X,), mj.ShapeError, ["sum", "axis 2", "out of range"]),
    (max_negative_axis, (X,), mj.ShapeError, ["max", "axis -3", "out of range"]),
    (softmax_axis, (X,), mj.ShapeError, ["softmax", "axis 5"]),
    (concatenate_axis, (X,), mj.ShapeError, ["concatenate", "axis 2"]),
    (expand_dims_axis, (X,), mj.ShapeError, ["expand_dims", "axis 4"]),
    (repeated_axis, (X,), mj.ShapeError, ["logsumexp", "repeated axis"]),
    (branch_shapes, (X,), mj.TracingError, ["different shapes", "float32[4, 3]", "float32[]"]),
    (while_on_traced, (X,), mj.UnsupportedError, ["test number 9", "np.where"]),
    (and_operator, (X,), mj.ShapeError, ["ambiguous", "a.any()"]),
    (float_call, (X,), mj.TracingError, ["float()", "traced"]),
    (asarray_call, (X,), mj.TracingError, ["x.tolist()", "traced"]),
    (fft, (X,), mj.UnsupportedError, ["np.fft.fft", "not supported"]),
    (sort, (X,), mj.UnsupportedError, ["np.sort", "not supported"]),
    (unique, (X,), mj.UnsupportedError, ["np.unique", "not supported"]),
    (fft_rfft, (X,), mj.UnsupportedError, ["np.fft.rfft", "not supported"]),
    (frexp_ufunc, (X,), mj.UnsupportedError, ["np.frexp", "not supported"]),
    (ufunc_reduce, (X,), mj.UnsupportedError, ["np.add.reduce", "not supported"]),
    (ufunc_out, (X,), mj.UnsupportedError, ["np.exp", "out=", "NumPy array"]),
    (index_array_out_of_range, (X,), mj.IndexingError, ["index 7", "size 4"]),
    (index_list_out_of_range, (X,), mj.IndexingError, ["index -4", "size 3"]),
    (index_with_floats, (X,), mj.IndexingError, ["integers", "float64"]),
    (index_with_float_tracer, (X,), mj.IndexingError, ["integers", "float32"]),
    (index_with_mask, (X,), mj.UnsupportedError, ["boolean mask", "np.where"]),
    (index_out_of_range, (X,), mj.ShapeError, ["index 4", "size 4"]),
    (too_many_indices, (X,), mj.ShapeError, ["too many indices"]),
    (item_assignment, (X,), mj.ArgumentWriteError, ["argument x", ".copy()"]),
    (string_operand, (X,), mj.TracingError, ["str"]),
    (none_operand, (X,), mj.TracingError, ["NoneType"]),
    (bad_reshape, (X,), mj.ShapeError, ["reshape", "(4, 3)", "(5, -1)"]),
    (bad_broadcast_to, (X,), mj.ShapeError, ["broadcast_to", "(4, 3)", "(3, 3)"]),
    (bad_transpose, (X,), mj.ShapeError, ["transpose", "(0, 0)"]),
    (bad_squeeze, (X,), mj.ShapeError, ["squeeze", "axis 0"]),
    (sce_label_shape, (X, LABELS), mj.ShapeError, ["softmax_cross_entropy", "(3,)", "(4, 3)"]),
    (one_hot_float_labels, (X,), mj.DtypeError, ["one_hot", "float32"]),
    (unsupported_captured_dtype, (X[:, :3],), mj.DtypeError, ["float16"]),
    (integer_power, (X, LABELS), mj.DtypeError, ["power", "integer"]),
    (bitwise_on_floats, (X,), mj.UnsupportedError, ["bitwise_and", "float32"]),
    (shape_from_an_argument, (X, 2), mj.TracingError, ["a shape", "argument n", "static_argnames='n'"]),
    (slice_to_an_argument, (X, 2), mj.UnsupportedError, ["extent known", "static_argnames='n'"]),
    (shape_from_an_entry, (X, {"width": 3}), mj.TracingError, ["a shape", "config['width']", "of its own"]),
]


@pytest.mark.parametrize("fn, args, error, words", ERRORS, ids=[e[0].__name__ for e in ERRORS])
def test_trace_error_points_at_the_user_line(fn, args, error, words):
    with pytest.raises(error) as info:
        mj.trace(fn, *args)
    assert_located(info.value, marked_line(fn))
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"


def test_every_error_kind_is_a_morphjit_error():
    for *_, error, _ in ERRORS:
        assert issubclass(error, mj.MorphjitError)


# ---------------------------------------------------------------------------------------------
# Errors about the arguments point at the call of mj.trace

@pytest.mark.parametrize("bad, error, words", [
    (b"hello", mj.TracingError, ["argument s", "bytes"]),
    ({"w": object()}, mj.TracingError, ["argument s['w']", "object"]),
    (np.ones(2, np.float16), mj.DtypeError, ["argument s", "float16"]),
    (np.ones(2, np.complex128), mj.DtypeError, ["argument s", "complex128"]),
])
def test_untraceable_argument(bad, error, words):
    def fn(x, s):
        return x

    with pytest.raises(error) as info:
        mj.trace(fn, X, bad)  # <- error
    assert_located(info.value, marked_line(test_untraceable_argument))
    for word in words:
        assert word in str(info.value)


def test_none_in_an_argument_is_passed_through():
    """``None`` is part of an argument's structure (as in JAX), not a leaf to trace."""
    seen = []

    def fn(x, s):
        seen.append(s)
        return x

    program = mj.trace(fn, X, (None, {"a": None}))
    assert seen == [(None, {"a": None})] and len(program.inputs) == 1


def test_returning_a_non_array_points_at_the_trace_call():
    with pytest.raises(mj.TracingError, match="returned a str") as info:
        mj.trace(lambda x: "loss", X)  # <- error
    assert_located(info.value, marked_line(test_returning_a_non_array_points_at_the_trace_call))


# ---------------------------------------------------------------------------------------------
# A traced value that escapes its trace

LEAKED = []


def leaks(x):
    LEAKED.append(x * 2)  # <- leak
    return x


def uses_leaked(x):
    return x + LEAKED[-1]  # <- error


def uses_leaked_alone(x):
    y = np.exp(LEAKED[-1])  # <- error
    return x + y


def uses_leaked_first(x):
    return LEAKED[-1] * x  # <- error


@pytest.mark.parametrize("fn", [uses_leaked, uses_leaked_alone, uses_leaked_first])
def test_escaped_tracer(fn):
    with pytest.raises(mj.TracingError, match=r"leaves a traced value in the global LEAKED\[\d+\]") as info:
        mj.trace(leaks, X)
    assert_located(info.value, marked_line(leaks, "# <- leak"))
    with pytest.raises(mj.TracingError, match="escaped") as info:
        mj.trace(fn, X)
    assert_located(info.value, marked_line(fn))


def test_trace_recovers_after_an_error():
    with pytest.raises(mj.ShapeError):
        mj.trace(broadcast_add, X)
    _, (out,) = trace_run(lambda x: x + x[:, :1], X)
    np.testing.assert_array_equal(out, X + X[:, :1])


# ---------------------------------------------------------------------------------------------
# Nothing the user passes in is modified

def _snapshot(tree):
    leaves, treedef = pytree.flatten(tree)
    return treedef, [copy.deepcopy(leaf) for leaf in leaves], [id(leaf) for leaf in leaves]


def _assert_unchanged(tree, snapshot):
    treedef, before, ids = snapshot
    leaves, now = pytree.flatten(tree)
    assert now == treedef
    assert [id(leaf) for leaf in leaves] == ids
    for a, b in zip(leaves, before):
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape and a.flags.writeable == b.flags.writeable
            np.testing.assert_array_equal(a, b)
        else:
            assert a == b and type(a) is type(b)


def _mutating_model(params, batch):
    params["W"] = params["W"] * 2          # rebinding a key of the traced dict
    params["extra"] = batch[0]
    batch.append(batch[0])
    x = batch[0].copy()                    # writing into the argument itself is refused
    x += 1.0
    x = x.reshape(-1)
    h = np.maximum(x[: params["W"].shape[0]] @ params["W"] + params["b"], 0)
    return {"loss": np.mean(h ** 2), "h": h, "x": batch[0], "table": params["W"] * TABLE}


TABLE = np.linspace(0, 1, 5)


@pytest.mark.parametrize("model", [
    _mutating_model,
    lambda params, batch: (params["W"], batch[0], batch[1]),            # outputs are the inputs
    lambda params, batch: (params["W"].T, batch[0][::-1], params["b"].reshape(1, -1)),  # views
])
def test_inputs_are_not_modified_by_tracing_or_running(model):
    rng = np.random.default_rng(0)
    params = {"W": rng.standard_normal((6, 5)), "b": rng.standard_normal(5)}
    batch = [rng.standard_normal((2, 3)), 3.0]
    before = _snapshot((params, batch))
    table_before = TABLE.copy()
    program = trace_checked(model, params, batch)
    _assert_unchanged((params, batch), before)
    leaves, _ = pytree.flatten((params, batch))
    outputs = mj.run(program, *leaves)
    outputs_again = mj.run(program, *leaves)
    _assert_unchanged((params, batch), before)
    for out in outputs:  # outputs are fresh arrays: writing to them touches no input
        out[...] = -12345
    _assert_unchanged((params, batch), before)
    np.testing.assert_array_equal(TABLE, table_before)
    for a, b in zip(mj.run(program, *leaves), outputs_again):
        np.testing.assert_array_equal(a, b)


def test_eager_functions_do_not_modify_inputs():
    x = np.linspace(-3, 3, 12).reshape(3, 4)
    y = x.copy()
    for fn in [mj.relu, mj.softmax, mj.log_softmax, mj.logsumexp, lambda a: mj.clip(a, -1, 1),
               lambda a: mj.where(a > 0, a, 0.0), mj.sigmoid, lambda a: mj.astype(a, np.float32)]:
        fn(x)
        np.testing.assert_array_equal(x, y)
