"""mj.dask on a LocalCluster of 2 single-threaded worker processes: the loss and gradients over
chunked data, and data-parallel training, equal the single-process results; lost and restarted
workers and cold worker caches change nothing; version mismatches are refused."""
import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import scipy.optimize

import morphjit as mj

dask = pytest.importorskip("dask", reason="mj.dask needs dask: pip install 'morphjit[dask]'")
da = pytest.importorskip("dask.array", reason="mj.dask needs dask: pip install 'morphjit[dask]'")
distributed = pytest.importorskip("distributed", reason="mj.dask needs distributed: pip install 'morphjit[dask]'")
cloudpickle = pytest.importorskip("cloudpickle")
cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the workers cannot import this file

mjd = mj.dask
from morphjit.integrations import dask_worker as mjw  # noqa: E402 (after the dask checks above)


def logistic(params, x, y):
    """Mean logistic loss with labels in {-1, 1}, plus a penalty that does not depend on the rows."""
    z = x @ params["w"] + params["b"]
    return mj.mean(mj.log1p(mj.exp(-y * z))) + 0.01 * mj.sum(params["w"] ** 2)


def squared_sum(params, x, y):
    return mj.sum((x @ params["w"] + params["b"] - y) ** 2)


@pytest.fixture(scope="module")
def client():
    # A LocalCluster closes for good a worker whose nanny has not brought it back within
    # lost-worker-timeout (15 s); on a loaded machine a killed worker takes longer to restart.
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "10 minutes"}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                     silence_logs=50) as cluster, distributed.Client(cluster) as client:
        yield client


@pytest.fixture
def two_workers(client):
    """The client, with both workers up again after a test that killed or restarted one."""
    yield client
    client.wait_for_workers(2, timeout=60)


def problem(rows=1003, features=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features))
    y = np.sign(x @ rng.normal(size=features) + rng.normal(size=rows))
    params = {"w": rng.normal(size=features) * 0.1, "b": np.array(0.3)}
    return params, x, y


UNEVEN = (100, 300, 3, 600)   # rows per chunk of a 1003-row data set


def assert_same(actual, expected, tol=1e-12):
    for k in expected:
        np.testing.assert_allclose(actual[k], expected[k], rtol=tol, atol=tol, err_msg=k)


def assert_single_process_result(result, fn, params, x, y):
    """``result``, ``(loss, grads)``, is what one process computes on all of ``x``, ``y``."""
    value, grads = result
    expected_value, expected_grads = mj.compile_loss(fn)(params, x, y)
    assert value == pytest.approx(expected_value, rel=1e-12)
    assert_same(grads, expected_grads)


@pytest.mark.slow
def test_import_morphjit_does_not_import_dask():
    code = "import sys, morphjit; assert 'dask' not in sys.modules and 'distributed' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
@pytest.mark.parametrize("fn,reduction,rows_per_call", [(logistic, "mean", None), (squared_sum, "sum", 7),
                                                        (logistic, "mean", 64)])
def test_uneven_chunks_give_the_single_process_result(client, fn, reduction, rows_per_call):
    params, x, y = problem()
    loss = mjd.dataset_loss(fn, da.from_array(x, chunks=(UNEVEN, 5)), da.from_array(y, chunks=250),
                            reduction=reduction, rows_per_call=rows_per_call)
    value, grads = loss(params)
    expected_value, expected_grads = mj.compile_loss(fn)(params, x, y)
    assert value == pytest.approx(expected_value, rel=1e-12, abs=1e-12)
    assert_same(grads, expected_grads)
    assert grads["b"].shape == () and grads["w"].shape == (5,)
    held_x, held_y = loss.arrays()                        # the chunks on the workers, in order
    np.testing.assert_array_equal(held_x.compute(), x)
    np.testing.assert_array_equal(held_y.compute(), y)


@pytest.mark.slow
def test_a_float32_loss_is_added_in_float64(client):
    """Each piece's float32 loss, weighted by its rows, is added in float64, as one process adding
    the same pieces would."""
    params, x, y = problem()
    params = {k: v.astype(np.float32) for k, v in params.items()}
    x, y = x.astype(np.float32), y.astype(np.float32)
    loss = mjd.dataset_loss(logistic, da.from_array(x, chunks=(UNEVEN, 5)), da.from_array(y, chunks=250),
                            rows_per_call=64)
    value, grads = loss(params)
    local, expected = mj.compile_loss(logistic), 0.0
    for first, end in zip(np.cumsum((0,) + UNEVEN), np.cumsum(UNEVEN)):
        for start in range(first, end, 64):
            stop = min(start + 64, end)
            expected += (stop - start) / len(x) * float(local(params, x[start:stop], y[start:stop])[0])
    assert value == pytest.approx(expected, rel=1e-12)
    assert grads["w"].dtype == np.float32


@pytest.mark.slow
def test_chunks_are_spread_evenly_over_the_workers(client):
    params, x, y = problem(rows=1000)
    loss = mjd.dataset_loss(logistic, da.from_array(x, chunks=100), da.from_array(y, chunks=100))
    distributed.wait([block for blocks in loss.blocks for block in blocks])
    where = client.who_has([blocks[0] for blocks in loss.blocks])
    assert sorted(Counter(workers[0] for workers in where.values()).values()) == [5, 5]


def actor_keys(dask_worker):
    return list(dask_worker.state.actors)


def actor_worker(client, actor) -> str:
    """The address of the worker that runs ``actor``."""
    [address] = [worker for worker, keys in client.run(actor_keys).items() if actor.key in keys]
    return address


class Idle:
    """An actor that does nothing: another loss's actor, as far as Dask's placement goes."""


@pytest.mark.slow
def test_each_actor_runs_on_the_worker_holding_its_chunks(client):
    """Dask alone puts an actor on the worker with the fewest actors, here the other one."""
    params, x, y = problem()
    loss = mjd.dataset_loss(logistic, da.from_array(x, chunks=100), da.from_array(y, chunks=100))
    firsts = [loss.blocks[group[0]][0] for group in loss.groups]
    holders = client.who_has(firsts)                  # before an actor elsewhere fetches a copy
    others = sum(len(keys) for keys in client.run(actor_keys).values())    # earlier tests' not yet released
    idle = [client.submit(Idle, actor=True, workers=holders[firsts[0].key][:1], pure=False)
            for _ in range(others + 2)]
    distributed.wait(idle)
    loss(params)
    assert loss.fallbacks == 0
    for first, actor in zip(firsts, loss.residents()):
        assert actor_worker(client, actor) in holders[first.key]


@pytest.mark.slow
def test_each_worker_compiles_at_most_once(client):
    params, x, y = problem()
    loss = mjd.dataset_loss(mj.compile_loss(logistic), da.from_array(x, chunks=(UNEVEN, 5)),
                            da.from_array(y, chunks=(UNEVEN,)))
    def calls():   # the worker's compiled loss is shared with earlier tests of the same function
        return sum(info.hits + info.misses for info in loss.worker_cache_info().values() if info is not None)

    before = calls()
    for scale in (1.0, 2.0, 3.0):
        loss({"w": params["w"] * scale, "b": params["b"]})
    assert calls() - before == 3 * len(UNEVEN)
    infos = [info for info in loss.worker_cache_info().values() if info is not None]
    assert infos and all(info.misses == 1 and len(info.signatures) == 1 for info in infos)


def test_an_actor_spreads_its_chunks_over_the_worker_threads_with_the_same_sum():
    params, x, y = problem()
    chunks = [[x[a:b], y[a:b]] for a, b in zip(np.cumsum((0,) + UNEVEN), np.cumsum(UNEVEN))]
    shipped = mjw.Shipped.of(logistic)
    one_thread = mjw.group_part(shipped, params, 1 / len(x), 64, chunks)
    for threads in (2, 3):
        value, grads = mjw.ResidentChunks(shipped, 1 / len(x), 64, chunks, threads=threads).part(params)
        assert value == one_thread[0] and all(np.array_equal(g, h) for g, h in zip(grads, one_thread[1]))


def worker_backends(token):
    return mjw._compiled[token].backend if token in mjw._compiled else None


@pytest.mark.slow
def test_a_client_that_is_not_the_default_serves_the_calls(client):
    """Dask binds an actor to the client current when it is made: made under the default client,
    the actors of a loss given another one waited forever on their first call."""
    params, x, y = problem()
    with distributed.Client(client.scheduler.address, set_as_default=False) as other:
        loss = mjd.dataset_loss(logistic, da.from_array(x, chunks=(UNEVEN, 5)), da.from_array(y, chunks=250),
                                client=other)
        result = {}
        caller = threading.Thread(target=lambda: result.update(call=loss(params)), daemon=True)
        caller.start()
        caller.join(120)
        assert not caller.is_alive(), "the call did not return in 120 s"
        assert_single_process_result(result["call"], logistic, params, x, y)
        assert loss.fallbacks == 0                        # the actors answered, not the task fallback


def thread_sampled_inside_and_after_unsampled_block():
    """On a worker, in a task: is this thread among those the profiler samples, inside and after
    ``unsampled_by_profiler``?"""
    worker, ident = distributed.get_worker(), threading.get_ident()
    with mjw.unsampled_by_profiler():
        inside = ident in worker.active_threads
    return inside, ident in worker.active_threads


@pytest.mark.slow
def test_an_actor_call_is_left_out_of_the_worker_profiler(client):
    assert client.submit(thread_sampled_inside_and_after_unsampled_block, pure=False).result() == (False, True)


@pytest.mark.slow
def test_an_asynchronous_client_is_refused_with_what_to_do(client):
    params, x, y = problem()

    async def in_the_event_loop():
        async with distributed.Client(client.scheduler.address, asynchronous=True) as async_client:
            for make in (lambda: mjd.dataset_loss(logistic, da.from_array(x), da.from_array(y), client=async_client),
                         lambda: mjd.data_parallel(logistic, mj.optim.sgd(0.1), params, da.from_array(x),
                                                   da.from_array(y), client=async_client)):
                with pytest.raises(ValueError, match="asynchronous=True.*run_in_executor"):
                    make()

    asyncio.run(in_the_event_loop())


def linear(params, x):
    return x @ params["w"] + params["b"]


def logistic_through_a_helper(params, x, y):
    return mj.mean(mj.log1p(mj.exp(-y * linear(params, x))))


@pytest.mark.slow
def test_an_error_on_a_worker_points_at_the_users_file_and_line(client):
    """cloudpickle ships a function's code under the file name ``<dynamic-code>``; the worker gives
    it back its file, so that an error names the user's file, line and source."""
    params, x, y = problem()
    loss = mjd.dataset_loss(logistic_through_a_helper, da.from_array(x, chunks=500), da.from_array(y, chunks=500))
    with pytest.raises(mj.ShapeError) as error:
        loss({"w": np.zeros(4), "b": np.array(0.0)})
    line = linear.__code__.co_firstlineno + 1
    assert f"{__file__}:{line} in linear: return x @ params[\"w\"]" in str(error.value)
    assert "<dynamic-code>" not in str(error.value)


@pytest.mark.slow
def test_first_calls_from_several_threads_make_one_set_of_actors(client, monkeypatch):
    params, x, y = problem()
    loss = mjd.dataset_loss(logistic, da.from_array(x, chunks=(UNEVEN, 5)), da.from_array(y, chunks=250))
    actors, submit = [], client.submit

    def counting_submit(fn, *args, **kwargs):
        if kwargs.get("actor"):
            actors.append(fn)
        return submit(fn, *args, **kwargs)

    monkeypatch.setattr(client, "submit", counting_submit)
    start = threading.Barrier(4)

    def first_call(_):
        start.wait()
        return loss(params)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(first_call, range(4)))
    for result in results:
        assert_single_process_result(result, logistic, params, x, y)
    assert len(actors) == len(loss.groups) and loss.fallbacks == 0


@pytest.mark.slow
def test_compile_options_travel_with_the_loss(client):
    params, x, y = problem()
    loss = mjd.dataset_loss(mj.compile_loss(logistic, backend="interp"), da.from_array(x, chunks=500),
                            da.from_array(y, chunks=500))
    assert_single_process_result(loss(params), logistic, params, x, y)
    assert set(client.run(worker_backends, loss.shipped.token).values()) - {None} == {"interp"}


@pytest.mark.slow
def test_scipy_lbfgs_matches_the_single_process_fit(client):
    params, x, y = problem()
    objective = mjd.dataset_loss(logistic, da.from_array(x, chunks=300), da.from_array(y, chunks=300)
                                 ).scipy_objective(params)
    local = mj.compile_loss(logistic)
    flat = mjd.FlatParams(params)

    def local_objective(v):
        value, grads = local(flat.tree(v), x, y)
        return float(value), flat.vector(grads)

    fit = scipy.optimize.minimize(objective, objective.x0, jac=True, method="L-BFGS-B")
    reference = scipy.optimize.minimize(local_objective, flat.x0, jac=True, method="L-BFGS-B")
    assert fit.success and fit.nit == reference.nit
    np.testing.assert_allclose(fit.x, reference.x, rtol=1e-9, atol=1e-9)
    assert set(objective.params(fit.x)) == {"w", "b"} and objective.params(fit.x)["b"].shape == ()


def test_flat_params_round_trip_keeps_shapes_and_dtypes():
    params = {"W": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array(1.5)}
    flat = mjd.FlatParams(params)
    assert flat.x0.dtype == np.float64 and flat.x0.shape == (7,)
    back = flat.tree(flat.x0)
    assert back["W"].dtype == np.float32 and back["W"].shape == (2, 3) and back["b"].shape == ()
    assert_same(back, params)
    with pytest.raises(ValueError, match="vector of 7 numbers"):
        flat.tree(np.zeros(6))


def kill_a_worker(client, after=0.0):
    """SIGKILL one worker process, ``after`` seconds from now (its nanny starts a new one)."""
    pid = next(iter(client.run(os.getpid).values()))
    threading.Timer(after, os.kill, (pid, signal.SIGKILL)).start()


@pytest.mark.slow
def test_a_worker_killed_mid_call_changes_nothing(two_workers):
    client = two_workers
    params, x, y = problem(rows=12_000, seed=1)
    loss = mjd.dataset_loss(logistic, da.from_array(x, chunks=(1200, 5)), da.from_array(y, chunks=1200),
                            rows_per_call=1)                  # about 0.2 s a call: killed during it
    expected_value, expected_grads = mj.compile_loss(logistic)(params, x, y)
    first = loss(params)
    assert loss.fallbacks == 0 and len(loss.residents()) == 2     # one actor per worker did the call
    kill_a_worker(client, after=0.05)
    for value, grads in (loss(params), loss(params)):         # the actor fails: tasks redo the call
        assert value == first[0] and all(np.array_equal(grads[k], first[1][k]) for k in grads)
    assert loss.fallbacks == 1                                # then new actors serve the calls
    assert value == pytest.approx(expected_value, rel=1e-12)
    assert_same(grads, expected_grads)


def worker_ids(dask_scheduler):
    return {address: worker.server_id for address, worker in dask_scheduler.workers.items()}


def replacement(client, address, timeout=60) -> str:
    """Restart the worker at ``address``; the new worker's address, once the scheduler has
    removed the old one (``restart_workers`` waits for as many workers as before, which a killed
    worker not yet removed still makes)."""
    old = set(client.run_on_scheduler(worker_ids).values())
    client.restart_workers([address])
    deadline = time.monotonic() + timeout
    while True:
        workers = client.run_on_scheduler(worker_ids)
        new = [worker for worker, server_id in workers.items() if server_id not in old]
        if len(workers) == 2 and len(new) == 1:
            return new[0]
        assert time.monotonic() < deadline, f"the restarted worker was not replaced in {timeout} s"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_restarted_worker_loads_the_step_from_its_disk_cache(two_workers):
    client = two_workers
    params, x, y = problem(seed=2)
    loss = mjd.dataset_loss(logistic, da.from_array(x, chunks=100), da.from_array(y, chunks=100))
    loss(params)
    restarted = actor_worker(client, loss.residents()[0])
    new = replacement(client, restarted)
    for _ in range(2):                                        # by tasks, then by new actors
        result = loss(params)
    assert loss.fallbacks == 1
    assert_single_process_result(result, logistic, params, x, y)
    info = loss.worker_cache_info()[new]              # one of the new actors: it held no actor of the loss
    assert info is not None and info.disk_loads, "the restarted worker should have loaded the step from the disk cache"


def set_cache_dir(directory):
    os.environ["MORPHJIT_CACHE_DIR"] = directory


@pytest.mark.slow
def test_a_cold_worker_cache_compiles(client, tmp_path):
    scale = 1 + (time.time_ns() % 997) / 1e4           # a constant no cache has seen: new source

    def scaled(params, x, y):
        return scale * logistic(params, x, y)

    params, x, y = problem(seed=3)
    old = client.run(os.environ.get, "MORPHJIT_CACHE_DIR")
    for k, worker in enumerate(old):                      # an empty cache directory of its own each
        client.run(set_cache_dir, str(tmp_path / str(k)), workers=[worker])
    try:
        loss = mjd.dataset_loss(scaled, da.from_array(x, chunks=300), da.from_array(y, chunks=300))
        result = loss(params)
        entries = client.run(lambda: mj.cache_info().entries)
    finally:
        for worker, directory in old.items():
            client.run(set_cache_dir, directory, workers=[worker])
    assert_single_process_result(result, scaled, params, x, y)
    infos = [info for info in loss.worker_cache_info().values() if info is not None]
    assert infos and all(info.misses == 1 and info.disk_loads == 0 for info in infos)
    assert sum(n >= 1 for n in entries.values()) == len(infos)          # each wrote its own entry


@pytest.mark.slow
def test_version_mismatch_is_refused_with_the_versions(client):
    expected = dict(mjw.versions(), numba="0.0.1")
    with pytest.raises(mjd.VersionMismatch, match=r"numba .* \(client 0\.0\.1\)"):
        mjd.check_versions(client, expected)
    shipped = dataclasses.replace(mjw.Shipped.of(logistic), versions=expected, token="mismatched")
    with pytest.raises(mjd.VersionMismatch, match="install the client's versions"):
        client.submit(mjw.compiled_loss, shipped).result()


@pytest.mark.slow
def test_a_worker_with_other_versions_refuses_the_call(client, monkeypatch):
    params, x, y = problem()
    shipped = dataclasses.replace(mjw.Shipped.of(logistic), versions=dict(mjw.versions(), numpy="0.0.1"),
                                  token="mismatched-call")
    monkeypatch.setattr(mjd.Shipped, "of", classmethod(lambda cls, loss: shipped))
    loss = mjd.dataset_loss(logistic, da.from_array(x, chunks=500), da.from_array(y, chunks=500))
    with pytest.raises(mjd.VersionMismatch, match="install the client's versions"):
        loss(params)


@pytest.mark.slow
def test_bad_data_and_options_are_refused(client):
    params, x, y = problem()
    with pytest.raises(TypeError, match="data argument 1 is a ndarray"):
        mjd.dataset_loss(logistic, da.from_array(x), y)
    with pytest.raises(ValueError, match="1003 rows but data argument 1 has 1000"):
        mjd.dataset_loss(logistic, da.from_array(x), da.from_array(y[:1000]))
    for make in (lambda *data: mjd.dataset_loss(logistic, *data),
                 lambda *data: mjd.data_parallel(logistic, mj.optim.sgd(0.1), params, *data)):
        with pytest.raises(ValueError, match=r"no rows \(data argument 0 has shape \(0, 5\)\)"):
            make(da.from_array(x[:0]), da.from_array(y[:0]))
    with pytest.raises(ValueError, match="reduction must be one of"):
        mjd.dataset_loss(logistic, da.from_array(x), da.from_array(y), reduction="median")
    with pytest.raises(ValueError, match="argnums=0"):
        mjd.dataset_loss(mj.compile_loss(logistic, argnums=(0,)), da.from_array(x), da.from_array(y))


# ---------------------------------------------------------------------------------------------
# Empty chunks, bad arguments, faults on the workers

def penalised_sum(params, x, y):
    """A sum over rows plus a penalty: counted once per chunk, so once more for an empty one."""
    return squared_sum(params, x, y) + mj.sum(params["w"] ** 2)


def with_empty_chunks(array, chunks, empty_at):
    """``array`` as a Dask array of ``chunks`` rows, with an empty chunk before each chunk of
    ``empty_at`` (``len(chunks)``: at the end)."""
    rows = [n for k, n in enumerate(chunks) for n in ((0, n) if k in empty_at else (n,))]
    rows += [0] * (len(chunks) in empty_at)
    return da.from_array(array, chunks=(tuple(rows),) + array.shape[1:])


def chunkwise(fn, reduction, params, x, y, chunks):
    """``(loss, grads)`` computed in this process chunk by chunk: weighted by rows over the total
    (``"mean"``) or added (``"sum"``)."""
    local, value, grads = mj.compile_loss(fn), 0.0, {k: np.zeros_like(v) for k, v in params.items()}
    for start, stop in zip(np.cumsum((0,) + chunks), np.cumsum(chunks)):
        weight = (stop - start) / len(x) if reduction == "mean" else 1.0
        chunk_value, chunk_grads = local(params, x[start:stop], y[start:stop])
        value += weight * float(chunk_value)
        for k in grads:
            grads[k] += weight * chunk_grads[k]
    return value, grads


def assert_close(result, expected, tol=1e-12):
    assert result[0] == pytest.approx(expected[0], rel=tol)
    assert_same(result[1], expected[1], tol)


@pytest.mark.slow
@pytest.mark.parametrize("fn,reduction", [(logistic, "mean"), (penalised_sum, "sum")])
@pytest.mark.parametrize("empty_at", [{1}, {0, 2, 3}])
def test_empty_chunks_contribute_nothing(client, fn, reduction, empty_at):
    """An empty chunk (a filtered dataframe's, a concatenation's) holds nothing to add; weighted by
    its 0 rows, the mean over it (NaN) made the whole loss NaN, and a sum counted the penalty once
    more."""
    params, x, y = problem()
    chunks = (300, 303, 400)
    x_empty = with_empty_chunks(x, chunks, empty_at)
    assert 0 in x_empty.chunks[0]
    loss = mjd.dataset_loss(fn, x_empty, with_empty_chunks(y, (500, 503), empty_at & {1}), reduction=reduction)
    expected = chunkwise(fn, reduction, params, x, y, chunks)
    assert_close(loss(params), expected)
    value, leaves = loss.submit(params).result()                      # the tasks of the fallback
    assert_close((value, dict(zip(sorted(params), leaves))), expected)   # leaves in the order of sorted keys
    objective, flat = loss.scipy_objective(params), mjd.FlatParams(params)
    for scale in (1.0, -2.0):
        value, gradient = objective(scale * objective.x0)
        assert_close((value, flat.tree(gradient)), chunkwise(fn, reduction, flat.tree(scale * flat.x0), x, y, chunks))


@pytest.mark.slow
def test_data_parallel_on_data_with_empty_chunks_equals_one_process(client):
    params, x, y = problem()
    optimizer = mj.optim.sgd(0.1, momentum=0.9)
    trainer = mjd.data_parallel(logistic, optimizer, params, with_empty_chunks(x, (500, 503), {0, 1, 2}),
                                with_empty_chunks(y, (1003,), {1}), batch_size=64)
    losses = trainer.run(3)
    expected, expected_losses = single_process(logistic, optimizer, params, concatenated_minibatches(trainer, x, y, 3))
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-12)
    assert_same(trainer.params, expected)


@pytest.mark.slow
def test_chunks_of_a_filtered_array_emptied_by_the_filter_are_left_out(client):
    """A boolean mask held as a Dask array filters chunk by chunk, as a dataframe's rows are."""
    params, x, y = problem()
    keep = np.ones(len(x), bool)
    keep[300:600] = False                                   # the whole second chunk
    keep[::7] = False
    mask = da.from_array(keep, chunks=300)
    filtered_x, filtered_y = da.from_array(x, chunks=(300, 5))[mask], da.from_array(y, chunks=300)[mask]
    for array in (filtered_x, filtered_y):
        array.compute_chunk_sizes()
    assert filtered_x.chunks[0][1] == 0
    loss = mjd.dataset_loss(logistic, filtered_x, filtered_y)
    assert_single_process_result(loss(params), logistic, params, x[keep], y[keep])


@pytest.mark.slow
def test_data_whose_chunks_are_all_empty_are_refused(client):
    params, x, y = problem()
    empty_x, empty_y = (da.from_array(a[:0], chunks=((0, 0, 0),) + a.shape[1:]) for a in (x, y))
    for make in (lambda: mjd.dataset_loss(logistic, empty_x, empty_y),
                 lambda: mjd.data_parallel(logistic, mj.optim.sgd(0.1), params, empty_x, empty_y)):
        with pytest.raises(ValueError, match=r"no rows \(data argument 0 has shape \(0, 5\)\): every chunk is empty"):
            make()


def unknown_columns(x):
    """``x`` with its second extent unknown, as a dataframe's values are."""
    return x.map_blocks(lambda b: b, chunks=(x.chunks[0], (np.nan,)), dtype=x.dtype)


BAD_DATASET_LOSS_ARGUMENTS = [
    (dict(rows_per_call=-1), ValueError, "rows_per_call must be None or an integer >= 1, got -1"),
    (dict(rows_per_call=0), ValueError, "rows_per_call .* got 0"),
    (dict(rows_per_call=2.5), ValueError, "rows_per_call .* got 2.5"),
    (dict(rows_per_call=True), ValueError, "rows_per_call .* got True"),
    (dict(rows_per_call="64"), ValueError, "rows_per_call .* got '64'"),
    (dict(reduction=["mean"]), ValueError, "reduction must be one of"),
    (dict(client="tcp://127.0.0.1:8786"), TypeError, "client must be a distributed.Client.* got a str"),
]


@pytest.mark.slow
@pytest.mark.parametrize("options,error,message", BAD_DATASET_LOSS_ARGUMENTS)
def test_bad_options_of_dataset_loss_are_refused_naming_them(client, options, error, message):
    _, x, y = problem()
    with pytest.raises(error, match=message):
        mjd.dataset_loss(logistic, da.from_array(x, chunks=500), da.from_array(y, chunks=500), **options)


BAD_DATA = [
    (lambda x, y: (x.astype(np.complex128), y), mj.DtypeError,
     "data argument 0 has dtype complex128; morphjit traces float32, float64, int32, int64 and bool"),
    (lambda x, y: (x, y.astype(np.float16)), mj.DtypeError, "data argument 1 has dtype float16"),
    (lambda x, y: (unknown_columns(x), y), ValueError, r"data argument 0 needs every extent known; got shape \(1003, nan\)"),
    (lambda x, y: (x, da.ma.masked_greater(y, 0)), TypeError, "data argument 1 has chunks of type numpy.ma"),
    (lambda x, y: (x, y.sum()), ValueError, "data argument 1 is 0-dimensional"),
]


@pytest.mark.slow
@pytest.mark.parametrize("bad,error,message", BAD_DATA)
def test_bad_data_are_refused_naming_the_argument(client, bad, error, message):
    params, x, y = problem()
    data = bad(da.from_array(x, chunks=500), da.from_array(y, chunks=500))
    for make in (lambda: mjd.dataset_loss(logistic, *data),
                 lambda: mjd.data_parallel(logistic, mj.optim.sgd(0.1), params, *data)):
        with pytest.raises(error, match=message):
            make()


@pytest.mark.slow
def test_data_chunked_along_the_columns_give_the_single_process_result(client):
    params, x, y = problem()
    loss = mjd.dataset_loss(logistic, da.from_array(x, chunks=(UNEVEN, (2, 3))), da.from_array(y, chunks=250))
    assert_single_process_result(loss(params), logistic, params, x, y)


@pytest.mark.slow
@pytest.mark.parametrize("bad,message", [
    (lambda p: {"w": p["w"].astype(np.int64), "b": p["b"]}, r"params\['w'\] is differentiated but is a int64 array"),
    (lambda p: {"w": p["w"], "b": 0.3}, r"params\['b'\] is differentiated but is a float"),
    (lambda p: {"w": np.ma.masked_array(p["w"]), "b": p["b"]}, r"params\['w'\] is a numpy.ma"),
])
def test_bad_parameters_are_refused_on_the_client_naming_the_leaf(client, bad, message):
    params, x, y = problem()
    loss = mjd.dataset_loss(logistic, da.from_array(x, chunks=500), da.from_array(y, chunks=500))
    for call in (loss, loss.scipy_objective):
        with pytest.raises(mj.DtypeError, match=message):
            call(bad(params))
    assert loss.fallbacks == 0                            # refused before any worker was asked


def outcome_within(seconds, fn, *args):
    """``("result", value)`` or ``("error", exception)`` of ``fn(*args)``, run in a thread that
    must end within ``seconds`` (it does not hang)."""
    outcome = []

    def run():
        try:
            outcome.append(("result", fn(*args)))
        except BaseException as error:   # noqa: B036 (what the call raised, whatever it is)
            outcome.append(("error", error))

    caller = threading.Thread(target=run, daemon=True)
    caller.start()
    caller.join(seconds)
    assert not caller.is_alive(), f"the call did not end within {seconds} s"
    return outcome[0]


class TwoArgumentError(Exception):
    """Pickles, but cannot be unpickled: its one argument, the message, does not fit ``__init__``."""

    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


class UnpicklableError(Exception):
    def __reduce__(self):
        raise TypeError("this error does not pickle")


FAULTS = {"StopIteration": StopIteration, "StopAsyncIteration": StopAsyncIteration,
          "SystemExit": lambda: SystemExit(3), "GeneratorExit": GeneratorExit,
          "TwoArgumentError": lambda: TwoArgumentError(1, 2), "UnpicklableError": lambda: UnpicklableError("x")}


def faulty_chunk_part(name, original):
    def chunk_part(*args):
        raise FAULTS[name]()
    return chunk_part


def faulty_compiled_loss(name, original):
    """A compiled loss that raises on the last, shorter, piece of a chunk (after the others)."""
    def compiled_loss(shipped):
        loss = original(shipped)

        def call(params, *piece):
            if len(piece[0]) < 64:
                raise FAULTS[name]()
            return loss(params, *piece)
        return call
    return compiled_loss


FAULTY = {"chunk_part": faulty_chunk_part, "compiled_loss": faulty_compiled_loss}


def inject_fault(where, name):
    """On a worker: the worker code's function ``where`` raises the fault ``name``; None puts
    the original back."""
    original = vars(mjw).setdefault(f"{where}_without_fault", getattr(mjw, where))
    setattr(mjw, where, original if name is None else FAULTY[where](name, original))


@pytest.fixture
def faulty_workers(two_workers):
    """``inject(where, name)`` makes every worker's ``where`` raise; the workers are mended after."""
    yield lambda where, name: two_workers.run(inject_fault, where, name)
    for where in FAULTY:
        two_workers.run(inject_fault, where, None)


def assert_worker_error(outcome, fault, where):
    """``outcome`` is a ``WorkerError`` telling the fault and the function that raised it."""
    kind, error = outcome
    assert kind == "error" and isinstance(error, mjd.WorkerError), error
    assert f".{fault}" in str(error) and "raised on a worker at " in str(error) and f"in {where}" in str(error)


def assert_fault_raised(outcome, fault, where):
    """``outcome`` is the fault itself, or a ``WorkerError`` telling it (a task's error that
    Dask brings back as it is comes back so)."""
    kind, error = outcome
    assert kind == "error", error
    if type(error).__name__ != fault:
        assert_worker_error(outcome, fault, where)


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_fault_in_the_worker_code_ends_every_call_with_an_error(faulty_workers, fault):
    """An actor's ``StopIteration`` could not be set on the worker's asyncio future and an error
    that does not survive pickling was lost with the reply: the call never returned. A
    ``BaseException`` escaped the worker's handlers (a task's killed its worker)."""
    params, x, y = problem()
    loss = mjd.dataset_loss(logistic, da.from_array(x, chunks=(UNEVEN, 5)), da.from_array(y, chunks=250))
    loss(params)                                          # the actors are made and answer
    faulty_workers("chunk_part", fault)
    assert_worker_error(outcome_within(120, lambda: loss.residents()[0].part(params).result()), fault, "chunk_part")
    assert_fault_raised(outcome_within(120, loss, params), fault, "chunk_part")   # actors, then tasks
    trainer = mjd.data_parallel(logistic, mj.optim.sgd(0.1), params, da.from_array(x), da.from_array(y))
    assert_fault_raised(outcome_within(120, trainer.step), fault, "chunk_part")


@pytest.mark.slow
def test_a_stop_iteration_on_a_later_piece_is_an_error_not_the_end_of_the_sum(faulty_workers):
    """The pieces' parts were summed as ``map`` gave them: a ``StopIteration`` raised by the
    last piece ended the map, and the chunk's sum silently missed that piece."""
    params, x, y = problem()
    loss = mjd.dataset_loss(logistic, da.from_array(x, chunks=(UNEVEN, 5)), da.from_array(y, chunks=250),
                            rows_per_call=64)
    faulty_workers("compiled_loss", "StopIteration")
    assert_worker_error(outcome_within(120, loss, params), "StopIteration", "call")


def stops_iterating(params, x, y):
    raise StopIteration


@pytest.mark.slow
def test_a_loss_raising_stop_iteration_ends_the_call_with_its_line(client):
    params, x, y = problem()
    loss = mjd.dataset_loss(stops_iterating, da.from_array(x, chunks=500), da.from_array(y, chunks=500))
    kind, error = outcome_within(120, loss, params)
    assert kind == "error" and isinstance(error, mjd.WorkerError), error
    line = stops_iterating.__code__.co_firstlineno + 1
    assert f"builtins.StopIteration (raised on a worker at {__file__}:{line} in stops_iterating: raise " \
           f"StopIteration;" in str(error)


# ---------------------------------------------------------------------------------------------
# Data-parallel training

def single_process(fn, optimizer, params, batches):
    step = mj.train_step(fn, optimizer)
    params = {k: v.copy() for k, v in params.items()}
    state = step.init(params)
    losses = [float(step(params, state, *batch)) for batch in batches]
    return params, losses


def concatenated_minibatches(trainer, x, y, steps):
    """The rows each step of ``trainer`` uses, gathered from every shard as one batch."""
    starts = np.cumsum((0,) + trainer.shard_rows)
    for step in range(steps):
        rows = []
        for shard, (start, n) in enumerate(zip(starts, trainer.shard_rows)):
            chosen = mjw.minibatch_rows(trainer.seed, shard, step, n, trainer.batch_size)
            rows.append(start + (np.arange(n) if chosen is None else chosen))
        rows = np.concatenate(rows)
        yield x[rows], y[rows]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,batch_size", [(mj.optim.adam(0.05), None),
                                                  (mj.optim.sgd(0.1, momentum=0.9), 64)])
def test_data_parallel_equals_one_process_on_the_concatenated_minibatches(client, optimizer, batch_size):
    params, x, y = problem()
    trainer = mjd.data_parallel(logistic, optimizer, params, da.from_array(x), da.from_array(y),
                                batch_size=batch_size, shards=3, checkpoint_every=2)
    losses = trainer.run(3) + [trainer.step() for _ in range(2)]      # a checkpoint inside run
    expected, expected_losses = single_process(logistic, optimizer, params,
                                               concatenated_minibatches(trainer, x, y, 5))
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-12)
    assert_same(trainer.params, expected)                     # reading params checks the replicas
    assert int(trainer.state["step"]) == 5


def test_shards_cover_the_rows_evenly():
    assert mjd.shard_sizes(1003, 3) == (335, 334, 334) and mjd.shard_sizes(5, 5) == (1, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="shards must be an integer from 1 to the number of rows"):
        mjd.shard_sizes(5, 6)


@pytest.mark.slow
def test_replicas_that_differ_are_detected(client):
    params, x, y = problem()
    trainer = mjd.data_parallel(logistic, mj.optim.sgd(0.1), params, da.from_array(x), da.from_array(y))
    trainer.step()
    leaves, slots, step = trainer.replicas[1].result()
    trainer.replicas[1] = client.submit(mjw.identity, ([leaves[0] + 1e-15, leaves[1]], slots, step))
    with pytest.raises(RuntimeError, match="replica 1 differs from replica 0 after step 1"):
        trainer.params


@pytest.mark.slow
def test_training_survives_a_killed_worker(two_workers):
    client = two_workers
    params, x, y = problem(seed=4)
    optimizer = mj.optim.adam(0.05)
    trainer = mjd.data_parallel(logistic, optimizer, params, da.from_array(x), da.from_array(y), batch_size=100)
    for step in range(6):
        if step == 3:
            pid = next(iter(client.run(os.getpid).values()))
            os.kill(pid, signal.SIGKILL)
        trainer.step()
    expected, _ = single_process(logistic, optimizer, params, concatenated_minibatches(trainer, x, y, 6))
    assert_same(trainer.params, expected)


def local_sgd_reference(fn, optimizer, params, trainer, x, y, rounds):
    """Local SGD in one process: each shard trains ``local_steps`` steps from the common
    parameters and state, then both are averaged, weighted by rows."""
    step = mj.train_step(fn, optimizer)
    starts = np.cumsum((0,) + trainer.shard_rows)
    weights = trainer.weights()
    params, state = {k: v.copy() for k, v in params.items()}, step.init(params)
    for round_ in range(rounds):
        first = round_ * trainer.local_steps
        replicas = []
        for shard, (start, n) in enumerate(zip(starts, trainer.shard_rows)):
            p, s = {k: v.copy() for k, v in params.items()}, {k: (v.copy() if k == "step" else {
                name: a.copy() for name, a in v.items()}) for k, v in state.items()}
            for k in range(first, first + trainer.local_steps):
                rows = start + mjw.minibatch_rows(trainer.seed, shard, k, n, trainer.batch_size)
                step(p, s, x[rows], y[rows])
            replicas.append((p, s))
        average = lambda arrays: np.array(sum(w * a for w, a in zip(weights, arrays)))  # noqa: E731
        params = {k: average([p[k] for p, _ in replicas]) for k in params}
        state = {"step": replicas[0][1]["step"],
                 **{slot: {k: average([s[slot][k] for _, s in replicas]) for k in params} for slot in optimizer.slots}}
    return params


@pytest.mark.slow
def test_local_sgd_averages_parameters_and_state_every_local_steps(client):
    params, x, y = problem()
    optimizer = mj.optim.sgd(0.1, momentum=0.9)
    trainer = mjd.data_parallel(logistic, optimizer, params, da.from_array(x), da.from_array(y),
                                batch_size=50, local_steps=4, shards=3)
    losses = [trainer.step() for _ in range(3)]
    assert int(trainer.state["step"]) == 12 and all(np.isfinite(losses))
    assert_same(trainer.params, local_sgd_reference(logistic, optimizer, params, trainer, x, y, rounds=3))


@pytest.mark.slow
def test_a_worker_that_cannot_import_the_loss_says_what_to_do(client):
    module = type(sys)("module_only_the_client_has")
    exec("import morphjit as mj\ndef loss(params, x):\n    return mj.sum(x @ params)\n", module.__dict__)
    sys.modules[module.__name__] = module
    try:
        shipped = mjw.Shipped.of(module.loss)                     # pickled by reference to the module
    finally:
        del sys.modules[module.__name__]
    with pytest.raises(ModuleNotFoundError, match="cannot import 'module_only_the_client_has'.*register_pickle_by_value"):
        client.submit(mjw.compiled_loss, shipped).result()





def diverging(params, x, y):
    """NaN from the first step: the square root of negative numbers, and its gradient."""
    return mj.mean(mj.sqrt(x @ params["w"] + params["b"] - 100.0))


@pytest.mark.slow
def test_a_diverging_run_keeps_its_nan_parameters_readable(client):
    """NaN != NaN: the replica check compared values, so NaN parameters (identical bits on every
    replica) made params, state and every checkpoint raise."""
    params, x, y = problem()
    optimizer = mj.optim.sgd(0.1, momentum=0.9)
    trainer = mjd.data_parallel(diverging, optimizer, params, da.from_array(x), da.from_array(y), shards=2,
                                checkpoint_every=1)
    losses = trainer.run(2)                                   # a checkpoint after each step
    expected, expected_losses = single_process(diverging, optimizer, params, concatenated_minibatches(trainer, x, y, 2))
    assert np.isnan(losses).all() and np.isnan(expected_losses).all()
    assert np.isnan(trainer.params["w"]).all()
    for k in expected:
        np.testing.assert_array_equal(trainer.params[k], expected[k])      # NaN where NaN
    np.testing.assert_array_equal(trainer.state["momentum"]["w"], np.full(5, np.nan))
    trainer.checkpoint()


def replace_replica(client, trainer, r, change):
    """Replica ``r`` of ``trainer`` with ``change(params, slots)`` applied to a copy of it."""
    leaves, slots, step = trainer.replicas[r].result()
    leaves, slots = [a.copy() for a in leaves], {name: [a.copy() for a in arrays] for name, arrays in slots.items()}
    change(leaves, slots)
    trainer.replicas[r] = client.submit(mjw.identity, (leaves, slots, step), pure=False)


@pytest.mark.slow
@pytest.mark.parametrize("change,differs", [
    (lambda leaves, slots: leaves[0].__setitem__((), 0.0), None),          # the same bits
    (lambda leaves, slots: leaves[0].__setitem__((), -0.0), r"params\['b'\] has other bits"),
    (lambda leaves, slots: leaves[1].__setitem__(2, np.nan), None),
    (lambda leaves, slots: slots["momentum"][1].__setitem__(2, -np.nan), r"the momentum slot of params\['w'\] has other bits"),
])
def test_replicas_are_compared_bit_for_bit(client, change, differs):
    """Replica 1 made like replica 0 but for ``change``: the same bits (NaN included) pass, other
    bits (-0.0 against 0.0, NaN of another sign) are an error naming the array."""
    params, x, y = problem()
    trainer = mjd.data_parallel(logistic, mj.optim.sgd(0.1, momentum=0.9), params, da.from_array(x), da.from_array(y),
                                shards=2)
    trainer.step()
    replace_replica(client, trainer, 0, lambda leaves, slots: (leaves[0].__setitem__((), 0.0),
                                                              leaves[1].__setitem__(2, np.nan),
                                                              slots["momentum"][1].__setitem__(2, np.nan)))
    replace_replica(client, trainer, 1, lambda leaves, slots: (leaves[0].__setitem__((), 0.0),
                                                              leaves[1].__setitem__(2, np.nan),
                                                              slots["momentum"][1].__setitem__(2, np.nan),
                                                              change(leaves, slots)))
    if differs is None:
        assert trainer.params["b"] == 0.0 and np.isnan(trainer.params["w"][2])
        trainer.checkpoint()
    else:
        for read in (lambda: trainer.params, lambda: trainer.state, trainer.checkpoint):
            with pytest.raises(RuntimeError, match=f"replica 1 differs from replica 0 after step 1: {differs}"):
                read()


BAD_DATA_PARALLEL_ARGUMENTS = [
    (dict(batch_size=0), ValueError, "batch_size must be None or an integer >= 1, got 0"),
    (dict(batch_size=-5), ValueError, "batch_size .* got -5"),
    (dict(batch_size=2.5), ValueError, "batch_size .* got 2.5"),
    (dict(seed=-1), ValueError, "seed must be an integer >= 0, got -1"),
    (dict(seed=0.5), ValueError, "seed must be an integer >= 0, got 0.5"),
    (dict(shards=0), ValueError, r"shards must be an integer from 1 to the number of rows \(1003\), got 0"),
    (dict(shards=True), ValueError, "shards must be an integer .* got True"),
    (dict(shards=1004), ValueError, "shards must be an integer .* got 1004"),
    (dict(local_steps=True), ValueError, "local_steps must be an integer >= 1, got True"),
    (dict(checkpoint_every=0), ValueError, "checkpoint_every must be an integer >= 1, got 0"),
    (dict(client=object()), TypeError, "client must be a distributed.Client.* got a object"),
]


@pytest.mark.slow
@pytest.mark.parametrize("options,error,message", BAD_DATA_PARALLEL_ARGUMENTS)
def test_bad_options_of_data_parallel_are_refused_naming_them(client, options, error, message):
    params, x, y = problem()
    with pytest.raises(error, match=message):
        mjd.data_parallel(logistic, mj.optim.sgd(0.1), params, da.from_array(x), da.from_array(y), **options)


@pytest.mark.slow
def test_integer_options_may_be_numpy_integers(client):
    params, x, y = problem()
    trainer = mjd.data_parallel(logistic, mj.optim.sgd(0.1), params, da.from_array(x), da.from_array(y),
                                batch_size=np.int64(64), shards=np.int32(3), seed=np.uint8(2))
    assert len(trainer.run(np.int64(2))) == 2 and trainer.shard_rows == (335, 334, 334)


@pytest.mark.slow
def test_bad_parameters_and_steps_of_data_parallel_are_refused(client):
    params, x, y = problem()
    with pytest.raises(mj.DtypeError, match=r"params\['w'\] is differentiated but is a int64 array"):
        mjd.data_parallel(logistic, mj.optim.sgd(0.1), {"w": np.zeros(5, np.int64), "b": 0.0}, da.from_array(x),
                          da.from_array(y))
    with pytest.raises(mj.DtypeError, match=r"params\['w'\] is a numpy.ma"):
        mjd.data_parallel(logistic, mj.optim.sgd(0.1), {"w": np.ma.masked_array(params["w"]), "b": 0.0},
                          da.from_array(x), da.from_array(y))
    trainer = mjd.data_parallel(logistic, mj.optim.sgd(0.1), params, da.from_array(x), da.from_array(y))
    for steps in (-1, 1.5, "2"):
        with pytest.raises(ValueError, match=f"steps must be an integer >= 0, got {steps!r}"):
            trainer.run(steps)
    assert trainer.run(0) == [] and trainer.step_count == 0
