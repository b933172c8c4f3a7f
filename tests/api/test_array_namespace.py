"""The array-API namespace of traced arrays (``x.__array_namespace__()``) and SciPy's functions that
run on it, with SCIPY_ARRAY_API=1 and without (each in a fresh interpreter: SciPy reads the
variable when it is imported)."""
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy._lib._array_api
import scipy.special as sp
from scipy._lib import array_api_extra as xpx

import morphjit as mj
from morphjit.api import namespace as xp
from support.paths import ROOT



@pytest.mark.slow
def test_scipy_functions_trace_differentiate_and_compile_with_scipy_array_api():
    env = dict(os.environ, SCIPY_ARRAY_API="1", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "scipy_array_api_cases.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


@pytest.mark.slow
def test_scipy_functions_trace_without_scipy_array_api():
    """SciPy's lookup of the namespace answers the traced array's while a trace runs."""
    import scipy._lib._array_api
    assert not scipy._lib._array_api.SCIPY_ARRAY_API
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "support" / "scipy_array_api_cases.py")],
                         env=dict(os.environ, SCIPY_ARRAY_API="", PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


def test_numpy_and_traced_arrays_mix_in_one_call_and_scipy_is_its_own_outside_traces():
    import scipy.special._logsumexp as module
    scipys = module.array_namespace
    b = np.array([1.0, 2.0, 0.5])
    value, grad = mj.compile_loss(lambda x: sp.logsumexp(x, b=b), backend="interp")(np.zeros(3))
    np.testing.assert_allclose(value, np.log(3.5), rtol=1e-14)
    np.testing.assert_allclose(grad, b / 3.5, rtol=1e-14)
    assert module.array_namespace is scipys and scipys.__module__.startswith("scipy.")


def test_the_namespace_has_the_standards_signatures():
    def f(x, y):
        n = x.__array_namespace__()
        assert n is xp and n.isdtype(x.dtype, "real floating") and not n.isdtype(x.dtype, ("integral", "bool"))
        assert n.result_type(x, 1.0) == np.float32 and n.result_type(x, y) == np.float64
        return (n.cumulative_sum(x, axis=1, include_initial=True), n.vecdot(x, y), n.permute_dims(x, (1, 0)),
                n.concat([x, x], axis=0), n.clip(x, max=0.5), n.pow(n.abs(x), 2.0), n.acos(x * 0.5),
                n.var(x, axis=0, correction=1), n.asarray(np.arange(3.0)) + x[0, :3], x.mT, n.squeeze(x[:1], 0),
                n.arange(4, step=2) + x[0, :2])

    x = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)
    y = np.arange(12.0).reshape(3, 4)
    expected = (np.concatenate([np.zeros((3, 1), np.float32), np.cumsum(x, axis=1)], axis=1), np.sum(x * y, axis=-1),
                x.T, np.concatenate([x, x]), np.minimum(x, 0.5), np.abs(x) ** 2, np.arccos(x * 0.5),
                np.var(x, axis=0, ddof=1), np.arange(3.0) + x[0, :3], x.T, x[0], np.arange(0, 4, 2) + x[0, :2])
    for got, want in zip(mj.compile(f, backend="interp")(x, y), expected):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_name_the_namespace_lacks_is_missing_to_hasattr_and_named_when_used():
    assert not hasattr(xp, "fft") and not hasattr(xp, "complex64")
    with pytest.raises(mj.UnsupportedError, match=r"xp\.sort \(the array API namespace of traced arrays\)"):
        mj.trace(lambda x: x.__array_namespace__().sort(x), np.ones(3))


def test_array_api_extra_at_updates_a_copy_of_a_traced_array():
    """SciPy's in-place-or-copy update (SciPy passes the namespace it found; here SciPy runs without
    SCIPY_ARRAY_API, so the test passes it). With copy=True the input keeps its value; with
    copy=None the array is updated in place, as a writeable NumPy array is: the tracer object then
    stands for the new value."""
    def f(x):
        y = xpx.at(x, x < 0).set(-np.inf, copy=True, xp=xp)
        z = xpx.at(y)[1:3].set(7.0, copy=True, xp=xp)
        w = xpx.at(z)[0].set(5.0, xp=xp)
        assert w is z
        return x, y, z

    x = np.array([1.0, -2.0, 3.0, -4.0])
    x_out, y, z = mj.compile(f, backend="interp")(x)
    np.testing.assert_array_equal(x_out, x)
    np.testing.assert_array_equal(y, [1.0, -np.inf, 3.0, -np.inf])
    np.testing.assert_array_equal(z, [5.0, 7.0, 7.0, -np.inf])


def test_array_api_extra_at_with_copy_false_and_item_assignment_into_an_argument_are_refused():
    with pytest.raises(mj.UnsupportedError, match=r"copy=False\) on a traced array is not supported") as error:
        mj.trace(lambda x: xpx.at(x, 0).set(1.0, copy=False, xp=xp), np.ones(3))
    assert error.value.loc.filename == __file__   # the user's line, not SciPy's that raised it
    with pytest.raises(mj.ArgumentWriteError, match=r"argument x"):
        mj.trace(lambda x: x.__setitem__(0, 1.0), np.ones(3))


def test_an_array_api_version_the_namespace_does_not_implement_is_refused():
    def f(x):
        assert x.__array_namespace__(api_version="2023.12") is xp
        return x.__array_namespace__(api_version="2099.12")

    with pytest.raises(ValueError, match="implements the array API 2023.12, not 2099.12"):
        mj.trace(f, np.ones(3))
