"""Pairwise squared distances as GEMMs (morphjit/distances.py): the rewrite, its values and
gradients against float64 NumPy and autograd, its reach and its accuracy bound."""
import numpy as np
import pytest

import morphjit as mj
from morphjit.transforms import distances

from support.gradcheck import anp, autograd

N, M, D = 7, 5, distances.MIN_DEPTH + 1


def distance_loss(ns, params, y):
    """Every spelling of the pattern the rewrite knows, with gradients flowing through each."""
    x, c = params["x"], params["C"]
    d_pow = ns.sum((x[:, None, :] - c[None, :, :]) ** 2, axis=-1)
    d_square = ns.sum(ns.square(c[None] - x[:, None]), axis=2)            # the other order
    diff = x[:, None] - c                                                 # c broadcast implicitly
    d_mul = (diff * diff).sum(axis=-1)
    return (ns.sum(ns.exp(-0.05 * d_pow) * y) + ns.sum(ns.sqrt(d_square + 1.0) * y)
            + ns.mean(d_mul * y * y))


def problem(dtype, seed=0):
    rng = np.random.default_rng(seed)
    params = {"x": rng.normal(size=(N, D)).astype(dtype), "C": rng.normal(size=(M, D)).astype(dtype)}
    return params, rng.normal(size=(N, M)).astype(dtype)


def reference(params, y):
    """Loss and gradients in float64 by autograd, the pattern computed as written."""
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    loss = lambda p: distance_loss(anp, p, y.astype(np.float64))  # noqa: E731
    return loss(p64), autograd.grad(loss)(p64)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_distances_match_float64_values_and_gradients(dtype, rtol):
    params, y = problem(dtype)
    loss, grads = mj.compile_loss(lambda p, y: distance_loss(np, p, y), cache=False)(params, y)
    expected_loss, expected_grads = reference(params, y)
    np.testing.assert_allclose(loss, expected_loss, rtol=rtol)
    for k in params:
        assert grads[k].dtype == dtype
        np.testing.assert_allclose(grads[k], expected_grads[k], rtol=rtol, atol=rtol * np.abs(expected_grads[k]).max())


def test_each_spelling_becomes_gemms_forward_and_backward():
    params, y = problem(np.float64)
    joint = mj.grad_program(lambda p, y: distance_loss(np, p, y), params, y)
    text = str(joint)
    assert f"[{N},{M},{D}]" not in text, "a pairwise difference is still computed"
    # The forward x C^T (once, after CSE), and per spelling its two gradients G C and G^T x.
    assert text.count(" = matmul ") == 1 + 2 * 3
    assert "maximum" in text


def test_short_contractions_stay_loop_nests():
    shallow = lambda a, b: np.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1)  # noqa: E731
    a, b = np.ones((3, distances.MIN_DEPTH - 1)), np.ones((4, distances.MIN_DEPTH - 1))
    program = mj.trace(shallow, a, b)
    assert distances.as_gemms(program) is program
    deep = mj.trace(shallow, np.ones((3, D)), np.ones((4, D)))
    assert "matmul" in str(distances.as_gemms(deep)) and "matmul" not in str(deep)


def test_other_shapes_and_reductions_are_left_alone():
    def not_distances(a, b):
        summed_rows = np.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=0)     # not the contracted axis
        cubed = np.sum((a[:, None, :] - b[None, :, :]) ** 3, axis=-1)
        return summed_rows.sum() + cubed.sum()

    program = mj.trace(not_distances, np.ones((3, D)), np.ones((4, D)))
    assert distances.as_gemms(program) is program


def test_float32_error_stays_within_the_expansions_bound_and_never_negative():
    # Points far from the origin, some equal to a centre: the distance cancels to (nearly) zero.
    rng = np.random.default_rng(1)
    c = (3.0 + rng.normal(size=(6, 32))).astype(np.float32)
    x = np.concatenate([c[:3], (3.0 + rng.normal(size=(40, 32)))]).astype(np.float32)
    d2 = mj.compile(lambda a, b: np.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1), cache=False)(x, c)
    exact = np.sum((x[:, None, :].astype(np.float64) - c[None, :, :]) ** 2, axis=-1)
    norms = np.sum(x.astype(np.float64) ** 2, 1)[:, None] + np.sum(c.astype(np.float64) ** 2, 1)[None, :]
    assert d2.dtype == np.float32 and (d2 >= 0).all() and np.isfinite(np.sqrt(d2)).all()
    assert (np.abs(d2 - exact) <= 8 * np.finfo(np.float32).eps * norms).all()
    far = exact > 1e-2 * norms
    np.testing.assert_allclose(d2[far], exact[far], rtol=1e-4)


def test_nan_in_a_point_is_nan_in_its_distances():
    x, c = np.ones((3, D)), np.zeros((4, D))
    x[1, 2] = np.nan
    d2 = mj.compile(lambda a, b: np.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1), cache=False)(x, c)
    assert np.isnan(d2[1]).all() and not np.isnan(d2[[0, 2]]).any()
    np.testing.assert_allclose(d2[[0, 2]], D)


def test_distances_between_rewritten_distances_read_the_rewritten_values():
    def pairwise(a, b):
        return np.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1)

    def nested(x, c):
        d = pairwise(x, c)            # (7, 9): rows of D coordinates
        return pairwise(d, d[:3])

    rng = np.random.default_rng(2)
    x, c = rng.normal(size=(7, D)), rng.normal(size=(D, D))
    program = distances.as_gemms(mj.trace(nested, x, c))
    assert str(program).count("matmul") == 2 and program.verify() is program
    (result,) = mj.run(program, x, c)
    np.testing.assert_allclose(result, nested(x, c), rtol=1e-10, atol=1e-9)   # d[:3] are rows of d: zeros, up to rounding
