"""Integer-array indexing end to end: values and gradients of every form on both backends (one
compiled program covers them all), repeated indices against autograd and finite differences,
traced scalar indices and slices with traced bounds, and the errors of bad indices."""
import re

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import morphjit as mj
from morphjit.util import pytree
from morphjit.runtime.interp import run_plan
from morphjit.api.indexing import NUMPY_ARANGE
from morphjit.backend import range_checks

from support.gradcheck import check_loss_grads_fd
from morphjit.jit.pipeline import compile_plan
from support.plans import check_plan_invariants
from support.random_keys import advanced_index, rand_shape

BACKENDS = ["interp", "numba"]
REPEATED = np.array([2, 0, 2, -1, 2, 2])


def every_form(ns, p, tokens, y, bits, i):
    """A loss using each indexing form; ``ns`` is morphjit's NumPy surface or autograd's.
    ``tokens``, ``y``, ``bits`` and ``i`` are data arguments (traced under morphjit)."""
    E, W, T = p["E"], p["W"], p["T"]
    take = (lambda x, idx, axis: np.take(x, idx, axis=axis)) if ns is mj else \
        (lambda x, idx, axis: x[(slice(None),) * axis + (idx,)])
    z = ns.tanh(E[tokens]) @ W                          # an embedding, then a layer
    logp = z - ns.log(ns.sum(ns.exp(z), axis=1, keepdims=True))
    terms = [
        -ns.mean(logp[np.arange(len(tokens)), y]),      # the cross-entropy pick
        ns.sum(W[:, REPEATED] ** 2),                     # columns, repeated
        ns.sum(E[REPEATED[:, None], np.array([0, -1, 0])]),   # broadcast pairs, repeated
        ns.sum(T[REPEATED % 3, :, REPEATED[::-1] % 2] * 0.5),  # separated by a slice
        ns.sum(T[1, ..., bits] ** 2),              # an integer counts as an index array
        ns.sum(E[None, REPEATED, 1:] ** 2),              # with None and a slice
        ns.sum(take(W, y, 1) * 0.1),
        ns.sum(E[i] * E[i + 1]),                         # traced scalars
        ns.sum(E[2 * i:2 * i + 3] ** 3),                  # a slice with traced bounds
    ]
    return sum(terms)


def every_form_args():
    rng = np.random.default_rng(3)
    params = {"E": rng.normal(size=(7, 3)), "W": rng.normal(size=(3, 4)), "T": rng.normal(size=(3, 4, 2))}
    return params, np.array([1, 3, 3, 0, -1, 6, 3, 2]), rng.integers(0, 4, 8), np.array([1, 0, 1, 1]), 2


def autograd_reference(params, tokens, y, bits, i):
    keys = sorted(params)

    def loss(*values):
        return every_form(anp, dict(zip(keys, values)), tokens, y, bits, i)

    value = loss(*(params[k] for k in keys))
    grads = autograd.grad(loss, tuple(range(len(keys))))(*(params[k] for k in keys))
    return value, dict(zip(keys, grads))


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_form_matches_autograd(backend):
    params, tokens, y, bits, i = every_form_args()
    compiled = mj.compile_loss(lambda p, tokens, y, bits, i: every_form(mj, p, tokens, y, bits, i), backend=backend)
    value, grads = compiled(params, tokens, y, bits, i)
    ref_value, ref_grads = autograd_reference(params, tokens, y, bits, i)
    np.testing.assert_allclose(value, ref_value, rtol=1e-12)
    for k in params:
        np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-10, atol=1e-12)
    # another traced scalar, the same compiled step
    value, _ = compiled(params, tokens, y, bits, 1)
    np.testing.assert_allclose(value, autograd_reference(params, tokens, y, bits, 1)[0], rtol=1e-12)


def batch_pick(ns, p, x, y):
    """Picks along the batch: at ``np.arange`` of the batch size, by ``np.take_along_axis`` and
    by ``np.choose`` (autograd has neither: it indexes and selects instead)."""
    along = np.take_along_axis if ns is mj else lambda a, i, axis: a[np.arange(len(a))[:, None], i]
    choose = np.choose if ns is mj else lambda k, c: anp.where(k == 0, c[0], c[1])
    z = x @ p["W"]
    logp = z - ns.log(ns.sum(ns.exp(z), axis=1, keepdims=True))
    n = x.shape[0]
    return -ns.mean(logp[np.arange(n), y]) + ns.sum(along(logp, y[:, None], axis=1) ** 2) * 0.1 \
        + ns.sum(choose(y % 2, [logp[:, 0], logp[:, 1]])) + ns.mean(logp * np.arange(5.0)) \
        + ns.mean(logp * np.arange(n)[:, None])          # an arange of the batch size as a value


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pick_at_an_arange_of_the_batch_size_serves_every_batch_size(backend):
    rng = np.random.default_rng(5)
    params = {"W": rng.normal(size=(4, 5))}
    compiled = mj.compile_loss(lambda p, x, y: batch_pick(mj, p, x, y), backend=backend)
    for n in (3, 7, 64):
        x = rng.normal(size=(n, 4))
        y = np.array([2, -1, 2]) if n == 3 else rng.integers(-5, 5, n)   # repeated and negative labels
        value, grads = compiled(params, x, y)
        np.testing.assert_allclose(value, batch_pick(anp, params, x, y), rtol=1e-12)
        ref = autograd.grad(lambda W: batch_pick(anp, {"W": W}, x, y))(params["W"])
        np.testing.assert_allclose(grads["W"], ref, rtol=1e-10, atol=1e-12)
    info = compiled.cache_info()
    assert info.misses == 1 and info.signatures == ("f64[4,5] f64[B,4] i64[B]",), info
    assert np.arange is NUMPY_ARANGE
    # the aranges are read as the loop index: the labels are range-checked, they are not
    program = compiled.program(params, x, y)
    producer = {id(b.out): b.op for b in program.bindings}
    checked = [producer.get(id(c.values), "y") for c in range_checks(program)]
    assert "iota" in producer.values() and "y" in checked and "iota" not in checked
    if backend == "interp":   # the plan interpreter: the loops read the aranges as loop indices
        plan = compile_plan(program)
        for a, e in zip(run_plan(plan, params["W"], x, y), mj.run(program, params["W"], x, y)):
            np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12)
    with pytest.raises(IndexError, match=r"index argument y \(at test_indexing.py:\d+\) must lie in \[-5, 5\), got 5"):
        compiled(params, x, np.where(np.arange(64) == 9, 5, y))


def test_repeated_indices_accumulate_against_finite_differences():
    rng = np.random.default_rng(5)
    E = rng.normal(size=(5, 3))
    compiled = mj.compile_loss(lambda E, idx: mj.sum(mj.sin(E[idx]) * np.arange(18.0).reshape(6, 3)))
    _, grad = compiled(E, REPEATED)

    def loss(xs):
        return np.sum(np.sin(xs[0][REPEATED]) * np.arange(18.0).reshape(6, 3))
    check_loss_grads_fd(loss, [E], [grad], rng=rng)
    assert np.count_nonzero(grad[2]) == 3 and np.all(grad[1] == 0)


def test_the_gather_is_read_inside_the_fused_loop_and_the_scatter_accumulates():
    # rows of 16: shorter ones run tanh as one loop over the block (selection.SHORT_ROW)
    E, tokens = np.ones((7, 16)), np.array([1, 2])
    source = mj.compile_loss(lambda E, t: mj.sum(mj.tanh(E[t]) ** 2)).source(E, tokens)
    # the row's index is read (and a negative one wrapped) once per row, then the row is read
    # inside the loop that computes tanh and the sum; the gradient adds into its row. Loops
    # along the rows run to the rows' run-time extent, which LLVM vectorises (the forward loop and
    # the scatter are kernels, their arrays a0, a1, ..., that extent their parameter n0)
    row = r"t0 = [av]1\[i0\]\n.*\n.*\n\s+t3 = select\(t1, t2, t0\)\n\s+for i1 in range\((n0|v\d\.shape\[1\])\):\n"
    assert re.search(row + r"\s+t4 = a\d\[t3, i1\]\n\s+t5 = (np|vm).tanh\(t4\)", source), source
    assert re.search(row + r"(.*\n)*\s+a\d\[t3, i1\] \+= t8", source), source


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_out_of_range_raises_index_error_with_value_and_position(backend):
    compiled = mj.compile_loss(lambda E, t: mj.sum(E[t] ** 2), backend=backend)
    E = np.ones((5, 2))
    compiled(E, np.array([0, -5, 4]))
    for bad, shown in [(np.array([0, 5, 1]), "got 5 at position (1)"), (np.array([-6]), "got -6 at position (0)")]:
        with pytest.raises(IndexError, match=r"must lie in \[-5, 5\)") as info:
            compiled(E, bad)
        assert shown in str(info.value) and "index argument t (at test_indexing.py:" in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_traced_scalar_index_out_of_range_raises(backend):
    compiled = mj.compile_loss(lambda E, i: mj.sum(E[i:i + 2] ** 2), backend=backend)
    E = np.ones((5, 2))
    assert compiled(E, 3)[0] == 4.0
    assert compiled(E, 4)[0] == 2.0   # NumPy's E[4:6] is one row
    with pytest.raises(IndexError, match=r"slice with traced bounds \(at test_indexing.py:\d+\), of 2 elements, "
                                         r"lacks its element 0 .* axis of 5"):
        compiled(E, 5)


TRACED_SLICES = {   # (key of the traced start t, of a (6, 3) array) -> the same slice of NumPy
    "x[t:t + 2]": lambda x, t: x[t:t + 2],
    "x[t:t + 5:2]": lambda x, t: x[t:t + 5:2],
    "x[t - 1:t + 2:3]": lambda x, t: x[t - 1:t + 2:3],
    "x[:, t:t + 1]": lambda x, t: x[:, t:t + 1],
    "x[2 * t:2 * t + 3]": lambda x, t: x[2 * t:2 * t + 3],
    "x[t:t] (empty)": lambda x, t: x[t:t],
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(TRACED_SLICES))
def test_slices_with_traced_bounds_follow_numpy_or_raise(name, backend):
    """Over every start from before the axis to past its end (bounds of both signs, mixed ones
    included): NumPy's values and gradients where NumPy's slice has the traced length or a
    shorter one (a step of its own per shorter length), else (empty) an IndexError naming the
    slice, never other rows."""
    key = TRACED_SLICES[name]
    x = np.random.default_rng(7).normal(size=(6, 3))
    compiled = mj.compile_loss(lambda x, t: np.sum(np.tanh(key(x, t)) * 1.5), backend=backend)
    traced = key(x, 1).shape   # the length of range(0, stop - start, step), as traced
    lengths = set()
    for t in range(-10, 10):
        picked = key(x, t)
        if picked.shape != traced and picked.size == 0:
            with pytest.raises(IndexError, match=r"slice with traced bounds .* lacks its element 0"):
                compiled(x, t)
            continue
        lengths.add(picked.shape)
        expected_grad = np.zeros_like(x)
        np.add.at(expected_grad, (key(np.arange(x.size).reshape(x.shape), t) // 3, key(np.arange(x.size).reshape(x.shape), t) % 3),
                  1.5 * (1 - np.tanh(picked) ** 2))
        value, grad = compiled(x, t)
        np.testing.assert_allclose(value, np.sum(np.tanh(picked) * 1.5), rtol=1e-12, err_msg=f"t={t}")
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-12, atol=1e-15, err_msg=f"t={t}")
    assert compiled.cache_info().misses == len(lengths)


TRAIN = np.random.default_rng(3).normal(size=(12, 4))   # captured by the objectives below


def minibatch_of_closure(w, it):
    """autograd's neural_net example: a batch of data the objective captures, picked by a counter."""
    idx = it % 3
    batch = slice(idx * 4, (idx + 1) * 4)
    return np.sum(np.tanh(TRAIN[batch] @ w) ** 2)


def minibatch_of_argument(w, X, it):
    idx = it % 3
    return np.sum(np.tanh(X[idx * 4:(idx + 1) * 4] @ w) ** 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_minibatches_sliced_by_a_traced_counter_follow_numpy(backend):
    w = np.array([0.5, -0.25, 1.0, 0.1])
    for fn, data in ((minibatch_of_closure, ()), (minibatch_of_argument, (TRAIN,))):
        step = mj.compile_loss(fn, backend=backend)
        for it in range(7):
            value, grad = step(w, *data, it)
            assert value == pytest.approx(fn(w, *data, it), rel=1e-12)
            rows = TRAIN[(it % 3) * 4:(it % 3 + 1) * 4]
            expected = 2 * rows.T @ (np.tanh(rows @ w) * (1 - np.tanh(rows @ w) ** 2))
            np.testing.assert_allclose(grad, expected, rtol=1e-10)
        assert step.cache_info().misses == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_bounds_that_compute_the_batch_number_twice_have_a_fixed_extent(backend):
    def twice(w, it):
        return np.sum(np.tanh(TRAIN[(it % 3) * 4:(it % 3 + 1) * 4] @ w) ** 2)
    step = mj.compile_loss(twice, backend=backend)
    w = np.array([0.5, -0.25, 1.0, 0.1])
    for it in range(4):
        assert step(w, it)[0] == pytest.approx(twice(w, it), rel=1e-12)
    with pytest.raises(mj.UnsupportedError, match="extent known when tracing"):   # it % 3 and it % 4 differ
        mj.compile_loss(lambda w, it: np.sum(TRAIN[(it % 3) * 4:(it % 4 + 1) * 4] @ w))(w, 1)


def test_a_minibatch_past_the_end_is_refused_where_numpy_would_give_an_empty_one():
    def ragged(w, it):
        idx = it % 4        # the fourth batch of 4 rows would be NumPy's TRAIN[12:16], which is empty
        return np.sum(TRAIN[idx * 4:(idx + 1) * 4] @ w)
    step = mj.compile_loss(ragged)
    assert step(np.ones(4), 2)[0] == pytest.approx(ragged(np.ones(4), 2))
    with pytest.raises(IndexError, match=r"slice with traced bounds .* lacks its element 0.*not for an empty"):
        step(np.ones(4), 3)


def test_float_index_arguments_and_masks_of_the_wrong_shape_are_refused():
    compiled = mj.compile_loss(lambda E, t: mj.sum(E[t]))
    with pytest.raises(mj.IndexingError, match=r"integers, got float64 \(argument t\)"):
        compiled(np.ones((5, 2)), np.array([0.0, 1.0]))
    assert compiled(np.ones((5, 2)), np.array([True, False, True, False, True]))[0] == 6.0
    with pytest.raises(mj.IndexingError, match=r"mask \(argument t\) of shape \(4,\) does not match .* \(5, 2\)"):
        compiled(np.ones((5, 2)), np.array([True, False, True, False]))


def test_a_slice_whose_extent_depends_on_traced_values_is_refused():
    with pytest.raises(mj.UnsupportedError, match=r"x\[i \* n:\(i \+ 1\) \* n\]"):
        mj.trace(lambda E, i: E[i:2 * i], np.ones((5, 2)), 1)
    # NumPy's x[t + 2:t] is empty, or 4 rows at t = -2 (x[0:-2])
    with pytest.raises(mj.UnsupportedError, match=r"stop - start at least 0"):
        mj.trace(lambda E, i: E[i + 2:i], np.ones((6, 2)), 1)


def test_the_plan_interpreter_runs_every_form_like_the_reference():
    params, *data = every_form_args()
    fn = lambda p, tokens, y, bits, i: every_form(mj, p, tokens, y, bits, i)  # noqa: E731
    joint = mj.grad_program(fn, params, *data)
    args = pytree.flatten((params, *data))[0]
    plan = compile_plan(joint)
    check_plan_invariants(plan)
    for a, e in zip(run_plan(plan, *args), mj.run(joint, *args)):
        np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_integer_indexes_match_numpy_in_the_plan_interpreter(data):
    """Values and gradients of ``sum(x[key] * w)``, the gradient being ``w`` added at the
    positions ``key`` picks (np.add.at), for random shapes and keys."""
    seed = data.draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=rand_shape(rng, 1, 4, max_dim=4))
    key = advanced_index(rng, x.shape)
    w = rng.normal(size=x[key].shape)
    joint = mj.grad_program(lambda x, w: mj.sum(x[key] * w), x, w)
    plan = compile_plan(joint)
    value, grad = run_plan(plan, x, w)
    expected = np.zeros_like(x)
    np.add.at(expected, key, w)
    np.testing.assert_allclose(value, np.sum(x[key] * w), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad, expected, rtol=1e-12, atol=1e-12)


def masks_and_updates(ns, p, mask, rows, idx):
    """Masked reductions and functional updates; autograd's side spells them with NumPy."""
    x, v = p["x"], p["v"]
    if ns is mj:
        added = mj.at(x)[idx].add(v)                   # repeated positions accumulate
        stored = mj.at(x)[idx[:2], 1:].set(v[:2, :2] * 2.0)
        masked = mj.at(x)[mask].set(0.5 * x)
    else:
        placed = np.zeros((len(idx), x.shape[0]))
        placed[np.arange(len(idx)), idx % x.shape[0]] = 1.0
        added = x + ns.dot(placed.T, v)
        keep = np.ones(x.shape)
        keep[idx[:2], 1:] = 0.0
        put = np.zeros((2, x.shape[0]))
        put[np.arange(2), idx[:2] % x.shape[0]] = 1.0
        stored = x * keep + ns.concatenate([np.zeros((x.shape[0], 1)), ns.dot(put.T, v[:2, :2] * 2.0)], axis=1)
        masked = ns.where(mask, 0.5 * x, x)
    return (x[mask].sum() + ns.sum(ns.log(x[mask]) ** 2) + x[mask].mean() + ns.mean((2 * x[rows] - 1) ** 2)
            + ns.sum(ns.sin(added) ** 2) + ns.sum(stored ** 3) + ns.sum(masked ** 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_reductions_and_functional_updates_match_autograd(backend):
    rng = np.random.default_rng(9)
    params = {"x": np.abs(rng.normal(size=(5, 3))) * np.sign(rng.normal(size=(5, 3))), "v": rng.normal(size=(4, 3))}
    params["x"][0, 0] = 0.0   # log(0) outside the mask must not reach the gradient as a NaN
    mask, rows, idx = params["x"] > 0.1, rng.random(5) < 0.5, np.array([1, 3, 1, -1])
    compiled = mj.compile_loss(lambda p, mask, rows, idx: masks_and_updates(mj, p, mask, rows, idx), backend=backend)
    value, grads = compiled(params, mask, rows, idx)

    def loss(x, v):
        return masks_and_updates(anp, {"x": x, "v": v}, mask, rows, idx)
    np.testing.assert_allclose(value, loss(params["x"], params["v"]), rtol=1e-12)
    gx, gv = autograd.grad(loss, (0, 1))(params["x"], params["v"])
    np.testing.assert_allclose(grads["x"], gx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads["v"], gv, rtol=1e-10, atol=1e-12)


def test_at_set_stores_the_mean_at_repeated_positions():
    x = np.zeros(3)
    out = mj.compile_loss(lambda x, v: mj.sum(mj.at(x)[np.array([1, 1, 2])].set(v) * np.array([1.0, 10.0, 100.0])))
    assert out(x, np.array([2.0, 4.0, 5.0]))[0] == 3.0 * 10 + 5.0 * 100


@pytest.mark.parametrize("fn, error, words", [
    (lambda x: x[x > 0], mj.UnsupportedError, ["data", "np.where(mask, x, 0)"]),
    (lambda x: x[x > 0] + x, mj.UnsupportedError, ["combined with an array", "np.where"]),
    (lambda x: mj.sum(x[x > 0], axis=0), mj.UnsupportedError, ["no axis", "np.where"]),
    (lambda x: x[x > 0].max(), mj.UnsupportedError, ["x[mask].max", "np.where"]),
    (lambda x: x[x[:, :2] > 0].sum(), mj.IndexingError, ["mask of shape (4, 2)", "(4, 3)"]),
    (lambda x: x[x[:, 0] > 0, 0].sum(), mj.UnsupportedError, ["mask combined with other indices"]),
])
def test_unsupported_mask_uses_explain_the_where_spelling(fn, error, words):
    def loss(x):
        return fn(x)
    with pytest.raises(error) as info:
        mj.trace(loss, np.ones((4, 3)))
    for word in words:
        assert word in str(info.value), str(info.value)


def test_item_assignment_into_an_argument_is_refused_naming_it_and_the_copy():
    def loss(x):
        x[0] = 1.0
        return mj.sum(x)
    with pytest.raises(mj.ArgumentWriteError, match=r"argument x.*x\.copy\(\)"):
        mj.trace(loss, np.ones(3))


def test_at_set_with_a_row_mask_sets_whole_rows_like_numpy():
    x, rows = np.arange(15.0).reshape(5, 3), np.array([True, False, True, False, False])
    expected = x.copy()
    expected[rows] = -1.0
    compiled = mj.compile_loss(lambda x, rows: mj.sum(mj.at(x)[rows].set(-1.0) * np.arange(15.0).reshape(5, 3)),
                               backend="interp")
    value, grad = compiled(x, rows)
    assert value == np.sum(expected * np.arange(15.0).reshape(5, 3))
    np.testing.assert_array_equal(grad, np.where(rows[:, None], 0.0, np.arange(15.0).reshape(5, 3)))


def test_numpys_reductions_of_a_masked_array_trace():
    """``np.sum(x[mask])`` reaches the masked value's NumPy dispatch with NumPy's own function
    (``np.sum`` itself is a substitute while the trace runs)."""
    x = np.array([1.0, -2.0, 3.0, 0.5])
    value, grad = mj.value_and_grad(lambda x: np.sum(x[x > 0]) + np.mean(x[x > 0] ** 2))(x)
    np.testing.assert_allclose(value, np.sum(x[x > 0]) + np.mean(x[x > 0] ** 2), rtol=1e-12)
    np.testing.assert_allclose(grad, np.where(x > 0, 1 + 2 * x / 3, 0), rtol=1e-12)
