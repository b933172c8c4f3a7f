"""The implementations of a workload's step, each built from the workload's declaration.

``IMPLEMENTATIONS[name].build(workload, params, data)`` returns a ``Built``: ``call()`` runs one
step (the timed thing; it leaves the loss and gradients materialised), ``result(r)`` turns what
``call`` returned into ``(loss, {name: gradient ndarray})`` for the correctness check, and
``first_call_s`` is the time of the first call (compilation included where the peer compiles).
An optional peer that is not installed raises ``Missing``; a workload an implementation does not
cover raises ``NotApplicable``.

Kinds: ``subject`` (morphjit), ``peer`` (other frameworks), ``reference`` (hand-written NumPy and
the hand-written numba MLP step), ``overhead`` (morphjit's compiled entry called directly) and
``floor`` (the step's GEMMs alone); floors compute no gradients and are not checked.
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from perf import handwritten as hw


class Missing(Exception):
    """An optional peer is not installed."""


class NotApplicable(Exception):
    """The implementation does not cover this workload."""


@dataclass
class Built:
    call: Callable[[], object]
    result: Callable[[object], tuple] | None  # None: not checked (floors)
    first_call_s: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Impl:
    name: str
    kind: str
    build: Callable
    alloc_visible: bool = True  # its allocations are NumPy's, seen by tracemalloc


def timed_first(call):
    start = time.perf_counter()
    r = call()
    return r, time.perf_counter() - start


def _as_numpy(loss, grads, params):
    """(float loss, {name: ndarray of the parameter's shape})."""
    return float(np.asarray(loss)), {k: np.asarray(grads[k]).reshape(np.shape(params[k])) for k in params}


def named_loss(workload, ns):
    """``loss(params, *data)`` of the workload, written against namespace ``ns``."""
    def loss(params, *data):
        return workload.loss(ns, params, *data)
    loss.__name__ = loss.__qualname__ = f"{workload.name}_loss"
    return loss


# ---------------------------------------------------------------- morphjit

def build_morphjit(wl, params, data, static_shapes=False):
    """``@compile_loss``: polymorphic in the batch size, or with ``static_shapes`` specialised to it."""
    import morphjit as mj
    step = mj.compile_loss(named_loss(wl, mj), static_shapes=static_shapes)
    call = lambda: step(params, *data)  # noqa: E731
    _, first = timed_first(call)
    note = "loaded from disk cache" if step.cache_info().disk_loads else "compiled in this process"
    return Built(call, lambda r: _as_numpy(r[0], r[1], params), first, note)


def as_entry_argument(x, dtype) -> np.ndarray:
    """A leaf as the machine code takes it: C-contiguous, of the traced dtype, at least 1-D (no
    workload passes a random generator, which the machine code would take as a seed)."""
    return np.atleast_1d(np.ascontiguousarray(x, dtype))


def build_morphjit_entry(wl, params, data):
    """The compiled machine code called directly with prepared inputs and preallocated outputs."""
    import morphjit as mj
    compiled = mj.compile_loss(named_loss(wl, mj))
    args = (params, *data)
    compiled(*args)
    step, leaves = compiled.step_for(*args)
    native = step.run
    inputs = [as_entry_argument(x, dt) for x, dt in zip(leaves, native.input_dtypes)]
    outputs = [np.empty(shape, dtype) for shape, dtype in native.output_buffers]
    batch = None if native.batched is None else inputs[native.batched].shape[0]
    workspace = native.workspace()
    arguments = (*inputs, *(workspace.fixed if batch is None else workspace.fixed_for(batch)), *outputs)
    entry = native.call

    def call():
        entry(*arguments)   # the pooled buffers' addresses are in `arguments`: `workspace` keeps them alive
        return outputs

    call.workspace = workspace

    def result(outs):
        grads = step.gradient_trees(outs[1:])[0]
        return _as_numpy(outs[0][0], grads, params)

    return Built(call, result, None, "entry point, no argument checks")


# ---------------------------------------------------------------- references

def build_numpy(wl, params, data):
    call = lambda: wl.numpy_step(params, *data)  # noqa: E731
    return Built(call, lambda r: _as_numpy(r[0], r[1], params))


def _mlp_problem(wl, params, data):
    if wl.mlp is None:
        raise NotApplicable("MLP workloads only")
    n = len(params) // 2
    return hw.problem_for([params[f"W{l}"] for l in range(n)], [params[f"b{l}"] for l in range(n)],
                          *data, wl.mlp[2])


def build_handwritten_numba(wl, params, data):
    p = _mlp_problem(wl, params, data)
    call = lambda: hw.run_step(p)  # noqa: E731
    _, first = timed_first(call)

    def result(loss):
        grads = {}
        for l, (gW, gb) in enumerate(zip(p.work.gWs, p.work.gbs)):
            grads[f"W{l}"], grads[f"b{l}"] = gW, gb
        return _as_numpy(loss, grads, params)

    return Built(call, result, first)


# ---------------------------------------------------------------- floors

def gemm_shapes(wl, params, data):
    """The step's GEMMs as morphjit's joint program states them: [(a, b, out, a_T, b_T)] shapes."""
    import morphjit as mj
    program = mj.grad_program(named_loss(wl, mj), params, *data)
    transposed = {id(b.out): b.inputs[0] for b in program.bindings if b.op == "transpose"
                  and dict(b.params).get("perm", ())[-2:] == tuple(range(b.out.ndim))[-2:][::-1]}
    gemms = []
    for b in program.bindings:
        if b.op == "matmul":
            a, c = b.inputs
            gemms.append((a.shape, c.shape, b.out.shape, id(a) in transposed, id(c) in transposed))
    return gemms


def build_gemm_floor(wl, params, data):
    """Each GEMM of the step through np.dot / np.matmul into a preallocated output."""
    rng = np.random.default_rng(0)
    dtype = next(iter(params.values())).dtype
    ops = []
    for a_shape, b_shape, out_shape, a_t, b_t in gemm_shapes(wl, params, data):
        def operand(shape, t):
            if t:  # a transposed view of a C-contiguous array, as in the step
                base = rng.standard_normal(shape[:-2] + shape[-2:][::-1]).astype(dtype)
                return np.swapaxes(base, -1, -2)
            return rng.standard_normal(shape).astype(dtype)
        a, b, out = operand(a_shape, a_t), operand(b_shape, b_t), np.empty(out_shape, dtype)
        ops.append((np.dot if a.ndim <= 2 and b.ndim <= 2 else _matmul, a, b, out))
    if not ops:
        raise NotApplicable("no GEMM in this step")

    def call():
        for f, a, b, out in ops:
            f(a, b, out)

    return Built(call, None, note=f"{len(ops)} GEMMs")


def _matmul(a, b, out):
    np.matmul(a, b, out=out)


def build_gemm_floor_njit(wl, params, data):
    p = _mlp_problem(wl, params, data)
    call = lambda: hw.run_gemm_floor(p)  # noqa: E731
    call()
    return Built(call, None, note="inside one njit function")


# ---------------------------------------------------------------- JAX

class JaxOps:
    def __init__(self):
        import jax
        import jax.numpy as jnp
        self.jnp, self.nn = jnp, jax.nn
        for name in ("tanh", "exp", "sin", "cos", "log", "log1p", "abs", "maximum", "sqrt", "mean", "sum", "swapaxes"):
            setattr(self, name, getattr(jnp, name))
        self.relu, self.softmax = jax.nn.relu, jax.nn.softmax

    def softmax_cross_entropy(self, logits, labels):
        logp = self.nn.log_softmax(logits, axis=-1)
        return -self.jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]


def build_jax(wl, params, data):
    try:
        import jax
    except ImportError as e:
        raise Missing(str(e)) from None
    jax.config.update("jax_enable_x64", True)
    step = jax.jit(jax.value_and_grad(named_loss(wl, JaxOps())))
    jparams = {k: jax.device_put(v) for k, v in params.items()}
    jdata = [jax.device_put(d) for d in data]

    def call():
        return jax.block_until_ready(step(jparams, *jdata))

    _, first = timed_first(call)
    return Built(call, lambda r: _as_numpy(r[0], r[1], params), first, "jax.jit(value_and_grad)")


# ---------------------------------------------------------------- PyTorch

class TorchOps:
    def __init__(self):
        import torch
        self.torch, self.F = torch, torch.nn.functional
        for name in ("tanh", "exp", "sin", "cos", "log", "log1p", "abs", "sqrt", "relu", "swapaxes"):
            setattr(self, name, getattr(torch, name))

    def maximum(self, a, b):
        return self.torch.clamp(a, min=b) if isinstance(b, (int, float)) else self.torch.maximum(a, b)

    def _reduce(self, f, x, axis, keepdims):
        return f(x) if axis is None else f(x, dim=axis, keepdim=keepdims)

    def mean(self, x, axis=None, keepdims=False):
        return self._reduce(self.torch.mean, x, axis, keepdims)

    def sum(self, x, axis=None, keepdims=False):
        return self._reduce(self.torch.sum, x, axis, keepdims)

    def softmax(self, x, axis=-1):
        return self.torch.softmax(x, dim=axis)

    def softmax_cross_entropy(self, logits, labels):
        return self.F.cross_entropy(logits, labels, reduction="none")


def import_torch():
    try:
        import torch
    except ImportError as e:
        raise Missing(str(e)) from None
    return torch


def _torch_inputs(torch, params, data, requires_grad):
    tparams = {k: torch.from_numpy(np.array(v)).requires_grad_(requires_grad) for k, v in params.items()}
    return tparams, [torch.from_numpy(d) for d in data]


def build_torch_eager(wl, params, data):
    torch = import_torch()
    loss_fn = named_loss(wl, TorchOps())
    tparams, tdata = _torch_inputs(torch, params, data, True)

    def call():
        for p in tparams.values():
            p.grad = None
        loss = loss_fn(tparams, *tdata)
        loss.backward()
        return loss

    _, first = timed_first(call)

    def result(loss):
        return _as_numpy(loss.detach().numpy(), {k: p.grad.numpy() for k, p in tparams.items()}, params)

    return Built(call, result, first, "loss.backward()")


def build_torch_compile(wl, params, data):
    torch = import_torch()
    step = torch.compile(torch.func.grad_and_value(named_loss(wl, TorchOps())))
    tparams, tdata = _torch_inputs(torch, params, data, False)
    call = lambda: step(tparams, *tdata)  # noqa: E731
    _, first = timed_first(call)

    def result(r):
        grads, loss = r
        return _as_numpy(loss.numpy(), {k: g.numpy() for k, g in grads.items()}, params)

    return Built(call, result, first, "torch.compile(torch.func.grad_and_value)")


# ---------------------------------------------------------------- PyTensor

class PytensorOps:
    def __init__(self):
        import pytensor.tensor as pt
        from pytensor.tensor import special
        self.pt = pt
        for name in ("tanh", "exp", "sin", "cos", "log", "log1p", "abs", "maximum", "sqrt", "mean", "sum", "swapaxes"):
            setattr(self, name, getattr(pt, name))
        self.special = special

    def relu(self, x):
        return self.pt.maximum(x, 0)

    def softmax(self, x, axis=-1):
        return self.special.softmax(x, axis=axis)

    def softmax_cross_entropy(self, logits, labels):
        logp = self.special.log_softmax(logits, axis=-1)
        return -logp[self.pt.arange(logits.shape[0]), labels]


def build_pytensor(wl, params, data):
    try:
        import pytensor
        import pytensor.tensor as pt
    except ImportError as e:
        raise Missing(str(e)) from None
    dtype = str(next(iter(params.values())).dtype)
    start = time.perf_counter()
    with pytensor.config.change_flags(floatX=dtype):
        sym = {k: pt.tensor(name=k, shape=np.shape(v), dtype=str(np.asarray(v).dtype)) for k, v in params.items()}
        sym_data = [pt.tensor(name=f"d{i}", shape=d.shape, dtype=str(d.dtype)) for i, d in enumerate(data)]
        loss = named_loss(wl, PytensorOps())(sym, *sym_data)
        grads = pt.grad(loss, list(sym.values()))
        fn = pytensor.function(list(sym.values()) + sym_data, [loss] + grads, mode="NUMBA")
    fn.trust_input = True
    args = [np.asarray(v) for v in params.values()] + list(data)
    call = lambda: fn(*args)  # noqa: E731
    call()
    first = time.perf_counter() - start

    def result(outs):
        return _as_numpy(outs[0], dict(zip(params, outs[1:])), params)

    return Built(call, result, first, 'pytensor.function(mode="NUMBA"), graph build included')


# ---------------------------------------------------------------- the registry

# PyTensor pins an older numba than morphjit's users get, so `make bench` installs it in a venv of
# its own and names that interpreter here; its figures then come from a process of their own.
SEPARATE_PYTHON = {"pytensor": "MORPHJIT_BENCH_PYTENSOR_PYTHON"}


def interpreter(impl: str) -> str:
    """The Python that runs `impl`: its own venv's where one is named, else this one."""
    return os.environ.get(SEPARATE_PYTHON.get(impl, ""), "") or sys.executable


IMPLEMENTATIONS = {i.name: i for i in (
    Impl("morphjit", "subject", build_morphjit),
    Impl("morphjit.entry", "overhead", build_morphjit_entry),
    Impl("morphjit.static", "variant", partial(build_morphjit, static_shapes=True)),
    Impl("numpy", "reference", build_numpy),
    Impl("numba.hand", "reference", build_handwritten_numba),
    Impl("jax", "peer", build_jax, alloc_visible=False),
    Impl("torch", "peer", build_torch_eager, alloc_visible=False),
    Impl("torch.compile", "peer", build_torch_compile, alloc_visible=False),
    Impl("pytensor", "peer", build_pytensor),
    Impl("floor.dot", "floor", build_gemm_floor),
    Impl("floor.njit", "floor", build_gemm_floor_njit),
)}


def check_close(got, want, dtype, what=""):
    """None if ``got`` matches ``want`` ((loss, grads) pairs), else a message naming the mismatch."""
    rtol = 2e-3 if np.dtype(dtype) == np.float32 else 1e-6
    (loss, grads), (ref_loss, ref_grads) = got, want
    pairs = [("loss", loss, ref_loss)] + [(k, grads.get(k), v) for k, v in ref_grads.items()]
    for name, g, w in pairs:
        if g is None or np.shape(g) != np.shape(w):
            return f"{what}{name}: shape {np.shape(g)} vs {np.shape(w)}"
        w = np.asarray(w, np.float64)
        atol = rtol * max(1e-3, float(np.max(np.abs(w))) if w.size else 0.0)
        if not np.allclose(g, w, rtol=rtol, atol=atol):
            err = float(np.max(np.abs(np.asarray(g, np.float64) - w)))
            return f"{what}{name}: max abs err {err:.3g} (atol {atol:.3g}, rtol {rtol:g})"
    if not math.isfinite(loss):
        return f"{what}loss is not finite"
    return None
