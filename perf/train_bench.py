"""The training-step benchmark: ``mj.train_step`` (loss, gradients and optimiser update in one compiled
call) against the compiled loss plus a NumPy update, hand-written NumPy, JAX and PyTorch.

Run: python -m perf.train_bench [--only tiny,small,medium] [--impls morphjit.fused,morphjit+numpy,numpy,...]
                                [--dtype float32,float64] [--optim adam,sgd] [--quick] [--threads 1]
                                [--json perf/results/train_results.json] [--markdown perf/results/TRAIN_RESULTS.md]

One fresh process per (workload, dtype), as in perf.bench (whose thread holding, environment and
version/machine reporting this reuses). Inside it, for each optimiser (Adam lr 1e-3 with PyTorch's
defaults; SGD lr 1e-2, momentum 0.9), every implementation is built from identical initial
parameters and run for CHECK_STEPS steps; its parameters are then compared with those of
``morphjit.fused`` (a wrong implementation is reported, not timed). Then every implementation is
reset to the initial parameters and a zero optimiser state and timed interleaved (perf.timing), one
call = one training step on a fixed batch. Every RESET_EVERY steps the parameters and the state
are restored again (inside the timed call, amortised), so every implementation times the same early
stage of training: on one fixed batch the loss would otherwise reach 0 within a few thousand steps
and the softmax underflow to denormals, which would penalise the fastest implementations.

Implementations (``TRAIN_IMPLS``):
  morphjit.fused        mj.train_step(loss, optimizer): one compiled call, params and state in place
  morphjit+numpy        mj.compile_loss(loss)(params, *data, out=grads) + the update in in-place NumPy
  morphjit+numpy.alloc  the same without out= (compile_loss's allocating fast path)
  numpy                 the workload's hand-written NumPy forward+backward + the same NumPy update
  jax                   one jax.jit(value_and_grad + hand-written optax-style update), donate_argnums=(0, 1)
  torch                 eager loss.backward() + torch.optim.Adam / SGD(momentum=0.9), foreach default
  torch.compile         the same whole step (zero_grad, forward, backward, opt.step) under torch.compile
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from perf import bench, report
from perf.impls import JaxOps, Missing, TorchOps, import_torch, named_loss, timed_first

ROOT = bench.ROOT
DEFAULT_JSON = os.path.join(ROOT, "perf", "results", "train_results.json")
DEFAULT_MARKDOWN = os.path.join(ROOT, "perf", "results", "TRAIN_RESULTS.md")
DEFAULT_WORKLOADS = ("tiny", "small", "medium")
MLP_WORKLOADS = ("tiny", "small", "medium", "large")
SUBJECT = "morphjit.fused"
CHECK_STEPS = 3
RESET_EVERY = 500
RTOL = {"float32": 1e-4, "float64": 1e-9}


# ================================================================ the optimisers

@dataclass(frozen=True)
class Opt:
    """One optimiser configuration, spelled for every implementation (PyTorch's conventions)."""

    name: str
    lr: float
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    momentum: float = 0.0

    @property
    def slots(self) -> tuple:
        return ("m", "v") if self.name == "adam" else ("momentum",)

    def describe(self) -> str:
        if self.name == "adam":
            return f"Adam lr {self.lr:g}, betas ({self.b1}, {self.b2}), eps {self.eps:g}"
        return f"SGD lr {self.lr:g}, momentum {self.momentum}"

    def morphjit(self):
        import morphjit as mj
        if self.name == "adam":
            return mj.optim.adam(self.lr, b1=self.b1, b2=self.b2, eps=self.eps)
        return mj.optim.sgd(self.lr, momentum=self.momentum)

    def torch(self, torch, params):
        if self.name == "adam":
            return torch.optim.Adam(params, lr=self.lr, betas=(self.b1, self.b2), eps=self.eps)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)


OPTIMIZERS = {o.name: o for o in (Opt("adam", 1e-3), Opt("sgd", 1e-2, momentum=0.9))}


class NumpyUpdate:
    """The optimiser's update written in NumPy with in-place ops and one scratch array per parameter:
    PyTorch's single-tensor formulas (``torch.optim.Adam`` / ``SGD`` with ``foreach=False``)."""

    def __init__(self, opt: Opt, params: dict):
        self.opt, self.t = opt, 0
        self.slots = {name: {k: np.zeros_like(p) for k, p in params.items()} for name in opt.slots}
        self.tmp = {k: np.empty_like(p) for k, p in params.items()}

    def reset(self):
        self.t = 0
        for slot in self.slots.values():
            for a in slot.values():
                a.fill(0)

    def __call__(self, params: dict, grads: dict):
        o = self.opt
        self.t += 1
        if o.name == "adam":
            step_size = o.lr / (1 - o.b1 ** self.t)
            bias2_sqrt = math.sqrt(1 - o.b2 ** self.t)
            for k, p in params.items():
                g, m, v, tmp = grads[k], self.slots["m"][k], self.slots["v"][k], self.tmp[k]
                m *= o.b1                                   # m = b1 m + (1 - b1) g
                np.multiply(g, 1 - o.b1, out=tmp)
                m += tmp
                v *= o.b2                                   # v = b2 v + (1 - b2) g^2
                np.multiply(g, g, out=tmp)
                tmp *= 1 - o.b2
                v += tmp
                np.sqrt(v, out=tmp)                         # p -= step_size m / (sqrt(v) / sqrt(bias2) + eps)
                tmp /= bias2_sqrt
                tmp += o.eps
                np.divide(m, tmp, out=tmp)
                tmp *= step_size
                p -= tmp
        else:
            for k, p in params.items():
                buf, tmp = self.slots["momentum"][k], self.tmp[k]
                buf *= o.momentum                           # buf = momentum buf + g
                buf += grads[k]
                np.multiply(buf, o.lr, out=tmp)             # p -= lr buf
                p -= tmp


# ================================================================ the implementations

@dataclass
class TrainBuilt:
    call: Callable[[], object]        # one training step, params and state updated
    params: Callable[[], dict]        # the current parameters as {name: ndarray}
    reset: Callable[[], None]         # back to the initial parameters and a fresh optimiser state
    note: str = ""
    first_call_s: float | None = None


@dataclass(frozen=True)
class TrainImpl:
    name: str
    kind: str
    build: Callable                   # build(workload, opt, params, data) -> TrainBuilt
    alloc_visible: bool = True
    rtol: dict | None = None          # {dtype: rtol} where the peer's own rounding is coarser than RTOL
    rtol_reason: str = ""


def _restore(params: dict, initial: dict):
    for k, p in params.items():
        np.copyto(p, initial[k])


def build_fused(wl, opt, params, data):
    import morphjit as mj
    initial = {k: v.copy() for k, v in params.items()}
    step = mj.train_step(named_loss(wl, mj), opt.morphjit())
    state = step.init(params)

    def reset():
        _restore(params, initial)
        for name, value in state.items():
            for a in (value.values() if isinstance(value, dict) else [value]):
                a.fill(0)

    return TrainBuilt(lambda: step(params, state, *data), lambda: params, reset, "mj.train_step")


def build_loss_plus_numpy(wl, opt, params, data, out=True):
    import morphjit as mj
    initial = {k: v.copy() for k, v in params.items()}
    loss = mj.compile_loss(named_loss(wl, mj))
    update = NumpyUpdate(opt, params)
    if out:
        grads = {k: np.empty_like(v) for k, v in params.items()}

        def call():
            value, _ = loss(params, *data, out=grads)
            update(params, grads)
            return value
    else:
        def call():
            value, g = loss(params, *data)
            update(params, g)
            return value

    def reset():
        _restore(params, initial)
        update.reset()

    note = "compile_loss(out=grads) + in-place NumPy update" if out else "compile_loss (allocating) + NumPy update"
    return TrainBuilt(call, lambda: params, reset, note)


def build_numpy(wl, opt, params, data):
    initial = {k: v.copy() for k, v in params.items()}
    update = NumpyUpdate(opt, params)

    def call():
        value, grads = wl.numpy_step(params, *data)
        update(params, grads)
        return value

    def reset():
        _restore(params, initial)
        update.reset()

    return TrainBuilt(call, lambda: params, reset, "hand-written forward+backward + in-place NumPy update")


def build_jax(wl, opt, params, data):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        raise Missing(str(e)) from None
    jax.config.update("jax_enable_x64", True)
    loss_fn = named_loss(wl, JaxOps())
    tmap = jax.tree_util.tree_map

    def train(p, state, *batch):
        value, g = jax.value_and_grad(loss_fn)(p, *batch)
        count = state["count"] + 1
        if opt.name == "adam":   # optax.adam's formula; bias corrections in f64, then the parameter dtype
            t = count.astype(jnp.float64)
            bias1, bias2 = 1 - opt.b1 ** t, 1 - opt.b2 ** t
            m = tmap(lambda m, g: opt.b1 * m + (1 - opt.b1) * g, state["m"], g)
            v = tmap(lambda v, g: opt.b2 * v + (1 - opt.b2) * (g * g), state["v"], g)
            p = tmap(lambda p, m, v: p - opt.lr * ((m / bias1.astype(p.dtype))
                                                   / (jnp.sqrt(v / bias2.astype(p.dtype)) + opt.eps)), p, m, v)
            return value, p, dict(count=count, m=m, v=v)
        buf = tmap(lambda b, g: opt.momentum * b + g, state["momentum"], g)
        p = tmap(lambda p, b: p - opt.lr * b, p, buf)
        return value, p, dict(count=count, momentum=buf)

    step = jax.jit(train, donate_argnums=(0, 1))
    jdata = [jax.device_put(d) for d in data]
    cur = {}

    def reset():
        cur["p"] = {k: jax.device_put(np.array(v)) for k, v in params.items()}
        cur["s"] = dict(count=jnp.zeros((), jnp.int32), **{s: {k: jnp.zeros_like(v) for k, v in cur["p"].items()}
                                                          for s in opt.slots})

    def call():
        value, cur["p"], cur["s"] = step(cur["p"], cur["s"], *jdata)
        return jax.block_until_ready((value, cur["p"], cur["s"]))[0]

    reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, first = timed_first(call)   # compiles; the check's steps then start from a fresh state again
    reset()
    donated = not any("donated buffers were not usable" in str(w.message) for w in caught)
    return TrainBuilt(call, lambda: {k: np.asarray(v) for k, v in cur["p"].items()}, reset,
                      "jax.jit(value_and_grad + hand-written optax-style update), "
                      + ("donate_argnums=(0, 1)" if donated else "donation NOT honoured on this backend"), first)


def build_torch(wl, opt, params, data, compiled=False):
    torch = import_torch()
    loss_fn = named_loss(wl, TorchOps())
    tparams = {k: torch.from_numpy(np.array(v)).requires_grad_(True) for k, v in params.items()}
    tdata = [torch.from_numpy(d) for d in data]
    optimizer = opt.torch(torch, list(tparams.values()))
    foreach = optimizer.defaults.get("foreach")

    def step():
        optimizer.zero_grad()
        value = loss_fn(tparams, *tdata)
        value.backward()
        optimizer.step()
        return value

    call = torch.compile(step) if compiled else step

    def reset():
        with torch.no_grad():
            for k, p in tparams.items():
                p.copy_(torch.from_numpy(params[k]))
            for st in optimizer.state.values():   # step, exp_avg, ... zeroed = a fresh state
                for v in st.values():
                    if torch.is_tensor(v):
                        v.zero_()

    from torch.optim.optimizer import _default_to_fused_or_foreach
    used = foreach if foreach is not None else _default_to_fused_or_foreach(
        list(tparams.values()), differentiable=False, use_fused=False)[1]
    kind = f"torch.optim.{type(optimizer).__name__} (default: {'foreach' if used else 'for-loop'} kernel)"
    note = f"torch.compile(whole step), {kind}" if compiled else f"eager loss.backward() + {kind}"
    return TrainBuilt(call, lambda: {k: p.detach().numpy() for k, p in tparams.items()}, reset, note)


TRAIN_IMPLS = {i.name: i for i in (
    TrainImpl(SUBJECT, "subject", build_fused),
    TrainImpl("morphjit+numpy", "unfused", build_loss_plus_numpy),
    TrainImpl("morphjit+numpy.alloc", "unfused", partial(build_loss_plus_numpy, out=False)),
    TrainImpl("numpy", "reference", build_numpy),
    TrainImpl("jax", "peer", build_jax, alloc_visible=False),
    TrainImpl("torch", "peer", build_torch, alloc_visible=False),
    TrainImpl("torch.compile", "peer", partial(build_torch, compiled=True), alloc_visible=False,
              rtol={"float64": 2e-5}, rtol_reason=(
                  "under torch.compile, torch.optim.Adam computes its bias corrections 1 - beta**step from the "
                  "float32 `step` tensor (torch.optim.optimizer._get_value returns the tensor while compiling; eager "
                  "mode takes step.item()): float64 parameters then differ from torch eager's by up to 6e-6 of "
                  "their largest magnitude after 3 steps on medium, and by 1e-13 once "
                  "torch.set_default_dtype(torch.float64) makes `step` a float64 tensor")),
)}


ADAM_F32_RTOL = 1e-3
ADAM_F32_REASON = (
    "Adam's first steps are lr x g / (|g| + eps): for gradient components of the size of eps (1e-8) the "
    "float32 rounding of an independently computed gradient (absolute differences ~5e-9 against morphjit's "
    "on medium, 3e-7 of the largest gradient) moves the update by up to a few percent of lr (4e-5 observed "
    "for torch on medium, 2e-4 of max |W1|); implementations that use morphjit's gradients stay at 1e-4")


def check_rtol(impl: TrainImpl, opt: Opt, dtype: str) -> tuple:
    """(rtol, why it is looser than RTOL or '') for checking ``impl`` against the fused step."""
    rtol, why = RTOL[dtype], ""
    if opt.name == "adam" and dtype == "float32" and impl.kind in ("reference", "peer"):
        rtol, why = ADAM_F32_RTOL, ADAM_F32_REASON
    if opt.name == "adam" and impl.rtol and dtype in impl.rtol and impl.rtol[dtype] > rtol:
        rtol, why = impl.rtol[dtype], impl.rtol_reason
    return rtol, why


def params_mismatch(got: dict, want: dict, rtol: float):
    """(message or None, max error relative to each array's largest magnitude)."""
    worst = 0.0
    for k, w in want.items():
        g = np.asarray(got.get(k))
        if g.shape != w.shape:
            return f"{k}: shape {g.shape} vs {w.shape}", math.inf
        w = np.asarray(w, np.float64)
        scale = max(1e-3, float(np.max(np.abs(w))) if w.size else 0.0)
        err = float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0
        worst = max(worst, err / scale if math.isfinite(err) else math.inf)
        if not np.all(np.isfinite(g)) or not np.allclose(g, w, rtol=rtol, atol=rtol * scale):
            return f"{k}: max abs err {err:.3g} (atol {rtol * scale:.3g}, rtol {rtol:g})", worst
    return None, worst


# ================================================================ the workload process

def run_optimizer(wl, opt: Opt, dtype: str, impl_names: list, budget_s: float, min_samples: int) -> dict:
    """Build, check and time every implementation of one workload, dtype and optimiser."""
    import tracemalloc

    from perf.timing import measure
    initial, data = wl.make(dtype)
    impls, built = {}, {}
    for name in impl_names:
        impl = TRAIN_IMPLS[name]
        entry = impls[name] = dict(kind=impl.kind)
        try:
            built[name] = impl.build(wl, opt, {k: v.copy() for k, v in initial.items()}, data)
        except Missing as e:
            built.pop(name, None)
            entry.update(status="missing", message=str(e))
            continue
        except Exception as e:  # a peer that cannot express the step is reported, not fatal
            built.pop(name, None)
            entry.update(status="error", message=f"{type(e).__name__}: {e}".strip()[:500],
                         traceback=traceback.format_exc(limit=4)[-1500:])
            continue
    # the correctness check: CHECK_STEPS steps from the initial parameters, params against the subject's
    finals = {}
    for name, b in list(built.items()):
        entry = impls[name]
        try:
            b.reset()
            losses = []
            for i in range(CHECK_STEPS):
                value, seconds = timed_first(b.call)
                if i == 0 and b.first_call_s is None:   # a builder that compiled ahead timed it itself
                    b.first_call_s = seconds
                losses.append(float(_to_numpy(value)))
            finals[name] = {k: np.array(v) for k, v in b.params().items()}
            entry.update(status="ok", note=b.note, first_call_s=b.first_call_s, check_losses=losses)
        except Exception as e:
            entry.update(status="error", message=f"{type(e).__name__}: {e}".strip()[:500],
                         traceback=traceback.format_exc(limit=4)[-1500:])
            del built[name]
    reference = finals.get(SUBJECT)
    for name in list(built):
        entry = impls[name]
        if name == SUBJECT:
            entry["check"] = "reference"
            continue
        if reference is None:
            entry.update(status="unchecked", message=f"{SUBJECT} not run")
            continue
        rtol, why = check_rtol(TRAIN_IMPLS[name], opt, dtype)
        problem, worst = params_mismatch(finals[name], reference, rtol)
        entry["check"] = dict(max_rel_err=worst, rtol=rtol, passed=problem is None)
        if why:
            entry["check"]["loosened"] = why
        if problem:
            entry.update(status="wrong", message=f"after {CHECK_STEPS} steps: {problem}")
            del built[name]
    for b in built.values():
        b.reset()
    for name, b in built.items():
        if TRAIN_IMPLS[name].alloc_visible:
            tracemalloc.start()
            b.call()
            impls[name]["alloc_peak_bytes"] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        b.reset()
    stats = measure({k: _with_resets(b) for k, b in built.items()}, budget_s=budget_s * len(built),
                    min_samples=min_samples)
    for name, s in stats.items():
        impls[name]["time"] = s.as_dict()
    return dict(description=opt.describe(), impls=impls)


def _to_numpy(value):
    if hasattr(value, "detach"):
        value = value.detach().numpy()
    return np.asarray(value)


def _with_resets(b: TrainBuilt):
    """``b.call``, restoring the initial parameters and state every RESET_EVERY calls."""
    count = 0
    call, reset = b.call, b.reset

    def timed():
        nonlocal count
        count += 1
        if count == RESET_EVERY:
            count = 0
            reset()
        return call()

    return timed


def run_workload(workload: str, dtype: str, impl_names: list, optimizers: list, threads: int, budget_s: float,
                 min_samples: int) -> dict:
    import resource

    from perf.workloads import WORKLOADS
    wl = WORKLOADS[workload]
    limits = bench.hold_threads(threads, impl_names)
    results = {o: run_optimizer(wl, OPTIMIZERS[o], dtype, impl_names, budget_s, min_samples) for o in optimizers}
    pools = bench.threadpools_of(limits)
    if limits is not None:
        limits.restore_original_limits()
    return dict(workload=workload, dtype=dtype, description=wl.description, optimizers=results,
                max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, threads=threads,
                threadpools=pools, versions=bench.versions())


# ================================================================ the runner

def run(opts, on_result=None) -> dict:
    """Every selected workload and dtype, one fresh process each; ``on_result(data so far)`` after each."""
    env = bench.child_env(opts.threads)
    results = []
    for workload in opts.only:
        for dtype in opts.dtypes:
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="morphjit-train-bench-") as cache_dir:
                r = bench.spawn_child("perf.train_bench", workload, dtype, [
                    "--impls", ",".join(opts.impls), "--optim", ",".join(opts.optims), "--threads", str(opts.threads),
                    "--budget", str(opts.budget), "--min-samples", str(opts.min_samples)],
                    dict(env, MORPHJIT_CACHE_DIR=cache_dir))
            r["wall_s"] = time.perf_counter() - t0
            results.append(r)
            print(workload_lines(r), flush=True)
            if on_result:
                on_result(_data(opts, results))
    return _data(opts, results)


def _data(opts, results: list) -> dict:
    return dict(command=" ".join(["python -m perf.train_bench"] + opts.argv), git=_git(),
                machine=bench.machine_info(results),
                date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), options=dict(
                    threads=opts.threads, budget_s=opts.budget, min_samples=opts.min_samples, quick=opts.quick,
                    optimizers={o: OPTIMIZERS[o].describe() for o in opts.optims}, check_steps=CHECK_STEPS,
                    rtol=RTOL, reset_every=RESET_EVERY, unset_env=list(bench.UNSET_ENV)),
                results=results)


def _git() -> str:
    """The checkout's commit, and whether morphjit/ differs from it (the figures depend on it)."""
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "morphjit"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return head.stdout.strip() + (" (morphjit/ modified)" if dirty.stdout.strip() else "")


# ================================================================ the tables

def _median(entry: dict):
    t = entry.get("time") if entry else None
    return t["median_s"] if t else None


def rows(r: dict) -> list:
    """One row per (optimiser, implementation) of one workload result."""
    out = []
    for o, res in r.get("optimizers", {}).items():
        fused = _median(res["impls"].get(SUBJECT))
        for name, e in res["impls"].items():
            t, check = e.get("time"), e.get("check")
            err = f"{check['max_rel_err']:.1e}" if isinstance(check, dict) else (check or "")
            out.append([r["workload"], r["dtype"], o, name, report.fmt_us(t["median_s"]) if t else e.get("status", ""),
                        report.fmt_us(t["iqr_s"]) if t else "", str(t["samples"] * t["calls_per_sample"]) if t else "",
                        report.fmt_ratio(report.ratio(_median(e), fused)), report.fmt_s(e.get("first_call_s")), err,
                        f"{e['alloc_peak_bytes'] / 1024:.0f}" if "alloc_peak_bytes" in e else "",
                        (e.get("message") or e.get("note", ""))[:90]])
    return out


HEADER = ["workload", "dtype", "optim", "impl", "median us", "IQR us", "calls", "x fused", "first call s",
          "check err", "alloc KiB", "note"]


def summary(data: dict):
    """Per workload, dtype and optimiser: the fused step and each alternative's time over it."""
    header = ["workload", "dtype", "optim", "fused us", "morphjit+numpy / fused", "morphjit+numpy.alloc / fused",
              "numpy / fused", "best peer", "best peer / fused"]
    body = []
    for r in data["results"]:
        for o, res in r.get("optimizers", {}).items():
            impls = res["impls"]
            fused = _median(impls.get(SUBJECT))
            peers = [(t, n) for n, e in impls.items() if e.get("kind") == "peer" and (t := _median(e))]
            peer_t, peer = min(peers) if peers else (None, "")
            ratios = [report.ratio(_median(impls.get(n)), fused)
                      for n in ("morphjit+numpy", "morphjit+numpy.alloc", "numpy")]
            body.append([r["workload"], r["dtype"], o, report.fmt_us(fused)] + [report.fmt_ratio(x) for x in ratios]
                        + [peer, report.fmt_ratio(report.ratio(peer_t, fused))])
    return header, body


def workload_lines(r: dict) -> str:
    return report.workload_lines(r, HEADER, rows, error_chars=800)


def terminal(data: dict) -> str:
    return report.terminal(data, HEADER, rows, summary)


def _impl_names(data: dict) -> list:
    names = []
    for r in data["results"]:
        for res in r.get("optimizers", {}).values():
            names += [n for n in res["impls"] if n not in names]
    return names


def _matrix(data: dict, cell) -> tuple:
    names = _impl_names(data)
    body = [[r["workload"], r["dtype"], o] + [cell(res["impls"], n) for n in names]
            for r in data["results"] for o, res in r.get("optimizers", {}).items()]
    return ["workload", "dtype", "optim"] + names, body


def _time_cell(impls: dict, name: str) -> str:
    e = impls.get(name)
    if e is None:
        return ""
    if "time" not in e:
        return e.get("status", "")
    return f"{report.fmt_us(e['time']['median_s'])} ±{report.fmt_us(e['time']['iqr_s'] / 2)}"


def _ratio_cell(impls: dict, name: str) -> str:
    return report.fmt_ratio(report.ratio(_median(impls.get(name)), _median(impls.get(SUBJECT))))


def _check_cell(impls: dict, name: str) -> str:
    check = (impls.get(name) or {}).get("check")
    if isinstance(check, dict):
        return (f"{check['max_rel_err']:.1e}" + (f" (rtol {check['rtol']:g})" if check.get("loosened") else "")
                + ("" if check["passed"] else " WRONG"))
    return check or (impls.get(name) or {}).get("status", "")


def _entries(r: dict) -> list:
    """("optimiser implementation", entry) of each implementation of one result."""
    return [(f"{o} {n}", e) for o, res in r.get("optimizers", {}).items() for n, e in res["impls"].items()]


def _loosened(data: dict) -> list:
    seen = {}
    for r in data["results"]:
        for o, res in r.get("optimizers", {}).items():
            for n, e in res["impls"].items():
                check = e.get("check")
                if isinstance(check, dict) and check.get("loosened"):
                    seen.setdefault(check["loosened"], []).append(f"`{n}` {r['dtype']} {o} ({check['rtol']:g})")
    return [f"- rtol loosened for {', '.join(dict.fromkeys(where))}: {why}." for why, where in seen.items()]


def _notes(data: dict) -> list:
    notes = {}
    for r in data["results"]:
        for o, res in r.get("optimizers", {}).items():
            for n, e in res["impls"].items():
                if e.get("note"):
                    notes.setdefault(n, set()).add(e["note"])
    return [f"- `{n}`: " + "; ".join(sorted(v)) for n, v in notes.items()]


def markdown(data: dict) -> str:
    o = data["options"]
    rtol = ", ".join(f"{k} {v:g}" for k, v in o["rtol"].items())
    parts = [
        "# morphjit training-step benchmark results",
        "",
        f"Produced by `{data['command']}` on {data['date']}, at commit {data.get('git', 'unknown')}.",
        "",
        *report.machine_lines(data),
        f"- Optimisers: {'; '.join(o['optimizers'].values())} (PyTorch's formulas and defaults otherwise).",
        f"- One call = one training step on a fixed batch: loss, gradients and the update of the parameters "
        f"and the optimiser state. One fresh process per workload and dtype (empty MORPHJIT_CACHE_DIR, so "
        f"morphjit's first call compiles); implementations interleaved, {o['budget_s']} s per implementation, "
        f"at least {o['min_samples']} samples, wall clock. Parameters and state are restored to their initial "
        f"values every {o['reset_every']} steps (inside the timed calls) so that every implementation times the "
        "same early stage of training.",
        f"- Correctness: from identical initial parameters every implementation runs {o['check_steps']} steps; "
        f"its parameters must be allclose to `morphjit.fused`'s (rtol {rtol}, atol = rtol x the array's largest "
        "magnitude) or it is reported and not timed.",
        *_loosened(data),
        "",
        "Implementations:",
        "",
        "\n".join(_notes(data)),
        "",
        "## Fused step against the alternatives (time / morphjit.fused time; above 1 = slower than fused)",
        "",
        report.md_table(*summary(data)),
        "",
        "## Step time, median us (± half the IQR)",
        "",
        report.md_table(*_matrix(data, _time_cell)),
        "",
        "## Ratio to morphjit.fused",
        "",
        report.md_table(*_matrix(data, _ratio_cell)),
        "",
        f"## Correctness check: max |param - fused param| / max |fused param| after {o['check_steps']} steps",
        "",
        report.md_table(*_matrix(data, _check_cell)),
        "",
    ] + report.closing_sections(report.problems(data, _entries), HEADER,
                                [row for r in data["results"] for row in rows(r)])
    return "\n".join(parts)


# ================================================================ command line

def parse(argv=None):
    from perf.workloads import DTYPES
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m perf.train_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(DEFAULT_WORKLOADS),
                    help=f"workloads, from {','.join(MLP_WORKLOADS)} (large is off by default)")
    ap.add_argument("--impls", default=",".join(TRAIN_IMPLS), help=f"implementations, from {','.join(TRAIN_IMPLS)}")
    ap.add_argument("--dtype", default="float32,float64", help="float32, float64 or both")
    ap.add_argument("--optim", default=",".join(OPTIMIZERS), help=f"optimisers, from {','.join(OPTIMIZERS)}")
    ap.add_argument("--quick", action="store_true", help="short time boxes (figures are rough)")
    ap.add_argument("--threads", type=int, default=1, help="BLAS / intra-op threads of every implementation")
    ap.add_argument("--budget", type=float, help="seconds of timing per implementation, workload and optimiser")
    ap.add_argument("--min-samples", type=int)
    ap.add_argument("--json", help=f"where to write the JSON results ({bench.PUBLISHED_HELP})")
    ap.add_argument("--markdown", help=f"where to write TRAIN_RESULTS.md ({bench.PUBLISHED_HELP})")
    ap.add_argument("--child", nargs=2, metavar=("WORKLOAD", "DTYPE"), help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    opts.argv = argv
    bench.result_paths(ap, opts, {"json": DEFAULT_JSON, "markdown": DEFAULT_MARKDOWN},
                       ("only", "impls", "dtype", "optim"))
    mode = bench.QUICK if opts.quick else bench.FULL
    opts.budget = mode["budget_s"] if opts.budget is None else opts.budget
    opts.min_samples = mode["min_samples"] if opts.min_samples is None else opts.min_samples
    opts.only = [w for w in opts.only.split(",") if w]
    opts.impls = [i for i in opts.impls.split(",") if i]
    opts.dtypes = [d for d in opts.dtype.split(",") if d]
    opts.optims = [o for o in opts.optim.split(",") if o]
    for kind, chosen, known in (("workload", opts.only, MLP_WORKLOADS), ("implementation", opts.impls, TRAIN_IMPLS),
                                ("dtype", opts.dtypes, DTYPES), ("optimiser", opts.optims, OPTIMIZERS)):
        unknown = [c for c in chosen if c not in known]
        if unknown:
            ap.error(f"unknown {kind} {', '.join(unknown)}; choose from {', '.join(known)}")
    return opts


def main(argv=None) -> dict | None:
    opts = parse(argv)
    if opts.child:
        result = run_workload(*opts.child, opts.impls, opts.optims, opts.threads, opts.budget, opts.min_samples)
        print("RESULT " + json.dumps(result), flush=True)
        return None

    return bench.run_and_report(opts, run, markdown, terminal)


if __name__ == "__main__":
    main()
