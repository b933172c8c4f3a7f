"""Fit a damped sine wave a*sin(b*t + c)*exp(-d*t) to noisy samples with a compiled gradient step.

What it shows:
  * parameters that are scalars (0-d arrays in a dict) and a model that is purely element-wise:
    no matrix product, so the whole forward+backward step fuses into a couple of loops over t
    with nothing allocated, where NumPy builds a temporary array for every operation;
  * the Adam optimiser in a few lines of NumPy around the compiled step;
  * the time of one compiled step next to the same forward+backward written by hand in NumPy,
    and the fitted parameters next to the true ones.

Run:  python examples/curve_fit.py
"""
import argparse

import numpy as np

import morphjit as mj
from _common import Progress, report_speed, time_per_call

TRUE = {"a": 2.0, "b": 3.0, "c": 0.5, "d": 0.4}
GUESS = {"a": 1.0, "b": 2.7, "c": 0.0, "d": 0.1}     # a rough guess, as read off a plot of the data


def curve(p, t):
    return p["a"] * mj.sin(p["b"] * t + p["c"]) * mj.exp(-p["d"] * t)


def loss(p, t, y):
    return mj.mean((curve(p, t) - y) ** 2)


def numpy_loss_and_grads(p, t, y):
    """The same loss and gradients by hand (the chain rule for each parameter)."""
    a, b, c, d = p["a"], p["b"], p["c"], p["d"]
    phase = b * t + c
    s, decay = np.sin(phase), np.exp(-d * t)
    f = a * s * decay
    r = f - y
    g = 2 * r / len(t)                                 # d loss / d f
    dphase = g * a * np.cos(phase) * decay             # d loss / d phase
    grads = {"a": np.sum(g * s * decay), "b": np.sum(dphase * t), "c": np.sum(dphase), "d": -np.sum(g * f * t)}
    return np.mean(r ** 2), grads


def make_data(rng, n=4000, noise=0.2):
    t = np.linspace(0, 10, n)
    y = TRUE["a"] * np.sin(TRUE["b"] * t + TRUE["c"]) * np.exp(-TRUE["d"] * t) + rng.normal(scale=noise, size=n)
    return t, y


def main(steps=600, lr=0.02, seed=0):
    """Fit with Adam; returns the fitted and true parameters, the losses and the step times."""
    rng = np.random.default_rng(seed)
    t, y = make_data(rng)
    params = {k: np.asarray(v) for k, v in GUESS.items()}   # 0-d float64 arrays: scalar parameters
    step = mj.compile_loss(loss)

    value, grads = step(params, t, y)                      # check the compiled gradients once
    _, np_grads = numpy_loss_and_grads(params, t, y)
    grad_diff = max(abs(float(grads[k] - np_grads[k])) for k in params)
    print(f"compiled vs hand-written NumPy gradients: largest difference {grad_diff:.1e}")

    # Adam: a per-parameter step size from running averages of the gradient and its square.
    m = {k: 0.0 for k in params}
    v = {k: 0.0 for k in params}
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    progress = Progress(steps)
    first = float(value)
    for i in range(steps):
        value, grads = step(params, t, y)
        for k in params:
            m[k] = beta1 * m[k] + (1 - beta1) * grads[k]
            v[k] = beta2 * v[k] + (1 - beta2) * grads[k] ** 2
            m_hat, v_hat = m[k] / (1 - beta1 ** (i + 1)), v[k] / (1 - beta2 ** (i + 1))
            params[k] = params[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
        progress.update(i, value)
    progress.close()

    fitted = {k: float(v) for k, v in params.items()}
    print("parameter   true  fitted")
    for k in TRUE:
        print(f"    {k}     {TRUE[k]:6.3f}  {fitted[k]:6.3f}")
    print(f"loss {first:.4f} -> {float(value):.4f} (the noise alone gives {0.2 ** 2:.4f})")

    compiled_s = time_per_call(step, params, t, y)
    numpy_s = time_per_call(numpy_loss_and_grads, params, t, y)
    report_speed(compiled_s, numpy_s, what=f"forward+backward step ({len(t)} samples)")
    return {"fitted": fitted, "true": dict(TRUE), "initial_loss": first, "final_loss": float(value),
            "grad_diff": grad_diff, "compiled_s": compiled_s, "numpy_s": numpy_s}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    main(steps=parser.parse_args().steps)
