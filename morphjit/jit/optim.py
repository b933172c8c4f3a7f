"""Optimisers for ``mj.train_step``: element-wise update rules written with the array functions.

A rule runs on tracers inside the training program, so the update is compiled into the same
native step as the loss and its gradients; it runs on NumPy arrays too. Hyperparameters other
than the learning rate are constants of the compiled program; the learning rate (a number or a
schedule ``lr(step) -> float``, step counting from 0) and the bias corrections that depend on the
step number are run-time scalars, so they change between calls without recompiling.

The formulas follow the published definitions with PyTorch's defaults and conventions:
``torch.optim.SGD``, ``Adam``/``AdamW`` (Kingma and Ba, Algorithm 1; Loshchilov and Hutter for
the decoupled decay) and ``RMSprop``.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable

from .. import api as A

LearningRate = float | Callable[[int], float]


class Optimizer:
    """An update rule: ``update(p, g, state, scalars) -> (new p, new state)``.

    ``state_names`` names the per-parameter state arrays (zero-initialised, shaped like the
    parameter; the keys of ``step.init(params)`` besides ``"step"``); ``scalars(step)`` gives
    the run-time scalars of a step (learning rate first).
    """

    state_names: tuple[str, ...] = ()
    scalar_names: tuple[str, ...] = ("lr",)

    def __init__(self, lr: LearningRate, **hyper: float):
        if not callable(lr):
            check_nonnegative("lr", lr)
        self.lr = lr
        self.hyper = hyper

    def learning_rate(self, step: int, lr=None) -> float:
        """The learning rate of ``step``: ``lr`` when given (a per-call override), else the
        optimiser's or its schedule's, checked to be a finite number >= 0."""
        if lr is None and callable(self.lr):
            lr = self.lr(step)
            check_nonnegative(f"the learning-rate schedule's lr({step})", lr)
        else:
            lr = self.lr if lr is None else lr
            check_nonnegative("lr", lr)
        return float(lr)

    def scalars(self, step: int, lr: float) -> tuple[float, ...]:
        return (lr,)

    def key(self) -> tuple:
        """What the compiled program depends on: the rule and its constant hyperparameters."""
        return (type(self).__name__,) + tuple(sorted(self.hyper.items()))

    def update(self, p, g, state: dict, scalars: tuple):
        raise NotImplementedError

    @property
    def slots(self) -> tuple[str, ...]:
        """The former name of ``state_names``, kept for code written against it."""
        return self.state_names

    def __repr__(self) -> str:
        hyper = "".join(f", {k}={v!r}" for k, v in self.hyper.items())
        return f"{type(self).__name__.lower()}(lr={self.lr!r}{hyper})"


def check_nonnegative(name: str, value) -> None:
    """``value`` is a real number (a Python or NumPy int or float, not a bool), finite and >= 0."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not value >= 0 or math.isinf(value):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def check_fraction(name: str, value) -> None:
    check_nonnegative(name, value)
    if not value < 1:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")


class SGD(Optimizer):
    def __init__(self, lr, momentum=0.0, nesterov=False, weight_decay=0.0):
        check_nonnegative("momentum", momentum)
        check_nonnegative("weight_decay", weight_decay)
        if nesterov and not momentum:
            raise ValueError("nesterov=True needs a momentum > 0")
        super().__init__(lr, momentum=float(momentum), nesterov=bool(nesterov), weight_decay=float(weight_decay))
        self.state_names = ("momentum",) if momentum else ()

    def update(self, p, g, state, scalars):
        (lr,) = scalars
        h = self.hyper
        if h["weight_decay"]:
            g = g + h["weight_decay"] * p
        if h["momentum"]:
            buf = h["momentum"] * state["momentum"] + g
            g = g + h["momentum"] * buf if h["nesterov"] else buf
            state = {"momentum": buf}
        return p - lr * g, state


class Adam(Optimizer):
    state_names = ("m", "v")
    scalar_names = ("lr", "bias1", "bias2")

    def __init__(self, lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, decoupled=False):
        check_fraction("b1", b1)
        check_fraction("b2", b2)
        check_nonnegative("eps", eps)
        check_nonnegative("weight_decay", weight_decay)
        super().__init__(lr, b1=float(b1), b2=float(b2), eps=float(eps), weight_decay=float(weight_decay),
                         decoupled=bool(decoupled))

    def scalars(self, step, lr):
        t = step + 1
        return lr, 1.0 - self.hyper["b1"] ** t, 1.0 - self.hyper["b2"] ** t

    def update(self, p, g, state, scalars):
        lr, bias1, bias2 = scalars
        h = self.hyper
        if h["weight_decay"] and not h["decoupled"]:
            g = g + h["weight_decay"] * p
        m = h["b1"] * state["m"] + (1.0 - h["b1"]) * g
        v = h["b2"] * state["v"] + (1.0 - h["b2"]) * (g * g)
        if h["weight_decay"] and h["decoupled"]:
            p = p - lr * h["weight_decay"] * p
        step = (m / bias1) / (A.sqrt(v / bias2) + h["eps"])
        return p - lr * step, {"m": m, "v": v}


class RMSprop(Optimizer):
    def __init__(self, lr, alpha=0.99, eps=1e-8, momentum=0.0, weight_decay=0.0, centered=False):
        check_fraction("alpha", alpha)
        check_nonnegative("eps", eps)
        check_nonnegative("momentum", momentum)
        check_nonnegative("weight_decay", weight_decay)
        super().__init__(lr, alpha=float(alpha), eps=float(eps), momentum=float(momentum),
                         weight_decay=float(weight_decay), centered=bool(centered))
        self.state_names = ("square_avg",) + (("grad_avg",) if centered else ()) + (("momentum",) if momentum else ())

    def update(self, p, g, state, scalars):
        (lr,) = scalars
        h = self.hyper
        if h["weight_decay"]:
            g = g + h["weight_decay"] * p
        new = {"square_avg": h["alpha"] * state["square_avg"] + (1.0 - h["alpha"]) * (g * g)}
        mean_square = new["square_avg"]
        if h["centered"]:
            new["grad_avg"] = h["alpha"] * state["grad_avg"] + (1.0 - h["alpha"]) * g
            mean_square = mean_square - new["grad_avg"] * new["grad_avg"]
        step = g / (A.sqrt(mean_square) + h["eps"])
        if h["momentum"]:
            new["momentum"] = step = h["momentum"] * state["momentum"] + step
        return p - lr * step, new


def sgd(lr: LearningRate, momentum=0.0, nesterov=False, weight_decay=0.0) -> SGD:
    """Stochastic gradient descent, optionally with (Nesterov) momentum and L2 weight decay."""
    return SGD(lr, momentum, nesterov, weight_decay)


def adam(lr: LearningRate = 1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, decoupled=False) -> Adam:
    """Adam; ``weight_decay`` adds ``weight_decay * p`` to the gradient, or with
    ``decoupled=True`` shrinks the parameter directly (AdamW)."""
    return Adam(lr, b1, b2, eps, weight_decay, decoupled)


def adamw(lr: LearningRate = 1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-2) -> Adam:
    """AdamW: Adam with decoupled weight decay (PyTorch's defaults)."""
    return Adam(lr, b1, b2, eps, weight_decay, decoupled=True)


def rmsprop(lr: LearningRate = 1e-2, alpha=0.99, eps=1e-8, momentum=0.0, weight_decay=0.0,
            centered=False) -> RMSprop:
    """RMSprop as in PyTorch (``eps`` outside the square root; ``centered`` subtracts the
    squared running mean of the gradient)."""
    return RMSprop(lr, alpha, eps, momentum, weight_decay, centered)
