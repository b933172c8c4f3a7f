"""What a compiled step keeps: views for a bounded number of batch sizes, and nothing of a
program (generated module, dispatcher, quoted source) once its compiled loss or step is deleted."""
import gc
import linecache
import sys
import weakref
from collections import OrderedDict

import numpy as np
import pytest

import morphjit as mj
from morphjit import pipeline
from morphjit.runtime import VIEWS_KEPT
from models import MODELS


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
    monkeypatch.setattr(pipeline, "RECENT_KERNELS", 0)   # none kept for a re-run notebook cell
    monkeypatch.setattr(pipeline, "_recent_kernels", OrderedDict())
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=16)
    before, lines_before = set(generated_modules()), set(linecache.cache)
    loss = mj.compile_loss(fn, cache=cache)
    loss(params, x, y)
    train = mj.train_step(fn, mj.optim.adam(1e-2), cache=cache)
    p = {k: v.copy() for k, v in params.items()}
    train(p, train.init(p), x, y)
    kernels = [weakref.ref(loss.steps()[0].run.kernel),
               weakref.ref(train.steps()[0].native.kernel)]
    del loss, train
    gc.collect()
    assert set(generated_modules()) <= before
    assert [k() for k in kernels] == [None, None]
    # the loop-nest kernels stay, shared with the programs compiled next (morphjit.kernels)
    assert not [name for name in set(linecache.cache) - lines_before
                if name.startswith("<morphjit") and "mj_kernel_" not in name]


def test_the_most_recent_disk_cached_kernels_are_kept_for_a_rerun():
    fn, (params, x, y) = MODELS["mlp2"](np.float64, batch=16)
    first = mj.compile_loss(fn)
    first(params, x, y)
    kernel = weakref.ref(first.steps()[0].run.kernel)
    del first
    gc.collect()
    again = mj.compile_loss(fn)   # a re-run cell: the same program, its machine code still in memory
    again(params, x, y)
    assert again.steps()[0].run.kernel is kernel() and again.steps()[0].timings.origin == "memory"
