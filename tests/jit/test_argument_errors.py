"""Arrays passed as Python lists: the error says which argument is a list and what to pass."""
import numpy as np
import pytest

import morphjit as mj

BACKENDS = ["numba", "interp"]


def loss(w, x):
    return mj.sum(x @ w)


def concrete_loss(w, x):
    return mj.sum(w) * float(x[0][0])     # a traced number cannot become a Python float


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_passed_as_a_list_is_an_array_like(backend):
    x = [[1.0, 2.0], [3.0, 4.0]]
    value, grad = mj.compile_loss(loss, backend=backend)(np.ones((2, 2)), x)
    assert value == loss(np.ones((2, 2)), np.asarray(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_passed_as_a_list(backend):
    with pytest.raises(mj.TracingError, match=r"needs a concrete value.*Note: x is a Python list, whose numbers "
                                              r"are traced one by one; to use it as an array, pass np.asarray\(x\)"):
        mj.compile_loss(concrete_loss, backend=backend)(np.ones((2, 2)), [[1.0, 2.0], [3.0, 4.0]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_list_nested_in_data_is_named_by_its_path(backend):
    fn = lambda w, batch: concrete_loss(w, batch["x"])
    with pytest.raises(mj.TracingError, match=r"Note: batch\['x'\] is a Python tuple"):
        mj.compile_loss(fn, backend=backend)(np.ones(2), {"x": ((1.0, 2.0), (3.0, 4.0))})


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_differentiated_list(backend):
    with pytest.raises(mj.DtypeError, match=r"^w is differentiated but is a Python list of numbers; .* "
                                            r"pass np.asarray\(w\)"):
        mj.compile_loss(loss, backend=backend)([[1.0, 2.0], [3.0, 4.0]], np.ones((2, 2)))


def test_a_differentiated_list_in_train_step():
    step = mj.train_step(lambda p, x: mj.sum(x @ p["w"]), mj.optim.sgd(0.1))
    with pytest.raises(mj.DtypeError, match=r"p\['w'\] is differentiated but is a Python list"):
        step({"w": [1.0, 2.0]}, {"step": np.zeros((), np.int64)}, np.ones((3, 2)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_numbers_in_a_list_used_one_by_one_still_work(backend):
    fn = lambda w, hyper: mj.sum(w * hyper[0]) + hyper[1]
    value, grad = mj.compile_loss(fn, backend=backend)(np.ones(2), [2.0, 3.0])
    assert value == 7.0
    np.testing.assert_array_equal(grad, [2.0, 2.0])


@pytest.mark.parametrize("kind", ["grad", "compile_loss", "compile"])
def test_a_traced_value_kept_past_its_trace_is_refused_with_the_users_line(kind):
    from morphjit.tracing import Trace
    t = Trace()
    kept = mj.api.full((3,), 1.0, np.float64, like=t)
    t.closed = True          # as a finished trace is
    again = {"grad": mj.grad, "compile_loss": mj.compile_loss, "compile": mj.compile}[kind](lambda x: np.sum(x))
    with pytest.raises(mj.UnsupportedError, match="kept past its trace") as raised:
        again(kept)   # the line the error names
    assert "x is a traced value of a function morphjit traced earlier" in str(raised.value)
    assert "again(kept)" in str(raised.value)
