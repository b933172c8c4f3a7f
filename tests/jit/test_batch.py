"""One compiled step for every batch size: the leading extent of the data is the symbol B."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import morphjit as mj
from morphjit.util import pytree
from morphjit.jit.callsite import batched_leaves
from morphjit.api.indexing import NUMPY_ARANGE
from morphjit.ir import BATCH_SIZE, Specialize, Sym, evaluate, parse, upper_bound
from support.models import MODELS
from support.strategies import random_programs
from support.paths import TESTS

BATCHED = ["mlp2", "layernorm", "attention", "logistic", "huber_ridge"]
SIZES = [16, 1, 2, 7, 13, 257, 4099, 16]   # 1, primes, large


def reference(fn, args):
    """The reference executor on the call's concrete shapes."""
    return mj.compile_loss(fn, backend="interp", static_shapes=True)(*args)


def assert_same(got, want, rtol):
    np.testing.assert_allclose(got[0], want[0], rtol=rtol)
    for g, w in zip(pytree.flatten(got[1])[0], pytree.flatten(want[1])[0]):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * 1e-3)


@pytest.mark.parametrize("backend", ["numba", "interp"])
@pytest.mark.parametrize("name", BATCHED)
def test_one_program_serves_every_batch_size(name, backend):
    step = mj.compile_loss(MODELS[name](np.float64)[0], backend=backend)
    for n in SIZES:
        fn, args = MODELS[name](np.float64, batch=n)
        assert_same(step(*args), reference(fn, args), rtol=1e-10)
        assert_same(step(*args), reference(fn, args), rtol=1e-10)   # the fast path
    info = step.cache_info()
    # One step for every batch size but 1, which has one of its own (compiler.batched_leaves).
    assert info.misses == 2 and len(info.signatures) == 2, info
    assert sum("[B," in s for s in info.signatures) == 1 and sum("[1," in s for s in info.signatures) >= 1


def test_float32_and_out_at_several_batch_sizes():
    fn, args = MODELS["mlp2"](np.float32)
    step = mj.compile_loss(fn)
    out = {k: np.empty_like(v) for k, v in args[0].items()}
    for n in (5, 64, 3):
        fn, args = MODELS["mlp2"](np.float32, batch=n)
        value, grads = step(*args, out=out)
        assert grads is out
        assert_same((value, grads), reference(fn, args), rtol=2e-5)
    assert step.cache_info().misses == 1


def test_the_program_reads_the_batch_size_at_run_time():
    fn, args = MODELS["logistic"](np.float64)
    step = mj.compile_loss(fn)
    program = step.program(*args)
    source = step.source(*args)
    assert "    B = v" in source and ".shape[0]" in source and "range(B)" in source
    # 1 / B is computed before the loops that use it, never inside one
    lines = [line for line in source.splitlines() if "/ np.float64(B)" in line]
    assert lines and all(line.startswith("    t") and not line.startswith("        ") for line in lines)
    text = str(program)
    assert text.splitlines()[0] == "in v0:f64[] v1:f64[6] v2:f64[B,6] v3:f64[B]"
    assert "fill dtype=f64 shape=() value=B" in text        # the mean divides by B
    assert str(parse(text)) == text


def test_a_program_that_needs_the_concrete_size_is_specialised():
    def grouped(params, x):
        groups = mj.reshape(x @ params["w"], (4, -1))          # four groups of B / 4 rows
        return mj.sum(mj.max(groups, axis=1) ** 2)

    params, rng = {"w": np.linspace(-1, 1, 3)}, np.random.default_rng(0)
    step = mj.compile_loss(grouped)
    for n in (8, 12, 8):
        x = rng.normal(size=(n, 3))
        assert_same(step(params, x), reference(grouped, (params, x)), rtol=1e-12)
    info = step.cache_info()
    assert info.misses == 2 and sorted(info.signatures) == ["f64[3] f64[12,3]", "f64[3] f64[8,3]"]


def test_using_the_batch_size_as_a_number_specialises():
    def per_row(params, x):
        return mj.sum((x @ params["w"]) ** 2) / x.shape[0]

    params, x = {"w": np.ones(3)}, np.arange(12.0).reshape(4, 3)
    step = mj.compile_loss(per_row)
    assert_same(step(params, x), reference(per_row, (params, x)), rtol=1e-12)
    assert step.cache_info().signatures == ("f64[3] f64[4,3]",)


SHAPE_BRANCHES = {
    "equal": lambda x: 0.0 if x.shape[0] == 4 else 1.0,
    "unequal": lambda x: 1.0 if x.shape[0] != 4 else 0.0,
    "tuple": lambda x: 0.0 if x.shape == (4, 3) else 1.0,
    "in": lambda x: 0.0 if 4 in x.shape else 1.0,
    "reflected": lambda x: 0.0 if np.int64(4) == x.shape[0] else 1.0,
    "two polynomials": lambda x: 0.0 if x.shape[0] * x.shape[0] == 2 * x.shape[0] else 1.0,   # B = 2
    "same polynomial": lambda x: 0.0 if x.shape[0] + x.shape[0] == 2 * x.shape[0] else 1.0,
}


@pytest.mark.parametrize("name", sorted(SHAPE_BRANCHES))
def test_a_branch_on_the_batch_size_takes_numpys_side_at_every_size(name):
    branch = SHAPE_BRANCHES[name]

    def loss(params, x):
        return mj.sum((x @ params["w"]) ** 2) * branch(x)

    params, rng = {"w": np.linspace(-1, 1, 3)}, np.random.default_rng(1)
    step = mj.compile_loss(loss)
    for n in (5, 4, 2, 4, 6):
        x = rng.normal(size=(n, 3))
        got = step(params, x)
        assert got[0] == pytest.approx(np.sum((x @ params["w"]) ** 2) * branch(x), rel=1e-12)   # NumPy's
        assert_same(got, reference(loss, (params, x)), rtol=1e-12)
    polymorphic = name == "same polynomial"
    assert (step.cache_info().misses == 1) == polymorphic


def test_an_arange_from_another_start_specialises():
    def tail(params, x):
        return mj.sum(x[np.arange(1, x.shape[0])] @ params["w"])

    params, x = {"w": np.ones(3)}, np.arange(12.0).reshape(4, 3)
    step = mj.compile_loss(tail)
    assert_same(step(params, x), reference(tail, (params, x)), rtol=1e-12)
    assert step.cache_info().signatures == ("f64[3] f64[4,3]",)
    assert np.arange is NUMPY_ARANGE            # NumPy's own again, after a trace that failed


def test_static_shapes_compiles_each_batch_size():
    fn, args = MODELS["mlp2"](np.float64)
    step = mj.compile_loss(fn, static_shapes=True)
    for n in (16, 9):
        fn, args = MODELS["mlp2"](np.float64, batch=n)
        assert_same(step(*args), reference(fn, args), rtol=1e-10)
    assert sorted(step.cache_info().signatures)[0].endswith("f64[16,12] i64[16]")
    assert step.cache_info().misses == 2


def test_data_of_other_leading_extents_stay_concrete():
    def rbf(params, x, centres):
        d2 = mj.sum((x[:, None, :] - centres[None, :, :]) ** 2, axis=-1)
        return mj.mean(mj.exp(-d2) @ params["w"])

    rng = np.random.default_rng(1)
    params, centres = {"w": rng.normal(size=5)}, rng.normal(size=(5, 2))
    step = mj.compile_loss(rbf)
    for n in (7, 30):
        x = rng.normal(size=(n, 2))
        assert_same(step(params, x, centres), reference(rbf, (params, x, centres)), rtol=1e-12)
    assert step.cache_info().signatures == ("f64[5] f64[B,2] f64[5,2]",)


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_disagreeing_batch_sizes_are_refused(backend):
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=64)
    step = mj.compile_loss(fn, backend=backend)
    with pytest.raises(mj.ShapeError, match=r"x has 64 rows but y has 63"):
        step(params, x, y[:63])
    step(params, x, y)
    with pytest.raises(mj.ShapeError, match=r"x has 32 rows but y has 64"):
        step(params, x[:32], y)


def test_the_pool_grows_to_the_largest_batch_and_is_reused():
    fn, args = MODELS["mlp2"](np.float64, batch=64)
    step = mj.compile_loss(fn)
    step(*args)
    [workspace] = step.steps()[0].run.idle
    pool = workspace.pool
    for n in (1, 17, 64):
        step(*MODELS["mlp2"](np.float64, batch=n)[1])
        assert workspace.pool is pool and workspace.pool_batch == 64
    step(*MODELS["mlp2"](np.float64, batch=100)[1])
    assert workspace.pool_batch == 100 and workspace.pool is not pool


CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import morphjit as mj
    sys.path.insert(0, {tests!r})
    from support.models import MODELS
    fn, args = MODELS["mlp2"](np.float64, batch=int(sys.argv[1]))
    step = mj.compile_loss(fn)
    value, _ = step(*args)
    want, _ = mj.compile_loss(fn, backend="interp", static_shapes=True)(*args)
    info = step.cache_info()
    print(json.dumps(dict(value=float(value), want=float(want), disk_loads=info.disk_loads,
                          misses=info.misses)))
""")


@pytest.mark.slow
def test_a_fresh_process_at_a_new_batch_size_loads_from_disk(tmp_path):
    def child(batch):
        env = dict(os.environ, MORPHJIT_CACHE_DIR=str(tmp_path))
        code = CHILD.format(tests=str(TESTS))
        done = subprocess.run([sys.executable, "-c", code, str(batch)], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    cold, warm = child(16), child(37)
    assert cold["disk_loads"] == 0 and warm["disk_loads"] == 1 and warm["misses"] == 1
    for run in (cold, warm):
        assert run["value"] == pytest.approx(run["want"], rel=1e-12)


# ---------------------------------------------------------------------------------------------
# The symbol itself


def test_extent_arithmetic():
    b = BATCH_SIZE
    assert str(784 * b) == "784*B" and str(b * b + 3 * b + 1) == "B**2+3*B+1"
    assert (784 * b) // b == 784 and (784 * b) // 784 == b and b * 0 == 0
    assert 2 * b == b + b and hash(2 * b) == hash(b * 2) and not (2 * b != b + b)
    assert evaluate((b, 784 * b, 3), 5) == (5, 3920, 3)
    assert upper_bound(10 * b, 4 * b + 7) == 10 * b + 7 and upper_bound(3, 5) == 5
    assert Sym.simplify({0: 4}) == 4
    for needs_value in (lambda: b < 3, lambda: int(b), lambda: bool(b), lambda: b - 1,
                        lambda: b // 4, lambda: 1 / b, lambda: range(b), lambda: b == 4, lambda: b != 2,
                        lambda: b * b == b, lambda: 3 in (b, 2), lambda: (b, 3) == (4, 3)):
        with pytest.raises(Specialize):
            needs_value()


# ---------------------------------------------------------------------------------------------
# Random programs: a step morphjit compiled for every batch size must be right at other sizes


def resized(leaves, batched, batch):
    """The leaves with the batched ones cut or tiled along their leading axis to ``batch`` rows."""
    return [np.take(x, np.arange(batch) % x.shape[0], axis=0) if k in batched else x for k, x in enumerate(leaves)]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(random_programs(), st.integers(1, 9))
def test_random_polymorphic_steps_agree_with_the_reference_at_other_batch_sizes(example, batch):
    fn, args = example
    leaves, treedef = pytree.flatten(args)
    batched = batched_leaves(leaves, range(len(pytree.flatten(args[0])[0])))
    assume(batched)                # before compiling: most drawn programs have no batch axis
    step = mj.compile_loss(fn)
    step(*args)
    (signature,) = step.cache_info().signatures
    assume("[B" in signature)
    new_args = pytree.unflatten(treedef, resized(leaves, batched, batch))
    reference = mj.compile_loss(fn, backend="interp", static_shapes=True)
    try:
        got = step(*new_args)
    except IndexError:   # an index array into the batch axis may point past fewer rows
        with pytest.raises(IndexError):
            reference(*new_args)
        return
    assert step.cache_info().misses == 1 + (batch == 1)       # no new compile, but for a batch of one
    want = reference(*new_args)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-9, atol=1e-12)
    for g, w in zip(pytree.flatten(got[1])[0], pytree.flatten(want[1])[0]):
        np.testing.assert_allclose(g, w, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_a_batch_of_one_keeps_numpys_meaning_of_squeeze(backend):
    # At batch 1 NumPy's squeeze() drops the batch axis too, so the sum over axis 0 runs over the
    # features: a step traced for every batch size would sum over the batch instead.
    def loss(w, x):
        return np.sum(np.sum(np.squeeze(x) * w, axis=0) ** 2)

    step = mj.compile_loss(loss, backend=backend)
    w = np.arange(1.0, 4.0)
    for n in (5, 1, 3, 1):
        x = np.linspace(-1, 1, 3 * n).reshape(n, 1, 3)
        value, grad = step(w, x)
        np.testing.assert_allclose(value, loss(w, x), rtol=1e-12)
        np.testing.assert_allclose(grad, reference(loss, (w, x))[1], rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# Reductions without an identity over no rows: NumPy's error, when tracing or when the step runs

NO_IDENTITY = {
    "np.max": lambda z: np.max(z),
    "np.amax axis=0": lambda z: np.amax(z, axis=0),
    "x.max() keepdims": lambda z: z.max(axis=0, keepdims=True),
    "mj.max": lambda z: mj.max(z, axis=(0, 1)),
    "np.min axis=0": lambda z: np.min(z, axis=0),
    "x.min()": lambda z: z.min(),
    "np.ptp": lambda z: np.ptp(z, axis=0),
    "np.argmax": lambda z: np.argmax(z),
    "np.argmin axis=0": lambda z: np.argmin(z, axis=0),
    "x.argmax()": lambda z: z.argmax(),
    "norm ord=-inf": lambda z: np.linalg.norm(z[:, 0], ord=-np.inf),
}


@pytest.mark.parametrize("static_shapes", [False, True])
@pytest.mark.parametrize("backend", ["numba", "interp"])
@pytest.mark.parametrize("name", list(NO_IDENTITY))
def test_a_reduction_without_identity_over_no_rows_raises_numpys_error(name, backend, static_shapes):
    reduce = NO_IDENTITY[name]

    def loss(w, x):
        return np.sum(w * 0.5) + np.sum(reduce(x @ w))

    rng = np.random.default_rng(2)
    w, x, empty = rng.normal(size=(3, 2)), rng.normal(size=(6, 3)), np.zeros((0, 3))
    with pytest.raises(ValueError) as numpy_error:   # mj.max of NumPy arrays computes too, as NumPy would
        loss(w, empty)
    step = mj.compile_loss(loss, backend=backend, static_shapes=static_shapes)
    value, _ = step(w, x)
    assert value == pytest.approx(loss(w, x), rel=1e-12)
    for _ in range(2):   # the slow path, then whatever the compiled step caches
        with pytest.raises(ValueError) as error:
            step(w, empty)
        assert numpy_error.value.args[0] in str(error.value)
        assert "test_batch.py" in str(error.value)   # the user's line: traced, or named by the step
    assert step(w, x[:4])[0] == pytest.approx(loss(w, x[:4]), rel=1e-12)   # the step runs on
    if not static_shapes and "arg" not in name:   # (argmax along the batch specialises)
        assert step.cache_info().misses == 1   # one step, polymorphic, for every call


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_reductions_with_an_identity_over_no_rows_give_numpys_values(backend):
    """Sums, products, a max with initial=, norm(ord=inf) (NumPy's starts from 0) and the stable
    shift inside logsumexp and softmax (SciPy's logsumexp of nothing is -inf) reduce no rows
    without an error."""
    import scipy.special

    def terms(w, x):
        z = x @ w
        return [np.sum(w), np.sum(z), np.prod(z, axis=0).sum(), np.sum(mj.softmax(z, axis=0)),
                np.max(z, axis=1).sum(), np.linalg.norm(z[:, 0], ord=np.inf), np.max(z, initial=-5.0)]

    rng = np.random.default_rng(3)
    w, empty = rng.normal(size=(3, 2)), np.zeros((0, 3))
    step = mj.compile_loss(lambda w, x: sum(terms(w, x)), backend=backend)
    step(w, rng.normal(size=(5, 3)))
    value, grad = step(w, empty)
    assert value == sum(terms(w, empty)) == np.sum(w) + 2.0 - 5.0
    np.testing.assert_array_equal(grad, np.ones((3, 2)))
    logsumexp = mj.compile_loss(lambda w, x: np.sum(w) + np.sum(mj.logsumexp(x @ w, axis=0)), backend=backend)
    logsumexp(w, rng.normal(size=(5, 3)))
    assert logsumexp(w, empty)[0] == np.sum(scipy.special.logsumexp(np.zeros((0, 2)), axis=0)) == -np.inf
