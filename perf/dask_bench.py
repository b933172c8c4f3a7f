"""Time per full-gradient evaluation of a logistic regression held as a Dask array: mj.dask on a
LocalCluster against morphjit in one process and dask-glm (what dask-ml's LogisticRegression
runs) on the same cluster; then the break-even size, below which one process is faster.

mj.dask's workers run the compiled step on ``ROWS_PER_CALL``-row pieces of their chunks (so the
forward and backward passes find the rows in the cache); one process is timed both in one call
over all rows and in pieces of the same size, to tell that gain from the distribution's.

The data set is ``rows`` x ``features`` float64, labels in {0, 1}; the loss is dask-glm's
logistic negative log-likelihood (a sum over rows), so the three compute the same numbers. The
cluster's data are made on the workers and held there (mj.dask spreads the chunks evenly; dask-glm
reads the same chunks); the one-process data are made in this process. The cases take turns,
``--repeat`` rounds; the medians are reported, and each speed-up both as the ratio of the medians
and round by round (one process's time over the case's in the same round: the machine's speed
drifts by tens of percent from minute to minute, which the ratio of two calls a moment apart
mostly cancels). The machine may be shared: say how loaded it was when you quote them.

Two more measurements explain the figures: where a call's fixed cost goes (``--round-trips``:
Dask's round trips on a tiny data set, wall and client CPU time per call) and the memory
bandwidth's ceiling (``--ceiling``: the one-process step on half the rows, alone and in two
processes at once; if two at once take as long as one on all the rows, two workers cannot be
faster than one process on this machine).

Run: python -m perf.dask_bench [--rows 10000000] [--features 16] [--workers 2] [--chunk 1000000]
                               [--repeat 7] [--break-even 1000,10000,100000,1000000]
                               [--round-trips] [--ceiling]
"""
from __future__ import annotations

import argparse
import inspect
import multiprocessing
import os
import statistics
import time

import numpy as np

import morphjit as mj

# The rows of a worker's call of the compiled step (the default of mj.dask.dataset_loss's rows_per_call)
ROWS_PER_CALL = inspect.signature(mj.dask.dataset_loss).parameters["rows_per_call"].default


def logistic_nll(beta, x, y):
    """dask-glm's Logistic.pointwise_loss: sum(x beta + log1p(exp(-x beta))) - y . x beta."""
    z = x @ beta
    return mj.sum(z + mj.log1p(mj.exp(-z)) - y * z)


def cluster_data(rows, features, chunk, seed=0):
    import dask.array as da
    rng = da.random.default_rng(seed)
    x = rng.standard_normal((rows, features), chunks=(chunk, features))
    beta = np.linspace(-1, 1, features)
    y = (rng.random(rows, chunks=chunk) < 1 / (1 + da.exp(-(x @ beta)))).astype(np.float64)
    return x, y


def local_data(rows, features, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features))
    y = (rng.random(rows) < 1 / (1 + np.exp(-(x @ np.linspace(-1, 1, features))))).astype(np.float64)
    return x, y


def in_pieces(loss, beta, x, y, rows=ROWS_PER_CALL):
    """What a worker does with its chunks (``rows_per_call``), in one process: the step on
    cache-sized pieces, the results added."""
    total, grad = 0.0, np.zeros_like(beta)
    for start in range(0, len(x), rows):
        value, g = loss(beta, x[start:start + rows], y[start:start + rows])
        total += value
        grad += g
    return total, grad


def dask_glm_evaluation(client, x, y):
    """dask-glm's compute_loss_grad of its lbfgs solver, as dask-ml's LogisticRegression calls it."""
    import dask
    from dask_glm.families import Logistic
    from dask_glm.utils import scatter_array

    def evaluate(beta):
        with dask.config.set({"optimization.fuse.ave-width": 0}):   # as dask-glm does
            scattered = scatter_array(beta, client)
            return dask.compute(Logistic.pointwise_loss(scattered, x, y), Logistic.pointwise_gradient(scattered, x, y))
    return evaluate


def rounds(cases: dict, repeat: int, cpu: dict | None = None) -> dict[str, list[float]]:
    """Each case called once per round, ``repeat`` rounds after a warm-up; seconds per round
    (and, into ``cpu``, each case's mean CPU seconds of this process, all its threads)."""
    times = {name: [] for name in cases}
    cpu_times = dict.fromkeys(cases, 0.0)
    for fn in cases.values():
        fn()
    for _ in range(repeat):
        for name, fn in cases.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - start)
            cpu_times[name] += (time.process_time() - start_cpu) / repeat
    if cpu is not None:
        cpu.update(cpu_times)
    return times


def medians(cases: dict, repeat: int, cpu: dict | None = None) -> dict[str, float]:
    """The median seconds of each case over ``rounds``."""
    return {name: statistics.median(t) for name, t in rounds(cases, repeat, cpu).items()}


def speed_ups(times: dict[str, list[float]], base: str, name: str) -> list[float]:
    """``base``'s time over ``name``'s, round by round: the two ran a moment apart, so the ratio
    is spared most of the machine's drift from round to round."""
    return sorted(b / t for b, t in zip(times[base], times[name]))


def full_gradient(client, rows, features, chunk, repeat, workers):
    beta = np.full(features, 0.1)
    x, y = cluster_data(rows, features, chunk)
    distributed_loss = mj.dask.dataset_loss(logistic_nll, x, y, reduction="sum")
    cases = {f"mj.dask, {workers} workers": lambda: distributed_loss(beta)}
    try:   # on the same chunks in the workers' memory
        cases[f"dask-glm (dask-ml), {workers} workers"] = (lambda evaluate: lambda: evaluate(beta))(
            dask_glm_evaluation(client, *distributed_loss.arrays()))
    except ImportError:
        print("dask-ml / dask-glm not installed: pip install dask-ml (its row is left out)")
    xl, yl = local_data(rows, features)
    local = mj.compile_loss(logistic_nll)
    cases["morphjit, one process"] = lambda: local(beta, xl, yl)
    cases[f"morphjit, one process, {ROWS_PER_CALL}-row calls"] = lambda: in_pieces(local, beta, xl, yl)
    result = rounds(cases, repeat)
    del xl, yl
    return result


def break_even(client, sizes, features, repeat, workers):
    """Per size, one process against the cluster with one chunk per worker."""
    beta = np.full(features, 0.1)
    local = mj.compile_loss(logistic_nll)
    table = []
    for rows in sizes:
        x, y = cluster_data(rows, features, -(-rows // workers))
        xl, yl = local_data(rows, features)
        distributed_loss = mj.dask.dataset_loss(logistic_nll, x, y, reduction="sum")
        t = medians({"local": lambda: local(beta, xl, yl), "pieces": lambda: in_pieces(local, beta, xl, yl),
                     "dask": lambda: distributed_loss(beta)}, repeat)
        table.append((rows, t["local"], t["pieces"], t["dask"]))
    return table


def identity(x):
    """A task that does nothing."""
    return x


def added(*parts):
    """The sum of ``(loss, [gradient])`` parts, as a task."""
    return sum(value for value, _ in parts), [sum(grads) for grads in zip(*(g for _, g in parts))]


def tree_sum(client, futures: list, split_every: int):
    """One future of the sum of ``futures``, added ``split_every`` at a time on the workers."""
    while len(futures) > 1:
        futures = [client.submit(added, *futures[i:i + split_every], pure=False)
                   for i in range(0, len(futures), split_every)]
    return futures[0]


def round_trips(client, features, repeat, chunks=10, chunk=1000):
    """Per call on ``chunks`` tiny chunks (compute negligible), wall and client CPU seconds: Dask
    round trips alone (one task; the graph of per-chunk tasks plus a tree reduction that mj.dask
    sent before its actors), then mj.dask's call (one actor request per worker) and its fallback
    (one task per worker and one adding task)."""
    beta = np.full(features, 0.1)
    loss = mj.dask.dataset_loss(logistic_nll, *cluster_data(chunks * chunk, features, chunk), reduction="sum")
    cases = {
        "one no-op task": lambda: client.submit(identity, beta, pure=False).result(),
        f"{chunks} no-op tasks + tree of adds": lambda: tree_sum(
            client, [client.submit(identity, (0.0, [beta]), pure=False) for _ in range(chunks)], 8).result(),
        "mj.dask call (actors)": lambda: loss(beta),
        "mj.dask fallback (tasks)": lambda: loss.submit(beta).result(),
    }
    cpu: dict = {}
    wall = medians(cases, repeat * 3, cpu)
    return {name: (wall[name], cpu[name]) for name in cases}


def one_process_alone(rows, features, repeat, barrier, results):
    """In a process of its own: the step on ``rows`` rows (in ``ROWS_PER_CALL``-row calls),
    timed after every process of the run has its data and its compiled step; median wall and
    mean CPU seconds (a process that waits for memory spends CPU time; one that waits for a
    core, as on a loaded machine, does not)."""
    beta = np.full(features, 0.1)
    x, y = local_data(rows, features)
    loss = mj.compile_loss(logistic_nll)
    in_pieces(loss, beta, x, y)
    barrier.wait()
    cpu: dict = {}
    wall = medians({"pieces": lambda: in_pieces(loss, beta, x, y)}, repeat, cpu)
    results.put((wall["pieces"], cpu["pieces"]))


def concurrent(processes, rows, features, repeat) -> list[tuple[float, float]]:
    """Wall and CPU seconds per step of each of ``processes`` processes running at once."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    started = [context.Process(target=one_process_alone, args=(rows, features, repeat, barrier, results))
               for _ in range(processes)]
    for process in started:
        process.start()
    seconds = [results.get() for _ in started]
    for process in started:
        process.join()
    return seconds


def ceiling(rows, features, repeat) -> dict:
    """The memory bandwidth's ceiling for two workers: half the rows in one process, alone and
    in two processes at once, and all the rows in one process."""
    return {"half alone": concurrent(1, rows // 2, features, repeat),
            "half, two at once": concurrent(2, rows // 2, features, repeat),
            "all alone": concurrent(1, rows, features, repeat)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--break-even", default="1000,10000,100000,1000000")
    parser.add_argument("--round-trips", action="store_true", help="time Dask's round trips on tiny data")
    parser.add_argument("--ceiling", action="store_true", help="time the one-process step in two processes at once")
    args = parser.parse_args(argv)
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=None,
                      silence_logs=50) as cluster, Client(cluster) as client:
        print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        times = full_gradient(client, args.rows, args.features, args.chunk, args.repeat, args.workers)
        result = {name: statistics.median(t) for name, t in times.items()}
        local = result["morphjit, one process"]
        print(f"\nloss and gradient of a {args.rows:,} x {args.features} logistic regression "
              f"(float64, {args.chunk:,}-row chunks), median of {args.repeat} "
              f"(speed-up: of the medians; round by round, median and range):")
        for name, seconds in result.items():
            paired = speed_ups(times, "morphjit, one process", name)
            print(f"  {name:38s} {seconds * 1e3:9.1f} ms   {local / seconds:5.2f}x one process   "
                  f"(rounds {statistics.median(paired):.2f}x, {paired[0]:.2f}-{paired[-1]:.2f})")
        sizes = [int(s) for s in args.break_even.split(",") if s]
        if sizes:
            print(f"\nbreak-even: rows per evaluation, one process against {args.workers} workers (ms):")
            print(f"| rows | one process | one process, {ROWS_PER_CALL}-row calls | mj.dask | speed-up |\n"
                  f"|---:|---:|---:|---:|---:|")
            for rows, t_local, t_pieces, t_dask in break_even(client, sizes, args.features, args.repeat, args.workers):
                print(f"| {rows:,} | {t_local * 1e3:.2f} | {t_pieces * 1e3:.2f} | {t_dask * 1e3:.2f} | "
                      f"{t_local / t_dask:.2f}x ({t_pieces / t_dask:.2f}x) |")
        if args.round_trips:
            print(f"\nround trips: ms per call on 10 chunks of 1,000 rows, median of {args.repeat * 3}:")
            for name, (wall, cpu) in round_trips(client, args.features, args.repeat).items():
                print(f"  {name:32s} {wall * 1e3:7.2f} ms   client CPU {cpu * 1e3:6.2f} ms")
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    if args.ceiling:
        print(f"\nmemory ceiling: one-process step ({ROWS_PER_CALL}-row calls), ms per step, "
              f"median of {args.repeat} (CPU ms):")
        for name, seconds in ceiling(args.rows, args.features, args.repeat).items():
            print(f"  {args.rows // (1 if name == 'all alone' else 2):,} rows, {name:18s} "
                  + "  ".join(f"{wall * 1e3:7.1f} ({cpu * 1e3:.1f})" for wall, cpu in seconds))
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return result


if __name__ == "__main__":
    main()
