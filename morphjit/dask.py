"""``mj.dask``: a compiled loss over data held as Dask arrays, and data-parallel training on a
``dask.distributed`` cluster (``pip install 'morphjit[dask]'``).

Dask does the scheduling, the transport and the fault handling; morphjit only ships the user's
function and runs its compiled step on the workers.

* ``dataset_loss(loss, *data, reduction="mean")``: the loss and gradients over the whole data
  set. Each chunk along the batch axis runs through the compiled step on the worker that holds
  it; the chunk results are summed by a tree reduction on the workers, weighted by the chunk's
  rows for a mean-type loss, so uneven chunks give the single-machine result to rounding.
* ``data_parallel(loss, optimizer, params, *data, batch_size=...)``: every worker holds a shard
  and a replica of the parameters and optimiser state; a step averages the gradients of all
  minibatches and every replica applies the same update, so the replicas stay identical.

Per worker, a function is compiled at most once (or loaded from the worker's disk cache,
``MORPHJIT_CACHE_DIR`` as everywhere); parameters travel once per step; data never come back to
the client. A lost worker's chunks and replicas are recomputed by Dask from their lineage, with
the same arithmetic in the same order, so the result does not change.
"""
from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass

import numpy as np

try:
    import cloudpickle
    import dask.array as da
    import distributed
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("mj.dask needs dask and distributed: pip install 'morphjit[dask]'") from error

from . import pytree
from .compiler import CompiledLoss, compile_loss
from .errors import MorphjitError
from .optim import Optimizer
from .train import TrainStep, train_step

REDUCTIONS = ("mean", "sum")
VERSIONED = ("morphjit", "numba", "numpy")


class VersionMismatch(MorphjitError):
    """A worker runs other versions of morphjit, numba or numpy than the client."""


# ---------------------------------------------------------------------------------------------
# Versions: checked once per client connection, and again by a worker before it compiles

def versions() -> dict[str, str]:
    """The versions of the packages a compiled step depends on, in this process."""
    from . import __version__
    import numba
    return {"morphjit": __version__, "numba": numba.__version__, "numpy": np.__version__}


def mismatch(expected: dict, found: dict) -> str | None:
    diffs = [f"{name} {found.get(name)} (client {expected[name]})" for name in VERSIONED
             if found.get(name) != expected[name]]
    return ", ".join(diffs) or None


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
    if client is None:
        try:
            client = distributed.get_client()
        except ValueError:
            raise ValueError("mj.dask needs a dask.distributed Client: create one "
                             "(distributed.Client(...) or LocalCluster) or pass client=") from None
    if client.id not in _checked_clients:
        check_versions(client)
        _checked_clients.add(client.id)
    return client


# ---------------------------------------------------------------------------------------------
# The function shipped to the workers, compiled once per worker

@dataclass(frozen=True)
class Shipped:
    """The user's loss function as the workers receive it: cloudpickled once on the client,
    named by a token (the hash of its bytes and compile options)."""

    payload: bytes
    options: dict       # compile_loss's keyword arguments: backend, cache, static_shapes
    versions: dict
    token: str

    @classmethod
    def of(cls, loss) -> "Shipped":
        if isinstance(loss, CompiledLoss):
            if loss.argnums != 0:
                raise ValueError("mj.dask differentiates the first argument (params); compile the "
                                 "loss with argnums=0")
            if loss.has_aux or loss.static_argnums:
                raise ValueError("mj.dask trains a loss returning one scalar from traced arguments; compile "
                                 "it without has_aux and static arguments (bind those with functools.partial)")
            fn = loss.fn
            options = {"backend": loss.backend, "cache": loss.cache, "static_shapes": loss.static_shapes}
        elif callable(loss):
            fn, options = loss, {}
        else:
            raise TypeError(f"loss must be a function or mj.compile_loss of one, got {type(loss).__name__}")
        payload = cloudpickle.dumps(fn)
        token = hashlib.sha256(payload + repr(sorted(options.items())).encode()).hexdigest()[:24]
        return cls(payload, options, versions(), token)


_compiled: dict = {}              # on a worker: (token, kind) -> compiled loss or optimiser state
_compiled_lock = threading.Lock()


def compiled(shipped: Shipped, key, make):
    """This process's ``make(fn)`` of the shipped function under ``key``: made once (after the
    version check), then reused for every chunk and step."""
    with _compiled_lock:
        made = _compiled.get(key)
        if made is None:
            problem = mismatch(shipped.versions, versions())
            if problem:
                raise VersionMismatch(f"this worker runs {problem}; install the client's versions")
            made = _compiled[key] = make(unpickled(shipped.payload))
        return made


def compiled_loss(shipped: Shipped) -> CompiledLoss:
    return compiled(shipped, shipped.token, lambda fn: compile_loss(fn, **shipped.options))


def compiled_train_step(shipped: Shipped, optimizer: Optimizer) -> TrainStep:
    """The learning rate is passed at each call, so optimisers differing only in it share a step."""
    return compiled(shipped, (shipped.token, optimizer.key()),
                    lambda fn: train_step(fn, optimizer, **shipped.options))


def unpickled(payload: bytes):
    try:
        return cloudpickle.loads(payload)
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"this worker cannot import {error.name!r}, where the loss function is defined; define it in "
            f"your script or notebook (shipped by value), install that module on the workers, or call "
            f"cloudpickle.register_pickle_by_value({error.name}) on the client") from error


def worker_cache_info(token: str):
    """On a worker: the cache info of its compiled loss for ``token`` (None if it has none)."""
    loss = _compiled.get(token)
    return None if loss is None else loss.cache_info()


# ---------------------------------------------------------------------------------------------
# Tasks (run on the workers); a part is (weighted loss, list of weighted gradient leaves)

ROWS_PER_CALL = 8192


def chunk_part(shipped: Shipped, params, row_weight: float | None, rows_per_call: int | None, *blocks):
    """The loss and gradients of one chunk, each piece of ``rows_per_call`` rows weighted by its
    rows times ``row_weight`` (a mean-type loss), or added (``None``: a sum over rows). Pieces
    that fit in the cache are read from memory once for the forward and backward passes."""
    loss = compiled_loss(shipped)
    rows = len(blocks[0])
    step = rows_per_call or rows
    parts = []
    for start in range(0, max(rows, 1), step):
        piece = [b[start:start + step] for b in blocks]
        weight = 1.0 if row_weight is None else len(piece[0]) * row_weight
        value, grads = loss(params, *piece)
        parts.append((weight * float(value), [np.asarray(g * g.dtype.type(weight)) for g in pytree.flatten(grads)[0]]))
    return add_parts(*parts)


def add_parts(*parts):
    """The sum of several parts, in the order given (so a recomputation repeats it bit for bit)."""
    value, grads = parts[0][0], [np.array(g, copy=True) for g in parts[0][1]]   # 0-d stay arrays
    for other_value, other_grads in parts[1:]:
        value += other_value
        for g, h in zip(grads, other_grads):
            np.add(g, h, out=g)
    return value, grads


def identity(x):
    return x


def ship(client, shipped: Shipped):
    """A future of ``shipped`` on the cluster: each worker fetches it once and keeps it."""
    return client.submit(identity, shipped, key=f"morphjit-loss-{shipped.token}")


def tree_sum(client, futures: list, split_every: int):
    """One future of the sum of ``futures``, added ``split_every`` at a time on the workers."""
    while len(futures) > 1:
        futures = [client.submit(add_parts, *futures[i:i + split_every], pure=False)
                   for i in range(0, len(futures), split_every)]
    return futures[0]


# ---------------------------------------------------------------------------------------------
# Data held as Dask arrays

def check_data(data) -> list:
    """The data arrays, checked: Dask arrays with the same number of rows."""
    if not data:
        raise ValueError("pass the data as Dask arrays after the loss (dataset_loss(loss, x, y))")
    for k, x in enumerate(data):
        if not isinstance(x, da.Array):
            raise TypeError(f"data argument {k} is a {type(x).__name__}; mj.dask takes Dask arrays "
                            f"(da.from_array(x, chunks=...)) chunked along the batch axis")
        if x.ndim == 0 or math.isnan(x.shape[0]):
            raise ValueError(f"data argument {k} needs a known leading (batch) extent; got shape {x.shape} "
                             f"(for a dataframe use .to_dask_array(lengths=True))")
    rows = data[0].shape[0]
    for k, x in enumerate(data[1:], 1):
        if x.shape[0] != rows:
            raise ValueError(f"data argument 0 has {rows} rows but data argument {k} has {x.shape[0]}: "
                             f"data arguments share their leading (batch) dimension")
    return list(data)


def aligned(data, row_chunks) -> list:
    """The arrays chunked along the batch axis by ``row_chunks`` and whole along the others."""
    return [x.rechunk((row_chunks,) + tuple(-1 for _ in x.shape[1:])) for x in data]


def placed_blocks(client, arrays) -> list[list]:
    """Per chunk of rows, futures of each array's block on the worker with the fewest rows so far
    (Dask alone may put 6 of 10 equal chunks on one of 2 workers); a worker that dies leaves its
    chunks free to be recomputed elsewhere. The arrays are computed in one graph first, so the
    per-chunk tasks only take blocks already in memory."""
    persisted = client.persist(arrays)
    distributed.wait(persisted)
    load = dict.fromkeys(client.scheduler_info()["workers"], 0)
    placed = []
    for i, rows in enumerate(arrays[0].chunks[0]):
        worker = min(load, key=load.get)
        load[worker] += rows
        placed.append(client.compute([x.blocks[i] for x in persisted], workers=[worker], allow_other_workers=True))
    distributed.wait(placed)
    return placed


class DatasetLoss:
    """The loss and gradients of ``loss`` over data held as Dask arrays; see ``dataset_loss``."""

    def __init__(self, loss, data, reduction="mean", client=None, split_every=8, rows_per_call=ROWS_PER_CALL):
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if not isinstance(split_every, int) or split_every < 2:
            raise ValueError(f"split_every must be an integer >= 2, got {split_every!r}")
        self.client = connected_client(client)
        self.shipped = Shipped.of(loss)
        self.reduction, self.split_every, self.rows_per_call = reduction, split_every, rows_per_call
        data = check_data(data)
        self.rows = data[0].shape[0]
        self.chunk_rows = data[0].chunks[0]
        self._meta = [(x.shape[1:], x.dtype) for x in data]
        self.blocks = placed_blocks(self.client, aligned(data, self.chunk_rows))
        self._shipped = ship(self.client, self.shipped)

    def arrays(self) -> list:
        """The data as Dask arrays over the chunks held on the workers, for other computations on
        the same data without a second copy."""
        return [da.concatenate([da.from_delayed(blocks[k], (rows,) + shape, dtype)
                                for rows, blocks in zip(self.chunk_rows, self.blocks)])
                for k, (shape, dtype) in enumerate(self._meta)]

    def submit(self, params):
        """A future of ``(loss, gradient leaves)``; the parameters travel to the cluster once."""
        params_future = self.client.submit(identity, params, pure=False)
        row_weight = 1 / self.rows if self.reduction == "mean" else None
        parts = [self.client.submit(chunk_part, self._shipped, params_future, row_weight, self.rows_per_call, *blocks,
                                    pure=False)
                 for blocks in self.blocks]
        return tree_sum(self.client, parts, self.split_every)

    def __call__(self, params):
        """``(loss, grads)`` over the whole data set; ``grads`` is shaped like ``params``."""
        _, treedef = pytree.flatten(params)
        value, leaves = self.submit(params).result()
        return value, pytree.unflatten(treedef, leaves)

    def scipy_objective(self, params) -> "FlatObjective":
        """This loss as a function of one float64 vector, for ``scipy.optimize.minimize(...,
        jac=True)``; ``params`` gives the structure, shapes and dtypes (and ``x0``)."""
        return FlatObjective(self, FlatParams(params))

    def worker_cache_info(self) -> dict:
        """Per worker, the ``cache_info()`` of its compiled loss (``None`` before its first chunk):
        ``misses`` counts compilations, ``disk_loads`` steps loaded from its disk cache."""
        return self.client.run(worker_cache_info, self.shipped.token)


def dataset_loss(loss, *data, reduction="mean", client=None, split_every=8,
                 rows_per_call=ROWS_PER_CALL) -> DatasetLoss:
    """``loss(params, *data)`` over the whole of ``data`` (Dask arrays sharing their leading
    axis), computed chunk by chunk on the cluster.

    ``reduction`` says how the loss aggregates over rows: ``"mean"`` (the loss is a mean over the
    rows of its batch, plus terms that do not depend on the rows, like a penalty on the
    parameters: chunk results are weighted by their rows over the total) or ``"sum"`` (a sum
    over rows: chunk results are added; a penalty would be counted once per chunk). The data are
    computed once into the workers' memory, the chunks spread evenly by rows (a copy if they were
    persisted already: pass them unpersisted to hold them once); each call sends the parameters
    once and returns only the loss and gradients. ``split_every`` chunk results are added per
    reduction task. A worker runs the compiled step on ``rows_per_call`` rows of a chunk at a time
    (None: the whole chunk), so that the forward and backward passes find them in the cache.
    """
    return DatasetLoss(loss, data, reduction, client, split_every, rows_per_call)


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

def minibatch_rows(seed: int, shard: int, step: int, rows: int, batch_size: int | None) -> np.ndarray | None:
    """The rows of a shard in a step's minibatch (None: the whole shard)."""
    if batch_size is None or batch_size >= rows:
        return None
    return np.sort(np.random.default_rng([seed, shard, step]).choice(rows, batch_size, replace=False))


def replica_part(shipped: Shipped, replica, treedef, row_weight, seed, shard, step, batch_size, *blocks):
    """A replica's weighted loss and gradients on its shard's minibatch of ``step``."""
    rows = minibatch_rows(seed, shard, step, len(blocks[0]), batch_size)
    if rows is not None:
        blocks = [b[rows] for b in blocks]
    return chunk_part(shipped, pytree.unflatten(treedef, replica[0]), row_weight, ROWS_PER_CALL, *blocks)


def apply_update(optimizer: Optimizer, replica, averaged):
    """A replica after the optimiser's update with the averaged gradients (new arrays)."""
    params, slots, step = replica
    grads = averaged[1]
    lr = optimizer.learning_rate(step)
    new_params, new_slots = [], {name: [] for name in optimizer.state_names}
    for k, (p, g) in enumerate(zip(params, grads)):
        scalars = tuple(p.dtype.type(s) for s in optimizer.scalars(step, lr))
        new_p, updated = optimizer.update(p, g, {name: slots[name][k] for name in optimizer.state_names}, scalars)
        new_params.append(np.array(new_p, p.dtype, order="C"))
        for name in optimizer.state_names:
            new_slots[name].append(np.array(updated[name], p.dtype, order="C"))
    return new_params, new_slots, step + 1


def local_part(shipped: Shipped, optimizer: Optimizer, replica, treedef, weight, seed, shard, batch_size,
               local_steps, *blocks):
    """A replica after ``local_steps`` training steps on its shard's minibatches, as a part: the
    weighted mean loss, and the weighted parameters and optimiser slots (the replica's own arrays
    are left as they are: they are a task's result)."""
    train = compiled_train_step(shipped, optimizer)
    leaves, slots, first = replica
    copied = lambda arrays: pytree.unflatten(treedef, [np.array(x, copy=True) for x in arrays])  # noqa: E731
    params = copied(leaves)
    state = {"step": np.array(first, np.int64), **{name: copied(slots[name]) for name in optimizer.state_names}}
    losses = []
    for step in range(first, first + local_steps):
        rows = minibatch_rows(seed, shard, step, len(blocks[0]), batch_size)
        batch = blocks if rows is None else [b[rows] for b in blocks]
        losses.append(float(train(params, state, *batch, lr=optimizer.learning_rate(step))))
    arrays = pytree.flatten(params)[0] + [x for name in optimizer.state_names for x in pytree.flatten(state[name])[0]]
    return weight * float(np.mean(losses)), [np.asarray(x * x.dtype.type(weight)) for x in arrays]


def averaged_replica(averaged, slot_names, step):
    """The replica made of an averaged part of ``local_part``s."""
    arrays = averaged[1]
    n = len(arrays) // (1 + len(slot_names))
    return arrays[:n], {name: arrays[n * (i + 1):n * (i + 2)] for i, name in enumerate(slot_names)}, step


def loss_of(part) -> float:
    return part[0]


def shard_sizes(rows: int, shards: int) -> tuple[int, ...]:
    """``rows`` cut into ``shards`` consecutive shards whose sizes differ by at most one."""
    if not isinstance(shards, int) or not 1 <= shards <= rows:
        raise ValueError(f"shards must be an integer from 1 to the number of rows ({rows}), got {shards!r}")
    return tuple(rows // shards + (r < rows % shards) for r in range(shards))


class DataParallel:
    """Data-parallel training; see ``data_parallel``."""

    def __init__(self, loss, optimizer, params, data, batch_size=None, seed=0, client=None, shards=None,
                 checkpoint_every=100, local_steps=1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must come from mj.optim, got {type(optimizer).__name__}")
        for name, value in (("local_steps", local_steps), ("checkpoint_every", checkpoint_every)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.client = connected_client(client)
        self.shipped, self.optimizer = Shipped.of(loss), optimizer
        self.batch_size, self.seed, self.checkpoint_every = batch_size, seed, checkpoint_every
        self.local_steps, self.rounds = local_steps, 0
        data = check_data(data)
        self.shard_rows = shard_sizes(data[0].shape[0], shards or len(self.client.scheduler_info()["workers"]))
        self.shards = placed_blocks(self.client, aligned(data, self.shard_rows))
        leaves, self.treedef = pytree.flatten(params)
        self._shipped = ship(self.client, self.shipped)
        self.step_count = 0
        self._seed_replicas(([np.array(x, copy=True) for x in leaves],
                             {name: [np.zeros_like(x) for x in leaves] for name in optimizer.state_names}, 0))

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
        replicas = self.client.gather(self.replicas)
        first = replicas[0]
        for r, (params, slots, step) in enumerate(replicas[1:], 1):
            same = step == first[2] and all(np.array_equal(a, b) for a, b in zip(params, first[0])) and all(
                np.array_equal(a, b) for name in slots for a, b in zip(slots[name], first[1][name]))
            if not same:
                raise RuntimeError(f"replica {r} differs from replica 0 after step {self.step_count}")
        return first

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
    workers; every replica applies the same update, so the replicas stay identical (checked every
    ``checkpoint_every`` steps and whenever ``params`` is read). The result equals one process
    training on the concatenation of the minibatches, to rounding.

    ``local_steps > 1`` is local SGD: each ``step()`` lets every replica run that many
    ``mj.train_step`` steps on its own minibatches, then averages the parameters and optimiser
    slots (weighted by rows). It communicates ``local_steps`` times less often; the replicas drift
    apart between averages, so it no longer equals large-batch training and may need more steps.
    """
    return DataParallel(loss, optimizer, params, data, batch_size, seed, client, shards, checkpoint_every,
                        local_steps)
