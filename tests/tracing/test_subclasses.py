"""ndarray subclasses whose meaning the compiled step would lose (a masked array's mask,
np.matrix's products) are refused wherever arguments enter, with an error naming the argument
and saying what to pass; a plain-data subclass (np.memmap) is taken as an array."""
import numpy as np
import pytest

import morphjit as mj

BACKENDS = ["numba", "interp"]
pytestmark = pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")


def loss(params, x, y):
    return mj.mean((x @ params["W"] - y) ** 2)


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    return {"W": rng.normal(size=(3, 1))}, rng.normal(size=(6, 3)), rng.normal(size=(6, 1))


def masked(a):
    m = np.ma.masked_array(a, mask=np.zeros(a.shape, bool))
    m.mask[0] = True
    return m


SUBCLASSES = {"masked": (masked, r"numpy.ma.MaskedArray: its mask would be ignored; pass .*filled"),
              "matrix": (np.asmatrix, r"numpy.matrix.*np.asarray")}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(SUBCLASSES))
@pytest.mark.parametrize("where", ["x", "params['W']"])
def test_compile_loss_refuses_subclasses(problem, backend, kind, where):
    params, x, y = problem
    make, message = SUBCLASSES[kind]
    step = mj.compile_loss(loss, backend=backend)
    for _ in range(2):   # compiled for plain arrays, then the fast path: a subclass is never taken
        step(params, x, y)
    if where == "x":
        x = make(x)
    else:
        params = {"W": make(params["W"])}
    with pytest.raises(mj.DtypeError, match=f"{where.replace('[', '.').replace(']', '.')} is a {message}"):
        step(params, x, y)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["x", "params['W']", "state['m']['W']"])
def test_train_step_refuses_a_masked_array(problem, backend, where):
    params, x, y = problem
    step = mj.train_step(loss, mj.optim.adam(0.01), backend=backend)
    state = step.init(params)
    for _ in range(2):
        step(params, state, x, y)
    if where == "x":
        x = masked(x)
    elif where == "params['W']":
        params = {"W": masked(params["W"])}
    else:
        state["m"] = {"W": masked(state["m"]["W"])}
    with pytest.raises(mj.DtypeError, match="MaskedArray: its mask would be ignored"):
        step(params, state, x, y)


def test_out_refuses_a_masked_array(problem):
    params, x, y = problem
    step = mj.compile_loss(loss)
    with pytest.raises(mj.DtypeError, match=r"out\['W'\] must be a writeable C-contiguous float64 array of shape \(3, 1\) .*got a MaskedArray"):
        step(params, x, y, out={"W": masked(np.zeros((3, 1)))})


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_memmap_is_taken_as_an_array(problem, backend, tmp_path):
    params, x, y = problem
    mapped = np.memmap(tmp_path / "x.dat", dtype=x.dtype, mode="w+", shape=x.shape)
    mapped[...] = x
    step = mj.compile_loss(loss, backend=backend)
    value, grads = step(params, x, y)
    for _ in range(2):
        mapped_value, mapped_grads = step(params, mapped, y)
        assert mapped_value == value
        np.testing.assert_array_equal(mapped_grads["W"], grads["W"])
