"""Random numbers drawn inside the compiled step: a generator argument is a source of draws.

Draws come out of a compiled step as gradients: d/dw sum(w * draw) is the draw, so one compiled
program returns many draws at once.
"""
import copy
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats as st

import morphjit as mj
from morphjit.native import seed_of
from morphjit.runtime.interp import run_plan

N = 20_000


def many_draws(w, rng):
    """Every distribution once, each times its own weight array."""
    draws = {"standard_normal": rng.standard_normal(N), "normal": rng.normal(1.5, 2.0, N),
             "random32": rng.random(N, dtype=np.float32), "uniform": rng.uniform(-1.0, 3.0, N),
             "exponential": rng.exponential(2.0, N), "integers": rng.integers(0, 5, N),
             "bernoulli": rng.binomial(1, 0.3, N), "normal32": rng.standard_normal(N, dtype=np.float32)}
    return sum(np.sum(w[k] * d) for k, d in draws.items())


def legacy_draws(w, rs):
    draws = {"randn": rs.randn(N), "rand": rs.rand(N), "randint": rs.randint(2, 6, N)}
    return sum(np.sum(w[k] * d) for k, d in draws.items())


WEIGHTS = {k: np.zeros(N) for k in ("standard_normal", "normal", "random32", "uniform", "exponential", "integers",
                                    "bernoulli", "normal32")}
LEGACY_WEIGHTS = {k: np.zeros(N) for k in ("randn", "rand", "randint")}

CONTINUOUS = {"standard_normal": ("norm", ()), "normal": ("norm", (1.5, 2.0)), "random32": ("uniform", ()),
              "uniform": ("uniform", (-1.0, 4.0)), "exponential": ("expon", (0.0, 2.0)),
              "normal32": ("norm", ()), "randn": ("norm", ()), "rand": ("uniform", ())}


@pytest.fixture(scope="module")
def samples():
    """Draws from both backends with generators of the same seed."""
    out = {}
    for backend in ("numba", "interp"):
        _, generated = mj.compile_loss(many_draws, backend=backend)(WEIGHTS, np.random.default_rng(5))
        _, legacy = mj.compile_loss(legacy_draws, backend=backend)(LEGACY_WEIGHTS, np.random.RandomState(5))
        out[backend] = {**generated, **legacy}
    return out


@pytest.mark.parametrize("name", sorted(CONTINUOUS))
def test_continuous_draws_follow_their_distribution(samples, name):
    x = samples["numba"][name]
    distribution, args = CONTINUOUS[name]
    assert st.kstest(x, distribution, args=args).pvalue > 1e-3
    frozen = getattr(st, distribution)(*args)
    assert abs(x.mean() - frozen.mean()) < 5 * frozen.std() / np.sqrt(N)
    assert abs(x.var() / frozen.var() - 1) < 0.05


@pytest.mark.parametrize("name, values, p", [("integers", range(5), [0.2] * 5), ("bernoulli", (0, 1), [0.7, 0.3]),
                                             ("randint", range(2, 6), [0.25] * 4)])
def test_discrete_draws_follow_their_distribution(samples, name, values, p):
    x = samples["numba"][name]
    assert set(np.unique(x)) == set(values)
    counts = [(x == v).sum() for v in values]
    assert st.chisquare(counts, np.array(p) * N).pvalue > 1e-3


def test_the_compiled_step_and_the_reference_executor_draw_the_same_numbers(samples):
    for name, x in samples["numba"].items():
        np.testing.assert_allclose(x, samples["interp"][name], rtol=1e-6 if "32" in name else 1e-11,
                                   atol=1e-12, err_msg=name)


def test_draws_of_one_call_are_independent(samples):
    x = samples["numba"]
    assert abs(np.corrcoef(x["standard_normal"], x["normal"])[0, 1]) < 4 / np.sqrt(N)
    assert abs(np.corrcoef(x["standard_normal"][:-1], x["standard_normal"][1:])[0, 1]) < 4 / np.sqrt(N)


def noise(w, x, rng):
    return np.sum(w * rng.standard_normal(x.shape)) + np.sum(x)


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_each_call_draws_afresh_and_a_seed_reproduces_the_calls(backend):
    step = mj.compile_loss(noise, backend=backend)
    w, x = np.zeros((200, 3)), np.zeros((200, 3))

    def three_calls(rng):
        return [step(w, x, rng)[1] for _ in range(3)]

    first = three_calls(np.random.default_rng(1))
    again = three_calls(np.random.default_rng(1))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert abs(np.corrcoef(first[0].ravel(), first[1].ravel())[0, 1]) < 4 / np.sqrt(first[0].size)
    assert not np.array_equal(first[1], first[2])
    rng = np.random.default_rng(1)
    step(w, x, rng)
    assert rng.bit_generator.state != np.random.default_rng(1).bit_generator.state   # it advanced


def noisy_rows(w, x, rng):
    return np.sum(w * (x + rng.standard_normal(x.shape)))


def test_a_draw_shaped_like_the_batch_follows_the_batch_size():
    step, reference = mj.compile_loss(noisy_rows), mj.compile_loss(noisy_rows, backend="interp")
    for batch in (3, 7):
        w, x = np.zeros(3), np.zeros((batch, 3))
        got, want = step(w, x, np.random.default_rng(batch)), reference(w, x, np.random.default_rng(batch))
        np.testing.assert_allclose(got[1], want[1], rtol=1e-11)
    assert step.cache_info().misses == 1
    assert step.cache_info().signatures == ("f64[3] f64[B,3] i64[]",)


def test_no_noise_array_is_allocated_and_the_draw_fuses():
    """The draw is computed inside the loops that read it (the forward and the backward one), and
    the plan interpreter draws the same numbers."""
    step = mj.compile_loss(noisy_rows)
    args = (np.ones(3), np.ones((8, 3)))
    plan = step.step_for(*args, np.random.default_rng(0))[0].plan
    pooled = [v for ins in plan.instructions for v in ins.outs if id(v) in plan.slot_of]
    assert all(v.shape != (8, 3) for v in pooled)
    assert [ins.kind for ins in plan.instructions] == ["reduce", "reduce"]
    compiled = step(*args, np.random.default_rng(4))
    replayed = run_plan(plan, *args, np.random.default_rng(4))
    np.testing.assert_allclose(replayed[0], compiled[0], rtol=1e-12)
    np.testing.assert_allclose(replayed[1], compiled[1], rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# Black-box variational inference: two published objectives (autograd's examples), written as
# published except that the generator is an argument

D, NUM_SAMPLES = 2, 64


def norm_logpdf(x, loc, scale):
    return -0.5 * ((x - loc) / scale) ** 2 - np.log(scale) - 0.5 * np.log(2 * np.pi)


def funnel_log_density(x, t):
    """examples/black_box_svi.py's target."""
    mu, log_sigma = x[:, 0], x[:, 1]
    sigma_density = norm_logpdf(log_sigma, 0, 1.35)
    mu_density = norm_logpdf(mu, 0, np.exp(log_sigma))
    return sigma_density + mu_density


def black_box_svi_objective(logprob, D, num_samples, rs=None):
    """black_box_variational_inference of examples/black_box_svi.py; with ``rs`` given, its
    RandomState is the published global one, else an argument."""
    def unpack_params(params):
        mean, log_std = params[:D], params[D:]
        return mean, log_std

    def gaussian_entropy(log_std):
        return 0.5 * D * (1.0 + np.log(2 * np.pi)) + np.sum(log_std)

    def variational_objective(params, t, rs=rs):
        mean, log_std = unpack_params(params)
        samples = rs.randn(num_samples, D) * np.exp(log_std) + mean
        lower_bound = gaussian_entropy(log_std) + np.mean(logprob(samples, t))
        return -lower_bound
    return variational_objective


def diag_gaussian_log_density(x, mu, log_std):
    return np.sum(norm_logpdf(x, mu, np.exp(log_std)), axis=-1)


def unpack_gaussian_params(params):
    D = np.shape(params)[0] // 2
    mean, log_std = params[:D], params[D:]
    return mean, log_std


def variational_log_density_gaussian(params, x):
    mean, log_std = unpack_gaussian_params(params)
    return diag_gaussian_log_density(x, mean, log_std)


def sample_diag_gaussian(params, num_samples, rs):
    mean, log_std = unpack_gaussian_params(params)
    D = np.shape(mean)[0]
    return rs.randn(num_samples, D) * np.exp(log_std) + mean


def variational_lower_bound(params, t, logprob, sampler, log_density, num_samples, rs):
    """examples/mixture_variational_inference.py's estimate of the lower bound."""
    samples = sampler(params, num_samples, rs)
    log_qs = log_density(params, samples)
    log_ps = logprob(samples, t)
    log_ps = np.reshape(log_ps, (num_samples, -1))
    log_qs = np.reshape(log_qs, (num_samples, -1))
    return np.mean(log_ps - log_qs)


def gaussian_target(x, t):
    return diag_gaussian_log_density(x, np.array([1.0, -2.0]), np.array([0.5, -0.3]))


def lower_bound_objective(rs=None):
    def objective(params, t, rs=rs):
        return -variational_lower_bound(params, t, gaussian_target, sample_diag_gaussian,
                                        variational_log_density_gaussian, NUM_SAMPLES, rs)
    return objective


def log_normalize(x):
    return x - logsumexp(x)


def build_mog_bbsvi(logprob, num_samples, k=3, rs=None):
    """build_mog_bbsvi of examples/mixture_variational_inference.py (its objective): with ``rs``
    given, the published global RandomState, else an argument of the objective."""
    component_log_density = variational_log_density_gaussian
    component_sample = sample_diag_gaussian

    def unpack_mixture_params(mixture_params):
        log_weights = log_normalize(mixture_params[:k])
        var_params = np.reshape(mixture_params[k:], (k, -1))
        return log_weights, var_params

    def mixture_log_density(var_mixture_params, x):
        log_weights, var_params = unpack_mixture_params(var_mixture_params)
        component_log_densities = np.vstack([component_log_density(params_k, x)
                                             for params_k in var_params]).T
        return logsumexp(component_log_densities + log_weights, axis=1, keepdims=False)

    def mixture_elbo(var_mixture_params, t, rs=rs):
        def mixture_lower_bound(params):
            samples = component_sample(params, num_samples, rs)
            log_qs = mixture_log_density(var_mixture_params, samples)
            log_ps = logprob(samples, t)
            log_ps = np.reshape(log_ps, (num_samples, -1))
            log_qs = np.reshape(log_qs, (num_samples, -1))
            return np.mean(log_ps - log_qs)

        log_weights, var_params = unpack_mixture_params(var_mixture_params)
        component_elbos = np.stack([mixture_lower_bound(params_k) for params_k in var_params])
        return np.sum(component_elbos * np.exp(log_weights))

    def objective(params, t, rs=rs):
        return -mixture_elbo(params, t, rs)
    return objective


logsumexp = mj.logsumexp
K = 3
OBJECTIVES = {"black_box_svi": lambda rs=None: black_box_svi_objective(funnel_log_density, D, NUM_SAMPLES, rs),
              "variational_lower_bound": lower_bound_objective,
              "mixture_variational_inference": lambda rs=None: build_mog_bbsvi(funnel_log_density, NUM_SAMPLES, K, rs)}
PARAMS = {"black_box_svi": np.array([0.3, -0.2, -0.5, 0.1]), "variational_lower_bound": np.array([0.3, -0.2, -0.5, 0.1]),
          "mixture_variational_inference": np.concatenate([np.array([0.2, -0.1, 0.0]),
                                                           np.linspace(-0.6, 0.5, K * 2 * D)])}
DRAWS = {"black_box_svi": 1, "variational_lower_bound": 1, "mixture_variational_inference": K}
# numba takes minutes over the mixture's step on a loaded machine; the reference executor draws the same numbers
BACKEND = {"mixture_variational_inference": "interp"}


# The first draws of a call, as gradients: the noise an objective drawing rs.randn(N, D) k times gets.
first_randn = {k: mj.compile_loss(lambda w, rs, k=k: sum(np.sum(w[i] * rs.randn(NUM_SAMPLES, D)) for i in range(k)))
               for k in (1, K)}


class Replay:
    """What autograd's run of an objective gets for ``rs``: the noises the compiled step drew."""

    def __init__(self, noises):
        self.noises = iter(noises)

    def randn(self, *shape):
        noise = next(self.noises)
        assert shape == noise.shape
        return noise


def on_autograd_numpy(run):
    """``run()`` with this module's functions calling autograd's NumPy (and logsumexp)."""
    import autograd.numpy
    import autograd.scipy.special
    module = globals()
    saved = module["np"], module["logsumexp"]
    module["np"], module["logsumexp"] = autograd.numpy, autograd.scipy.special.logsumexp
    try:
        return run()
    finally:
        module["np"], module["logsumexp"] = saved


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_bbvi_gradients_equal_autograds_with_the_same_noise(name):
    import autograd

    objective = OBJECTIVES[name]()
    step = mj.compile_loss(objective, backend=BACKEND.get(name, "numba"))
    params, rs, draws = PARAMS[name], np.random.RandomState(0), DRAWS[name]
    grads = []
    for t in range(2):
        _, noise = first_randn[draws](np.zeros((draws, NUM_SAMPLES, D)), copy.deepcopy(rs))
        value, grad = step(params, t, rs)
        want_value = on_autograd_numpy(lambda: objective(params, t, Replay(noise)))
        want_grad = on_autograd_numpy(lambda: autograd.grad(objective)(params, t, Replay(noise)))
        np.testing.assert_allclose(value, want_value, rtol=1e-10)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-9, atol=1e-12)
        grads.append(grad)
    assert not np.allclose(grads[0], grads[1])   # fresh noise on the second call


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_bbvi_objectives_as_published_with_a_global_random_state_are_refused(name):
    objective = OBJECTIVES[name](np.random.RandomState(0))
    with pytest.raises(mj.FrozenValueError, match="generator passed as an argument") as caught:
        mj.compile_loss(objective, backend="interp")(PARAMS[name], 0)
    assert "rs.randn(num_samples, D)" in caught.value.loc.code


# ---------------------------------------------------------------------------------------------
# Dropout, mj.random, errors


def mlp_with_dropout(params, x, y, rng):
    h = np.tanh(x @ params["W1"] + params["b1"])
    h = mj.dropout(h, 0.3, rng)
    return np.mean((h @ params["W2"] + params["b2"] - y) ** 2)


def test_an_mlp_with_dropout_trains_through_train_step():
    data = np.random.default_rng(0)
    x = data.normal(size=(64, 4))
    y = np.sin(x @ np.array([[1.0], [-0.5], [0.3], [0.8]]))
    params = {"W1": data.normal(scale=0.5, size=(4, 32)), "b1": np.zeros(32),
              "W2": data.normal(scale=0.5, size=(32, 1)), "b2": np.zeros(1)}
    losses = {}
    for backend in ("numba", "interp"):
        p = copy.deepcopy(params)
        step = mj.train_step(mlp_with_dropout, mj.optim.adam(1e-2), backend=backend)
        state, rng = step.init(p), np.random.default_rng(3)
        losses[backend] = [step(p, state, x, y, rng) for _ in range(150)]
    np.testing.assert_allclose(losses["numba"], losses["interp"], rtol=1e-8)
    assert np.mean(losses["numba"][-10:]) < 0.5 * np.mean(losses["numba"][:10])
    assert len(set(losses["numba"][:5])) == 5


def test_dropout_zeroes_a_fraction_and_scales_the_rest():
    def kept(w, x, rng):
        return np.sum(w * mj.dropout(x, 0.25, rng))
    _, out = mj.compile_loss(kept)(np.ones((100, 100)), np.ones((100, 100)), np.random.default_rng(0))
    _, grad_x = mj.compile_loss(kept, argnums=1)(np.ones((100, 100)), np.ones((100, 100)), np.random.default_rng(0))
    assert set(np.unique(out)) == {0.0, 1 / 0.75}
    assert abs((out == 0).mean() - 0.25) < 0.02
    np.testing.assert_array_equal(out, grad_x)   # the mask is not differentiated, the kept elements are
    eager = mj.dropout(np.ones(10_000), 0.5, np.random.default_rng(0))
    assert abs((eager == 0).mean() - 0.5) < 0.03


def test_mj_random_draws_inside_and_outside_a_compiled_loss():
    def loss(w, rng):
        return np.sum(w * mj.random.normal(rng, 2.0, 0.5, size=w.shape)) + np.sum(w * mj.random.bernoulli(rng, 0.5, w.shape))
    _, g = mj.compile_loss(loss)(np.zeros(5000), np.random.default_rng(0))
    assert abs(g.mean() - 2.5) < 0.05
    assert mj.random.normal(np.random.default_rng(0), 2.0, 0.5, size=3).shape == (3,)


def test_a_method_that_is_not_drawn_inside_the_step_is_refused_by_name():
    def loss(w, rng):
        return np.sum(w * rng.gamma(2.0, size=3))
    with pytest.raises(mj.UnsupportedError, match=r"rng\.gamma is not drawn inside a compiled loss; supported: .*normal"):
        mj.compile_loss(loss, backend="interp")(np.zeros(3), np.random.default_rng(0))


DISK_CHILD = """
import numpy as np, morphjit as mj
def noise(w, x, rng):
    return np.sum(w * (x + rng.standard_normal(x.shape)))
step = mj.compile_loss(noise)
rng = np.random.default_rng(11)
grads = [step(np.zeros(3), np.zeros((4, 3)), rng)[1] for _ in range(2)]
assert not np.array_equal(grads[0], grads[1])
print(step.cache_info().disk_loads, repr([g.tolist() for g in grads]))
"""


@pytest.mark.slow
def test_a_step_loaded_from_the_disk_cache_draws_the_same_numbers(tmp_path):
    env = dict(os.environ, MORPHJIT_CACHE_DIR=str(tmp_path))
    runs = [subprocess.run([sys.executable, "-c", DISK_CHILD], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[-1].stderr
    (first_loads, first), (second_loads, second) = (run.stdout.split(" ", 1) for run in runs)
    assert (first_loads, second_loads) == ("0", "1")
    assert first == second


# ---------------------------------------------------------------------------------------------
# Arguments checked as NumPy checks them: each case runs on NumPy's generator and on the traced
# stand-in, and both raise the same kind of error or both draw an array of the same shape and dtype

def draws_alike(method, argument, draw):
    return pytest.param(method, argument, draw, id=f"{method}-{draw.__code__.co_firstlineno}")


GENERATOR_CASES = [
    draws_alike("normal", "size", lambda r: r.normal(np.zeros((4, 3)), 1.0, size=3)),
    draws_alike("normal", "size", lambda r: r.normal(np.zeros((4, 3)), 1.0, size=(2, 4, 1))),
    draws_alike("normal", None, lambda r: r.normal(np.zeros((4, 3)), 1.0, size=(4, 3))),
    draws_alike("normal", None, lambda r: r.normal(np.zeros((1, 3)), 1.0, size=(4, 3))),
    draws_alike("normal", None, lambda r: r.normal(np.zeros((4, 1)), np.ones(3), size=(2, 4, 3))),
    draws_alike("normal", None, lambda r: r.normal(np.zeros(3), 1.0, size=(1, 3))),
    draws_alike("normal", "scale", lambda r: r.normal(np.zeros(3), np.ones(4))),
    draws_alike("normal", "scale", lambda r: r.normal(scale=-2)),
    draws_alike("normal", "scale", lambda r: r.normal(scale=-0.0)),
    draws_alike("normal", "scale", lambda r: r.normal(0.0, [1.0, -1.0], size=(3, 2))),
    draws_alike("normal", None, lambda r: r.normal(0.0, np.nan, size=2)),
    draws_alike("normal", "loc", lambda r: r.normal("a")),
    draws_alike("normal", "size", lambda r: r.normal(size=2.0)),
    draws_alike("uniform", "high - low", lambda r: r.uniform(2.0, 1.0)),
    draws_alike("uniform", "high - low", lambda r: r.uniform(0.0, np.inf)),
    draws_alike("uniform", "high - low", lambda r: r.uniform(np.nan, 1.0)),
    draws_alike("uniform", "high - low", lambda r: r.uniform(np.zeros(2), [1.0, np.inf])),
    draws_alike("uniform", None, lambda r: r.uniform(np.zeros(2), 1.0, size=(3, 2))),
    draws_alike("uniform", "size", lambda r: r.uniform(0.0, np.ones(3), size=2)),
    draws_alike("exponential", "scale", lambda r: r.exponential(-1.0)),
    draws_alike("exponential", "scale", lambda r: r.exponential([1.0, -1.0])),
    draws_alike("exponential", None, lambda r: r.exponential(np.ones(3), size=(2, 3))),
    draws_alike("exponential", "size", lambda r: r.exponential(np.ones(3), size=(3, 2))),
    draws_alike("binomial", "p", lambda r: r.binomial(1, 1.5)),
    draws_alike("binomial", "p", lambda r: r.binomial(1, np.nan)),
    draws_alike("binomial", "p", lambda r: r.binomial(1, [0.5, 2.0], size=2)),
    draws_alike("binomial", "n", lambda r: r.binomial(-1, 0.5)),
    draws_alike("binomial", None, lambda r: r.binomial(1, -0.0, size=3)),
    draws_alike("binomial", None, lambda r: r.binomial(1.5, 0.5, size=3)),
    draws_alike("binomial", None, lambda r: r.binomial(1, np.full(3, 0.5), size=(2, 3))),
    draws_alike("binomial", "size", lambda r: r.binomial(1, np.full(3, 0.5), size=2)),
    draws_alike("integers", "high", lambda r: r.integers(0, 2 ** 40, dtype=np.int32)),
    draws_alike("integers", "low", lambda r: r.integers(-2 ** 63 - 1, 0)),
    draws_alike("integers", "high", lambda r: r.integers(0, 2 ** 63 + 1)),
    draws_alike("integers", "high", lambda r: r.integers(5, 5)),
    draws_alike("integers", None, lambda r: r.integers(5, 5, endpoint=True)),
    draws_alike("integers", "high", lambda r: r.integers(5, 4, endpoint=True)),
    draws_alike("integers", "dtype", lambda r: r.integers(4, dtype=np.float64)),
    draws_alike("integers", "high", lambda r: r.integers(3, dtype=bool)),
    draws_alike("integers", None, lambda r: r.integers(2, size=4, dtype=bool)),
    draws_alike("integers", None, lambda r: r.integers(-2 ** 31, 2 ** 31, size=4, dtype=np.int32)),
    draws_alike("integers", None, lambda r: r.integers(2.7)),
    draws_alike("integers", "size", lambda r: r.integers(0, 5, size=2.0)),
    draws_alike("integers", "size", lambda r: r.integers(0, 5, size=(2, -1))),
    draws_alike("random", "size", lambda r: r.random(2.0)),
    draws_alike("random", "size", lambda r: r.random((2, 2.0))),
    draws_alike("random", "size", lambda r: r.random(-1)),
    draws_alike("random", "size", lambda r: r.random(True)),
    draws_alike("random", None, lambda r: r.random(np.array(3))),
    draws_alike("random", None, lambda r: r.random(np.array([2, 3]))),
    draws_alike("random", None, lambda r: r.random(())),
    draws_alike("random", "dtype", lambda r: r.random(3, dtype=np.int64)),
    draws_alike("random", "dtype", lambda r: r.random(3, dtype=np.float16)),
    draws_alike("standard_normal", "size", lambda r: r.standard_normal((2, -3))),
    draws_alike("standard_normal", None, lambda r: r.standard_normal(3, dtype=np.float32)),
    draws_alike("standard_exponential", "dtype", lambda r: r.standard_exponential(3, dtype=np.int64)),
]

RANDOM_STATE_CASES = [
    draws_alike("rand", "2.0", lambda r: r.rand(2.0, 3)),
    draws_alike("randn", "-1", lambda r: r.randn(-1)),
    draws_alike("randn", None, lambda r: r.randn(np.int64(2), 3)),
    draws_alike("randn", None, lambda r: r.randn()),
    draws_alike("rand", "True", lambda r: r.rand(True)),
    draws_alike("rand", "(2, 3)", lambda r: r.rand((2, 3))),
    draws_alike("randint", "high", lambda r: r.randint(5, 5)),
    draws_alike("randint", "high", lambda r: r.randint(0, 2 ** 40, dtype=np.int32)),
    draws_alike("randint", "dtype", lambda r: r.randint(5, dtype=float)),
    draws_alike("randint", "high", lambda r: r.randint(2.5, 2.7, 3)),
    draws_alike("normal", "scale", lambda r: r.normal(0.0, -1.0)),
    draws_alike("normal", "size", lambda r: r.normal(np.zeros((4, 3)), 1.0, size=3)),
    draws_alike("uniform", None, lambda r: r.uniform(2.0, 1.0, size=3)),
    draws_alike("uniform", "high - low", lambda r: r.uniform(0.0, np.inf)),
    draws_alike("binomial", "p", lambda r: r.binomial(1, 1.5)),
    draws_alike("exponential", "scale", lambda r: r.exponential(-0.0)),
    draws_alike("random", "dtype", lambda r: r.random(3, dtype=np.float32)),
    draws_alike("integers", "integers", lambda r: r.integers(3)),
]


def drawn(draw, generator):
    """What ``draw(generator)`` gives inside a compiled function: the array, or the error."""
    def traced(rng):
        return draw(rng)
    try:
        return mj.compile(traced, backend="interp")(generator)
    except Exception as error:
        return error


def assert_drawn_alike(method, argument, draw, generator):
    try:
        want = np.asarray(draw(copy.deepcopy(generator)))
    except Exception as error:
        want = error
    got = drawn(draw, generator)
    if not isinstance(want, Exception):
        assert not isinstance(got, Exception), f"NumPy draws {want.shape}, the traced generator raised {got!r}"
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        return
    numpy_kind = next(k for k in (ValueError, TypeError, OverflowError, AttributeError) if isinstance(want, k))
    assert isinstance(got, numpy_kind), f"NumPy raised {want!r}, the traced generator gave {got!r}"
    assert argument in str(got)
    if isinstance(got, mj.MorphjitError):   # named by method, at the user's line
        assert f"rng.{method}" in got.message
        assert got.loc.lineno == draw.__code__.co_firstlineno


@pytest.mark.parametrize("method, argument, draw", GENERATOR_CASES)
def test_a_generators_draws_check_their_arguments_as_numpy_does(method, argument, draw):
    assert_drawn_alike(method, argument, draw, np.random.default_rng(0))


@pytest.mark.parametrize("method, argument, draw", RANDOM_STATE_CASES)
def test_a_random_states_draws_check_their_arguments_as_numpy_does(method, argument, draw):
    assert_drawn_alike(method, argument, draw, np.random.RandomState(0))


def test_a_batch_of_means_gets_a_noise_row_each():
    """``normal(mu, 1.0, size=mu.shape)``: one draw per element (the refused ``size=d`` would
    have reused one row of noise across the batch)."""
    def noisy_means(w, mu, rng):
        return np.sum(w * rng.normal(mu, 1.0, size=mu.shape))
    _, eps = mj.compile_loss(noisy_means)(np.zeros((64, 3)), np.zeros((64, 3)), np.random.default_rng(0))
    assert len({tuple(row) for row in eps}) == 64
    with pytest.raises(mj.ArgumentError, match=r"rng\.normal: size \(3,\) is not compatible"):
        mj.compile_loss(lambda w, mu, rng: np.sum(w * rng.normal(mu, 1.0, size=3)))(
            np.zeros(3), np.zeros((64, 3)), np.random.default_rng(0))


# A traced parameter is checked by the compiled step each time it runs: what NumPy refuses raises
# NumPy's error there, naming the method, the parameter and the line.
RUN_TIME_CASES = [
    ("rng.normal", "scale", lambda r, x: r.normal(0.0, x, size=(2, 3)), [1.0, -2.0, 1.0], [1.0, np.nan, 0.0]),
    ("rng.normal", "scale", lambda r, x: r.normal(0.0, x, size=(2, 3)), [1.0, -0.0, 1.0], [1.0, np.inf, 0.0]),
    ("rng.exponential", "scale", lambda r, x: r.exponential(x, size=(2, 3)), [1.0, 2.0, -1.0], [1.0, 2.0, 0.0]),
    ("rng.binomial", "p", lambda r, x: r.binomial(1, x, size=(2, 3)), [0.5, 1.5, 0.0], [0.5, 1.0, 0.0]),
    ("rng.binomial", "p", lambda r, x: r.binomial(1, x, size=(2, 3)), [0.5, np.nan, 0.0], [0.5, 1.0, -0.0]),
    ("rng.uniform", "high - low", lambda r, x: r.uniform(x, 1.0, size=(2, 3)), [0.0, 2.0, 0.0], [0.0, 0.5, 1.0]),
    ("rng.uniform", "high - low", lambda r, x: r.uniform(0.0, x, size=(2, 3)), [1.0, np.inf, 1.0], [1.0, 2.0, 0.0]),
    ("rng.uniform", "high - low", lambda r, x: r.uniform(x, 1.0, size=(2, 3)), [0.0, np.nan, 0.0], [-1.0, 0.5, 0.9]),
]


@pytest.mark.parametrize("backend", ["numba", "interp"])
@pytest.mark.parametrize("method, name, draw, refused, accepted", RUN_TIME_CASES)
def test_a_traced_parameter_numpy_refuses_raises_numpys_error_when_the_step_runs(backend, method, name, draw,
                                                                                refused, accepted):
    def traced(x, rng):
        return draw(rng, x)
    step = mj.compile(traced, backend=backend)
    with pytest.raises(Exception) as numpy_error:
        draw(np.random.default_rng(0), np.array(refused))
    with pytest.raises(type(numpy_error.value)) as caught:
        step(np.array(refused), np.random.default_rng(0))
    assert f"{method}: {name}" in str(caught.value)
    assert f"test_random.py:{draw.__code__.co_firstlineno}" in str(caught.value)
    want = draw(np.random.default_rng(0), np.array(accepted))
    got = step(np.array(accepted), np.random.default_rng(0))
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))   # NaN where NumPy gives NaN


def test_a_random_states_uniform_takes_high_below_low_traced_or_not():
    def traced(x, rs):
        return rs.uniform(x, 1.0, size=(2, 3))
    got = mj.compile(traced, backend="interp")(np.array([0.0, 2.0, 0.0]), np.random.RandomState(0))
    assert np.all((got[:, 1] <= 2.0) & (got[:, 1] > 1.0))


@pytest.mark.parametrize("backend", ["numba", "interp"])
def test_dropout_and_bernoulli_check_their_rate_and_p_traced_or_not(backend):
    def dropped(x, rate, rng):
        return mj.dropout(x, rate, rng)

    def mask(p, rng):
        return mj.random.bernoulli(rng, p, (4, 3))
    x = np.ones((500, 4))
    out = mj.compile(dropped, backend=backend)(x, 0.25, np.random.default_rng(0))
    assert set(np.unique(out)) == {0.0, 1 / 0.75}
    for rate in (1.0, -0.1, np.nan):
        with pytest.raises(ValueError, match=r"mj\.dropout: rate must lie in \[0, 1\) \(at test_random\.py:\d+\)"):
            mj.compile(dropped, backend=backend)(x, rate, np.random.default_rng(0))
        with pytest.raises(mj.ArgumentError, match=r"mj\.dropout: rate must lie in \[0, 1\)"):
            mj.dropout(x, rate, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"mj\.random\.bernoulli: p < 0, p > 1 or p is NaN"):
        mj.compile(mask, backend=backend)(np.array([0.5, 1.2, 0.0]), np.random.default_rng(0))
    for p in (1.2, [0.5, np.nan]):
        with pytest.raises(mj.ArgumentError, match=r"mj\.random\.bernoulli: p < 0, p > 1 or p is NaN"):
            mj.random.bernoulli(np.random.default_rng(0), p, 2)
    with pytest.raises(mj.ArgumentError, match=r"mj\.random\.bernoulli: size \(2,\) is not compatible"):
        mj.random.bernoulli(np.random.default_rng(0), np.full((3, 2), 0.5), 2)


# ---------------------------------------------------------------------------------------------
# The seed of a call: 64 bits from every bit generator

BIT_GENERATORS = [lambda seed, kind=kind: np.random.Generator(kind(seed)) for kind in
                  (np.random.MT19937, np.random.PCG64, np.random.PCG64DXSM, np.random.Philox, np.random.SFC64)] + \
                 [np.random.RandomState, lambda seed: np.random.RandomState(np.random.PCG64(seed))]
BIT_GENERATOR_IDS = ["MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64", "RandomState", "RandomState-PCG64"]


@pytest.mark.parametrize("make", BIT_GENERATORS, ids=BIT_GENERATOR_IDS)
def test_the_seed_of_a_call_spans_64_bits_of_every_bit_generator(make):
    generator = make(7)
    seeds = np.array([seed_of(generator)[0] for _ in range(256)]).view(np.uint64)
    high = seeds >> np.uint64(32)
    assert len(set(high.tolist())) > 250                    # the high 32 bits vary
    bits = (seeds[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    assert np.all(np.abs(bits.mean(axis=0) - 0.5) < 0.15)   # every one of the 64 bits is random
    again = make(7)
    np.testing.assert_array_equal([seed_of(again)[0] for _ in range(256)], seeds.view(np.int64))


@pytest.mark.parametrize("make", BIT_GENERATORS, ids=BIT_GENERATOR_IDS)
def test_generators_seeded_alike_give_the_same_losses(make):
    def loss(w, rng):
        return np.sum(w * rng.standard_normal(8)) if hasattr(rng, "integers") else np.sum(w * rng.randn(8))
    step = mj.compile_loss(loss, backend="interp")
    w = np.ones(8)
    first, second = make(3), make(3)
    losses = [step(w, first)[0] for _ in range(3)]
    assert losses == [step(w, second)[0] for _ in range(3)]
    assert len(set(losses)) == 3
