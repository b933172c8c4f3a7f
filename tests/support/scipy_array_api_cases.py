"""SciPy's own logsumexp, softmax, log_softmax and special ufuncs on traced arrays, run by
tests/api/test_array_namespace.py as it is and in a fresh interpreter with SCIPY_ARRAY_API=1 (SciPy
reads it when it is imported). Values against SciPy on NumPy arrays, gradients against central
differences, on both backends; prints ``ok``."""
import numpy as np
import scipy.special as sp

import morphjit as mj

# Each case is f(s, x) with s = x * w traced in w; x is data (it may be negative: signed weights).
CASES = {
    "logsumexp": lambda s, x: sp.logsumexp(s),
    "logsumexp axis=1": lambda s, x: sp.logsumexp(s, axis=1),
    "logsumexp axis=(0, 1) keepdims": lambda s, x: sp.logsumexp(s, axis=(0, 1), keepdims=True),
    "logsumexp axis=0 b": lambda s, x: sp.logsumexp(s, axis=0, b=x * x),
    "logsumexp axis=-1 b keepdims": lambda s, x: sp.logsumexp(s, axis=-1, b=x * x + 1.0, keepdims=True),
    "logsumexp signed b return_sign": lambda s, x: sp.logsumexp(s, axis=1, b=x, return_sign=True)[0],
    "logsumexp tied maxima, b": lambda s, x: sp.logsumexp(np.stack([s[0], s[0], s[1]]), axis=0, b=x[:, :1] ** 2 + 1),
    "softmax": lambda s, x: sp.softmax(s),
    "softmax axis=0": lambda s, x: sp.softmax(s, axis=0),
    "softmax axis=(0, 1)": lambda s, x: sp.softmax(s, axis=(0, 1)),
    "log_softmax axis=1": lambda s, x: sp.log_softmax(s, axis=1),
    "log_softmax axis=0": lambda s, x: sp.log_softmax(s, axis=0),
    "expit": lambda s, x: sp.expit(s),
    "xlogy": lambda s, x: sp.xlogy(x * x, sp.expit(s)),
    "entr": lambda s, x: sp.entr(sp.expit(s)),
    "softplus, sinc": lambda s, x: sp.softplus(s) * sp.sinc(s),
}
SIGN = lambda s, x: sp.logsumexp(s, axis=1, b=x, return_sign=True)[1]   # no gradient: values only

rng = np.random.default_rng(15)
w, x = rng.normal(size=4), rng.normal(size=(3, 4))
weights = {name: rng.normal(size=np.shape(f(x * w, x))) for name, f in CASES.items()}


def outputs(w, x):
    return {name: f(x * w, x) for name, f in CASES.items()} | {"sign": SIGN(x * w, x)}


def loss(w, x):
    return sum(np.sum(f(x * w, x) * weights[name]) for name, f in CASES.items())


def central_differences(w, x, eps=1e-6):
    return np.array([(loss(w + eps * e, x) - loss(w - eps * e, x)) / (2 * eps) for e in np.eye(w.size)])


values, expected = mj.compile(outputs, backend="interp")(w, x), outputs(w, x)
for name in expected:
    np.testing.assert_allclose(values[name], expected[name], rtol=1e-13, atol=1e-15, err_msg=name)
    assert np.shape(values[name]) == np.shape(expected[name]), name

# float32 stays float32 and integers become float64, as SciPy computes them on NumPy arrays.
for data in (x.astype(np.float32), np.arange(12).reshape(3, 4)):
    lse = lambda d: (sp.logsumexp(d, axis=1, b=d * d), sp.softmax(d, axis=0), sp.log_softmax(d))
    for got, want in zip(mj.compile(lse, backend="interp")(data), lse(data)):
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_allclose(got, want, rtol=1e-6)

for backend in ("numba", "interp"):
    value, grad = mj.compile_loss(loss, backend=backend)(w, x)
    np.testing.assert_allclose(value, loss(w, x), rtol=1e-13, err_msg=backend)
    np.testing.assert_allclose(grad, central_differences(w, x), rtol=1e-6, atol=1e-8, err_msg=backend)

# A second batch size: softmax and log_softmax stay batch-polymorphic; logsumexp retraces (SciPy
# asks for the array's size as a number).
step = mj.compile_loss(lambda w, x: np.sum(sp.log_softmax(x * w, axis=1) * x) + np.sum(sp.softmax(x * w, axis=1)))
for n in (5, 9):
    x_n = rng.normal(size=(n, 4))
    np.testing.assert_allclose(step(w, x_n)[0], np.sum(sp.log_softmax(x_n * w, axis=1) * x_n) + n, rtol=1e-13)
assert step.cache_info().misses == 1, step.cache_info()
# A SciPy function that still converts its argument is named by its public path, not by the
# wrapper SciPy's array-API dispatch puts around it.
import scipy.ndimage  # noqa: E402

try:
    mj.trace(lambda x: scipy.ndimage.gaussian_filter(x, 1.0), x)
except mj.UnsupportedError as error:
    assert str(error).startswith("scipy.ndimage.gaussian_filter does not trace"), error
else:
    raise AssertionError("scipy.ndimage.gaussian_filter traced")
print("ok")
