"""Compiled steps called from several threads at once: no spurious errors, the values of a
single-threaded run, and a new signature traced and compiled once however many threads ask; the
same inputs give the same bits whatever workspace, thread or addresses a call gets."""
import threading

import numpy as np
import pytest

import morphjit as mj
from morphjit.util import pytree
from morphjit.runtime.step import Workspace
from support.models import MODELS, deep_mlp
from support.threads import THREADS, run_threads

CALLS = 150
BATCHES = range(1, CALLS + 1)   # more than runtime.VIEWS_KEPT


def batch_order(seed):
    """Batch sizes rising (so that the pool grows often, while other threads use it) with jitter."""
    jitter = np.random.default_rng(seed).integers(-8, 9, CALLS)
    return np.clip(np.arange(1, CALLS + 1) + jitter, 1, CALLS)


@pytest.mark.parametrize("with_out", [False, True])
def test_concurrent_calls_with_different_batch_sizes_agree_with_one_thread(with_out):
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=max(BATCHES))
    step = mj.compile_loss(fn)
    expected = {n: step(params, x[:n], y[:n]) for n in BATCHES}

    def work(i):
        out = {k: np.empty_like(v) for k, v in params.items()}
        for n in batch_order(i):
            loss, grads = step(params, x[:n], y[:n], out=out) if with_out else step(params, x[:n], y[:n])
            assert loss == expected[n][0]
            for k in params:
                np.testing.assert_array_equal(grads[k], expected[n][1][k])

    run_threads(work)
    assert step.cache_info().misses == 1 + (1 in BATCHES)   # a batch of one has a step of its own


def test_concurrent_training_steps_agree_with_one_thread():
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=max(BATCHES))
    step = mj.train_step(fn, mj.optim.adam(1e-2))

    def train(seed):
        """Each thread trains its own copy of the parameters on its own order of batch sizes."""
        p = {k: v.copy() for k, v in params.items()}
        state = step.init(p)
        losses = [step(p, state, x[:n], y[:n]) for n in batch_order(seed)]
        return losses, p

    expected = [train(i) for i in range(THREADS)]
    got = [None] * THREADS
    run_threads(lambda i: got.__setitem__(i, train(i)))
    for (losses, p), (want_losses, want_p) in zip(got, expected):
        assert losses == want_losses
        for k in params:
            np.testing.assert_array_equal(p[k], want_p[k])


def test_a_step_keeps_a_workspace_per_concurrent_call_not_per_call():
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=16)
    step = mj.compile_loss(fn)
    for _ in range(5):
        step(params, x, y)
    assert len(step.steps()[0].run.idle) == 1
    run_threads(lambda i: [step(params, x, y) for _ in range(50)])
    assert 1 <= len(step.steps()[0].run.idle) <= THREADS


def test_a_call_can_run_while_another_grows_the_pool():
    """A second call (another thread, a larger batch) runs to its end while the first call's
    kernel runs: it borrows a workspace of its own instead of waiting or resizing the first's."""
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=64)
    reference = mj.compile_loss(fn)
    step = mj.compile_loss(fn)
    step(params, x[:8], y[:8])
    native = step.steps()[0].run
    kernel, inner, started = native.call, [], []

    def call_with_another_inside(*args):
        if not started:
            started.append(True)
            thread = threading.Thread(target=lambda: inner.append(step(params, x, y)))
            thread.start()
            thread.join(timeout=30)
            assert inner, "the second call did not finish while the first ran"
        kernel(*args)

    native.call = call_with_another_inside
    for got, n in [(step(params, x[:8], y[:8]), 8), (inner[0], 64)]:
        want = reference(params, x[:n], y[:n])
        assert got[0] == want[0]
        for k in params:
            np.testing.assert_array_equal(got[1][k], want[1][k])
    assert sorted(w.pool_batch for w in native.idle) == [8, 64]


def counting_traces(fn):
    """``fn`` and a list that grows by one each time it runs (each trace)."""
    traces = []

    def counted(*args):
        traces.append(threading.get_ident())
        return fn(*args)

    counted.__name__ = fn.__name__
    return counted, traces


def test_a_new_signature_called_from_eight_threads_is_traced_once():
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=16)
    counted, traces = counting_traces(fn)
    step = mj.compile_loss(counted)
    results = [None] * 8
    run_threads(lambda i: results.__setitem__(i, step(params, x, y)), n=8)
    assert len(traces) == 2 and len(set(traces)) == 1 and step.cache_info().misses == 1   # one compile: two traces (frozen.py), one thread
    assert all(r[0] == results[0][0] for r in results)


def test_a_new_training_signature_called_from_eight_threads_is_traced_once():
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=16)
    counted, traces = counting_traces(fn)
    step = mj.train_step(counted, mj.optim.sgd(0.1))
    copies = [{k: v.copy() for k, v in params.items()} for _ in range(8)]
    states = [step.init(p) for p in copies]
    losses = [None] * 8
    run_threads(lambda i: losses.__setitem__(i, step(copies[i], states[i], x, y)), n=8)
    assert len(traces) == 2 and len(set(traces)) == 1 and step.cache_info().misses == 1   # one compile: two traces (frozen.py), one thread
    assert len(set(losses)) == 1


# ---------------------------------------------------------------- same inputs, same bits

def transcendental(dtype, batch):
    """tanh, exp, log and sin in fused loops over a (batch, 5) array."""
    rng = np.random.default_rng(7)
    params = {"a": rng.normal(size=5).astype(dtype), "b": rng.normal(size=5).astype(dtype)}

    def loss(p, x):
        h = mj.tanh(x * p["a"] + p["b"])
        return mj.mean(mj.exp(-h) * mj.log(1 + x * x) + mj.sin(h * p["a"]))
    return loss, (params, rng.normal(size=(batch, 5)).astype(dtype))


def tanh_mlp(dtype, batch):
    return deep_mlp(dtype, batch=batch, sizes=(3, 6, 5, 2))


def bits(result) -> tuple:
    value, grads = result
    return (np.asarray(value).tobytes(),) + tuple(g.tobytes() for g in pytree.flatten(grads)[0])


def laid_out(native, batch: int, order, gap: int) -> Workspace:
    """A workspace whose pool slots lie in one block, in ``order``, ``gap`` bytes apart (slots
    placed close together made LLVM's run-time overlap check fail, and the scalar loop run)."""
    workspace = Workspace(native)
    workspace.fixed_for(batch)
    sizes = [a.nbytes for a in workspace.pool]
    block = np.empty(sum(sizes) + gap * len(sizes) + 64, np.uint8)
    at, pool = -block.ctypes.data % 64, [None] * len(sizes)
    for k in order:
        pool[k] = block[at:at + sizes[k]].view(workspace.pool[k].dtype)
        at += sizes[k] + gap
    workspace.pool, workspace.views = pool, type(workspace.views)()
    workspace.fixed_for(batch)
    return workspace


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("model", [transcendental, tanh_mlp])
def test_the_same_inputs_give_the_same_bits_in_any_workspace(model, dtype):
    fn, _ = model(dtype, 2)
    step = mj.compile_loss(fn, cache=False)
    rng = np.random.default_rng(0)
    for batch in (2, 3, 5, 9, 13):
        _, args = model(dtype, batch)
        first = bits(step(*args))
        native = step.steps()[0].run
        got = set()
        for _ in range(25):
            native.idle[:] = [laid_out(native, batch, rng.permutation(len(native.slots)), int(rng.choice([0, 16, 48])))]
            got.add(bits(step(*args)))
        assert got == {first}, f"batch {batch}: {len(got)} distinct results"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_data_at_any_offset_and_out_arrays_next_to_it_give_the_same_bits(dtype):
    fn, (params, x) = transcendental(dtype, 9)
    step = mj.compile_loss(fn, cache=False)
    first = bits(step(params, x))
    got = set()
    for start in range(8):   # every alignment of the data, in elements
        block = np.empty(x.size + 2 * 5 + start + 4, dtype)
        shifted = block[start:start + x.size].reshape(x.shape)
        shifted[...] = x
        after = start + x.size + (start % 3)   # the gradients right after the data, or a few apart
        out = {"a": block[after:after + 5], "b": block[after + 5:after + 10]}
        got.add(bits(step(params, shifted, out=out)))
        got.add(bits(step(params, shifted)))
    assert got == {first}


def test_a_thread_storm_with_fresh_workspaces_gives_the_bits_of_one_call():
    fn, args = transcendental(np.float64, 5)
    step = mj.compile_loss(fn, cache=False)
    first = bits(step(*args))
    results = [set() for _ in range(THREADS)]

    def work(i):
        rng, padding = np.random.default_rng(i), []
        for _ in range(60):
            padding.append(np.empty(int(rng.integers(1, 400)), np.uint8))   # moves the next pools
            step.steps()[0].run.idle.clear()
            results[i].add(bits(step(*args)))

    run_threads(work)
    assert set().union(*results) == {first}
