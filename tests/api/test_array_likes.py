"""NumPy spellings published code reaches for, traced: lists holding traced values wherever NumPy
takes an array_like (``core.as_value``, the routed NumPy functions of ``dispatch``, ``np.r_`` and
``np.c_``), hsplit/vsplit/dsplit, einsum's sublist form, the complex parts of real arrays,
count_nonzero, the is*complex*/is*real* tests, ``np.lib.stride_tricks.as_strided``; the hints of
unsupported functions.

Each group of functions is one compiled function per backend and dtype: its values (and dtypes)
against NumPy on plain arrays, its gradient against central finite differences.
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.special
import scipy.stats

import morphjit as mj

from support.gradcheck import check_loss_grads_fd

BACKENDS = ["interp", "numba"]
DTYPES = [np.float32, np.float64]


def check_against_numpy(terms, x, backend):
    """``terms(x)`` (a list of arrays) compiled equals NumPy's, dtype included, and the gradient of a
    random weighting of its float terms agrees with central differences (taken in float64)."""
    expected = terms(x)
    got = mj.compile(terms, backend=backend)(x)
    rtol = 1e-5 if x.dtype == np.float32 else 1e-12
    for k, (g, e) in enumerate(zip(got, expected)):
        e = np.asarray(e)
        assert np.asarray(g).dtype == e.dtype, f"term {k}: dtype {np.asarray(g).dtype}, NumPy's {e.dtype}"
        np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol, err_msg=f"term {k}")
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(np.shape(e)) for e in expected]

    def loss(x):
        return sum(np.sum(t * w) for t, w in zip(terms(x), weights))

    _, grad = mj.compile_loss(loss, backend=backend)(x)
    assert grad.dtype == x.dtype
    check_loss_grads_fd(lambda xs: loss(xs[0]), [x.astype(np.float64)], [grad.astype(np.float64)], rng=rng,
                        rtol=1e-4 if x.dtype == np.float32 else 1e-6)


# ---------------------------------------------------------------------------------------------
# Lists holding traced values


def list_terms(x):
    return [np.mean([x[0], 2 * x[1]]), np.sum([x[0], 2 * x[1]]), np.r_[x, x[:2], 1.0], np.c_[x, 2 * x],
            np.r_["0,2", x, x], np.concatenate([x, [x[0], 3.0]]), np.stack([[x[0], x[1]], [x[2], 1.0]]),
            np.linalg.norm([x[0], x[1], x[2]]), np.dot([x[0], x[1]], [x[2], x[3]]), np.maximum([x[0], x[1]], x[2]),
            mj.mean([x, 2 * x], axis=0), np.array([x[0], 1]), np.array((x[:2], [x[3], 5.0])),
            np.prod([[x[0], x[1]], [x[2], 2.0]], axis=1), np.where(x > 0, [x[1]] * 4, x),
            np.float64(np.sum(x)), np.float32(x > 0), np.float64([x[0], x[1]]), np.int64(3 * x), np.int32(x[2]),
            np.double(x[1])]   # (np.float32 of float64 values: test_numpy_scalar_types_cast_traced_values)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_lists_of_traced_values_are_arrays(backend, dtype):
    x = np.array([0.7, -1.3, 2.1, 0.4], dtype)
    check_against_numpy(list_terms, x, backend)


def test_a_python_scalar_argument_in_a_list_is_not_weak():
    """``np.array([x32, s])`` of a float32 array and a Python float is float64, as NumPy makes it, even
    when the float is a (weak) traced scalar argument."""
    x = np.ones(1, np.float32)
    out = mj.compile(lambda x, s: np.array([x[0], s]))(x, 2.5)
    assert out.dtype == np.array([x[0], 2.5]).dtype == np.float64


@pytest.mark.parametrize("backend", BACKENDS)
def test_numpy_scalar_types_cast_traced_values(backend):
    x = np.array([0.1, -2.7, 1e40, 3.5])
    casts = lambda x: [np.float32(x), np.single(x[0]), np.int64(x[:2]), np.float64(np.float32(x[1]))]
    with np.errstate(over="ignore"):    # 1e40 is inf in float32
        expected = casts(x)
    for got, e in zip(mj.compile(casts, backend=backend)(x), expected):
        assert np.asarray(got).dtype == np.asarray(e).dtype
        np.testing.assert_array_equal(got, e)


def test_numpy_scalar_types_keep_their_meaning_while_tracing():
    """The scalar types' substitutes (which cast traced values) are NumPy's types to every other use."""
    def uses(x):
        assert isinstance(np.float64(1.5), np.float64) and type(np.float64(1.5)).__name__ == "float64"
        assert issubclass(np.float64, np.floating) and np.issubdtype(np.float64, np.floating)
        assert np.dtype(np.float64) == np.float64 and np.zeros(2, np.int32).dtype == np.int32
        assert {np.float32: 1}[np.dtype(np.float32).type] == 1 and np.finfo(np.float32).bits == 32
        assert isinstance(np.int64(7), np.int64) and np.float32(2) == 2
        return x.astype(np.float32)

    assert mj.compile(uses)(np.ones(2)).dtype == np.float32


@pytest.mark.parametrize("ufunc", [lambda x: np.exp([x[0], x[1]]), lambda x: np.add([x[0], x[1]], 1.0)])
def test_a_ufunc_of_a_list_of_traced_values_says_to_make_it_an_array(ufunc):
    """NumPy's ufuncs convert a list argument themselves, before any dispatch a tracer could take."""
    with pytest.raises(mj.UnsupportedError, match=r"of a list holding traced values.*np.array\(\[...\]\)"):
        mj.trace(ufunc, np.ones(2))


def test_a_numba_function_compiled_while_tracing_reads_numpys_scalar_types():
    """Functions compiled while a trace runs (in any thread) see the substitute of ``np.float64``
    under NumPy's name: numba types it as NumPy's type."""
    import numba
    source = "def f(a):\n    return np.float64(a[0]) + np.float32(1) + np.int32(2) + np.int64(a[1])\n"

    def fn(x):
        namespace = {"np": np}
        exec(source, namespace)    # a new function, so numba compiles it now, while the trace runs
        assert numba.njit(namespace["f"])(np.arange(1.0, 4.0)) == 1 + 1 + 2 + 2
        return np.sum(x)

    mj.trace(fn, np.ones(2))


def test_ragged_lists_are_refused():
    with pytest.raises(mj.ShapeError, match="same shape"):
        mj.trace(lambda x: np.sum([x, x[:2]]), np.ones(3))


# ---------------------------------------------------------------------------------------------
# Splits, einsum's sublists, complex parts, counts, strided views


def function_terms(x):
    flat, m = x.reshape(-1), x[0]
    return [np.hsplit(x, 2)[1], np.vsplit(x, [1])[0], np.dsplit(x, 3)[2], np.hsplit(x[0, 0], 3)[1],
            np.real(x), np.imag(x), np.conj(x), np.conjugate(x), np.angle(x), np.angle(x, deg=True),
            x[:, 0, :] * np.count_nonzero(x > 0.1, axis=1), x * np.count_nonzero(x > 0),
            np.count_nonzero(x, axis=(0, 2), keepdims=True), np.iscomplex(x) * x, np.isreal(x) * x,
            x * np.iscomplexobj(x), x * np.isrealobj(x), np.einsum(x[0], [0, 1], x[1], [0, 2], [1, 2]),
            np.einsum(x, [Ellipsis, 1], [Ellipsis]), np.einsum(x[0], [0, 1], x[1].T, [1, 0]),
            np.lib.stride_tricks.as_strided(flat, (5, 4), (2 * flat.strides[0], flat.strides[0])),
            np.lib.stride_tricks.as_strided(m, (3, 5, 2), (m.strides[0], m.strides[1], m.strides[1]))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_functions_match_numpy(backend, dtype):
    x = np.random.default_rng(1).standard_normal((2, 4, 6)).astype(dtype)
    check_against_numpy(function_terms, x, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES + [np.int64])
def test_angle_of_signed_zeros_infinities_and_nan(backend, dtype):
    special = [-0.0, 0.0, np.nan, -np.inf, np.inf, -1.5, 2.0] if dtype != np.int64 else [0, -3, 4]
    x = np.array(special, dtype)
    fn = lambda x: [np.angle(x), np.angle(x, deg=True), np.real(x), np.imag(x), np.count_nonzero(x)]
    for got, expected in zip(mj.compile(fn, backend=backend)(x), fn(x)):
        assert np.asarray(got).dtype == np.asarray(expected).dtype
        np.testing.assert_array_equal(got, expected)


def test_the_complex_tests_answer_as_numpy():
    x = np.ones((2, 3))

    def tests(x):
        assert np.iscomplexobj(x) is False and np.isrealobj(x) is True
        return [np.iscomplex(x), np.isreal(x)]

    for got, expected in zip(mj.compile(tests)(x), tests(x)):
        assert got.dtype == expected.dtype == np.bool_
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("split, x", [(np.hsplit, np.float64(1.0)), (np.vsplit, np.ones(4)),
                                      (np.dsplit, np.ones((2, 2)))])
def test_splits_refuse_too_few_dimensions_as_numpy(split, x):
    with pytest.raises(ValueError) as numpy_error:
        split(x, 2)
    with pytest.raises(ValueError) as traced_error:
        mj.trace(lambda x: split(x, 2)[0], x)
    assert str(traced_error.value) == str(numpy_error.value)


@pytest.mark.parametrize("label", [52, -1, "a", 1.0])
def test_einsum_refuses_labels_outside_the_sublist_range(label):
    with pytest.raises(ValueError, match="valid range"):
        mj.trace(lambda x: np.einsum(x, [0, label]), np.ones((2, 2)))


def test_conjugate_of_booleans_is_refused():
    with pytest.raises(mj.DtypeError, match="conjugate"):
        mj.trace(lambda x: np.conjugate(x > 0) * x, np.ones(3))


@pytest.mark.parametrize("shape, strides", [((4, 2), (16, 8)), ((3,), (-8,)), ((3,), (4,)), ((2, 3), (8, 24))])
def test_as_strided_refuses_views_it_cannot_express(shape, strides):
    with pytest.raises(mj.UnsupportedError, match="as_strided"):
        mj.trace(lambda x: np.lib.stride_tricks.as_strided(x, shape, strides), np.ones(5))


def test_writes_through_as_strided_are_refused():
    def write(x):
        y = x.copy()
        view = np.lib.stride_tricks.as_strided(y, (3, 2), (y.strides[0], y.strides[0]))
        view[0, 1] = 5.0    # NumPy writes y[1], which view[1, 0] also is
        return np.sum(view)

    with pytest.raises(ValueError, match="as_strided view is read-only"):
        mj.trace(write, np.ones(4))


# ---------------------------------------------------------------------------------------------
# The hints of unsupported functions


MISLEADING = [lambda x: np.select([x > 0], [x]), lambda x: np.linalg.matrix_rank(np.outer(x, x)), np.sort, np.median,
              lambda x: np.quantile(x, 0.5), lambda x: np.convolve(x, x), lambda x: np.cross(x, x),
              lambda x: np.isclose(x, x), np.argwhere, np.cov, lambda x: np.resize(x, 4),
              lambda x: np.insert(x, 0, x), lambda x: np.delete(x, 0), lambda x: np.fmax(x, x), np.nanmax,
              np.nancumsum, np.signbit, lambda x: np.ldexp(x, 2), np.modf, np.gradient, np.nonzero, np.vander,
              lambda x: np.linalg.cond(np.outer(x, x)), lambda x: np.linalg.matrix_power(np.outer(x, x), 2),
              lambda x: np.vecdot(x, x), np.spacing, np.nanstd]


@pytest.mark.parametrize("fn", MISLEADING)
def test_no_hint_names_a_function_that_does_another_job(fn):
    with pytest.raises(mj.UnsupportedError) as info:
        mj.trace(fn, np.array([0.5, 1.5, 2.5]))
    message = str(info.value)
    assert "is not supported by morphjit" in message and "use np." not in message and "nearest" not in message


@pytest.mark.parametrize("fn, hint", [(np.cumulative_sum, "use np.cumsum, which does the same"),
                                      (np.fix, "use np.trunc, which does the same"),
                                      (scipy.special.loggamma, r"use scipy.special.gammaln \(equal for real x\)")])
def test_a_hint_names_a_function_that_does_the_same_job(fn, hint):
    with pytest.raises(mj.UnsupportedError, match=hint):
        mj.trace(fn, np.array([0.5, 1.5, 2.5]))


@pytest.mark.parametrize("method", [lambda x: scipy.stats.dirichlet.var(np.ones(3) + x)])
def test_a_multivariate_distribution_is_named_by_its_public_name(method):
    with pytest.raises(mj.UnsupportedError) as info:
        mj.trace(method, np.array([0.2, 0.3, 0.5]))
    message = str(info.value)
    assert message.startswith("scipy.stats.dirichlet.var does not trace") and "mj.stats.logpdf" not in message


# ---------------------------------------------------------------------------------------------
# A Python list of ints as a data argument (min-char-rnn's ``inputs``)


def char_rnn_loss(params, inputs, targets):
    """min-char-rnn's loss: one-hot rows written at ``inputs[t]``, a row of the embedding gathered
    with the whole list."""
    wxh, why = params
    h, loss = np.zeros((wxh.shape[0], 1), wxh.dtype), 0.0
    for t in range(len(inputs)):
        x = np.zeros((wxh.shape[1], 1), wxh.dtype)
        x[inputs[t]] = 1
        h = np.tanh(wxh @ x + h)
        y = why @ h
        loss += -np.log((np.exp(y) / np.sum(np.exp(y)))[targets[t], 0])
    return loss + 0.1 * np.sum(wxh[:, inputs] ** 2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_list_of_ints_argument_indexes_without_a_compile_per_list(backend, dtype):
    rng = np.random.default_rng(5)
    params = [rng.standard_normal((4, 5)).astype(dtype), rng.standard_normal((5, 4)).astype(dtype)]
    step = mj.compile_loss(char_rnn_loss, backend=backend)
    for inputs, targets in (([3, 1, 4], [1, 4, 0]), ([0, 2, 2], [2, 2, 1])):
        value, grads = step(params, inputs, targets)
        np.testing.assert_allclose(value, char_rnn_loss(params, inputs, targets), rtol=1e-5 if dtype == np.float32 else 1e-12)
        check_loss_grads_fd(lambda ps: char_rnn_loss(ps, inputs, targets), [p.astype(np.float64) for p in params],
                            [g.astype(np.float64) for g in grads], rng=rng, rtol=1e-4 if dtype == np.float32 else 1e-6)
    info = step.cache_info()
    assert info.misses == 1 and info.signatures[0].endswith(" i64[3] i64[3]"), info   # one int array each
