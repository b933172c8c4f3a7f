"""The checks ``mj.dask`` runs on the client before anything reaches the cluster: the client,
the data (Dask arrays, their dimensions, dtypes and chunks), the parameters and the counts and
options of ``dataset_loss`` and ``data_parallel``. Each error names the argument and says what
it must be.
"""
from __future__ import annotations

import math
import numbers

import dask.array as da
import distributed
import numpy as np
from dask.array.utils import meta_from_array

from ..jit import check_differentiable, check_plain, is_plain_array
from ..tracing import SUPPORTED_DTYPES
from ..util import DtypeError, pytree

REDUCTIONS = ("mean", "sum")


def is_count(value, minimum: int) -> bool:
    """Is ``value`` an integer (Python or NumPy, not a bool) of at least ``minimum``?"""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum


def check_count(name: str, value, minimum: int) -> int:
    if not is_count(value, minimum):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_optional_count(name: str, value, minimum: int) -> int | None:
    if value is None:
        return None
    if not is_count(value, minimum):
        raise ValueError(f"{name} must be None or an integer >= {minimum}, got {value!r}")
    return int(value)


def check_reduction(reduction) -> str:
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return reduction


def check_client(client) -> None:
    if client is not None and not isinstance(client, distributed.Client):
        raise TypeError(f"client must be a distributed.Client (or None: the default client), "
                        f"got a {type(client).__name__}")


def check_params(params) -> None:
    """Every leaf of ``params`` a plain float32 or float64 NumPy array, as ``compile_loss``
    requires of the differentiated argument (refused here rather than by every worker)."""
    leaves, treedef = pytree.flatten(params)
    for leaf, path in zip(leaves, pytree.leaf_paths(treedef, "params")):
        check_plain(leaf, path)
        check_differentiable(leaf, path)


def param_copies(params) -> tuple[list, pytree.TreeDef]:
    """Copies of the leaves of ``params`` as NumPy arrays (a Python float becomes a 0-d array),
    each checked as by ``check_params``, and the tree's structure."""
    leaves, treedef = pytree.flatten(params)
    copies = []
    for leaf, path in zip(leaves, pytree.leaf_paths(treedef, "params")):
        check_plain(leaf, path)            # before the copy, which would drop a mask
        copies.append(np.array(leaf, copy=True))
        check_differentiable(copies[-1], path)
    return copies, treedef


# ---------------------------------------------------------------------------------------------
# The data


def check_data(data) -> list:
    """The data arrays, checked: Dask arrays of NumPy chunks of a dtype morphjit traces, every
    extent known, with the same number of rows, and at least one row."""
    if not data:
        raise ValueError("pass the data as Dask arrays after the loss (dataset_loss(loss, x, y))")
    for k, x in enumerate(data):
        check_data_array(f"data argument {k}", x)
    rows = data[0].shape[0]
    if rows == 0:
        raise ValueError(f"the data have no rows (data argument 0 has shape {data[0].shape}): every chunk is "
                         f"empty, and mj.dask needs at least one row to compute a loss over")
    for k, x in enumerate(data[1:], 1):
        if x.shape[0] != rows:
            raise ValueError(f"data argument 0 has {rows} rows but data argument {k} has {x.shape[0]}: "
                             f"data arguments share their leading (batch) dimension")
    return list(data)


def check_data_array(name: str, x) -> None:
    if not isinstance(x, da.Array):
        raise TypeError(f"{name} is a {type(x).__name__}; mj.dask takes Dask arrays "
                        f"(da.from_array(x, chunks=...)) chunked along the batch axis")
    if x.ndim == 0:
        raise ValueError(f"{name} is 0-dimensional; mj.dask needs a leading (batch) axis to cut into chunks")
    if any(math.isnan(n) for n in x.shape):
        raise ValueError(f"{name} needs every extent known; got shape {x.shape} (for a dataframe use "
                         f".to_dask_array(lengths=True), for an array x.compute_chunk_sizes())")
    if x.dtype not in SUPPORTED_DTYPES:
        raise DtypeError(f"{name} has dtype {x.dtype}; morphjit traces float32, float64, int32, int64 "
                         f"and bool arrays (convert it with .astype)")
    meta = meta_from_array(x)
    if not is_plain_array(meta):
        raise TypeError(f"{name} has chunks of type {type(meta).__module__}.{type(meta).__qualname__}; "
                        f"mj.dask takes chunks that are plain NumPy arrays (a mask, a sparse layout or a "
                        f"device would be lost: convert them, e.g. with .map_blocks(np.asarray))")
