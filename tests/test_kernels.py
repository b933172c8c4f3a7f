"""Loop nests run as kernels compiled once per text: repeated layers share one, and a model
edited in the same process compiles only the kernels whose text changed."""
import re

import numpy as np
import pytest

import morphjit as mj
from morphjit import kernels

KERNEL = re.compile(r"(?:kernels\.load|table\.kernel)\('''(.*?)'''", re.S)   # either step form


def kernel_texts(source: str) -> set[str]:
    return set(KERNEL.findall(source))


def trunk(params, x):
    """Three tanh layers of widths no other test uses, so their kernels are new to the process."""
    h = x
    for k in range(3):
        h = np.tanh(h @ params[f"W{k}"] + params[f"b{k}"])
    return h


def classifier(params, x, y):
    return mj.mean(mj.softmax_cross_entropy(trunk(params, x) @ params["out"], y))


def regressor(params, x, y):   # the same trunk, another head
    return mj.mean((trunk(params, x) @ params["out"] - y[:, None]) ** 2)


def problem():
    rng = np.random.default_rng(19)
    params = {**{f"W{k}": rng.normal(size=(13, 13)) * 0.3 for k in range(3)},
              **{f"b{k}": rng.normal(size=13) for k in range(3)}, "out": rng.normal(size=(13, 3))}
    return params, rng.normal(size=(7, 13)), rng.integers(0, 3, 7)


def test_an_edited_model_compiles_only_the_kernels_that_changed():
    params, x, y = problem()
    first = mj.compile_loss(classifier, cache=False)
    first(params, x, y)
    before = kernels.statistics()
    edited = mj.compile_loss(regressor, cache=False)
    value, grads = edited(params, x, y)
    after = kernels.statistics()
    old, new = kernel_texts(first.source(params, x, y)), kernel_texts(edited.source(params, x, y))
    assert old & new and new - old    # the trunk's kernels are shared, the head's are not
    assert after["compiled"] - before["compiled"] == len(new - old)
    assert after["reused"] - before["reused"] == len(new & old)
    want, want_grads = mj.compile_loss(regressor, backend="interp")(params, x, y)
    assert value == pytest.approx(want, rel=1e-12)
    for k in params:
        np.testing.assert_allclose(grads[k], want_grads[k], rtol=1e-10, atol=1e-12)


def unrolled(w, x):
    """A recurrence unrolled over the time axis of x, reading the slice x[:, t] at each step."""
    h = np.tanh(x[:, 0] * w)
    for t in range(1, x.shape[1]):
        h = np.tanh(x[:, t] * w + h)
    return mj.sum(h ** 2)


def test_the_time_steps_of_an_unrolled_loop_share_their_kernels():
    rng = np.random.default_rng(7)
    w = rng.normal(size=5)
    texts = {}
    for steps in (3, 6):
        x = rng.normal(size=(4, steps, 5))
        compiled = mj.compile_loss(unrolled, cache=False)
        value, grad = compiled(w, x)
        texts[steps] = kernel_texts(compiled.source(w, x))
        want, want_grad = mj.compile_loss(unrolled, backend="interp")(w, x)
        assert value == pytest.approx(want, rel=1e-12)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-12)
    # a slice's start is the kernel's parameter, not part of its text: twice the steps, as many kernels
    assert len(texts[6]) == len(texts[3]) and any("o0" in text for text in texts[6])
