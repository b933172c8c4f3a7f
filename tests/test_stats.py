"""SciPy's distributions on traced arrays (morphjit/stats.py): SciPy's values everywhere (outside
the support, at its ends, invalid parameters, NaN and inf), gradients against finite differences,
frozen distributions, the multivariate normal, and the refusal of what is not covered."""
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats as ss

import morphjit as mj
from gradcheck import check_loss_grads_fd

BACKENDS = ["interp", "numba"]
X = np.array([-2.0, -0.3, 0.0, 0.2, 0.7, 1.0, 1.5, 3.0, np.nan, np.inf, -np.inf])
K = np.array([-1.0, 0.0, 1.0, 2.0, 3.0, 5.0, 2.5, np.nan])

CONTINUOUS = [  # (distribution, method, parameters after x)
    ("norm", "logpdf", (0.3, 1.7)), ("norm", "pdf", ()), ("norm", "cdf", (0.3, 1.7)), ("norm", "logcdf", ()),
    ("norm", "sf", (-0.2,)), ("norm", "logsf", (0.3, 1.7)), ("norm", "logpdf", (0.0, -1.0)),
    ("t", "logpdf", (3.0, 0.1, 2.0)), ("t", "logpdf", (-1.0,)), ("cauchy", "pdf", (0.5,)),
    ("laplace", "logpdf", (0.1, 0.5)), ("logistic", "logpdf", ()), ("logistic", "logcdf", (0.2,)),
    ("logistic", "sf", ()), ("expon", "logpdf", (0.0, 2.0)), ("expon", "logcdf", (-0.5, 2.0)),
    ("expon", "sf", (-0.5, 2.0)), ("gamma", "logpdf", (2.5,)), ("gamma", "logpdf", (0.5, 0.1)),
    ("gamma", "pdf", (1.0,)), ("gamma", "logpdf", (0.0,)), ("chi2", "logpdf", (3.0,)), ("lognorm", "logpdf", (0.7,)),
    ("halfnorm", "logpdf", ()), ("beta", "logpdf", (2.0, 3.0)), ("beta", "logpdf", (0.5, 3.0)),
    ("beta", "pdf", (1.0, 1.0)), ("uniform", "logpdf", (-1.0, 2.0)),
]
DISCRETE = [("poisson", (2.5,)), ("poisson", (-1.0,)), ("bernoulli", (0.3,)), ("binom", (4, 0.3)), ("binom", (4, 1.5)),
            ("geom", (0.3,)), ("nbinom", (3, 0.4)), ("poisson", (2.0, 1))]


def _every_case(x, k):
    out = [getattr(getattr(ss, name), method)(x, *params) for name, method, params in CONTINUOUS]
    return out + [getattr(ss, name).logpmf(k, *params) for name, params in DISCRETE] + \
        [ss.poisson.pmf(k, 1.5), ss.norm(0.5, 2.0).logpdf(x), ss.binom(4, 0.5).logpmf(k), ss.expon(scale=2.0).cdf(x)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_method_gives_scipys_values_everywhere(backend):
    got = mj.compile(_every_case, backend=backend)(X, K)
    expected = _every_case(X, K)
    with np.errstate(all="ignore"):
        for (g, e), case in zip(zip(got, expected), CONTINUOUS + DISCRETE + ["poisson.pmf", "frozen"] * 2):
            np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-300, equal_nan=True, err_msg=str(case))


def _log_likelihood(p, x, k):
    """Every distribution, with its parameters and the points (inside the supports) as parameters."""
    unit = 1.0 / (1.0 + np.exp(-p["u"]))   # in (0, 1)
    terms = [
        ss.norm.logpdf(p["x"], p["loc"], p["scale"]), ss.norm.logcdf(p["x"], p["loc"], p["scale"]),
        ss.norm.logsf(p["x"], p["loc"]), ss.norm.cdf(p["x"]), ss.t.logpdf(p["x"], p["df"], p["loc"], p["scale"]),
        ss.cauchy.logpdf(p["x"], p["loc"], p["scale"]), ss.laplace.logpdf(p["x"] + 0.05, p["loc"], p["scale"]),
        ss.logistic.logpdf(p["x"], p["loc"], p["scale"]), ss.logistic.logsf(p["x"], p["loc"]),
        ss.expon.logpdf(p["pos"], scale=p["scale"]), ss.expon.logcdf(p["pos"], scale=p["scale"]),
        ss.gamma.logpdf(p["pos"], p["df"], scale=p["scale"]), ss.chi2.logpdf(p["pos"], p["df"]),
        ss.lognorm.logpdf(p["pos"], p["scale"]), ss.halfnorm.pdf(p["pos"], scale=p["scale"]),
        ss.beta.logpdf(unit, p["df"], p["scale"]), ss.uniform.logpdf(unit * 0.5, p["loc"] - 1.0, 2.0 + p["scale"]),
        ss.poisson.logpmf(k, p["mu"]), ss.bernoulli.logpmf(k % 2, unit), ss.binom.logpmf(k, 5, unit),
        ss.geom.logpmf(k + 1, unit), ss.nbinom.logpmf(k, p["df"], unit), ss.norm(p["loc"], p["scale"]).logpdf(x),
    ]
    return sum(np.sum(term) for term in terms)


def _few_terms(p, x, k):
    """A few of the terms above: numba's compile time grows faster than a program's size."""
    return np.sum(ss.t.logpdf(p["x"], p["df"], p["loc"], p["scale"])) + np.sum(ss.poisson.logpmf(k, p["mu"]))


@pytest.mark.parametrize("backend,loss", [("interp", _log_likelihood), ("numba", _few_terms)])
def test_gradients_match_finite_differences(backend, loss):
    rng = np.random.default_rng(0)
    p = {"x": rng.normal(size=5), "pos": rng.uniform(0.2, 3.0, 5), "u": rng.normal(size=5), "loc": np.float64(0.2),
         "scale": np.float64(1.3), "df": np.float64(2.5), "mu": np.float64(1.7)}
    x, k = rng.normal(size=4), rng.integers(0, 5, 5).astype(float)
    value, grads = mj.compile_loss(loss, backend=backend)(p, x, k)
    np.testing.assert_allclose(value, loss(p, x, k), rtol=1e-12)
    keys = [key for key in sorted(p) if np.any(grads[key])]
    assert len(keys) >= 4
    check_loss_grads_fd(lambda xs: loss({**p, **dict(zip(keys, xs))}, x, k), [p[key] for key in keys],
                        [grads[key] for key in keys], rng=rng)


def _mvn_terms(mean, root, x):
    cov = root @ root.T + np.eye(3)
    return [ss.multivariate_normal.logpdf(x, mean, cov), ss.multivariate_normal.pdf(x[0], mean, cov),
            ss.multivariate_normal.logpdf(x, mean, np.diagonal(cov)), ss.multivariate_normal.logpdf(x, mean, 2.0),
            ss.multivariate_normal.logpdf(x[:, 0], mean[0], cov[0, 0]), ss.multivariate_normal.logpdf(x, cov=cov)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_multivariate_normal_values_and_gradients(backend):
    rng = np.random.default_rng(1)
    mean, root, x = rng.normal(size=3), rng.normal(size=(3, 3)), rng.normal(size=(4, 3))
    got = mj.compile(_mvn_terms, backend=backend)(mean, root, x)
    for g, e in zip(got, _mvn_terms(mean, root, x)):
        assert np.shape(g) == np.shape(e)
        np.testing.assert_allclose(g, e, rtol=1e-11)

    def loss(mean, root, x):
        terms = _mvn_terms(mean, root, x)
        return sum(np.sum(term) for term in (terms if backend == "interp" else terms[:1]))

    value, grads = mj.compile_loss(loss, argnums=(0, 1, 2), backend=backend)(mean, root, x)
    np.testing.assert_allclose(value, loss(mean, root, x), rtol=1e-11)
    check_loss_grads_fd(lambda xs: loss(*xs), [mean, root, x], list(grads), rng=rng)


def test_float32_stays_float32():
    step = mj.compile_loss(lambda mu, x: np.sum(ss.norm.logpdf(x, mu, 2.0)))
    value, grad = step(np.float32(0.5), np.linspace(-1, 1, 5, dtype=np.float32))
    assert value.dtype == np.float32 and grad.dtype == np.float32
    np.testing.assert_allclose(value, np.sum(ss.norm.logpdf(np.linspace(-1, 1, 5), 0.5, 2.0)), rtol=1e-6)


def test_scipys_methods_are_its_own_outside_traces():
    originals = (ss.rv_continuous.logpdf, ss.rv_discrete.logpmf, type(ss.multivariate_normal).logpdf)
    mj.compile_loss(lambda mu: ss.norm.logpdf(1.0, mu) + ss.poisson.logpmf(2, np.exp(mu)))(np.float64(0.1))
    assert (ss.rv_continuous.logpdf, ss.rv_discrete.logpmf, type(ss.multivariate_normal).logpdf) == originals
    assert ss.norm.logpdf(1.0, 0.1) == pytest.approx(-0.5 * 0.81 - 0.5 * np.log(2 * np.pi), rel=1e-15)


def test_what_is_not_covered_is_refused_naming_it():
    def weibull(c):
        return np.sum(ss.weibull_min.logpdf(np.ones(3), c))  # <- weibull

    def quantile(mu):
        return np.sum(ss.norm(mu).ppf(0.3))  # <- quantile

    def singular(mean):
        return ss.multivariate_normal.logpdf(np.zeros(2), mean, np.eye(2), allow_singular=True)  # <- singular

    for fn, words in [(weibull, ["scipy.stats.weibull_min.logpdf does not trace", "logpdf and pdf of beta"]),
                      (quantile, ["scipy.stats.norm.ppf does not trace"]),
                      (singular, ["allow_singular=True is not supported"])]:
        with pytest.raises(mj.UnsupportedError) as error:
            mj.compile_loss(fn)(np.zeros(2) if fn is singular else np.float64(1.5))
        for word in words + [f"# <- {fn.__name__}"]:
            assert word in str(error.value)


LATE_IMPORT = '''
import sys
import numpy as np
import morphjit as mj

assert not {"scipy.stats", "scipy.signal", "morphjit.stats", "morphjit.signal"} & set(sys.modules)

def loss(mu, x):
    import scipy.stats      # first imported while the first trace runs
    return -np.sum(scipy.stats.norm.logpdf(x, mu, 2.0))

x, mu = np.array([0.0, 1.0, 3.0]), np.float64(0.5)
try:
    mj.trace(loss, mu, x)
    raise SystemExit("the first trace should not have traced scipy.stats")
except mj.UnsupportedError as error:
    assert "import it before the function is traced" in str(error), error
value, grad = mj.compile_loss(loss)(mu, x)   # traces that start after the import
assert np.isclose(value, loss(mu, x)) and np.isclose(grad, -np.sum(x - mu) / 4), (value, grad)

import scipy.signal
try:
    mj.trace(lambda a: np.sum(scipy.signal.convolve(a, np.ones(2))), np.ones(3))
except mj.UnsupportedError as error:
    assert "call mj.signal.convolve instead" in str(error), error
'''


def test_scipy_stats_and_signal_load_on_first_use():
    # import morphjit leaves them out (a third of its import time); a trace that starts once
    # scipy.stats is imported substitutes its methods, and errors still name mj.signal's twins.
    subprocess.run([sys.executable, "-c", LATE_IMPORT], check=True)
