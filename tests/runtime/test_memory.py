"""What a compiled step keeps: views for a bounded number of batch sizes, and nothing of a
program (generated module, dispatcher, quoted source, the kernels no other step calls beyond a
bounded number) once its compiled loss or step is deleted; and numba's pass managers freed."""
import gc
import linecache
import sys
import weakref
from collections import OrderedDict

import numba
import numpy as np
import pytest

import morphjit as mj
from morphjit.runtime import kernels, loading
from morphjit.jit.explain import namespace
from morphjit.runtime.step import VIEWS_KEPT
from support.models import MODELS, deep_mlp


def test_views_are_kept_for_a_bounded_number_of_batch_sizes():
    sizes = np.random.default_rng(0).permutation(np.arange(1, 2001))
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=len(sizes))
    step = mj.compile_loss(fn, cache=False)
    reference = mj.compile_loss(fn, backend="interp", static_shapes=True)
    for k, n in enumerate(sizes):
        loss, grads = step(params, x[:n], y[:n])
        if k % 250 == 0 or k == len(sizes) - 1:
            want, want_grads = reference(params, x[:n], y[:n])
            assert loss == pytest.approx(want, rel=1e-12)
            for name in params:
                np.testing.assert_allclose(grads[name], want_grads[name], rtol=1e-10, atol=1e-14)
    [workspace] = step.steps()[0].run.idle
    assert len(workspace.views) == VIEWS_KEPT and workspace.pool_batch == len(sizes)
    assert int(sizes[-1]) in workspace.views


def generated_modules():
    return [name for name in sys.modules if name.startswith("mj_")]


@pytest.mark.parametrize("cache", [True, False])
def test_a_deleted_program_leaves_no_module_dispatcher_or_source_behind(cache, monkeypatch):
    monkeypatch.setattr(loading, "RECENT_KERNELS", 0)   # none kept for a re-run notebook cell
    monkeypatch.setattr(loading, "_recent_kernels", OrderedDict())
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=16)
    before, lines_before = set(generated_modules()), set(linecache.cache)
    loss = mj.compile_loss(fn, cache=cache)
    loss(params, x, y)
    train = mj.train_step(fn, mj.optim.adam(1e-2), cache=cache)
    p = {k: v.copy() for k, v in params.items()}
    train(p, train.init(p), x, y)
    steps = [weakref.ref(loss.steps()[0].run.kernel), weakref.ref(train.steps()[0].native.kernel)]
    del loss, train
    gc.collect()
    assert set(generated_modules()) <= before
    assert [k() for k in steps] == [None, None]
    assert not [name for name in set(linecache.cache) - lines_before if name.startswith("<morphjit")]


def collect() -> None:
    """Collect garbage until a pass finds none (cycles through numba's objects take several)."""
    while gc.collect():
        pass


def kernels_of(compiled) -> list:
    """Weak references to the kernel dispatchers of each step of ``compiled`` (a loss or a
    training step, whose native step is ``native``)."""
    return [weakref.ref(k) for step in compiled.steps()
            for k in kernels.called_by(namespace(getattr(step, "native", None) or step.run))]


@pytest.fixture
def kept(monkeypatch):
    """``kept(n)``: from now on, the kernels no step holds that stay loaded are the ``n`` loaded
    last (and no disk-cached step is kept for a re-run). ``kept.before`` holds the ids of the
    kernels loaded before: steps of earlier tests in this process may still hold them."""
    monkeypatch.setattr(loading, "RECENT_KERNELS", 0)
    loading._recent_kernels.clear()   # (steps and kernels kept by the tests before: let them go)

    def keep(n):
        monkeypatch.setattr(kernels, "KEPT", n)
        kernels._recent.clear()
        collect()
        keep.before = {id(k.dispatcher) for k in list(kernels._loaded.values())}
    return keep


def loaded_here(refs: list, kept) -> list:
    """The kernels of ``refs`` this test loaded (no step of an earlier test holds them)."""
    return [k for k in refs if k() is not None and id(k()) not in kept.before]


@pytest.mark.parametrize("cache", [True, False])
def test_the_kernels_of_a_deleted_program_are_released(cache, kept):
    kept(0)
    fn, (params, x, y) = deep_mlp(np.float64, sizes=(5, 11, 7, 2), activation=mj.sigmoid)  # no other test's
    loss = mj.compile_loss(fn, cache=cache)
    loss(params, x, y)
    train = mj.train_step(fn, mj.optim.adam(1e-2), cache=cache)
    p = [(w.copy(), b.copy()) for w, b in params]
    train(p, train.init(p), x, y)
    held = loaded_here(kernels_of(loss) + kernels_of(train), kept)
    assert len(held) >= 4
    del loss, train
    collect()
    assert [k for k in held if k() is not None] == []


def test_a_live_step_keeps_its_kernels_and_runs_as_before_when_another_is_deleted(kept):
    kept(0)
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=16)
    first, second = mj.compile_loss(fn, cache=False), mj.compile_loss(fn, cache=False)
    want_value, want_grads = first(params, x, y)
    second(params, x, y)
    shared = kernels_of(second)
    assert {id(k()) for k in kernels_of(first)} == {id(k()) for k in shared}   # the same kernels
    del first
    collect()
    assert all(k() is not None for k in shared)
    other = mj.compile_loss(deep_mlp(np.float64)[0], cache=False)   # loads kernels of its own
    other(*deep_mlp(np.float64)[1])
    value, grads = second(params, x, y)
    assert value == want_value
    for name in params:
        np.testing.assert_array_equal(grads[name], want_grads[name])


def test_the_kernels_no_step_holds_are_the_last_loaded_up_to_a_bound(kept):
    kept(3)
    held = []
    for sizes, activation in [((4, 5, 3), mj.sin), ((4, 7, 3), mj.cos), ((6, 5, 2), mj.arctan), ((5, 9, 3), mj.sinh)]:
        fn, args = deep_mlp(np.float64, sizes=sizes, activation=activation)   # kernels no other test loads
        loss = mj.compile_loss(fn, cache=False)
        loss(*args)
        held += loaded_here(kernels_of(loss), kept)
        del loss
    collect()
    assert len(held) > 3
    alive = {id(k()) for k in held if k() is not None}
    recent = {id(k.dispatcher) for k in kernels._recent.values()}
    assert len(recent) == 3 and alive == recent - kept.before


def test_a_table_step_runs_kernels_compiled_again_after_their_release(kept, monkeypatch):
    kept(0)
    monkeypatch.setenv("MORPHJIT_TABLE_STEP", "1")
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=16)
    results = []
    for _ in range(2):
        loss = mj.compile_loss(fn, cache=False)
        results.append(loss(params, x, y))
        assert loss.steps()[0].run.table
        del loss
        collect()
    assert kernels.statistics()["compiled"] >= 2
    (v0, g0), (v1, g1) = results
    assert v0 == v1
    for name in params:
        np.testing.assert_array_equal(g0[name], g1[name])


def test_numba_deletes_the_pass_managers_it_builds(monkeypatch):
    """llvmlite 0.50 never deleted its new-style pass managers (``morphjit.passmanagers``)."""
    from llvmlite.binding import ffi
    counts = {}

    def counted(name):
        real = getattr(ffi.lib, name)   # (llvmlite's table of its C functions holds it now)

        def call(*args):
            counts[name] = counts.get(name, 0) + 1
            return real(*args)
        monkeypatch.setitem(ffi.lib._fntab, name, call)

    made = ["LLVMPY_buildFunctionSimplificationPipeline", "LLVMPY_buildPerModuleDefaultPipeline"]
    deleted = ["LLVMPY_DisposeNewFunctionPassManger", "LLVMPY_DisposeNewModulePassManger"]
    for name in made + deleted:
        counted(name)
    namespace = {"numba": numba}
    exec("@numba.njit\ndef f(x):\n    return x * 2.5 + 1\n", namespace)
    assert namespace["f"](2.0) == 6.0
    collect()
    assert counts.get(made[0], 0) > 0 and counts.get(made[1], 0) > 0
    assert [counts.get(name, 0) for name in deleted] == [counts[name] for name in made]


def test_the_most_recent_disk_cached_kernels_are_kept_for_a_rerun():
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=16)
    first = mj.compile_loss(fn)
    first(params, x, y)
    kernel = weakref.ref(first.steps()[0].run.kernel)
    del first
    collect()
    again = mj.compile_loss(fn)   # a re-run cell: the same program, its machine code still in memory
    again(params, x, y)
    assert again.steps()[0].run.kernel is kernel() and again.steps()[0].timings.origin == "memory"
