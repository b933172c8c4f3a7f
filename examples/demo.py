"""morphjit in one screen: trace a small MLP, show its programs, and train it with the compiled step.

Run with `make demo`.
"""
import time

import numpy as np

import morphjit as mj


def mlp_loss(params, x, y):
    """Mean softmax cross-entropy of a 2-layer relu MLP: plain NumPy-style code."""
    h = mj.relu(x @ params["W1"] + params["b1"])
    logits = h @ params["W2"] + params["b2"]
    return mj.mean(mj.softmax_cross_entropy(logits, y))


def make_data(rng, n=512, features=20, classes=4):
    """Points around one centre per class: a problem an MLP learns in a few hundred steps."""
    centres = rng.normal(scale=2.0, size=(classes, features))
    y = rng.integers(0, classes, n)
    x = centres[y] + rng.normal(size=(n, features))
    return x, y


def init_params(rng, sizes):
    return {
        "W1": rng.normal(scale=1 / np.sqrt(sizes[0]), size=sizes[:2]),
        "b1": np.zeros(sizes[1]),
        "W2": rng.normal(scale=1 / np.sqrt(sizes[1]), size=sizes[1:]),
        "b2": np.zeros(sizes[2]),
    }


def main():
    rng = np.random.default_rng(0)
    x, y = make_data(rng)
    params = init_params(rng, (20, 32, 4))
    batch = (x[:64], y[:64])

    print("== forward program ==")
    print(mj.trace(mlp_loss, params, *batch))
    print("== joint forward+backward program ==")
    print(mj.grad_program(mlp_loss, params, *batch))

    step = mj.compile_loss(mlp_loss)
    start = time.perf_counter()
    step(params, *batch)
    print(f"first call (trace, compile or load from disk): {time.perf_counter() - start:.2f} s")
    reference = mj.compile_loss(mlp_loss, backend="interp")
    value, grads = step(params, *batch)
    ref_value, ref_grads = reference(params, *batch)
    error = max(np.abs(grads[k] - ref_grads[k]).max() for k in params)
    print(f"compiled vs reference executor: loss {value:.6f} vs {ref_value:.6f}, max gradient difference {error:.1e}")

    print("== training, SGD with learning rate 0.5 ==")
    start = time.perf_counter()
    for i in range(301):
        j = rng.integers(0, len(x) - 64)
        value, grads = step(params, x[j:j + 64], y[j:j + 64])
        for k in params:
            params[k] -= 0.5 * grads[k]
        if i % 50 == 0:
            print(f"step {i:3d}  loss {value:.4f}")
    per_step = (time.perf_counter() - start) / 301
    logits = mj.relu(x @ params["W1"] + params["b1"]) @ params["W2"] + params["b2"]
    print(f"training accuracy {np.mean(np.argmax(logits, 1) == y):.3f}; {per_step * 1e6:.0f} us per step "
          f"(compiled loss and gradients plus the NumPy update)")


if __name__ == "__main__":
    main()
