"""SciPy's distributions on traced arrays (morphjit/stats.py): SciPy's values everywhere (outside
the support, at its ends, invalid parameters, NaN and inf), gradients against finite differences,
frozen distributions, the multivariate normal, and the refusal of what is not covered."""
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats as ss

import morphjit as mj
from support import limits
from support import gradcheck
from support.gradcheck import check_loss_grads_fd

BACKENDS = ["interp", "numba"]
X = np.array([-2.0, -0.3, 0.0, 0.2, 0.7, 1.0, 1.5, 3.0, np.nan, np.inf, -np.inf])
K = np.array([-1.0, 0.0, 1.0, 2.0, 3.0, 5.0, 2.5, np.nan, 4.0, 30.0, np.inf, -np.inf])

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
    # the tails of SciPy's special functions (gammainc, betainc, stdtr, ...) and of closed forms
    *[(name, method, params) for name, params in [("gamma", (2.5,)), ("gamma", (0.5, 0.1, 2.0)), ("chi2", (3.0,)),
                                                 ("beta", (2.0, 3.0)), ("beta", (0.5, 0.5, -0.1, 1.5)),
                                                 ("t", (3.0, 0.1, 2.0)), ("cauchy", (0.5,)), ("laplace", (0.1, 0.5)),
                                                 ("lognorm", (0.7,)), ("halfnorm", ()), ("uniform", (-1.0, 2.0))]
      for method in ("cdf", "sf", "logcdf", "logsf")],
]
DISCRETE = [("poisson", (2.5,)), ("poisson", (-1.0,)), ("bernoulli", (0.3,)), ("binom", (4, 0.3)), ("binom", (4, 1.5)),
            ("geom", (0.3,)), ("nbinom", (3, 0.4)), ("poisson", (2.0, 1))]


# SciPy's logcdf with an invalid parameter is 0 beyond the support (its cdf NaN): morphjit's is NaN,
# as its other methods' (test_nan_arguments_and_invalid_parameters_give_nan_values_and_gradients)
INVALID_DISCRETE = [("poisson", (-1.0,)), ("binom", (4, 1.5))]
DISCRETE_TAILS = [(name, method, params) for name, params in DISCRETE + [("poisson", (0.0,)), ("geom", (1.0,)),
                                                                         ("nbinom", (2.5, 1.0)), ("binom", (4, 0.0))]
                  for method in ("cdf", "sf", "logcdf", "logsf")
                  if not (method == "logcdf" and (name, params) in INVALID_DISCRETE)]


def _every_case(x, k):
    out = [getattr(getattr(ss, name), method)(x, *params) for name, method, params in CONTINUOUS]
    return out + [getattr(ss, name).logpmf(k, *params) for name, params in DISCRETE] + \
        [ss.poisson.pmf(k, 1.5), ss.norm(0.5, 2.0).logpdf(x), ss.binom(4, 0.5).logpmf(k), ss.expon(scale=2.0).cdf(x)] + \
        [getattr(getattr(ss, name), method)(k, *params) for name, method, params in DISCRETE_TAILS]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_method_gives_scipys_values_everywhere(backend):
    got = mj.compile(_every_case, backend=backend)(X, K)
    expected = _every_case(X, K)
    with np.errstate(all="ignore"):
        for (g, e), case in zip(zip(got, expected), CONTINUOUS + DISCRETE + ["poisson.pmf", "frozen"] * 2 + DISCRETE_TAILS):
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
        # tails (held shapes: their gradient is refused)
        ss.gamma.logcdf(p["pos"], 2.5, p["loc"] - 0.5, p["scale"]), ss.chi2.sf(p["pos"], 3.0, scale=p["scale"]),
        ss.beta.cdf(unit, 2.0, 0.5), ss.beta.logsf(unit * p["scale"], 1.5, 2.5, scale=p["scale"] + 0.1),
        ss.t.logsf(p["x"], 2.5, p["loc"], p["scale"]), ss.cauchy.cdf(p["x"], p["loc"], p["scale"]),
        ss.laplace.logcdf(p["x"], p["loc"], p["scale"]), ss.halfnorm.logsf(p["pos"], scale=p["scale"]),
        ss.lognorm.cdf(p["pos"], p["df"], scale=p["scale"]), ss.lognorm.logsf(p["pos"], p["df"]),
        ss.uniform.sf(unit * 0.5, p["loc"] - 1.0, 2.0 + p["scale"]), ss.t.cdf(p["x"], 4.0),
        ss.poisson.logcdf(k, p["mu"]), ss.poisson.sf(k, p["mu"]), ss.binom.sf(k, 5, unit), ss.geom.cdf(k + 1, unit),
        ss.geom.logsf(k + 1, unit), ss.nbinom.logsf(k, 3.0, unit), ss.bernoulli.logcdf(k % 2, unit),
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


@pytest.mark.parametrize("method", ["cdf", "logsf"])
def test_a_tails_gradient_in_a_shape_without_one_is_refused(method):
    def loss(a, x):
        return np.sum(getattr(ss.gamma, method)(x, a))   # <- the shape

    with pytest.raises(mj.UnsupportedError, match="gradient in the shape a of scipy.special.gammainc") as refused:
        mj.compile_loss(loss, argnums=(0, 1))(np.float64(2.0), np.array([0.5, 3.0]))
    assert "<- the shape" in str(refused.value)
    value, (grad_x,) = mj.compile_loss(loss, argnums=(1,))(np.float64(2.0), np.array([0.5, 3.0]))
    np.testing.assert_allclose(value, loss(2.0, np.array([0.5, 3.0])), rtol=1e-12)
    assert np.all(grad_x != 0)


def _entropies(mean, root):
    cov = root @ root.T + np.eye(3)
    return [ss.multivariate_normal.entropy(mean, cov), ss.multivariate_normal.entropy(cov=cov),
            ss.multivariate_normal.entropy(mean, np.diagonal(cov)), ss.multivariate_normal.entropy(mean, cov[0, 0]),
            ss.multivariate_normal.entropy(mean[0], cov[0, 0])]


@pytest.mark.parametrize("backend", BACKENDS)
def test_multivariate_normal_entropy_values_and_gradients(backend):
    rng = np.random.default_rng(6)
    mean, root = rng.normal(size=3), rng.normal(size=(3, 3))
    got = mj.compile(_entropies, backend=backend)(mean, root)
    for g, e in zip(got, _entropies(mean, root)):
        np.testing.assert_allclose(g, e, rtol=1e-12)

    def loss(mean, root):
        return sum(np.sum(h) for h in _entropies(mean, root))

    value, (grad_mean, grad_root) = mj.compile_loss(loss, argnums=(0, 1), backend=backend)(mean, root)
    np.testing.assert_allclose(value, loss(mean, root), rtol=1e-12)
    np.testing.assert_array_equal(grad_mean, 0.0)   # the entropy does not depend on the mean
    check_loss_grads_fd(lambda xs: loss(mean, xs[0]), [root], [grad_root], rng=rng)


def _dirichlet_terms(x, alpha):
    return [ss.dirichlet.logpdf(x, alpha), ss.dirichlet.logpdf(x[:, 0], alpha), ss.dirichlet.logpdf(x[:-1], alpha)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dirichlet_logpdf_values_and_gradients(backend):
    rng = np.random.default_rng(8)
    alpha, x = np.array([0.5, 2.0, 3.5, 1.0]), rng.dirichlet(np.ones(4), size=5).T   # points along the columns
    got = mj.compile(_dirichlet_terms, backend=backend)(x, alpha)
    for g, e in zip(got, _dirichlet_terms(x, alpha)):
        assert np.shape(g) == np.shape(e)
        np.testing.assert_allclose(g, e, rtol=1e-12)

    def loss(x, alpha):
        return sum(np.sum(t) for t in _dirichlet_terms(x, alpha))

    value, grads = mj.compile_loss(loss, argnums=(0, 1), backend=backend)(x, alpha)
    np.testing.assert_allclose(value, loss(x, alpha), rtol=1e-12)
    # along the simplex: a direction whose columns sum to 0 (the first term's x stays on it)
    step = rng.normal(size=x.shape)
    step -= step.mean(axis=0)
    check_loss_grads_fd(lambda xs: loss(x + xs[0] * step, xs[1]), [np.float64(0.0), alpha],
                        [np.sum(grads[0] * step), grads[1]], rng=rng)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dirichlet_points_passed_as_data_compile_for_their_number_of_components(backend):
    # x's leading extent would be the batch size; the components are checked at the concrete one
    alpha, rng = np.array([1.5, 2.0, 3.0]), np.random.default_rng(3)
    step = mj.compile_loss(lambda alpha, x: np.sum(ss.dirichlet.logpdf(x, alpha)), backend=backend)
    for x in (np.array([0.2, 0.3, 0.5]), rng.dirichlet(np.ones(3), size=4).T, np.array([0.6, 0.1])):
        value, grad = step(alpha, x)
        np.testing.assert_allclose(np.sum(value), np.sum(ss.dirichlet.logpdf(x, alpha)), rtol=1e-12)
        bumps = 1e-6 * np.eye(3)
        fd = [(np.sum(ss.dirichlet.logpdf(x, alpha + d)) - np.sum(ss.dirichlet.logpdf(x, alpha - d))) / 2e-6
              for d in bumps]
        np.testing.assert_allclose(grad, fd, rtol=1e-6)
    with pytest.raises(ValueError, match="one entry fewer"):
        step(alpha, np.full(5, 0.2))


def test_dirichlet_logpdf_is_nan_where_scipy_refuses_the_values():
    x = np.array([[0.2, 0.3, 0.0], [0.5, 0.1, 0.5], [0.3, 0.7, 0.5]])   # the second column sums to 1.1
    value, grad_alpha = mj.compile_loss(lambda alpha, x: np.sum(ss.dirichlet.logpdf(x, alpha)),
                                        static_shapes=True)(np.array([1.5, 2.0, 0.5]), x)
    assert np.isnan(value) and np.isnan(grad_alpha).all()
    good = mj.compile(lambda alpha, x: ss.dirichlet.logpdf(x, alpha), static_shapes=True)(
        np.array([1.5, 2.0, 3.0]), x[:, [0, 2]])
    np.testing.assert_allclose(good, ss.dirichlet.logpdf(x[:, [0, 2]], np.array([1.5, 2.0, 3.0])), rtol=1e-12)
    with pytest.raises(ValueError, match="one entry fewer"):
        mj.trace(lambda alpha: ss.dirichlet.logpdf(np.ones((5, 2)) / 5, alpha), np.ones(3))


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

assert not {"scipy.stats", "scipy.signal", "morphjit.api.scipy.stats", "morphjit.api.scipy.signal"} & set(sys.modules)

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


@pytest.mark.slow
def test_scipy_stats_and_signal_load_on_first_use():
    # import morphjit leaves them out (a third of its import time); a trace that starts once
    # scipy.stats is imported substitutes its methods, and errors still name mj.signal's twins.
    subprocess.run([sys.executable, "-c", LATE_IMPORT], check=True)


# ---------------------------------------------------------------------------------------------
# At +-inf and at the ends of the supports: SciPy's values, and gradients that are the limits of
# the derivatives there (tests/support/limits.py: central differences of SciPy's function along a path)

LOC, SCALE = 0.3, 1.7
EDGE_SHAPES = {  # the shapes tried: where a power of z is (a - 1), below, at and above 0
    "norm": [()], "t": [(3.0,)], "cauchy": [()], "laplace": [()], "logistic": [()], "expon": [()],
    "gamma": [(0.5,), (1.0,), (2.5,)], "chi2": [(1.0,), (2.0,), (5.0,)], "lognorm": [(0.7,)], "halfnorm": [()],
    "beta": [(0.5, 3.0), (1.0, 1.0), (2.5, 1.0), (1.0, 0.5)], "uniform": [()],
}
# SciPy's laplace.logpdf is log(pdf), -inf from |z| = 745 on, and so are its logcdf below and its
# logsf above, and halfnorm's logsf, log(2 ndtr(-z)), from z = 38 on: the path into +-inf reads the formula.
REFERENCES = {("laplace", "logpdf"): lambda x, loc, scale: -np.abs((x - loc) / scale) - np.log(2 * scale),
              ("laplace", "logcdf"): lambda x, loc, scale: ss.laplace.logcdf(np.maximum(x, loc), loc, scale)
              + np.minimum((x - loc) / scale, 0.0),
              ("laplace", "logsf"): lambda x, loc, scale: ss.laplace.logsf(np.minimum(x, loc), loc, scale)
              - np.maximum((x - loc) / scale, 0.0),
              ("halfnorm", "logsf"): lambda x, loc, scale: np.log(2.0) + ss.norm.logsf(x, loc, scale)}
# Tails whose gradient in the shapes is refused (SciPy's gammainc, betainc, stdtr have none): held.
HELD_SHAPES = {"gamma", "chi2", "beta", "t"}


def _methods(name):
    return ["logpdf", "pdf"] + (["logcdf", "cdf", "logsf", "sf"] if mj.stats.CONTINUOUS[name].tails else [])


def _held(name, method, arguments) -> set:
    """The indices of the shapes among ``(x, *shapes, loc, scale)`` (``(k, *shapes)``) a method's
    gradient refuses."""
    if method in ("logpdf", "pdf", "logpmf", "pmf"):
        return set()
    if name in HELD_SHAPES:
        return set(range(1, len(arguments) - 2))
    return {1 + i for i in HELD_IN_TAILS.get(name, ())}


def _call(dist, method, arguments):
    """``dist.method(*arguments)``, the held shapes under ``mj.stop_gradient``."""
    held = _held(dist.name, method, arguments)
    return getattr(dist, method)(*[mj.stop_gradient(a) if i in held else a for i, a in enumerate(arguments)])


def _support_edges(name, shapes):
    """(point, approach) for x: +-inf, and each finite end of the support from inside (from
    outside where the support is open there: lognorm's z > 0)."""
    lo, hi = mj.stats.CONTINUOUS[name].support
    n = 3 + len(shapes)
    ends = [(-np.inf, 0), (np.inf, 0)]
    if np.isfinite(lo):
        ends.append((0.0, -1) if lo > 0 else (lo, 1))
    if np.isfinite(hi):
        ends.append((hi, -1))
    return [limits.edge((LOC + z * SCALE if np.isfinite(z) else z, *shapes, LOC, SCALE), (side,) + (0,) * (n - 1),
                        (SCALE,) + (1.0,) * (n - 1), (0,) + tuple(range(2, 2 + len(shapes))) + (0, 1))
            for z, side in ends]


def _nan_allowed(dist, method, edge, value):
    """The pdf, cdf and sf (and their logs) where the density is 0 or infinite at a closed end of the
    support (a power of z other than 0), and a log tail that is -inf there: their gradients are
    products with the density or with the log-density's, 0 * inf, whose limit the formula does not
    give; they are NaN there (README), never a wrong number."""
    if edge.approach[0] == 0 or method == "logpdf":
        return False
    with np.errstate(all="ignore"):
        density = dist.pdf(*edge.point)
    return density in (0.0, np.inf) or (method in ("logcdf", "logsf") and value == -np.inf)


def _method(dist, method):
    return lambda *args: getattr(dist, method)(*args)   # SciPy's own outside a trace, looked up at the call


def _edge_groups(name):
    """(method, edges, arguments): per method, the edge points as arrays (one per argument), so
    that the gradient of each array is, element by element, the partial derivative at a point."""
    edges = [e for shapes in EDGE_SHAPES[name] for e in _support_edges(name, shapes)]
    arguments = [np.array(column) for column in zip(*(e.point for e in edges))]
    return [(method, edges, arguments) for method in _methods(name)]


def _check_edges(dist, groups, values, grads, reference) -> list[str]:
    failures = []
    for (method, edges, _), value, grad in zip(groups, values, grads):
        for k, edge in enumerate(edges):
            with np.errstate(all="ignore"):
                expected = getattr(dist, method)(*edge.point)
            if not np.allclose(value[k], expected, rtol=1e-12, atol=0, equal_nan=True):
                failures.append(f"{dist.name}.{method}{edge.point}: value {value[k]!r}, SciPy's {expected!r}")
            limit = limits.derivative_limits(reference(method), edge)
            free = [i for i in range(len(grad)) if i not in _held(dist.name, method, grad)]
            misses = limits.gradient_misses_limits([grad[i][k] for i in free], [limit[i] for i in free],
                                                   _nan_allowed(dist, method, edge, expected))
            failures += [f"{dist.name}.{method}{edge.point} from {edge.approach[0]:+d}: {m}" for m in misses]
    return failures


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(mj.stats.CONTINUOUS))
def test_every_continuous_method_at_infinity_and_the_ends_of_its_support(name, backend):
    assert set(EDGE_SHAPES) == set(mj.stats.CONTINUOUS)
    dist, groups = getattr(ss, name), _edge_groups(name)

    def loss(arguments):
        values = [_call(dist, method, args) for (method, _, _), args in zip(groups, arguments)]
        return sum(np.sum(v) for v in values), values

    (_, values), grads = mj.compile_loss(loss, has_aux=True, backend=backend)([args for _, _, args in groups])
    failures = _check_edges(dist, groups, values, grads,
                            lambda method: REFERENCES.get((name, method), _method(dist, method)))
    assert not failures, "\n".join(failures)


# (k, shape parameters, how each comes to its value): the ends of the support in k, and the
# parameters at the ends of their ranges (mu -> 0, p -> 0 and 1).
DISCRETE_EDGES = {
    "poisson": [(k, (2.5,), (0,)) for k in (0, 1)] + [(k, (0.0,), (1,)) for k in (0, 1, 2)],
    "bernoulli": [(k, (p,), (a,)) for k in (0, 1) for p, a in ((0.3, 0), (0.0, 1), (1.0, -1))],
    "binom": [(k, (4.0, p), (0, a)) for k in (0, 1, 4) for p, a in ((0.3, 0), (0.0, 1), (1.0, -1))],
    "geom": [(k, (p,), (a,)) for k in (1, 2) for p, a in ((0.3, 0), (1.0, -1))],
    "nbinom": [(k, (3.0, p), (0, a)) for k in (0, 2) for p, a in ((0.4, 0), (1.0, -1), (0.0, 0))],   # p = 0: NaN
}
INTEGER_SHAPES = {"binom": (0,)}   # binom's n: no derivative
HELD_IN_TAILS = {"binom": (0,), "nbinom": (0,)}   # n: the tails' gradient in it is refused


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(mj.stats.DISCRETE))
def test_every_discrete_method_at_the_ends_of_its_support_and_parameters(name, backend):
    """As above, for the continuous parameters; a pmf that is 0 there (poisson's mu = 0 at k >= 1)
    has the gradient 0 * inf, NaN (README)."""
    assert set(DISCRETE_EDGES) == set(mj.stats.DISCRETE)
    dist = getattr(ss, name)
    edges = [limits.edge((float(k), *shapes), (0, *approach)) for k, shapes, approach in DISCRETE_EDGES[name]]
    k, *shapes = [np.array(column) for column in zip(*(e.point for e in edges))]
    methods = ["logpmf", "pmf", "cdf", "sf", "logcdf", "logsf"]

    def held(method):
        return HELD_IN_TAILS.get(name, ()) if method not in ("logpmf", "pmf") else ()

    def loss(arguments, k):   # each method its own parameter arrays, and so its own gradients
        values = [getattr(dist, method)(k, *[mj.stop_gradient(s) if i in held(method) else s for i, s in enumerate(shapes)])
                  for method, shapes in zip(methods, arguments)]
        return sum(np.sum(v) for v in values), values

    (_, values), (all_grads,) = mj.compile_loss(loss, argnums=(0,), has_aux=True, backend=backend)(
        [shapes] * len(methods), k)
    failures = []
    for method, value, grads in zip(methods, values, all_grads):
        continuous = [i for i in range(len(shapes)) if i not in INTEGER_SHAPES.get(name, ()) + held(method)]
        for j, e in enumerate(edges):
            expected = getattr(dist, method)(*e.point)
            if not np.allclose(value[j], expected, rtol=1e-12, atol=0, equal_nan=True):
                failures.append(f"{name}.{method}{e.point}: value {value[j]!r}, SciPy's {expected!r}")
            limit = limits.derivative_limits(_method(dist, method), e)[1:]
            misses = limits.gradient_misses_limits([grads[i][j] for i in continuous], [limit[i] for i in continuous],
                                                   method in ("pmf", "logcdf", "logsf") and expected in (0.0, -np.inf))
            failures += [f"{name}.{method}{e.point}: {m}" for m in misses]
    assert not failures, "\n".join(failures)


INVALID = {"t": (-1.0,), "gamma": (0.0,), "chi2": (-2.0,), "lognorm": (0.0,), "beta": (1.0, -1.0),
           "poisson": (-1.0,), "bernoulli": (1.5,), "binom": (4.0, -0.1), "geom": (0.0,), "nbinom": (0.0, 0.5)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_arguments_and_invalid_parameters_give_nan_values_and_gradients(backend):
    """A NaN argument, a scale <= 0 or an invalid shape: NaN, and NaN in the gradient of every
    argument (the value is undefined around the point), not the 0 of a masked branch."""
    cases = {}   # (distribution, method) -> its argument tuples, evaluated as one vector each
    for name in sorted(mj.stats.CONTINUOUS):
        shapes = EDGE_SHAPES[name][0]
        invalid = [(1.0, *INVALID[name], LOC, SCALE)] if name in INVALID else []
        for method in _methods(name):
            cases[name, method] = [(np.nan, *shapes, LOC, SCALE), (1.0, *shapes, np.nan, SCALE),
                                   (1.0, *shapes, LOC, -1.0), *invalid]
    for name in sorted(mj.stats.DISCRETE):
        shapes = DISCRETE_EDGES[name][0][1]
        for method in ("logpmf", "pmf", "cdf", "sf", "logcdf", "logsf"):
            cases[name, method] = [(np.nan, *shapes), (1.0, *INVALID[name])]
    arguments = [[np.array(column) for column in zip(*rows)] for rows in cases.values()]

    def loss(arguments):
        values = [_call(getattr(ss, name), method, columns) for (name, method), columns in zip(cases, arguments)]
        return sum(np.sum(v) for v in values), values

    (_, values), grads = mj.compile_loss(loss, has_aux=True, backend=backend)(arguments)
    not_nan = [f"{name}.{method}{rows[j]}: value {value[j]!r}, gradient {[float(g[j]) for g in grad]}"
               for ((name, method), rows), value, grad in zip(cases.items(), values, grads)
               for j in range(len(rows)) if not (np.isnan(value[j]) and all(
                   np.isnan(g[j]) for i, g in enumerate(grad) if i not in _held(name, method, grad)))]
    assert not not_nan, "\n".join(not_nan)
    for (name, method), rows in cases.items():
        for args in rows:
            scipys = getattr(getattr(ss, name), method)(*args)
            quirk = method == "logcdf" and name in mj.stats.DISCRETE and not np.isnan(args[0])   # INVALID_DISCRETE
            assert np.isnan(scipys) or quirk, (name, method, args)   # as SciPy


def _ordered_model(dist):
    """statsmodels' OrderedModel: P(y = j) = F(cut_j - x w) - F(cut_{j-1} - x w), the outer cuts
    -inf and inf, written with the cdf and again with the sf."""
    def loss(w, cuts, x, y):
        bounds = np.concatenate([np.array([-np.inf]), cuts, np.array([np.inf])])
        eta = x @ w
        lower, upper = bounds[y] - eta, bounds[y + 1] - eta
        return (-np.sum(np.log(dist.cdf(upper) - dist.cdf(lower)))
                - np.sum(np.log(dist.sf(lower) - dist.sf(upper))))
    return loss


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["logistic", "norm"])
def test_an_ordered_model_differentiates_at_its_lowest_and_highest_categories(name, backend):
    """The issue's case: F(-inf - x w) at the lowest category made every coefficient's gradient NaN."""
    rng = np.random.default_rng(4)
    w, cuts, x = rng.normal(size=3), np.array([-0.5, 0.4, 1.2]), rng.normal(size=(12, 3))
    y = np.array([0, 3, 1, 2, 0, 3, 0, 1, 2, 3, 3, 0])   # the lowest (0) and highest (3) categories
    loss = _ordered_model(getattr(ss, name))
    value, (grad_w, grad_cuts) = mj.compile_loss(loss, argnums=(0, 1), backend=backend)(w, cuts, x, y)
    np.testing.assert_allclose(value, loss(w, cuts, x, y), rtol=1e-12)
    assert np.isfinite(grad_w).all() and np.isfinite(grad_cuts).all(), (grad_w, grad_cuts)
    check_loss_grads_fd(lambda xs: loss(xs[0], xs[1], x, y), [w, cuts], [grad_w, grad_cuts], rng=rng)


@pytest.mark.parametrize("name", sorted(mj.stats.CONTINUOUS))
def test_the_edges_in_float32_have_the_float64_gradients(name):
    """The constants that pick the branches at the edges (far tails, clips) hold in float32."""
    dist, groups = getattr(ss, name), _edge_groups(name)

    def loss(arguments):
        return sum(np.sum(_call(dist, method, args)) for (method, _, _), args in zip(groups, arguments))

    results = {dtype: mj.compile_loss(loss, backend="interp")([[a.astype(dtype) for a in args] for _, _, args in groups])
               for dtype in (np.float32, np.float64)}
    for g32, g64 in zip(gradcheck.flat_leaves(results[np.float32][1]), gradcheck.flat_leaves(results[np.float64][1])):
        assert g32.dtype == np.float32
        np.testing.assert_allclose(g32, g64, rtol=1e-4, atol=1e-5, equal_nan=True)
