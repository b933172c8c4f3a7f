"""Compiled steps called from several threads at once: no spurious errors, the values of a
single-threaded run, and a new signature traced and compiled once however many threads ask."""
import sys
import threading

import numpy as np
import pytest

import morphjit as mj
from models import MODELS

THREADS, CALLS = 4, 150
BATCHES = range(1, CALLS + 1)   # more than runtime.VIEWS_KEPT


def run_threads(work, n=THREADS):
    """Run ``work(i)`` in ``n`` threads released together, switching threads as often as the
    interpreter can (so that races show); re-raise the first exception."""
    start, errors = threading.Barrier(n), []

    def body(i):
        try:
            start.wait()
            work(i)
        except BaseException as e:   # noqa: BLE001 (collected and re-raised in the main thread)
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    if errors:
        raise errors[0]


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
