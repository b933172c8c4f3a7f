"""Train a small MLP on scikit-learn's 8x8 handwritten digits with a morphjit-compiled step.

What it shows:
  * the loss is ordinary NumPy-style code; ``mj.compile_loss`` turns it into one native function
    returning the loss and the gradients of every parameter (a dict shaped like ``params``);
  * the program morphjit traced from it, and a check of the compiled step against morphjit's
    reference executor and against the gradients written by hand in NumPy;
  * training with ``mj.train_step``: loss, gradients and the SGD-with-momentum update in one
    compiled call that updates the parameters in place; the last, smaller batch of each epoch
    runs through the same compiled step (the batch size is symbolic);
  * the time of one training step next to the same step written by hand in NumPy.

Run:  python examples/mlp_digits.py        (or `make demo`; needs scikit-learn: pip install -e '.[examples]')
The digits data ship inside scikit-learn, so nothing is downloaded.
"""
import argparse

import numpy as np
from sklearn.datasets import load_digits

import morphjit as mj
from _common import Progress, report_speed, time_per_call


def mlp_loss(params, x, y):
    """Mean softmax cross-entropy of a 2-layer relu MLP; ``y`` holds integer class labels."""
    h = mj.relu(x @ params["W1"] + params["b1"])
    logits = h @ params["W2"] + params["b2"]
    return mj.mean(mj.softmax_cross_entropy(logits, y))


def numpy_loss_and_grads(params, x, y):
    """The same loss and its gradients by hand: what morphjit derives and fuses for you."""
    W1, b1, W2, b2 = params["W1"], params["b1"], params["W2"], params["b2"]
    n = len(x)
    # forward
    z = x @ W1 + b1
    h = np.maximum(z, 0)
    logits = h @ W2 + b2
    shifted = logits - logits.max(axis=1, keepdims=True)        # stable log-softmax
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_p[np.arange(n), y].mean()
    # backward: d loss / d logits = (softmax - one_hot(y)) / n, then the chain rule layer by layer
    d_logits = np.exp(log_p)
    d_logits[np.arange(n), y] -= 1
    d_logits /= n
    d_h = d_logits @ W2.T
    d_z = d_h * (z > 0)
    grads = {"W1": x.T @ d_z, "b1": d_z.sum(axis=0), "W2": h.T @ d_logits, "b2": d_logits.sum(axis=0)}
    return loss, grads


def load_data(seed=0, test_fraction=0.25):
    """Digits (1797 images of 64 pixels, labels 0-9), split by a fixed permutation, standardised."""
    digits = load_digits()
    x, y = digits.data.astype(np.float64), digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    mean, std = x[train].mean(axis=0), x[train].std(axis=0) + 1e-8    # statistics of the training set only
    standardise = lambda a: (a - mean) / std                          # noqa: E731
    return standardise(x[train]), y[train], standardise(x[test]), y[test]


def init_params(rng, sizes):
    """He-style initialisation for relu layers; biases start at zero."""
    return {
        "W1": rng.normal(scale=np.sqrt(2 / sizes[0]), size=sizes[:2]), "b1": np.zeros(sizes[1]),
        "W2": rng.normal(scale=np.sqrt(1 / sizes[1]), size=sizes[1:]), "b2": np.zeros(sizes[2]),
    }


def accuracy(params, x, y):
    logits = np.maximum(x @ params["W1"] + params["b1"], 0) @ params["W2"] + params["b2"]
    return float(np.mean(logits.argmax(axis=1) == y))


def main(steps=600, batch=64, hidden=64, lr=0.05, momentum=0.9, seed=0, show_programs=True):
    """Train and evaluate; returns a dict of the numbers it printed (the tests check them)."""
    rng = np.random.default_rng(seed)
    x_train, y_train, x_test, y_test = load_data(seed)
    params = init_params(rng, (x_train.shape[1], hidden, 10))
    print(f"digits: {len(x_train)} training and {len(x_test)} test images of {x_train.shape[1]} pixels")

    step = mj.compile_loss(mlp_loss)               # compiled on the first call, then cached on disk
    xb, yb = x_train[:batch], y_train[:batch]
    if show_programs:
        # mj.grad_program(mlp_loss, params, xb, yb) shows the joint forward+backward program too.
        print("\n== the forward program morphjit traced from mlp_loss ==")
        print(str(mj.trace(mlp_loss, params, xb, yb)).rstrip())

    # The compiled step agrees with morphjit's reference executor and with the hand-written NumPy.
    value, grads = step(params, xb, yb)
    ref_value, ref_grads = mj.compile_loss(mlp_loss, backend="interp")(params, xb, yb)
    np_value, np_grads = numpy_loss_and_grads(params, xb, yb)
    grad_diff = max(max(np.abs(grads[k] - ref_grads[k]).max(), np.abs(grads[k] - np_grads[k]).max()) for k in params)
    print(f"\ninitial loss {value:.4f} (reference executor {ref_value:.4f}, NumPy {np_value:.4f}); "
          f"largest gradient difference {grad_diff:.1e}")

    # Training: one compiled call per mini-batch computes the loss and gradients and applies the
    # momentum update to params (in place). Every epoch ends with a smaller batch: same step.
    train = mj.train_step(mlp_loss, mj.optim.sgd(lr, momentum=momentum))
    state = train.init(params)
    progress = Progress(steps)
    losses = []
    for i, (xb_, yb_) in enumerate(minibatches(rng, x_train, y_train, batch, steps)):
        losses.append(float(train(params, state, xb_, yb_)))
        progress.update(i, losses[-1])
    progress.close()

    test_acc = accuracy(params, x_test, y_test)
    print(f"test accuracy {test_acc:.3f}  (training accuracy {accuracy(params, x_train, y_train):.3f})")

    velocity = {k: np.zeros_like(v) for k, v in params.items()}
    compiled_s = time_per_call(train, {k: v.copy() for k, v in params.items()}, train.init(params), xb, yb)
    numpy_s = time_per_call(numpy_train_step, {k: v.copy() for k, v in params.items()}, velocity, xb, yb,
                            lr, momentum)
    report_speed(compiled_s, numpy_s, what=f"training step (batch {batch}, 64-{hidden}-10 MLP, SGD momentum)")
    return {"initial_loss": losses[0], "final_loss": float(np.mean(losses[-20:])), "test_accuracy": test_acc,
            "grad_diff": float(grad_diff), "compiled_s": compiled_s, "numpy_s": numpy_s,
            "compiles": train.cache_info().misses}


def minibatches(rng, x, y, batch, steps):
    """``steps`` mini-batches: each epoch a new shuffle, cut into batches, the last one smaller."""
    done = 0
    while True:
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch):
            idx = order[start:start + batch]
            yield x[idx], y[idx]
            done += 1
            if done == steps:
                return


def numpy_train_step(params, velocity, x, y, lr, momentum):
    """The same training step in plain NumPy: hand-written gradients, then the momentum update
    (PyTorch's form, as mj.optim.sgd: velocity = momentum * velocity + grad; p -= lr * velocity)."""
    loss, grads = numpy_loss_and_grads(params, x, y)
    for k in params:
        velocity[k] *= momentum
        velocity[k] += grads[k]
        params[k] -= lr * velocity[k]
    return loss


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--quiet", action="store_true", help="do not print the traced program")
    args = parser.parse_args()
    main(steps=args.steps, show_programs=not args.quiet)
