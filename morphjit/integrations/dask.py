"""``mj.dask``: a compiled loss over data held as Dask arrays, and data-parallel training on a
``dask.distributed`` cluster (``pip install 'morphjit[dask]'``).

Dask does the scheduling, the transport and the fault handling; morphjit only ships the user's
function and runs its compiled step on the workers (what runs there is in ``dask_worker.py``,
where the chunks and actors go in ``dask_placement.py``).

* ``dataset_loss(loss, *data, reduction="mean")``: the loss and gradients over the whole data
  set. The chunks along the batch axis are grouped by the worker that holds them; a Dask actor
  per group runs the compiled step over its chunks, weighted by the chunk's rows for a mean-type
  loss, and adds their results on the worker, so a call is one request and one reply per worker
  (Dask tasks over the same groups, with the same arithmetic, if a worker was lost). Uneven
  chunks give the single-machine result to rounding.
* ``data_parallel(loss, optimizer, params, *data, batch_size=...)``: every worker holds a shard
  and a replica of the parameters and optimiser state; a step averages the gradients of all
  minibatches and every replica applies the same update, so the replicas stay identical.

Per worker, a function is compiled at most once (or loaded from the worker's disk cache,
``MORPHJIT_CACHE_DIR`` as everywhere); parameters travel once per step; data never come back to
the client. A lost worker's chunks and replicas are recomputed by Dask from their lineage, with
the same arithmetic in the same order, so the result does not change.
"""
from __future__ import annotations

import threading

import numpy as np

try:
    import cloudpickle  # noqa: F401 (dask_worker's; checked here with the others)
    import dask.array as da
    import distributed
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("mj.dask needs dask and distributed: pip install 'morphjit[dask]'") from error

from ..jit import Optimizer
from ..util import pytree
from .dask_checks import (check_client, check_count, check_data, check_optional_count, check_params,
                          check_reduction, is_count, param_copies)
from .dask_placement import actor_workers, aligned, nonempty, placed_blocks, resident_groups
from .dask_worker import (ROWS_PER_CALL, ResidentChunks, Shipped, VersionMismatch, add_parts, apply_update,
                          averaged_replica, group_part, identity, local_part, loss_of, mismatch, replica_part,
                          sum_parts, versions, worker_cache_info)
from .dask_worker import WorkerError  # noqa: F401 (mj.dask.WorkerError: what a worker raises in its place)


# ---------------------------------------------------------------------------------------------
# Versions: checked once per client connection

_checked_clients: set = set()


def check_versions(client, expected: dict | None = None) -> None:
    """Raise ``VersionMismatch`` naming every worker whose versions differ from the client's."""
    expected = expected or versions()
    problems = {worker: mismatch(expected, found) for worker, found in client.run(versions).items()}
    problems = {w: p for w, p in problems.items() if p}
    if problems:
        lines = "\n".join(f"  {w}: {p}" for w, p in sorted(problems.items()))
        raise VersionMismatch(f"workers run other versions than the client:\n{lines}\n"
                              f"install the same morphjit, numba and numpy everywhere (the compiled "
                              f"steps and their disk cache depend on them)")


def connected_client(client=None):
    """The client to use (the default one unless given), its workers' versions checked once."""
    check_client(client)
    if client is None:
        try:
            client = distributed.get_client()
        except ValueError:
            raise ValueError("mj.dask needs a dask.distributed Client: create one "
                             "(distributed.Client(...) or LocalCluster) or pass client=") from None
    if client.asynchronous:
        raise ValueError("mj.dask calls the cluster synchronously and cannot run inside the client's event loop: "
                         "pass a Client made without asynchronous=True, or call mj.dask from a thread "
                         "(await loop.run_in_executor(None, ...) in async code)")
    if client.id not in _checked_clients:
        check_versions(client)
        _checked_clients.add(client.id)
    return client


# ---------------------------------------------------------------------------------------------
# The shipped function and the parts, on the cluster


def ship(client, shipped: Shipped):
    """A future of ``shipped`` on the cluster: each worker fetches it once and keeps it."""
    return client.submit(identity, shipped, key=f"morphjit-loss-{shipped.token}")


def tree_sum(client, futures: list, split_every: int):
    """One future of the sum of ``futures``, added ``split_every`` at a time on the workers."""
    while len(futures) > 1:
        futures = [client.submit(add_parts, *futures[i:i + split_every], pure=False)
                   for i in range(0, len(futures), split_every)]
    return futures[0]


class DatasetLoss:
    """The loss and gradients of ``loss`` over data held as Dask arrays; see ``dataset_loss``."""

    def __init__(self, loss, data, reduction="mean", client=None, rows_per_call=ROWS_PER_CALL):
        self.reduction = check_reduction(reduction)
        self.rows_per_call = check_optional_count("rows_per_call", rows_per_call, 1)
        self.shipped = Shipped.of(loss)
        data = check_data(data)
        self.client = connected_client(client)
        self.rows = data[0].shape[0]
        self.chunk_rows = nonempty(data[0].chunks[0])
        self._meta = [(x.shape[1:], x.dtype) for x in data]
        self.blocks = placed_blocks(self.client, aligned(data, self.chunk_rows))
        self.groups = resident_groups(self.client, self.blocks)
        self.row_weight = 1 / self.rows if reduction == "mean" else None
        self._shipped = ship(self.client, self.shipped)
        self._residents = None
        self._residents_lock = threading.Lock()   # calls from several threads make one set of actors
        self.fallbacks = 0          # calls made again by tasks because an actor failed

    def arrays(self) -> list:
        """The data as Dask arrays over the chunks held on the workers, for other computations on
        the same data without a second copy."""
        return [da.concatenate([da.from_delayed(blocks[k], (rows,) + shape, dtype)
                                for rows, blocks in zip(self.chunk_rows, self.blocks)])
                for k, (shape, dtype) in enumerate(self._meta)]

    def group_chunks(self, group: list[int]) -> list[list]:
        return [self.blocks[i] for i in group]

    def submit(self, params):
        """A future of ``(loss, gradient leaves)`` computed by Dask tasks, one per group of chunks
        and one that adds the groups' parts in order (what a call falls back to when a worker was
        lost: Dask recomputes the lost chunks from their lineage); the parameters travel to the
        cluster once."""
        params_future = self.client.submit(identity, params, pure=False)
        parts = [self.client.submit(group_part, self._shipped, params_future, self.row_weight, self.rows_per_call,
                                    self.group_chunks(group), pure=False)
                 for group in self.groups]
        return self.client.submit(add_parts, *parts, pure=False)

    def residents(self) -> list:
        """The actors holding the groups of chunks, one per group on the worker holding its
        chunks (``actor_workers``); made again from the chunks' futures after a fault (Dask
        recomputes lost chunks)."""
        with self._residents_lock:
            if self._residents is None:
                workers = actor_workers(self.client, self.groups, self.blocks)   # elsewhere if one is lost meanwhile
                futures = [self.client.submit(ResidentChunks, self._shipped, self.row_weight, self.rows_per_call,
                                              self.group_chunks(group), actor=True, pure=False,
                                              workers=None if worker is None else [worker],
                                              allow_other_workers=worker is not None)
                           for group, worker in zip(self.groups, workers)]
                with self.client.as_current():   # an actor calls through the client current when it is made
                    self._residents = self.client.gather(futures)
            return self._residents

    def evaluate(self, params):
        """``(loss, gradient leaves)``: each worker's actor adds its chunks' parts, the client
        adds the groups' parts in order. If an actor fails (its worker was lost or restarted),
        the call is made again by ``submit``'s tasks, which give the same numbers, and the actors
        are made again at the next call; an error of the loss itself is raised by the tasks."""
        check_params(params)
        try:
            calls = [resident.part(params) for resident in self.residents()]
            parts = [call.result() for call in calls]
        except Exception:
            with self._residents_lock:
                self._residents = None
                self.fallbacks += 1
            return self.submit(params).result()
        return sum_parts(parts)

    def __call__(self, params):
        """``(loss, grads)`` over the whole data set; ``grads`` is shaped like ``params``."""
        _, treedef = pytree.flatten(params)
        value, leaves = self.evaluate(params)
        return value, pytree.unflatten(treedef, leaves)

    def scipy_objective(self, params) -> "FlatObjective":
        """This loss as a function of one float64 vector, for ``scipy.optimize.minimize(...,
        jac=True)``; ``params`` gives the structure, shapes and dtypes (and ``x0``)."""
        check_params(params)
        return FlatObjective(self, FlatParams(params))

    def worker_cache_info(self) -> dict:
        """Per worker, the ``cache_info()`` of its compiled loss (``None`` before its first chunk):
        ``misses`` counts compilations, ``disk_loads`` steps loaded from its disk cache."""
        return self.client.run(worker_cache_info, self.shipped.token)


def dataset_loss(loss, *data, reduction="mean", client=None, rows_per_call=ROWS_PER_CALL) -> DatasetLoss:
    """``loss(params, *data)`` over the whole of ``data`` (Dask arrays sharing their leading
    axis), computed chunk by chunk on the cluster.

    ``reduction`` says how the loss aggregates over rows: ``"mean"`` (the loss is a mean over the
    rows of its batch, plus terms that do not depend on the rows, like a penalty on the
    parameters: chunk results are weighted by their rows over the total) or ``"sum"`` (a sum
    over rows: chunk results are added; a penalty would be counted once per chunk; empty chunks
    are left out). The data are computed once into the workers' memory, the chunks spread evenly
    by rows (a copy if they were persisted already: pass them unpersisted to hold them once);
    each call sends the parameters
    once to each worker holding chunks and returns only the loss and gradients, added on the
    workers and then over the workers on the client. A worker runs the compiled step on
    ``rows_per_call`` rows of a chunk at a time (None: the whole chunk), so that the forward and
    backward passes find them in the cache.
    """
    return DatasetLoss(loss, data, reduction, client, rows_per_call)


# ---------------------------------------------------------------------------------------------
# Parameter trees as one vector (scipy.optimize)


class FlatParams:
    """A parameter tree as one float64 vector and back, with the tree's shapes and dtypes."""

    def __init__(self, params):
        leaves, self.treedef = pytree.flatten(params)
        arrays = [np.asarray(x) for x in leaves]
        self.shapes = [x.shape for x in arrays]
        self.dtypes = [x.dtype for x in arrays]
        self.offsets = np.cumsum([0] + [x.size for x in arrays])
        self.x0 = self.vector(params)

    def vector(self, tree) -> np.ndarray:
        leaves, _ = pytree.flatten(tree)
        return np.concatenate([np.asarray(x, np.float64).ravel() for x in leaves]) if leaves else np.zeros(0)

    def tree(self, vector):
        vector = np.asarray(vector, np.float64)
        if vector.shape != (self.offsets[-1],):
            raise ValueError(f"expected a vector of {self.offsets[-1]} numbers, got shape {vector.shape}")
        leaves = [np.array(vector[a:b].reshape(shape), dtype, order="C")
                  for a, b, shape, dtype in zip(self.offsets, self.offsets[1:], self.shapes, self.dtypes)]
        return pytree.unflatten(self.treedef, leaves)


class FlatObjective:
    """``fun(x) -> (loss, gradient)`` over one float64 vector; ``x0`` and ``params(x)`` convert."""

    def __init__(self, loss: DatasetLoss, flat: FlatParams):
        self.loss, self.flat, self.x0 = loss, flat, flat.x0

    def __call__(self, x):
        value, grads = self.loss(self.flat.tree(x))
        return float(value), self.flat.vector(grads)

    def params(self, x):
        return self.flat.tree(x)


# ---------------------------------------------------------------------------------------------
# Data-parallel training


def shard_sizes(rows: int, shards) -> tuple[int, ...]:
    """``rows`` cut into ``shards`` consecutive shards whose sizes differ by at most one."""
    if not is_count(shards, 1) or shards > rows:
        raise ValueError(f"shards must be an integer from 1 to the number of rows ({rows}), got {shards!r}")
    shards = int(shards)
    return tuple(rows // shards + (r < rows % shards) for r in range(shards))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Are ``a`` and ``b`` the same array bit for bit: dtype, shape and every byte?"""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


class DataParallel:
    """Data-parallel training; see ``data_parallel``."""

    def __init__(self, loss, optimizer, params, data, batch_size=None, seed=0, client=None, shards=None,
                 checkpoint_every=100, local_steps=1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must come from mj.optim, got {type(optimizer).__name__}")
        self.local_steps = check_count("local_steps", local_steps, 1)
        self.checkpoint_every = check_count("checkpoint_every", checkpoint_every, 1)
        self.batch_size = check_optional_count("batch_size", batch_size, 1)
        self.seed = check_count("seed", seed, 0)
        self.shipped, self.optimizer = Shipped.of(loss), optimizer
        leaves, self.treedef = param_copies(params)
        data = check_data(data)
        self.client = connected_client(client)
        self.rounds = 0
        workers = len(self.client.scheduler_info()["workers"])
        self.shard_rows = shard_sizes(data[0].shape[0], workers if shards is None else shards)
        self.shards = placed_blocks(self.client, aligned(data, self.shard_rows))
        self._shipped = ship(self.client, self.shipped)
        self.step_count = 0
        self._seed_replicas((leaves, {name: [np.zeros_like(x) for x in leaves] for name in optimizer.state_names}, 0))

    def _seed_replicas(self, replica) -> None:
        """Every shard's replica made from ``replica`` (a task: recomputable if a worker dies)."""
        self.replicas = [self.client.submit(identity, replica, pure=False) for _ in self.shards]

    def batch_rows(self, shard: int) -> int:
        return self.shard_rows[shard] if self.batch_size is None else min(self.batch_size, self.shard_rows[shard])

    def weights(self) -> list[float]:
        """Each shard's share of a step's rows."""
        rows = [self.batch_rows(r) for r in range(len(self.shards))]
        return [n / sum(rows) for n in rows]

    def step(self) -> float:
        """One step (``local_steps`` steps with local SGD); returns the loss averaged over the
        shards' minibatches (and over the local steps)."""
        return self._submit_step().result()

    def run(self, steps: int) -> list[float]:
        """``steps`` calls of ``step`` submitted together: Dask runs them back to back, without a
        round trip to the client per step; returns their losses."""
        steps = check_count("steps", steps, 0)
        return self.client.gather([self._submit_step() for _ in range(steps)])

    def _submit_step(self):
        """Submit one step's tasks; a future of its loss."""
        averaged = self._local_round() if self.local_steps > 1 else self._averaged_gradients_step()
        loss = self.client.submit(loss_of, averaged, pure=False)
        self.rounds += 1
        self.step_count += self.local_steps
        if self.rounds % self.checkpoint_every == 0:
            self.checkpoint()
        return loss

    def _averaged_gradients_step(self):
        """Gradients of every shard's minibatch, averaged by a tree reduction, then the same update
        applied by every replica."""
        row_weight = 1 / sum(self.batch_rows(r) for r in range(len(self.shards)))
        parts = [self.client.submit(replica_part, self._shipped, replica, self.treedef, row_weight, self.seed, r,
                                    self.step_count, self.batch_size, *shard, pure=False)
                 for r, (replica, shard) in enumerate(zip(self.replicas, self.shards))]
        averaged = tree_sum(self.client, parts, 8)
        self.replicas = [self.client.submit(apply_update, self.optimizer, replica, averaged, pure=False)
                         for replica in self.replicas]
        return averaged

    def _local_round(self):
        """Every replica trains ``local_steps`` steps on its own minibatches; then parameters and
        optimiser slots are averaged (weighted by rows) and every replica continues from that."""
        parts = [self.client.submit(local_part, self._shipped, self.optimizer, replica, self.treedef, weight,
                                    self.seed, r, self.batch_size, self.local_steps, *shard, pure=False)
                 for r, (replica, shard, weight) in enumerate(zip(self.replicas, self.shards, self.weights()))]
        averaged = tree_sum(self.client, parts, 8)
        replica = self.client.submit(averaged_replica, averaged, self.optimizer.state_names,
                                     self.step_count + self.local_steps, pure=False)
        self.replicas = [replica] * len(self.shards)
        return averaged

    def checkpoint(self) -> None:
        """Fetch every replica, check they are identical, and start the replicas afresh from the
        copy (Dask's lineage then goes back no further than here)."""
        replica = self._identical_replica()
        self._seed_replicas(replica)

    def _identical_replica(self):
        """The replicas' common ``(params, slots, step)``; an error naming the first array that
        differs unless every replica holds the same bits (NaN included, -0.0 not 0.0: replicas
        doing the same arithmetic in the same order hold the same bits)."""
        replicas = self.client.gather(self.replicas)
        first = replicas[0]
        for r, replica in enumerate(replicas[1:], 1):
            difference = self._difference(first, replica)
            if difference:
                raise RuntimeError(f"replica {r} differs from replica 0 after step {self.step_count}: "
                                   f"{difference} (replicas doing the same arithmetic in the same order "
                                   f"hold the same bits)")
        return first

    def _difference(self, replica, other) -> str | None:
        """What first differs between two replicas: their step counts or an array's bits."""
        (params, slots, step), (other_params, other_slots, other_step) = replica, other
        if step != other_step:
            return f"its step count is {other_step}, not {step}"
        paths = pytree.leaf_paths(self.treedef, "params")
        pairs = list(zip(paths, params, other_params))
        for name in self.optimizer.state_names:
            pairs += [(f"the {name} slot of {path}", a, b) for path, a, b in zip(paths, slots[name], other_slots[name])]
        return next((f"{label} has other bits" for label, a, b in pairs if not same_bits(a, b)), None)

    @property
    def params(self):
        """The parameters (fetched from the replicas, which are checked to be identical)."""
        params, _, _ = self._identical_replica()
        return pytree.unflatten(self.treedef, params)

    @property
    def state(self) -> dict:
        """The optimiser state, in the layout of ``mj.train_step``'s ``init``."""
        _, slots, step = self._identical_replica()
        state = {"step": np.array(step, np.int64)}
        state.update({name: pytree.unflatten(self.treedef, slots[name]) for name in self.optimizer.state_names})
        return state


def data_parallel(loss, optimizer, params, *data, batch_size=None, seed=0, client=None, shards=None,
                  checkpoint_every=100, local_steps=1) -> DataParallel:
    """Data-parallel training of ``params`` on ``data`` (Dask arrays) with ``optimizer``.

    The rows are cut into ``shards`` (default: one per worker), each held in memory by a worker
    together with a replica of the parameters and optimiser state. ``step()``: each shard's
    minibatch of ``batch_size`` rows (drawn from ``seed`` and the step; None: the whole shard)
    gives its loss and gradients; they are averaged, weighted by rows, by a tree reduction on the
    workers; every replica applies the same update, so the replicas stay identical (checked bit
    for bit every ``checkpoint_every`` steps and whenever ``params`` is read). The result equals
    one process training on the concatenation of the minibatches, to rounding.

    ``local_steps > 1`` is local SGD: each ``step()`` lets every replica run that many
    ``mj.train_step`` steps on its own minibatches, then averages the parameters and optimiser
    slots (weighted by rows). It communicates ``local_steps`` times less often; the replicas drift
    apart between averages, so it no longer equals large-batch training and may need more steps.
    """
    return DataParallel(loss, optimizer, params, data, batch_size, seed, client, shards, checkpoint_every,
                        local_steps)
