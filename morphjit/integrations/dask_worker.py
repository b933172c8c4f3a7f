"""What ``mj.dask`` runs on the workers (``dask.py`` is the client side that submits it): the
user's function as shipped (``Shipped``), compiled once per worker process after a version check,
the tasks of ``dataset_loss`` and ``data_parallel``, and ``dataset_loss``'s per-worker actor. A
task's result is a part, ``(weighted loss, list of weighted arrays)``; parts are summed with
``sum_parts`` (``add_parts`` as a task). What runs here raises only errors that Dask brings back
to the client (``delivered``, ``answered``).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import threading
import traceback
import types
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import cloudpickle
import distributed
import numpy as np
from distributed.protocol import pickle as dask_pickle

from ..jit import CompiledLoss, Optimizer, TrainStep, compile_loss, train_step
from ..util import VERSION, MorphjitError, pytree

VERSIONED = ("morphjit", "numba", "numpy")


class VersionMismatch(MorphjitError):
    """A worker runs other versions of morphjit, numba or numpy than the client."""


class WorkerError(MorphjitError, RuntimeError):
    """An error raised on a worker, told in words (its type, message and line): one that Dask
    could not bring back as it is, or any error of an actor."""


# ---------------------------------------------------------------------------------------------
# Errors that reach the client


def raising_only(kept):
    """A decorator: the function raises an error as it is if ``kept(error)``, else as a
    ``WorkerError`` that tells it (in words: its type need not exist on the client)."""
    def decorate(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except BaseException as error:
                if kept(error):
                    raise
                told = described(error)
            # Raised outside the handler, so that the error is not its context: Dask pickles an
            # error with its causes and context (tblib), and this one must pickle.
            raise WorkerError(told)
        return call
    return decorate


def deliverable(error: BaseException) -> bool:
    """Does a task's ``error`` reach the client as it is: an ``Exception``, not a
    ``StopIteration``, that comes back from Dask's pickling (with its causes and context) with
    its type?"""
    if not isinstance(error, Exception) or isinstance(error, (StopIteration, StopAsyncIteration)):
        return False
    try:
        return type(dask_pickle.loads(dask_pickle.dumps(error))) is type(error)
    except Exception:
        return False


def is_worker_error(error: BaseException) -> bool:
    return isinstance(error, WorkerError)


# Tasks, and the functions whose results sum_parts adds as map gives them. A BaseException that
# is not an Exception (SystemExit, GeneratorExit) kills a task's worker, and the task is tried
# again on another; a StopIteration raised by a mapped function ends the map, and the sum
# silently misses the rest.
delivered = raising_only(deliverable)

# An actor's method: every error as a WorkerError. The worker's event loop awaits the method's
# thread through an asyncio future, on which a StopIteration cannot be set (the loop logs a
# TypeError and the call never returns); the reply carries the error pickled, and one that the
# worker cannot pickle or the client cannot unpickle is lost with it (the call never returns
# either). The client makes a failed call again by tasks, which raise the error itself.
answered = raising_only(is_worker_error)


def described(error: BaseException) -> str:
    """``error``'s type, message and the line that raised it, as text."""
    where = traceback.extract_tb(error.__traceback__)[-1]
    kind, message = type(error), f": {error}" if str(error) else ""
    source = f": {where.line}" if where.line else ""
    return (f"{kind.__module__}.{kind.__qualname__}{message} (raised on a worker at {where.filename}:"
            f"{where.lineno} in {where.name}{source}; Dask cannot bring this error back as it is)")


# ---------------------------------------------------------------------------------------------
# Versions: checked again by a worker before it compiles


def versions() -> dict[str, str]:
    """The versions of the packages a compiled step depends on, in this process."""
    import numba
    return {"morphjit": VERSION, "numba": numba.__version__, "numpy": np.__version__}


def mismatch(expected: dict, found: dict) -> str | None:
    diffs = [f"{name} {found.get(name)} (client {expected[name]})" for name in VERSIONED
             if found.get(name) != expected[name]]
    return ", ".join(diffs) or None


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
    files: dict         # the source file of each function shipped, by qualified name

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
        files = {f.__qualname__: f.__code__.co_filename for f in reachable_functions(fn)}
        return cls(payload, options, versions(), token, files)


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
            made = _compiled[key] = make(unpickled(shipped))
        return made


def compiled_loss(shipped: Shipped) -> CompiledLoss:
    return compiled(shipped, shipped.token, lambda fn: compile_loss(fn, **shipped.options))


def compiled_train_step(shipped: Shipped, optimizer: Optimizer) -> TrainStep:
    """The learning rate is passed at each call, so optimisers differing only in it share a step."""
    return compiled(shipped, (shipped.token, optimizer.key()),
                    lambda fn: train_step(fn, optimizer, **shipped.options))


def unpickled(shipped: Shipped):
    """The shipped function, its code (and that of the functions it calls) named after its source
    file again, so that errors raised on the worker point at the user's file and line."""
    try:
        fn = cloudpickle.loads(shipped.payload)
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            f"this worker cannot import {error.name!r}, where the loss function is defined; define it in "
            f"your script or notebook (shipped by value), install that module on the workers, or call "
            f"cloudpickle.register_pickle_by_value({error.name}) on the client") from error
    for f in reachable_functions(fn):
        filename = shipped.files.get(f.__qualname__)
        if filename and f.__code__.co_filename == SHIPPED_FILENAME:
            f.__code__ = with_filename(f.__code__, filename)
    return fn


SHIPPED_FILENAME = "<dynamic-code>"   # cloudpickle's file name for the code it ships by value


def reachable_functions(fn):
    """``fn`` and the Python functions of its module it reaches through its globals and closure
    cells, each once."""
    seen, todo = set(), [fn]
    while todo:
        f = todo.pop()
        if not inspect.isfunction(f) or f.__module__ != fn.__module__ or id(f) in seen:
            continue
        seen.add(id(f))
        yield f
        todo.extend(f.__globals__.get(name) for name in global_names(f.__code__))
        todo.extend(cell_contents(cell) for cell in f.__closure__ or ())


def cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:   # a cell not filled yet
        return None


def global_names(code: types.CodeType) -> set[str]:
    """The names ``code`` and the code nested in it (comprehensions, lambdas) may look up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= global_names(const)
    return names


def with_filename(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(with_filename(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def worker_cache_info(token: str):
    """On a worker: the cache info of its compiled loss for ``token`` (None if it has none)."""
    loss = _compiled.get(token)
    return None if loss is None else loss.cache_info()


# ---------------------------------------------------------------------------------------------
# Tasks of dataset_loss; a part is (weighted loss, list of weighted gradient leaves)

ROWS_PER_CALL = 8192


def chunk_part(shipped: Shipped, params, row_weight: float | None, rows_per_call: int | None, *blocks):
    """The loss and gradients of one chunk, each piece of ``rows_per_call`` rows weighted by its
    rows times ``row_weight`` (a mean-type loss), or added (``None``: a sum over rows). Pieces
    that fit in the cache are read from memory once for the forward and backward passes; their
    results are added as they come (a worker makes hundreds of calls per chunk)."""
    loss = compiled_loss(shipped)
    rows = len(blocks[0])
    step = rows_per_call or rows

    @delivered
    def piece_part(start):
        piece = [b[start:start + step] for b in blocks]
        value, grads = loss(params, *piece)
        leaves = pytree.flatten(grads)[0]
        if row_weight is None:
            return float(value), leaves
        weight = len(piece[0]) * row_weight
        return weight * float(value), [g * g.dtype.type(weight) for g in leaves]   # the value in float64

    return sum_parts(map(piece_part, range(0, rows, step)))


@delivered
def group_part(shipped: Shipped, params, row_weight: float | None, rows_per_call: int | None, chunks: list,
               threads: int = 1):
    """The part of a group of chunks (each a list of blocks): their ``chunk_part``s, computed
    ``threads`` at a time (the compiled step releases the GIL), added in order."""
    @delivered
    def part(blocks):
        return chunk_part(shipped, params, row_weight, rows_per_call, *blocks)

    if threads == 1 or len(chunks) == 1:
        return sum_parts(map(part, chunks))
    with ThreadPoolExecutor(min(threads, len(chunks))) as pool:
        return sum_parts(pool.map(part, chunks))


class ResidentChunks:
    """A Dask actor on the worker that holds a group of chunks: references to the chunks (not
    copies) and the shipped loss, so that ``part(params)``, the ``group_part`` of those chunks,
    is one request from the client to the worker and one reply, with no task and no scheduling.
    An actor runs in one thread of its own: the chunks are spread over ``threads`` threads
    (None: as many as the worker has for tasks, which are idle meanwhile)."""

    def __init__(self, shipped: Shipped, row_weight: float | None, rows_per_call: int | None, chunks: list,
                 threads: int | None = None):
        self.shipped, self.row_weight, self.rows_per_call, self.chunks = shipped, row_weight, rows_per_call, chunks
        self.threads = threads or distributed.get_worker().state.nthreads

    @answered
    def part(self, params):
        with unsampled_by_profiler():
            return group_part(self.shipped, params, self.row_weight, self.rows_per_call, self.chunks, self.threads)


@contextmanager
def unsampled_by_profiler():
    """This thread left out of the worker's sampling profiler for the block. The profiler walks
    the Python stack of every thread running a task or an actor's method every 10 ms
    (``distributed.worker.profile``); for an actor's call, whose time goes to compiled steps, the
    samples say nothing and cost CPU time and waits for the GIL (per 200 ms call on 5 million
    rows the worker's other threads took 16-20 ms, 12 ms with the actor left out). Off a worker,
    or on a ``distributed`` without that bookkeeping, the block runs as it is."""
    try:
        worker = distributed.get_worker()
    except ValueError:
        worker = None
    sampled, lock = getattr(worker, "active_threads", None), getattr(worker, "active_threads_lock", None)
    if sampled is None or lock is None:
        yield
        return
    ident = threading.get_ident()
    with lock:
        name = sampled.pop(ident, None)
    try:
        yield
    finally:
        if name is not None:
            with lock:
                sampled[ident] = name


def add_parts(*parts):
    """``sum_parts`` as a Dask task: the parts are its arguments, where Dask passes futures' results."""
    return sum_parts(parts)


def sum_parts(parts):
    """The sum of parts, taken in the order they come (so a recomputation repeats it bit for bit)."""
    parts = iter(parts)
    first = next(parts, None)
    if first is None:
        raise ValueError("there are no parts to add (no chunk, or a chunk of no rows)")
    value, grads = first
    grads = [np.array(g, copy=True) for g in grads]   # 0-d stay arrays
    for other_value, other_grads in parts:
        value += other_value
        for g, h in zip(grads, other_grads):
            np.add(g, h, out=g)
    return value, grads


def identity(x):
    return x


# ---------------------------------------------------------------------------------------------
# Tasks of data_parallel


def minibatch_rows(seed: int, shard: int, step: int, rows: int, batch_size: int | None) -> np.ndarray | None:
    """The rows of a shard in a step's minibatch (None: the whole shard)."""
    if batch_size is None or batch_size >= rows:
        return None
    return np.sort(np.random.default_rng([seed, shard, step]).choice(rows, batch_size, replace=False))


@delivered
def replica_part(shipped: Shipped, replica, treedef, row_weight, seed, shard, step, batch_size, *blocks):
    """A replica's weighted loss and gradients on its shard's minibatch of ``step``."""
    rows = minibatch_rows(seed, shard, step, len(blocks[0]), batch_size)
    if rows is not None:
        blocks = [b[rows] for b in blocks]
    return chunk_part(shipped, pytree.unflatten(treedef, replica[0]), row_weight, ROWS_PER_CALL, *blocks)


@delivered
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


@delivered
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
