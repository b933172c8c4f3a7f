"""Loop nests run as kernels compiled once per text: repeated layers share one, and a model
edited in the same process compiles only the kernels whose text changed. GEMM kernels call
``lapack.gemm`` (BLAS directly), checked against NumPy here."""
import re

import numba
import numpy as np
import pytest

import morphjit as mj
from morphjit.runtime import kernels
from morphjit.native import lapack

KERNEL = re.compile(r"(?:kernels\.load|table\.kernel)\('''(.*?)'''", re.S)   # either step form


def kernel_texts(source: str) -> set[str]:
    return set(KERNEL.findall(source))


def trunk(params, x):
    """Three tanh layers of widths no other test uses, so their kernels are new to the process."""
    h = x
    for k in range(3):
        h = np.tanh(h @ params[f"W{k}"] + params[f"b{k}"])
    return h


def classifier(params, x, y):
    return mj.mean(mj.softmax_cross_entropy(trunk(params, x) @ params["out"], y))


def regressor(params, x, y):   # the same trunk, another head
    return mj.mean((trunk(params, x) @ params["out"] - y[:, None]) ** 2)


def problem():
    rng = np.random.default_rng(19)
    params = {**{f"W{k}": rng.normal(size=(13, 13)) * 0.3 for k in range(3)},
              **{f"b{k}": rng.normal(size=13) for k in range(3)}, "out": rng.normal(size=(13, 3))}
    return params, rng.normal(size=(7, 13)), rng.integers(0, 3, 7)


def test_an_edited_model_compiles_only_the_kernels_that_changed():
    params, x, y = problem()
    first = mj.compile_loss(classifier, cache=False)
    first(params, x, y)
    before = kernels.statistics()
    edited = mj.compile_loss(regressor, cache=False)
    value, grads = edited(params, x, y)
    after = kernels.statistics()
    old, new = kernel_texts(first.source(params, x, y)), kernel_texts(edited.source(params, x, y))
    assert old & new and new - old    # the trunk's kernels are shared, the head's are not
    assert after["compiled"] - before["compiled"] == len(new - old)
    assert after["reused"] - before["reused"] == len(new & old)
    want, want_grads = mj.compile_loss(regressor, backend="interp")(params, x, y)
    assert value == pytest.approx(want, rel=1e-12)
    for k in params:
        np.testing.assert_allclose(grads[k], want_grads[k], rtol=1e-10, atol=1e-12)


def unrolled(w, x):
    """A recurrence unrolled over the time axis of x, reading the slice x[:, t] at each step."""
    h = np.tanh(x[:, 0] * w)
    for t in range(1, x.shape[1]):
        h = np.tanh(x[:, t] * w + h)
    return mj.sum(h ** 2)


def test_the_time_steps_of_an_unrolled_loop_share_their_kernels():
    rng = np.random.default_rng(7)
    w = rng.normal(size=5)
    texts = {}
    for steps in (3, 6):
        x = rng.normal(size=(4, steps, 5))
        compiled = mj.compile_loss(unrolled, cache=False)
        value, grad = compiled(w, x)
        texts[steps] = kernel_texts(compiled.source(w, x))
        want, want_grad = mj.compile_loss(unrolled, backend="interp")(w, x)
        assert value == pytest.approx(want, rel=1e-12)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-12)
    # a slice's start is the kernel's parameter, not part of its text: twice the steps, as many kernels
    assert len(texts[6]) == len(texts[3]) and any("o0" in text for text in texts[6])


def test_gemms_of_matrices_share_one_kernel_per_transposition():
    # Every extent of a matrix GEMM's kernel is a parameter: x @ W1 and h @ W2 run one kernel.
    def loss(p, x):
        h = np.tanh(x @ p["W1"])
        return np.sum((h @ p["W2"]) ** 2)

    rng = np.random.default_rng(0)
    p = {"W1": rng.standard_normal((5, 7)), "W2": rng.standard_normal((7, 3))}
    x = rng.standard_normal((4, 5))
    step = mj.compile_loss(loss)
    value, grads = step(p, x)
    source = step.source(p, x)
    assert source.count("lapack.gemm(a0, a1, a2)") == 1 and source.count("lapack.gemm(a0.T, a1, a2)") == 1
    assert source.count("lapack.gemm(a0, a1.T, a2)") == 1
    assert ": 5 gemm, " in source.splitlines()[0]
    want_value, want = mj.compile_loss(loss, backend="interp")(p, x)
    np.testing.assert_allclose(value, want_value, rtol=1e-12)
    for k in p:
        np.testing.assert_allclose(grads[k], want[k], rtol=1e-12)


@numba.njit
def _gemm(a, b, out):
    lapack.gemm(a, b, out)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_kernels_gemm_agrees_with_numpy_for_every_transposition_and_degenerate_shape(dtype):
    rng = np.random.default_rng(1)
    for m, k, n in [(4, 8, 16), (1, 1, 1), (3, 0, 2), (0, 3, 2), (5, 1, 7), (1, 6, 1), (7, 3, 1), (1, 5, 4), (9, 16, 1),
                    (1, 16, 9), (1, 0, 3)]:
        a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
        for a_view in (a, a.T.copy().T):        # C-ordered (strides as numba.carray gives), or a transposed view
            for b_view in (b, b.T.copy().T):
                out = np.full((m, n), np.nan, dtype)
                _gemm(a_view, b_view, out)
                np.testing.assert_allclose(out, a @ b, rtol=1e-5 if dtype == np.float32 else 1e-12,
                                           atol=1e-6, err_msg=f"{(m, k, n)} {a_view.strides} {b_view.strides}")
    a, b, out = np.ones((2, 3), dtype), np.ones((3, 2), dtype), np.zeros((2, 2), dtype)
    a[0, 1] = np.nan
    _gemm(a, b, out)
    assert np.isnan(out[0]).all() and not np.isnan(out[1]).any()
