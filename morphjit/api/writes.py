"""NumPy's in-place writes on traced arrays: ``x[key] = v``, ``x op= v``, ufuncs with ``out=``,
``np.add.at``, and the copies and conversions that decide what a later write reaches.

A write computes the written array's new value as a functional update (``update_slice`` for a
box, ``scatter`` for integer arrays, ``where`` for a mask) and hands it to the tracer's storage
(``morphjit.tracing.storage``), which makes it the new version every view of it reads. NumPy's
rules hold as NumPy states them: the value is cast unsafely and broadcast to the selection, an
in-place operator casts ``same_kind`` and keeps the array's shape, integer indices that repeat
keep the value written last, and the right side is computed before anything is written (as if
copied, NumPy's rule for overlapping operands).
"""
from __future__ import annotations

import numpy as np

from ..ir import Specialize, Sym, broadcast_shapes, slice_shape
from ..tracing import Tracer, storage
from ..util import ShapeError, UnsupportedError, user_location
from . import core as A
from .conversions import updates_through_at
from .indexing import (Masked, at, basic_box, basic_getitem, expand_ellipsis, getitem, index_array, is_index_array,
                       is_mask, same_value)
from .slices import is_dynamic_slice, slice_positions


def setitem(x: Tracer, key, value, frame=None) -> None:
    """NumPy's ``x[key] = value`` on a traced array (written from ``frame``)."""
    key = key if isinstance(key, tuple) else (key,)
    key = tuple(np.arange(k.start, k.stop, k.step) if isinstance(k, range) else k for k in key)
    if frame is not None and updates_through_at(frame):
        new = A.as_value(updated(x, key, value))   # SciPy's at(): the caller takes the result, x stays
        x.storage, x._operand = None, new.operand
        return
    storage.check_writable(x)
    if _known_write(x, key, value):
        return
    if isinstance(value, Tracer) and value.storage is not None and value.storage is x.storage:
        region = getitem(x, key)   # x[key] op= v wrote through the view already (a copy, x[idx], did not)
        if isinstance(region, Tracer) and region.storage is x.storage and region.steps == value.steps:
            return
    if x.storage is None:
        _assign(x, updated(x, key, value))
        return
    with x.storage.writing(x.steps, key):
        _assign(x, updated(x, key, value))


def _known_write(x: Tracer, key: tuple, value) -> bool:
    """Write into a buffer that is still known, where nothing written is traced: NumPy's write."""
    if x.concrete() is None:
        return False
    concrete = [_concrete(k) for k in (*key, value)]
    if any(c is None for c in concrete):
        return False
    with x.storage.writing(x.steps, tuple(concrete[:-1])):
        x.storage.write_known(x.steps, tuple(concrete[:-1]), concrete[-1])
    return True


def _concrete(v):
    """The NumPy value of a key part or a written value, None where it is traced."""
    if isinstance(v, Tracer):
        return v.concrete()
    if isinstance(v, Masked):
        return None
    if isinstance(v, (list, tuple)):
        parts = [_concrete(p) for p in v]
        return None if any(p is None for p in parts) else type(v)(parts)
    return v


def updated(x: Tracer, key: tuple, value):
    """The value of ``x`` after ``x[key] = value``."""
    if isinstance(value, Masked):
        return _masked_write(x, key, value)
    value = A.astype(A.as_array(value), x.dtype)
    if len(key) == 1 and is_mask(key[0]):
        return _mask_write(x, key[0], value)
    if any(is_index_array(k) or is_dynamic_slice(k) for k in key):
        return index_write(x, key, value)
    return box_write(x, key, value)


def _assign(x: Tracer, value) -> None:
    """Write ``value`` (``x``'s shape, a tracer or a constant) into ``x``."""
    value = A.astype(A.as_array(value), x.dtype)
    if x.concrete() is not None and _concrete(value) is not None:
        x.storage.write_known(x.steps, ..., _concrete(value))
    elif isinstance(value, Tracer):
        storage.assign(x, A.broadcast_to(value, x.shape).operand)
    elif value.ndim == 0:
        storage.assign(x, A.full(x.shape, value.item(), x.dtype, like=x.trace).operand)
    else:
        storage.assign(x, x.trace.operand(np.broadcast_to(value, x.shape), lift_literals=False))


def _mask_write(x, mask, value):
    """``x[mask] = value``: ``where`` over the mask's axes (a mask of x's leading axes writes
    whole rows); the value must be one value per row, not one per selected element."""
    mask = A.as_array(mask)
    if tuple(mask.shape) != tuple(x.shape[:mask.ndim]):
        if any(isinstance(d, Sym) for d in (*mask.shape, *x.shape)):
            raise Specialize("a mask and the array it writes into have extents that match at one batch size")
        raise IndexError(f"boolean index of shape {mask.shape} does not match the indexed array of shape "
                         f"{x.shape}\n  at {user_location()}")
    if A.shape_of(value) != () and len(A.shape_of(value)) > x.ndim - mask.ndim:
        raise UnsupportedError("x[mask] = v: v must be a scalar, a value per row (of the shape after the mask's "
                               "axes), or computed element-wise from x[mask] with the same mask; write "
                               "x = np.where(mask, v, x) for an array v of x's shape", user_location())
    rows = A.reshape(mask, mask.shape + (1,) * (x.ndim - mask.ndim))
    return A.where(rows, value, x)


def _masked_write(x, key, value: Masked):
    """``x[mask] = f(y[mask])``: the selected values written where the same mask holds."""
    if not (len(key) == 1 and is_mask(key[0]) and same_value(Masked.select(x, key[0]).mask, value.mask)):
        raise UnsupportedError("x[mask] = v with v a selection y[mask]: write it with the same mask as the selection "
                               "(x[m] = f(y[m])), or as x = np.where(mask, v, x) for v of x's shape", user_location())
    values = A.astype(value.values, x.dtype)
    return A.where(value.mask, A.broadcast_to(values, x.shape), x)


def index_write(x, key, value):
    """The value of ``x`` after NumPy's ``x[key] = value`` for a key with integer arrays (or one
    slice with traced bounds): the basic part of the key is a view, the index arrays a scatter into
    it, with the value broadcast to what ``x[key]`` would read and positions that repeat keeping
    the value written last."""
    key = tuple(np.asarray(k) if isinstance(k, (int, np.integer)) else k for k in key)
    key = expand_ellipsis(key, x.ndim)
    if any(is_dynamic_slice(k) for k in key):
        key = _dynamicslice_positions(x, key)
    basic = tuple(slice(None) if is_index_array(k) else k for k in key)
    viewed = basic_getitem(x, basic)
    positions = [j for j, k in enumerate(key) if is_index_array(k)]
    index = tuple(index_array(key[j], viewed.shape[j]) for j in positions)
    perm = None
    if positions != list(range(positions[0], positions[0] + len(positions))):
        perm = tuple(positions + [j for j in range(viewed.ndim) if j not in positions])
        viewed, positions = A.transpose(viewed, perm), list(range(len(positions)))
    axis = positions[0]
    picked = broadcast_shapes("indexing", *(A.shape_of(i) for i in index))
    shape = tuple(viewed.shape[:axis]) + tuple(picked) + tuple(viewed.shape[axis + len(index):])
    new = A.scatter(viewed, assigned_value(value, shape), index, axis)
    if perm is not None:
        new = A.transpose(new, tuple(int(p) for p in np.argsort(perm)))
    return new if all(k == slice(None) for k in basic) else box_write(x, basic, new)


def _dynamicslice_positions(x, key):
    """The key with its one slice with traced bounds replaced by its positions, an index array."""
    if sum(is_dynamic_slice(k) for k in key) > 1 or any(is_index_array(k) for k in key):
        raise UnsupportedError("a write through a slice with traced bounds combined with other such slices or "
                               "with index arrays is not supported: write one slice at a time", user_location())
    axis = next(j for j, k in enumerate(key) if is_dynamic_slice(k))
    index, *_ = slice_positions(key[axis], x.shape[axis - sum(k is None for k in key[:axis])])
    return key[:axis] + (index,) + key[axis + 1:]


def assigned_value(value, shape):
    """``value`` broadcast to the selection's shape as NumPy assigns it (extra leading unit axes of
    the value dropped), or NumPy's error."""
    vshape = tuple(A.shape_of(value))
    kept = vshape
    while len(kept) > len(shape) and kept[0] == 1:
        kept = kept[1:]
    if kept != vshape:
        value = A.reshape(value, kept)
    try:
        return A.broadcast_to(value, shape)
    except ShapeError:
        if any(isinstance(d, Sym) for d in (*vshape, *shape)):
            raise Specialize("a value and the selection it is written into match at one batch size") from None
        raise ValueError(f"could not broadcast input array from shape {vshape} into shape {tuple(shape)}"
                         f"\n  at {user_location()}") from None


def box_write(x, key, value):
    """The value of ``x`` after ``x[key] = value`` for a basic key: ``value`` replaces the box."""
    starts, stops, steps, shape = basic_box(x.shape, key)
    box = slice_shape(starts, stops, steps)
    placed = A.reshape(assigned_value(value, shape), box)
    if tuple(box) == tuple(x.shape) and all(a == 0 and s == 1 for a, s in zip(starts, steps)):
        return placed
    return A.update_slice(x, placed, starts, stops, steps)


# ---------------------------------------------------------------------------------------------
# In-place operators and out=


def inplace(function, name: str):
    """The tracer's ``__i<name>__``: NumPy's ``np.<name>(x, v, out=x)``."""
    def method(self, other):
        result = function(self, other)
        if self.storage is None and self.ndim == 0 and not isinstance(other, Masked):
            return result                 # a NumPy scalar is immutable: the name is rebound
        store_result(self, result, name)
        return self
    method.__name__ = f"__i{name}__"
    return method


def store_result(out: Tracer, result, name: str) -> None:
    """Write ``result`` into ``out`` as a ufunc's ``out=`` does: the result's shape must be
    ``out``'s, and its dtype cast to ``out``'s under ``same_kind``."""
    result = A.as_array(result)
    if not _broadcasts_to(tuple(A.shape_of(result)), tuple(out.shape)):
        if any(isinstance(d, Sym) for d in (*A.shape_of(result), *out.shape)):
            raise Specialize("an out= array and the result written into it match at one batch size")
        raise ValueError(f"non-broadcastable output operand with shape {tuple(out.shape)} doesn't match the "
                         f"broadcast shape {tuple(A.shape_of(result))}\n  at {user_location()}")
    if not np.can_cast(A.dtype_of(result), out.dtype, "same_kind"):
        raise TypeError(f"Cannot cast ufunc '{name}' output from {A.dtype_of(result)!r} to {out.dtype!r} with "
                        f"casting rule 'same_kind'\n  at {user_location()}")
    storage.check_writable(out)
    _assign(out, result)


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether ``shape`` broadcasts to ``target`` (the output takes part in broadcasting, but is never
    broadcast itself)."""
    return len(shape) <= len(target) and all(d == 1 or d == t for d, t in zip(reversed(shape), reversed(target)))


def with_out(function, name: str, out):
    """``np.<name>(..., out=out)``: ``out`` a tracer (or a 1-tuple of one), written in place and returned."""
    target = out[0] if isinstance(out, tuple) and len(out) == 1 else out
    if isinstance(target, np.ndarray):
        raise UnsupportedError(f"np.{name}(..., out=...) into a NumPy array while tracing: NumPy's array cannot "
                               f"hold a traced value; make the output with np.zeros inside the function, or use the "
                               f"result (y = np.{name}(...))", user_location())
    if not isinstance(target, Tracer):
        raise TypeError(f"np.{name}: out must be an array, got {type(target).__name__}")

    def call(*args):
        store_result(target, function(*args), name)
        return target
    return call


# ---------------------------------------------------------------------------------------------
# Copies and conversions


def copy(a, order="K", subok=False):
    """NumPy's ``np.copy`` / ``x.copy()``: an array of its own, which later writes into ``a`` do not reach."""
    return A.copy(a, order)


def add_at(a, indices, b=None, subtract=False):
    """``np.add.at(a, indices, b)`` (and ``np.subtract.at``): accumulates at repeated indices."""
    if not isinstance(a, Tracer):
        raise UnsupportedError("np.add.at into a NumPy array while tracing: make the array inside the function "
                               "(np.zeros, np.copy) so that it can hold traced values", user_location())
    storage.check_writable(a)
    if a.concrete() is not None and _concrete(indices) is not None and _concrete(b) is not None:
        (np.subtract if subtract else np.add).at(a.concrete(), _concrete(indices), 1 if b is None else _concrete(b))
        a.storage.version += 1
        return
    v = A.astype(A.as_array(1 if b is None else b), a.dtype)
    _assign(a, at(a)[indices].add(A.negative(v) if subtract else v))


def conversion_copy(a, dtype=None, order="K", copy=True):
    """``np.array(a, dtype, copy=..., order=...)`` of a traced array: ``a`` itself where NumPy
    returns it (``copy`` False or None, the dtype and order kept), else a copy."""
    converted = A.astype(a, dtype) if dtype is not None else a
    needs_copy = converted is not a or not _keeps_order(a, order)
    if copy is False and needs_copy:
        raise ValueError(f"Unable to avoid copy while creating an array as requested.\n  at {user_location()}")
    return A.copy(converted, order) if needs_copy or copy else a


def _keeps_order(a: Tracer, order) -> bool:
    return order in (None, "K", "A") or a.contiguous(order)


FUNCTIONS = {np.copy: copy}
