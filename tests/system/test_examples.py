"""Each script in examples/ runs (in this process, with few steps) and reaches what it claims.

The examples import their shared helper as ``_common``, so the examples folder goes on sys.path.
Compiled steps land in the test cache directory set by conftest.py. No timing is asserted.
"""
import importlib
import subprocess
import sys

import numpy as np
import pytest

import morphjit as mj

from support.paths import ROOT

EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def load():
    sys.path.insert(0, str(EXAMPLES))
    try:
        yield importlib.import_module
    finally:
        sys.path.remove(str(EXAMPLES))


def test_every_example_is_tested():
    scripts = {p.stem for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    assert scripts == {"mlp_digits", "regression", "attention", "curve_fit", "dask_logistic", "char_embeddings",
                       "gp_regression", "scipy_fit", "cnn_digits", "pinn"}


def test_mlp_digits(load, capsys):
    result = load("mlp_digits").main(steps=200)
    out = capsys.readouterr().out
    assert "matmul" in out and "softmax_cross_entropy" in out        # the traced program is shown
    assert result["grad_diff"] < 1e-10                               # compiled == interp == hand-written NumPy
    assert result["final_loss"] < 0.25 * result["initial_loss"]
    assert result["test_accuracy"] > 0.9
    assert "test accuracy" in out and "hand-written NumPy" in out
    assert result["compiled_s"] > 0 and result["numpy_s"] > 0
    assert result["compiles"] == 1                   # the smaller last batch of an epoch: same step


def test_pinn_solves_poissons_equation(load, capsys):
    pinn = load("pinn")
    result = pinn.main(steps=1500, points=256)
    assert result["final_loss"] < 1e-3 * result["initial_loss"]
    assert result["max_error"] < 0.2                 # against sin(pi x) sin(pi y), whose peak is 1
    assert result["compiles"] == 1
    assert "largest error" in capsys.readouterr().out
    # the Laplacian inside the loss against central second differences of the network
    params = pinn.init(np.random.default_rng(1))
    X = np.random.default_rng(2).uniform(0.2, 0.8, (5, 2))
    u, h = mj.compile(pinn.u), 1e-4
    differences = sum((u(params, X + h * e) - 2 * u(params, X) + u(params, X - h * e)) / h ** 2 for e in np.eye(2))
    np.testing.assert_allclose(mj.compile(pinn.laplacian)(params, X), differences, rtol=1e-5, atol=1e-5)


def test_cnn_digits(load, capsys):
    result = load("cnn_digits").main(steps=300, show_plan=False)
    assert result["final_loss"] < 0.1 * result["initial_loss"]
    assert result["test_accuracy"] >= 0.95
    assert "test accuracy" in capsys.readouterr().out
    assert result["compiles"] == 1                   # the smaller last batch of an epoch: same step


def test_regression_matches_exact_solutions(load, capsys):
    result = load("regression").main(steps=150)
    for name in ("ridge", "logistic"):
        assert result[name]["final_loss"] < result[name]["initial_loss"]
        assert result[name]["diff"] < 1e-5, name
    assert "closed-form" in capsys.readouterr().out


def test_attention_loss_falls(load):
    result = load("attention").main(steps=150)
    assert result["final_loss"] < result["initial_loss"] / 20


def test_curve_fit_recovers_parameters(load):
    result = load("curve_fit").main(steps=300)
    assert result["grad_diff"] < 1e-10
    for k, true in result["true"].items():
        assert result["fitted"][k] == pytest.approx(true, abs=0.05), k
    assert result["final_loss"] < 0.05                               # about the noise variance, 0.04


def test_char_embeddings_learns_beyond_character_frequencies(load, capsys):
    result = load("char_embeddings").main(steps=300)
    assert result["grad_diff"] < 1e-10
    assert result["final_loss"] < 0.5 * result["unigram_loss"] < result["initial_loss"]
    assert "character frequencies alone" in capsys.readouterr().out


def test_gp_regression_reaches_the_optimum_of_scikit_learn(load, capsys):
    result = load("gp_regression").main(n=40)
    assert abs(result["lml"] - result["sklearn_lml"]) <= 1e-6 * abs(result["sklearn_lml"])
    np.testing.assert_allclose(result["theta"], result["sklearn_theta"], atol=1e-3)
    assert "scikit-learn" in capsys.readouterr().out


def test_scipy_fit_matches_autograd_and_newton_needs_fewer_iterations(load, capsys):
    result = load("scipy_fit").main(n=2000, d=12, maxiter=100)
    lbfgs, newton = result["results"]["L-BFGS-B"], result["results"]["trust-ncg"]
    assert abs(lbfgs["loss"] - newton["loss"]) < 1e-8 and newton["iterations"] < lbfgs["iterations"]
    assert lbfgs["autograd_diff"] < 1e-8 and newton["autograd_diff"] < 1e-8
    objective, direction = result["objective"], np.linspace(-1.0, 1.0, 13)
    np.testing.assert_allclose(result["hessian"] @ direction, objective.hessp(newton["x"], direction), rtol=1e-12)
    assert np.all(result["standard_errors"] > 0) and "autograd" in capsys.readouterr().out


def test_progress_redraws_in_place_on_a_tty(load):
    progress_mod = load("_common")

    class Tty:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return True

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    stream = Tty()
    progress = progress_mod.Progress(3, stream=stream)
    for i, loss in enumerate((3.0, 2.0, 1.0)):
        progress.update(i, loss)
    progress.close()
    assert stream.text.startswith("\r") and stream.text.endswith("\n")
    assert stream.text.count("\n") == 1 and "3/3 [####################]  loss 1.00000" in stream.text


@pytest.mark.slow
def test_script_runs_from_the_command_line(tmp_path):
    """`python examples/NAME.py --steps N` works as a script (its own folder on sys.path, output piped)."""
    run = subprocess.run([sys.executable, str(EXAMPLES / "attention.py"), "--steps", "20"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("step  1/20") and lines[-2].startswith("step 20/20")
    assert "\r" not in run.stdout                                    # plain lines when not a terminal
    assert np.isfinite(float(lines[-1].split()[2].rstrip(",")))


@pytest.mark.slow   # a Dask cluster's worker processes
def test_dask_logistic_fits_on_a_cluster_as_in_one_process(load):
    pytest.importorskip("distributed", reason="mj.dask needs dask and distributed: pip install 'morphjit[dask]'")
    result = load("dask_logistic").main(rows=20_000, chunk=6_000, digits_steps=100, compare_dask_ml=False)
    logistic, digits = result["logistic"], result["digits"]
    assert logistic["local_diff"] < 1e-6                         # the same fit as in one process
    assert np.abs(logistic["w"] - np.linspace(-1, 1, 16)).max() < 0.15 and abs(logistic["b"] - 0.5) < 0.1
    assert digits["final_loss"] < 0.25 * digits["initial_loss"] and digits["test_accuracy"] > 0.9
