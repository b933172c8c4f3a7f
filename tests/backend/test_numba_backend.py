"""The numba backend against the reference executor: every op, the models, random programs."""
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import morphjit as mj
from morphjit.util import pytree
from morphjit.api.custom import is_user_op
from morphjit.ir import LINALG, OPS

from support.models import MODELS, deep_mlp
from support.strategies import random_programs

TOL = {np.float64: dict(rtol=1e-9, atol=1e-10), np.float32: dict(rtol=2e-4, atol=2e-5)}


def assert_backends_agree(fn, args, dtype=np.float64, argnums=0):
    compiled = mj.compile_loss(fn, argnums=argnums)
    reference = mj.compile_loss(fn, argnums=argnums, backend="interp")
    ref_value, ref_grads = reference(*args)
    for _ in range(2):  # the first call compiles, the second takes the generated fast path
        value, grads = compiled(*args)
        assert type(value) is type(ref_value)
        np.testing.assert_allclose(value, ref_value, **TOL[dtype])
        assert pytree.flatten(grads)[1] == pytree.flatten(ref_grads)[1]
        for g, r in zip(pytree.flatten(grads)[0], pytree.flatten(ref_grads)[0]):
            assert g.dtype == r.dtype and g.shape == r.shape
            np.testing.assert_allclose(g, r, **TOL[dtype])
    assert compiled.cache_info().hits == 1
    return compiled


def every_op(p, labels, mask):
    """One loss that uses every op of the table (so one compile covers them all)."""
    x, y, w = p["x"], p["y"], p["w"]
    pos = mj.exp(x * 0.3)
    terms = [
        -x, mj.exp(x), mj.log(pos), mj.log1p(pos), mj.sqrt(pos), mj.abs(x), mj.sign(x) * x, mj.sin(x),
        mj.cos(x), mj.tanh(x), mj.sigmoid(x), mj.relu(x), mj.square(x), (x > 0).astype(x.dtype) * y,
        x + y, x - y, x * y, x / (pos + 1), pos ** y, mj.maximum(x, y), mj.minimum(x, y),
        mj.where(mask, x, y), mj.clip(x, -0.5, 0.5),
        mj.where((x < y) & (x <= 0.1) | ~(x >= y) & (x == x) & (x != 2.0), x, 0.0),
    ]
    loss = sum(mj.sum(t * (i + 1) * 0.01) for i, t in enumerate(terms))
    loss = loss + mj.sum(x.max(axis=1)) + mj.sum(x.min(axis=0)) + mj.sum(mj.sum(x, axis=0, keepdims=True) * y)
    z = mj.concatenate([x[:, ::2], x[::-1, 1::2]], axis=1)
    loss = loss + mj.sum(z * y) + mj.sum(mj.broadcast_to(w[None, :3], (4, 3)) * x.T[:3, :].T) + x[1, 2]
    logits = x @ w[:, None] + mj.expand_dims(y[:, 0], 1)
    loss = loss + mj.sum(mj.logsumexp(x, axis=1)) + mj.sum(mj.softmax(x, axis=0) * y)
    loss = loss + mj.sum(mj.log_softmax(x) * y) + mj.mean(mj.softmax_cross_entropy(x * 2.0, labels))
    loss = loss + mj.sum(mj.one_hot(labels, 6, x.dtype) * y) + mj.sum(logits) * 0.1
    loss = loss + mj.sum(mj.tanh(x[:, labels]) * y[:, :4]) + mj.sum(x[np.array([3, 0, 3, -1]), labels[::-1]]) + mj.sum(x.T[labels, 1:3])
    loss = loss + mj.sum(mj.reshape(x, (2, 12)).astype(np.float32).astype(x.dtype) ** 2) * 0.01
    loss = loss + mj.sum(np.take_along_axis(x, labels[:, None], axis=1) * y[:, :1])   # an iota
    written = mj.exp(x)
    written[1:3, ::2] = y[:2, :3] * 2.0                 # update_slice
    written[labels[::-1] % 4] = mj.tanh(y)              # scatter, repeated rows: the last wins
    loss = loss + mj.sum(written * y)
    return loss + sum(mj.sum(t) * 0.01 for t in _extended_terms(x, y, pos))


def _extended_terms(x, y, pos):
    """The op families of numpy_ext, special, numpy_reduce, einsum and custom."""
    unit = mj.tanh(x) * 0.9
    return [mj.expm1(x), mj.log2(pos), mj.log10(pos), mj.exp2(x), mj.sinh(x), mj.cosh(x), mj.tan(unit),
            mj.arcsin(unit), mj.arccos(unit), mj.arctan(x), mj.arcsinh(x), mj.arccosh(pos + 1.0), mj.arctanh(unit),
            mj.cbrt(x), mj.fabs(x), mj.rint(x * 3), mj.floor(x * 3), mj.ceil(x * 3), mj.trunc(x * 3),
            mj.hypot(x, y), mj.arctan2(x, y), mj.logaddexp(x, y), mj.logaddexp2(x, y), mj.copysign(x, y),
            x % (pos + 0.5), mj.fmod(x, pos + 0.5), x // (pos + 0.5), mj.heaviside(x, 0.5),
            mj.isnan(x / x) * x, mj.isinf(1 / x) * x, mj.isfinite(x) * x, mj.erf(x), mj.erfc(x), mj.gammaln(pos),
            mj.erfinv(unit), mj.digamma(pos), mj.xlogy(pos, pos + 0.5), mj.xlog1py(pos, unit), mj.entr(pos),
            mj.prod(pos, axis=0), mj.diagonal(x) * y[0, :4],
            mj.stop_gradient(x) * x,
            mj.grad(lambda z: mj.sum(mj.sin(z) * y))(x) * x,     # a derivative inside: at an identity point
            mj.jvp(lambda z: mj.tanh(z) * y, (x,), (y,))[1],      # forward mode: reverse mode transposed
            mj.gamma(pos), mj.beta(pos, pos + 0.5), mj.betaln(pos, pos + 0.5), mj.betainc(1.5, 2.0, unit * 0.5 + 0.5),
            mj.gammainc(1.5, pos), mj.gammaincc(1.5, pos), mj.i0(x), mj.i1(x), mj.iv(1.5, pos), mj.j0(x), mj.j1(x),
            mj.y0(pos), mj.y1(pos), mj.kv(0.5, pos), mj.polygamma(2, pos), mj.betaincc(1.5, 2.0, unit * 0.5 + 0.5),
            mj.stdtr(3.0, x)]


def every_op_args(dtype):
    rng = np.random.default_rng(7)
    params = {"x": rng.normal(size=(4, 6)), "y": rng.normal(size=(4, 6)), "w": rng.normal(size=6)}
    params = {k: v.astype(dtype) for k, v in params.items()}
    return params, rng.integers(0, 6, 4), rng.random((4, 6)) < 0.5


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_op_agrees_with_reference(dtype):
    compiled = assert_backends_agree(every_op, every_op_args(dtype), dtype)
    program = compiled.program(*every_op_args(dtype))
    used = {b.op for b in program.bindings} | {"matmul", "transpose", "broadcast_to", "fill"}
    used |= {name for name, op in OPS.items() if op.kind == LINALG}   # one program in test_linalg.py
    used |= {"random", "check_parameter"}   # a draw and the check of a traced parameter of one: test_random.py
    used |= {"window", "unwindow", "window_max"}                        # programs in test_conv.py
    used |= {"branch_gate"}   # tests of traced values, on both backends: tests/tracing/test_branches.py
    assert set(OPS) - used - set(filter(is_user_op, OPS)) == set(), "an op is not exercised"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_agree_with_reference(name, dtype):
    fn, args = MODELS[name](dtype)
    assert_backends_agree(fn, args, dtype)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs())
def test_random_programs_agree_with_reference(example):
    fn, args = example
    assert_backends_agree(fn, args)


def test_nan_in_data_reaches_the_loss():
    fn, (params, x, y) = MODELS["mlp2"](np.float64)
    step = mj.compile_loss(fn)
    x = x.copy()
    x[3, 1] = np.nan
    value, grads = step(params, x, y)
    assert np.isnan(value)
    assert np.isnan(grads["W1"]).any()


def test_inputs_are_not_modified_and_outputs_are_fresh():
    fn, (params, x, y) = MODELS["mlp2"](np.float64)
    before = {k: v.copy() for k, v in params.items()}, x.copy(), y.copy()
    step = mj.compile_loss(fn)
    _, first = step(params, x, y)
    snapshot = {k: v.copy() for k, v in first.items()}
    step(params, x, y)
    for k in params:
        np.testing.assert_array_equal(params[k], before[0][k])
        np.testing.assert_array_equal(first[k], snapshot[k])  # a later call does not reuse returned arrays
    np.testing.assert_array_equal(x, before[1])
    np.testing.assert_array_equal(y, before[2])


def test_non_contiguous_and_python_scalar_arguments():
    def loss(w, x, scale):
        return mj.sum((x @ w) ** 2) * scale

    rng = np.random.default_rng(0)
    w, x = rng.normal(size=(3, 2)), rng.normal(size=(6, 8))[:, ::2][:, :3]
    assert not x.flags.c_contiguous
    assert_backends_agree(loss, (w, x, 0.5))


def test_generated_source_is_deterministic():
    fn, args = MODELS["mlp2"](np.float64)
    sources = {mj.compile_loss(fn).source(*args) for _ in range(2)}
    assert len(sources) == 1
    (source,) = sources
    assert source.startswith("# morphjit step for program 'loss'")
    assert "lapack.gemm(" in source and ".T" in source


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_out_receives_the_gradients(backend):
    fn, (params, x, y) = MODELS["mlp2"](np.float64)
    step = mj.compile_loss(fn, backend=backend)
    value, grads = step(params, x, y)
    out = {k: np.full_like(v, np.nan) for k, v in params.items()}
    for batch in (len(x), 3, len(x)):   # the fast path after the first call, at any batch size
        out_value, returned = step(params, x[:batch], y[:batch], out=out)
        want_value, want = step(params, x[:batch], y[:batch])
        assert returned is out and out_value == want_value
        for k in params:
            np.testing.assert_array_equal(out[k], want[k])
            out[k][...] = np.nan
    assert step.cache_info().misses == 1


EXTREMA_OF_EXPRESSIONS = {
    "min": lambda p: mj.sum(p * (p + 1.3)) + mj.min((p + 1.3) * 1.581),
    "max over an axis": lambda p: mj.sum(mj.tanh(p) * p) + mj.sum(mj.max(mj.tanh(p) * 0.7 + 0.2, axis=-1)),
    "min beside a remainder": lambda p: (mj.sum(mj.remainder(mj.sigmoid(p) + 0.5, mj.exp(mj.tanh(p)) + 1.3176))
                                         + mj.min((mj.exp(mj.tanh(p)) + 1.3176) * 1.581)),
}


@pytest.mark.parametrize("shape", [(9,), (1, 3, 3), (4, 5)])
@pytest.mark.parametrize("name", list(EXTREMA_OF_EXPRESSIONS))
def test_the_gradient_of_an_extremum_finds_the_elements_that_attain_it(name, shape):
    # The gradient compares each element with the stored max or min. The element recomputed in
    # another loop, under fast-math, may round differently and match none: 0/0 gradients.
    p = np.linspace(-1.5, 1.2, np.prod(shape)).reshape(shape)
    grads = assert_backends_agree(EXTREMA_OF_EXPRESSIONS[name], (p,))(p)[1]
    assert np.isfinite(grads).all()


def unpickled(tree):
    """``tree`` after a pickle round trip: equal arrays whose dtypes are copies, not NumPy's own
    objects (as multiprocessing, joblib and Dask's transfers hand them over)."""
    copy = pickle.loads(pickle.dumps(tree))
    assert all(a.dtype is not b.dtype for a, b in zip(pytree.flatten(copy)[0], pytree.flatten(tree)[0]))
    return copy


def no_slow_path(*args):
    raise AssertionError("the call left the fast path")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_unpickled_arrays_take_the_fast_path(dtype, monkeypatch):
    fn, (params, x, y) = MODELS["mlp2"](dtype)
    loss, forward = mj.compile_loss(fn), mj.compile(fn)
    train = mj.train_step(fn, mj.optim.adam(0.01))
    value, grads = loss(params, x, y)
    loss(params, x, y, out={k: np.empty_like(v) for k, v in params.items()})
    forward(params, x, y)
    trained, state = {k: v.copy() for k, v in params.items()}, train.init(params)
    train(trained, state, x, y)
    trained_copy, state_copy = unpickled((trained, state))
    monkeypatch.setattr(loss, "_step", no_slow_path)
    monkeypatch.setattr(forward, "_step", no_slow_path)
    monkeypatch.setattr(train, "_checked_call", no_slow_path)
    again, again_grads = loss(*unpickled((params, x, y)))
    assert again == value and all(np.array_equal(again_grads[k], grads[k]) for k in params)
    copied_dtype = {k: np.empty(v.shape, unpickled(v).dtype) for k, v in params.items()}   # owns its memory
    loss(*unpickled((params, x, y)), out=copied_dtype)
    assert all(np.array_equal(copied_dtype[k], grads[k]) for k in params)
    assert forward(*unpickled((params, x, y))) == value
    assert train(trained_copy, state_copy, *unpickled((x, y))) == train(trained, state, x, y)
    assert all(np.array_equal(trained_copy[k], trained[k]) for k in params)


def test_out_is_checked():
    fn, (params, x, y) = MODELS["mlp2"](np.float64)
    step = mj.compile_loss(fn)
    step(params, x, y, out={k: np.empty_like(v) for k, v in params.items()})   # fast path from here on
    bad_shape = {k: np.zeros(v.shape + (1,)) for k, v in params.items()}
    with pytest.raises(mj.DtypeError, match=r"out\['W1'\] must be a writeable C-contiguous float64 array"):
        step(params, x, y, out=bad_shape)
    with pytest.raises(mj.TracingError, match="structure of the gradients"):
        step(params, x, y, out=[np.zeros(3)])
    with pytest.raises(mj.TracingError, match=r"out\['W1'\] shares memory with params\['W1'\], an argument"):
        step(params, x, y, out=dict(params))


def test_fast_path_covers_every_tree_and_falls_back_on_mismatch():
    from collections import namedtuple

    Layer = namedtuple("Layer", "w b")

    def loss(params, x, scale):
        (layer, extra), c = params["layers"], params["c"]
        return mj.sum(mj.tanh(x @ layer.w + layer.b) * extra[0]) * scale + c * c

    rng = np.random.default_rng(3)
    params = {"layers": (Layer(rng.normal(size=(3, 2)), rng.normal(size=2)), [rng.normal(size=2)]),
              "c": np.asarray(0.5)}
    x = rng.normal(size=(4, 3))
    step = mj.compile_loss(loss)
    reference = mj.compile_loss(loss, backend="interp")
    calls = [(params, x, 2.0), (params, x, 3.0), (params, np.asfortranarray(x), 2.0),
             (params, x[:2], 2.0), (params, x.astype(np.float32), 2.0)]
    for args in calls:
        for _ in range(2):  # the second call of a signature takes the fast path
            value, grads = step(*args)
            ref_value, ref_grads = reference(*args)
            np.testing.assert_allclose(value, ref_value, rtol=1e-6)
            assert type(grads["layers"][0]) is Layer and isinstance(grads["layers"][1], list)
            assert grads["c"].shape == () and grads["c"].dtype == np.float64
            for g, r in zip(pytree.flatten(grads)[0], pytree.flatten(ref_grads)[0]):
                np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-9)
    info = step.cache_info()
    # the scale's value and a new batch size need no new step; F order does (NumPy's results keep
    # it, which decides whether a reshape is a view: jit.callsite.layout_tag), as does float32
    assert info.misses == 3 and info.hits == 7
    with pytest.raises(mj.DtypeError):
        step({"layers": params["layers"], "c": np.asarray(1)}, x, 2.0)  # an int leaf is refused, not fast-pathed


def test_signatures_differing_only_in_unused_inputs():
    def loss(p, unused):
        return mj.sum(mj.log_softmax(p, axis=-1))

    step = mj.compile_loss(loss)
    p = np.array([[0.9, -0.2]])
    for unused in (np.float64(1.0), np.float32(1.0), np.float64(2.0)):
        value, grad = step(p, unused)
        np.testing.assert_allclose(grad, 1 - 2 * np.exp(p - np.log(np.exp(p).sum())), rtol=1e-12)
    assert step.cache_info().misses == 2


@pytest.mark.parametrize("bad", [-1, 5])
def test_out_of_range_labels_are_refused(bad):
    fn, (params, x, y) = MODELS["mlp2"](np.float64)
    y = y.copy()
    y[2] = bad
    for backend in ("numba", "interp"):
        with pytest.raises(ValueError, match=r"labels must lie in \[0, 5\)"):
            mj.compile_loss(fn, backend=backend)(params, x, y)


def test_repeated_nests_become_one_shared_kernel():
    fn, args = deep_mlp(np.float64, sizes=(12, 16, 16, 16, 5), activation=mj.relu, loss="sce", batch=8)
    compiled = assert_backends_agree(fn, args)
    source = compiled.source(*args)
    # k0 is the first layer's GEMM, k1 the bias and relu after it: one kernel, three layers
    assert source.count("k1 = kernels.load(") == 1 and source.count("    k1(") == 3


def test_empty_batch_and_scalar_parameters():
    def loss(w, x, c):
        return mj.mean(x @ w) + (c - 3.0) ** 2

    for x in (np.ones((2, 3)), np.ones((0, 3))):  # the mean of nothing is NaN, as in NumPy
        assert_backends_agree(loss, (np.ones(3), x, np.asarray(1.0)), argnums=(0, 2))
    value, (gw, gc) = mj.compile_loss(loss, argnums=(0, 2))(np.ones(3), np.ones((0, 3)), np.asarray(1.0))
    assert np.isnan(value) and gw.shape == (3,) and gc.shape == () and gc == -4.0


def test_calls_from_several_threads_agree_with_sequential_calls():
    from concurrent.futures import ThreadPoolExecutor

    fn, (params, x, y) = MODELS["mlp2"](np.float64)
    step = mj.compile_loss(fn)
    rng = np.random.default_rng(11)
    batches = [(rng.normal(size=x.shape), rng.integers(0, 5, len(y))) for _ in range(16)]
    expected = [step(params, bx, by) for bx, by in batches]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda b: step(params, *b), batches * 40))
    for (value, grads), (ref_value, ref_grads) in zip(results, expected * 8):
        assert value == ref_value
        for k in grads:
            np.testing.assert_array_equal(grads[k], ref_grads[k])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_short_rows_exponentiated_as_one_block_agree_with_numpy(dtype):
    # 10 classes (under selection.SHORT_ROW): the exponentials of softmax and log_softmax run as
    # one flat loop over the batch's block; the batch size stays symbolic.
    def loss(w, x, y):
        z = x @ w
        return mj.sum(mj.softmax(z, axis=1) * y) + mj.mean(mj.log_softmax(z + 1.0, axis=1) * y)

    rng = np.random.default_rng(3)
    w = rng.normal(size=(5, 10)).astype(dtype)
    step = mj.compile_loss(loss, cache=False)
    for batch in (7, 33):
        x, y = rng.normal(size=(batch, 5)).astype(dtype), rng.normal(size=(batch, 10)).astype(dtype)
        value, grad = step(w, x, y)
        z = x.astype(np.float64) @ w
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        expected = np.sum(p * y) + np.mean(np.log(p) * y)
        gz = p * (y - np.sum(p * y, 1, keepdims=True)) + (y - p * y.sum(1, keepdims=True)) / y.size
        rtol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(value, expected, rtol=rtol)
        np.testing.assert_allclose(grad, x.T @ gz, rtol=rtol, atol=rtol * np.abs(x.T @ gz).max())
    assert "nest over [10*B]" in str(step.steps()[0].plan)


# ---------------------------------------------------------------------------------------------
# Constants (arrays the loss reads from a global or a closure) of every memory layout

LAYOUTS = ("C", "F", "transposed", "negative", "steps", "broadcast")


def laid_out(a: np.ndarray, layout: str) -> np.ndarray:
    """An array equal to ``a`` (for "broadcast": to ``broadcastable(a)``) held in ``layout``: a
    Fortran-ordered copy, a transposed view, a view with negative strides, a view taking every
    other element of a larger array, a ``broadcast_to`` view with zero strides. A 0-d array is
    a view into a larger one (an offset, no strides)."""
    if a.ndim == 0:
        return np.stack([a - 1, a])[1:].reshape(()) if layout != "C" else a.copy()
    if layout == "F":
        return np.asfortranarray(a)
    if layout == "transposed":
        return np.ascontiguousarray(a.transpose()).transpose()
    if layout == "negative":
        return np.flip(np.flip(a).copy())
    if layout == "steps":
        big = np.zeros(tuple(2 * n + 1 for n in a.shape), a.dtype)
        big[tuple(slice(1, None, 2) for _ in a.shape)] = a
        return big[tuple(slice(1, None, 2) for _ in a.shape)]
    if layout == "broadcast":
        return np.broadcast_to(broadcastable(a)[(slice(None),) * (a.ndim - 1) + (slice(0, 1),)], a.shape)
    return a.copy()


def broadcastable(a: np.ndarray) -> np.ndarray:
    """``a`` with its last axis filled with its first column, so that a view with a zero stride
    along it holds the same values."""
    return np.broadcast_to(a[..., :1], a.shape).copy() if a.ndim else a


def test_laid_out_arrays_are_what_they_say():
    a = np.arange(24.0).reshape(2, 3, 4)
    for layout in LAYOUTS:
        b = laid_out(a, layout)
        np.testing.assert_array_equal(b, broadcastable(a) if layout == "broadcast" else a)
        assert b.flags.c_contiguous == (layout == "C"), layout
    assert laid_out(a, "broadcast").strides[-1] == 0 and min(laid_out(a, "negative").strides) < 0
    zero_d = laid_out(np.array(2.5), "steps")
    assert zero_d.shape == () and zero_d == 2.5 and zero_d.base is not None


CONTRACTIONS = {   # ns: NumPy for the compiled loss (dispatched on tracers), autograd.numpy for the oracle
    "matmul .T": lambda ns, x, W: ns.sum((x @ W.T) ** 2),
    "einsum": lambda ns, x, W: ns.sum(ns.einsum("bi,ji->bj", x, W) ** 2),
    "inner": lambda ns, x, W: ns.sum(ns.inner(x, W) ** 2),
    "tensordot": lambda ns, x, W: ns.sum(ns.tensordot(x, W, axes=([1], [1])) ** 2),
    "dot .T": lambda ns, x, W: ns.sum(ns.dot(x, W.T) ** 2),
    "matmul": lambda ns, x, W: ns.sum(ns.tanh(W @ x.T)),
    "elementwise": lambda ns, x, W: ns.sum(x * W[:1] + ns.sin(W[1:2] * x)),
}


@pytest.mark.parametrize("backend", ["numba", "interp"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", sorted(CONTRACTIONS))
def test_a_constant_of_any_layout_reads_as_numpy_does(name, layout, backend):
    import autograd
    import autograd.numpy as anp

    rng = np.random.default_rng(12)
    x = rng.standard_normal((5, 3))
    W = laid_out(broadcastable(rng.standard_normal((4, 3))), layout)
    fn = CONTRACTIONS[name]
    value, grad = mj.compile_loss(lambda x: fn(np, x, W), backend=backend)(x)
    np.testing.assert_allclose(value, fn(np, x, W), rtol=1e-12)
    np.testing.assert_allclose(grad, autograd.grad(lambda x: fn(anp, x, W))(x), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_permuted_fortran_zero_d_and_empty_constants(backend):
    rng = np.random.default_rng(13)
    T = rng.standard_normal((2, 3, 4))
    permuted, fortran = T.transpose(2, 0, 1), np.asfortranarray(rng.standard_normal((4, 2, 3)))
    scale, empty = laid_out(np.array(1.5), "steps"), np.asfortranarray(np.ones((0, 3)))

    def loss(x):   # x: (4, 2, 3)
        joined = np.concatenate([x.reshape(8, 3), empty, np.flip(x, 0).reshape(8, 3)])
        return np.sum(x * permuted) * scale + np.sum(np.tanh(x + fortran)) + np.sum(joined[::3] ** 2)

    x = rng.standard_normal((4, 2, 3))
    value, grad = mj.compile_loss(loss, backend=backend)(x)
    np.testing.assert_allclose(value, loss(x), rtol=1e-12)
    joined_grad = np.zeros((16, 3))
    joined_grad[::3] = 2 * np.concatenate([x.reshape(8, 3), np.flip(x, 0).reshape(8, 3)])[::3]
    expected = permuted * scale + (1 - np.tanh(x + fortran) ** 2) + joined_grad[:8].reshape(x.shape) \
        + np.flip(joined_grad[8:].reshape(x.shape), 0)
    np.testing.assert_allclose(grad, expected, rtol=1e-12, atol=1e-12)


def test_a_program_whose_constants_are_not_c_contiguous_runs_right():
    """A program not made by tracing (a pass, or by hand) may hold a constant in any layout: the
    step reads it as NumPy does."""
    from morphjit.jit.pipeline import BACK, Build, run
    from morphjit.runtime import NativeStep

    rng = np.random.default_rng(14)
    W, x = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
    joint = mj.grad_program(lambda x: np.sum((x @ W.T) ** 2), x)
    [(var, value)] = joint.consts
    for layout in ("F", "transposed", "negative", "steps"):
        program = joint.replace(consts=((var, laid_out(value, layout)),))
        build = run(BACK, Build(program=program, cache=False))
        loss, grad = NativeStep(build.plan, build.kernel, build.arguments)(x)
        np.testing.assert_allclose(loss, np.sum((x @ W.T) ** 2), rtol=1e-12)
        np.testing.assert_allclose(grad, 2 * (x @ W.T) @ W, rtol=1e-12)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs(), st.data())
def test_random_programs_read_constants_of_any_layout_as_arguments(example, data):
    """The same program with its data passed as arguments and captured as constants laid out at
    random (a 0-d scale and an empty array among them) gives the same value and gradients."""
    fn, (params, arrays) = example
    layouts = {k: data.draw(st.sampled_from(LAYOUTS), label=k) for k in sorted(arrays)}
    arrays = {k: broadcastable(a) if layouts[k] == "broadcast" else a for k, a in arrays.items()}
    extra = {"scale": np.array(0.75), "empty": np.ones((0, 2))}
    consts = {k: laid_out(a, layouts.get(k, data.draw(st.sampled_from(LAYOUTS), label=k)))
              for k, a in {**arrays, **extra}.items()}

    def with_extras(params, data):
        return fn(params, data) * data["scale"] + np.sum(np.concatenate([data["empty"], data["empty"]]) ** 2)

    value, grads = mj.compile_loss(with_extras)(params, {**arrays, **extra})
    const_value, const_grads = mj.compile_loss(lambda params: with_extras(params, consts))(params)
    np.testing.assert_allclose(const_value, value, rtol=1e-10, atol=1e-12, err_msg=fn.source)
    for k in grads:
        np.testing.assert_allclose(const_grads[k], grads[k], rtol=1e-9, atol=1e-11, err_msg=fn.source)


def test_the_fast_path_takes_none_in_an_argument():
    def loss(p, data):
        x, w = data
        return mj.sum(p * x) if w is None else mj.sum(p * x * w)

    step, p, x = mj.compile_loss(loss), np.ones(3), np.arange(3.0)
    step(p, (x, None))
    assert step._by_fast_path((p, (x, None)), None) is not None    # the second call's path
    assert step._by_fast_path((p, (x, x)), None) is None           # another structure: another step
    np.testing.assert_allclose(step(p, (x, x))[1], x * x)
