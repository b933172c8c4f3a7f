"""A single-head self-attention block, compiled and trained to imitate a "teacher" block.

What it shows:
  * batched matrix products (``q @ k^T`` over a batch of sequences), ``mj.swapaxes`` and a
    softmax over the last axis, all inside one compiled forward+backward step;
  * a residual connection: out = x + softmax(q k^T / sqrt(d)) v W_o with q, k, v = x W_q, x W_k, x W_v;
  * mean squared error to targets produced by a block with hidden weights, so the loss can go to
    (almost) zero and you can watch it fall.

Run:  python examples/attention.py
"""
import argparse

import numpy as np

import morphjit as mj
from _common import Progress


def attention_block(params, x):
    """x: (batch, seq, d) -> (batch, seq, d). Written once, used traced (training) and eagerly (teacher)."""
    d = x.shape[-1]
    q, k, v = x @ params["Wq"], x @ params["Wk"], x @ params["Wv"]
    scores = q @ mj.swapaxes(k, -1, -2) / np.sqrt(d)       # (batch, seq, seq)
    weights = mj.softmax(scores, axis=-1)                   # each row sums to 1
    return x + weights @ v @ params["Wo"]                   # residual connection


def loss(params, x, target):
    return mj.mean((attention_block(params, x) - target) ** 2)


def init_params(rng, d, scale):
    return {name: rng.normal(scale=scale / np.sqrt(d), size=(d, d)) for name in ("Wq", "Wk", "Wv", "Wo")}


def main(steps=400, batch=32, seq=10, d=16, lr=0.1, momentum=0.9, seed=0):
    """Train on fresh random sequences each step; returns the first and last losses."""
    rng = np.random.default_rng(seed)
    teacher = init_params(rng, d, scale=1.5)                 # the weights the student should find
    params = init_params(rng, d, scale=0.5)
    step = mj.compile_loss(loss)
    # mj.* functions also run eagerly on NumPy arrays: the teacher uses the very same code.
    x_val = rng.normal(size=(batch, seq, d))
    t_val = attention_block(teacher, x_val)

    velocity = {k: np.zeros_like(v) for k, v in params.items()}
    progress = Progress(steps)
    initial_val = float(np.mean((attention_block(params, x_val) - t_val) ** 2))
    for i in range(steps):
        x = rng.normal(size=(batch, seq, d))
        value, grads = step(params, x, attention_block(teacher, x))
        for k in params:
            velocity[k] = momentum * velocity[k] - lr * grads[k]
            params[k] += velocity[k]
        progress.update(i, value)
    progress.close()
    final_val = float(np.mean((attention_block(params, x_val) - t_val) ** 2))
    print(f"held-out loss: {initial_val:.5f} before training, {final_val:.5f} after {steps} steps "
          f"({initial_val / final_val:.0f}x lower)")
    return {"initial_loss": initial_val, "final_loss": final_val}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    main(steps=parser.parse_args().steps)
