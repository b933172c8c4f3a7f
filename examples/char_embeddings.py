"""A character-level language model with learned embeddings, trained with ``mj.train_step``.

What it shows:
  * an embedding lookup written as NumPy indexing, ``params["E"][context]``: in the compiled step
    it is a load through the index array inside the fused loop that feeds the first layer, and
    its gradient is a loop that adds each row's gradient into ``E`` at its character (a
    character seen twice in a context, or in a batch, accumulates);
  * the next-character loss as the classic pick ``-log_softmax(z)[np.arange(n), y]``;
  * one compiled step (loss, gradients and the Adam update) for every batch;
  * the model's gradients checked against the reference executor, and the loss on the last tenth
    of the text (not trained on, though its sayings repeat earlier ones) falling well below what
    the character frequencies alone give.

Run:  python examples/char_embeddings.py [--steps N]
"""
import argparse

import numpy as np

import morphjit as mj
from _common import Progress

TEXT = (
    "the quick brown fox jumps over the lazy dog. a watched pot never boils. "
    "all that glitters is not gold. the early bird catches the worm. "
    "actions speak louder than words. better late than never. practice makes perfect. "
    "when in rome do as the romans do. the pen is mightier than the sword. "
) * 8


def loss(params, context, target):
    """Mean cross-entropy of the next character given the previous ones (a bag of embeddings
    concatenated in order, a tanh layer, then logits over the alphabet)."""
    embedded = params["E"][context]                              # [n, k, d]: the gather
    h = np.tanh(embedded.reshape(len(context), -1) @ params["W1"] + params["b1"])
    z = h @ params["W2"] + params["b2"]
    logp = z - mj.logsumexp(z, axis=1, keepdims=True)
    return -np.mean(logp[np.arange(len(target)), target])       # the cross-entropy pick


def windows(codes, k):
    """Every ``k`` characters and the one after them."""
    idx = np.arange(len(codes) - k)[:, None] + np.arange(k)
    return codes[idx], codes[k:]


def init_params(rng, vocab, k, d, hidden):
    return {"E": rng.normal(scale=0.5, size=(vocab, d)),
            "W1": rng.normal(scale=1 / np.sqrt(k * d), size=(k * d, hidden)), "b1": np.zeros(hidden),
            "W2": rng.normal(scale=1 / np.sqrt(hidden), size=(hidden, vocab)), "b2": np.zeros(vocab)}


def main(steps=600, k=4, d=12, hidden=64, batch=64, lr=0.01, seed=0):
    rng = np.random.default_rng(seed)
    alphabet = sorted(set(TEXT))
    codes = np.array([alphabet.index(c) for c in TEXT])
    contexts, targets = windows(codes, k)
    split = int(0.9 * len(targets))
    held_out = contexts[split:], targets[split:]
    params = init_params(rng, len(alphabet), k, d, hidden)

    # The compiled gradients against the reference executor, on one batch.
    probe = contexts[:batch], targets[:batch]
    _, compiled = mj.compile_loss(loss)(params, *probe)
    _, reference = mj.compile_loss(loss, backend="interp")(params, *probe)
    grad_diff = max(float(np.max(np.abs(compiled[n] - reference[n]))) for n in params)

    frequencies = np.bincount(codes, minlength=len(alphabet)) / len(codes)
    unigram = float(-np.mean(np.log(frequencies[held_out[1]])))
    initial = float(loss(params, *held_out))
    step = mj.train_step(loss, mj.optim.adam(lr))
    state = step.init(params)
    progress = Progress(steps)
    for i in range(steps):
        rows = rng.integers(0, split, size=batch)
        progress.update(i, step(params, state, contexts[rows], targets[rows]))
    progress.close()
    final = float(loss(params, *held_out))
    print(f"held-out loss (nats per character): {initial:.3f} before training, {final:.3f} after; "
          f"character frequencies alone: {unigram:.3f}")
    print(f"largest gradient difference, compiled vs reference: {grad_diff:.1e}")
    return {"initial_loss": initial, "final_loss": final, "unigram_loss": unigram, "grad_diff": grad_diff}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    main(steps=parser.parse_args().steps)
