"""Train a LeNet-style CNN on scikit-learn's 8x8 handwritten digits with a morphjit-compiled step.

What it shows:
  * a convolutional network written with ``mj.conv2d`` and ``mj.max_pool2d`` (NCHW, PyTorch's
    weight layout); ``mj.train_step`` compiles the loss, its gradients and Adam's update into
    one call that updates the parameters in place, for every batch size;
  * how the convolutions run in the compiled step (``loss.explain``'s plan): im2col + GEMM, or a
    direct loop nest reading the input through the window map;
  * the test accuracy.

Run:  python examples/cnn_digits.py        (needs scikit-learn: pip install -e '.[examples]')
"""
import argparse

import numpy as np

import morphjit as mj
from _common import Progress


def logits(params, x):
    """conv 3x3 (1 -> 16) + relu, max-pool 2; conv 3x3 (16 -> 32) + relu, max-pool 2; dense 128 -> 10."""
    h = mj.max_pool2d(mj.relu(mj.conv2d(x, params["c1"], params["b1"], padding=1)), 2)   # (n, 16, 4, 4)
    h = mj.max_pool2d(mj.relu(mj.conv2d(h, params["c2"], params["b2"], padding=1)), 2)   # (n, 32, 2, 2)
    return h.reshape(h.shape[0], -1) @ params["W"] + params["b"]


def cnn_loss(params, x, y):
    return mj.mean(mj.softmax_cross_entropy(logits(params, x), y))


def init_params(rng, dtype=np.float32):
    he = lambda shape, fan_in: rng.normal(scale=np.sqrt(2 / fan_in), size=shape).astype(dtype)   # noqa: E731
    return {"c1": he((16, 1, 3, 3), 9), "b1": np.zeros(16, dtype), "c2": he((32, 16, 3, 3), 144),
            "b2": np.zeros(32, dtype), "W": he((128, 10), 256), "b": np.zeros(10, dtype)}


def images(x, dtype=np.float32):
    """Rows of 64 pixels as (n, 1, 8, 8) images."""
    return x.reshape(-1, 1, 8, 8).astype(dtype)


def accuracy(params, x, y):
    return float(np.mean(np.argmax(logits(params, x), axis=1) == y))   # mj.* compute eagerly on NumPy arrays


def gemm_lines(loss_fn, params, x, y) -> list[str]:
    """The GEMMs of the compiled step, read from its plan (a convolution planned as a direct loop
    nest has none)."""
    plan = mj.compile_loss(loss_fn).explain(params, x, y).plan_text()
    return [line.strip() for line in plan.splitlines() if line.strip().startswith("gemm")]


def main(steps=300, batch=64, lr=3e-3, seed=0, show_plan=True):
    """Train and evaluate; returns a dict of the numbers it printed (the tests check them)."""
    from mlp_digits import load_data, minibatches   # the digits need scikit-learn (perf/ imports the model only)
    rng = np.random.default_rng(seed)
    x_train, y_train, x_test, y_test = load_data(seed)
    x_train, x_test = images(x_train), images(x_test)
    params = init_params(rng)
    print(f"digits: {len(x_train)} training and {len(x_test)} test images of 8x8 pixels")
    if show_plan:   # (compiles the loss and gradients alone: a second compile)
        gemms = gemm_lines(cnn_loss, params, x_train[:batch], y_train[:batch])
        print(f"the compiled step runs {len(gemms)} GEMMs (the convolutions as im2col + GEMM, forward and "
              f"backward, and the dense layer); the first: {gemms[0]}")

    train = mj.train_step(cnn_loss, mj.optim.adam(lr))
    state = train.init(params)
    progress = Progress(steps)
    losses = []
    for i, (xb, yb) in enumerate(minibatches(rng, x_train, y_train, batch, steps)):
        losses.append(float(train(params, state, xb, yb)))
        progress.update(i, losses[-1])
    progress.close()

    test_acc = accuracy(params, x_test, y_test)
    print(f"test accuracy {test_acc:.3f}  (training accuracy {accuracy(params, x_train, y_train):.3f})")
    return {"initial_loss": losses[0], "final_loss": float(np.mean(losses[-20:])), "test_accuracy": test_acc,
            "compiles": train.cache_info().misses}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    main(steps=parser.parse_args().steps)
