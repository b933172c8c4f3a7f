"""The gradient of a function at an edge of its domain (+-inf, an end of a support): the limit of
its partial derivatives along a path into the edge, by central differences of the reference
function (SciPy's, NumPy's) at finite points of the path.

An oracle that shares nothing with morphjit's rules. The limit is read off three points of the
path: a finite limit where the derivatives settle (the last two agree, or their differences shrink
fivefold), +-inf where they keep moving one way no slower than before, NaN where they are NaN.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PATH = (1e-4, 1e-6, 1e-8)   # the path parameter t at the three points
RELATIVE_STEP = 1e-6        # of an argument's magnitude, away from a finite end
END_STEP = 1e-2             # of the distance t to a finite end (a step never crosses it)
AGREE = 1e-4                # relative agreement of the last two derivatives: a finite limit


@dataclass(frozen=True)
class Edge:
    """A point on the edge of a function's domain and the path into it.

    ``approach[i]`` is 0 for a coordinate that stays put, +1 (-1) for one that comes to its finite
    value from above (below); an infinite coordinate comes as ``+-1 / t``. ``units[i]`` is the
    length one unit of t moves coordinate i by (the scale, for x at an end of a support).
    ``groups[i]`` names the coordinates whose magnitudes one step follows (x and loc together: a
    step in loc must grow with x, or rounding swamps the difference)."""
    point: tuple
    approach: tuple
    units: tuple
    groups: tuple

    def at(self, t: float) -> list[float]:
        return [math.copysign(1.0 / t, p) if math.isinf(p) else p + a * t * u
                for p, a, u in zip(self.point, self.approach, self.units)]

    def steps(self, point, t: float) -> list[float]:
        size = {g: max([1.0] + [abs(p) for p, h in zip(point, self.groups) if h == g]) for g in self.groups}
        steps = [RELATIVE_STEP * size[g] for g in self.groups]
        if any(self.approach):
            steps = [min(h, END_STEP * t * u) for h, u in zip(steps, self.units)]
        return steps


def edge(point, approach=None, units=None, groups=None) -> Edge:
    n = len(point)
    return Edge(tuple(point), tuple(approach or (0,) * n), tuple(units or (1.0,) * n), tuple(groups or range(n)))


@dataclass(frozen=True)
class Limit:
    value: float
    error: float    # of a finite value


def central_differences(fun, point, steps) -> list[float]:
    grads = []
    for i, h in enumerate(steps):
        hi, lo = list(point), list(point)
        hi[i], lo[i] = point[i] + h, point[i] - h
        with np.errstate(all="ignore"):
            f_hi, f_lo = float(fun(*hi)), float(fun(*lo))
        # -inf on both sides: a log-density outside its support, flat there.
        grads.append(0.0 if f_hi == f_lo == -math.inf else (f_hi - f_lo) / (2 * h))
    return grads


def _limit(d1: float, d2: float, d3: float) -> Limit:
    if np.isnan(d2) or np.isnan(d3):
        return Limit(math.nan, 0.0)
    if math.isinf(d3):
        return Limit(d3, 0.0)
    first, last = d2 - d1, d3 - d2
    if abs(last) <= AGREE * (1.0 + abs(d3)) or abs(last) <= 0.2 * abs(first):
        return Limit(d3, abs(last) + AGREE * (1.0 + abs(d3)))
    if first * last > 0 and abs(last) >= 0.5 * abs(first) and abs(d3) > abs(d2):
        return Limit(math.copysign(math.inf, last), 0.0)
    raise AssertionError(f"derivatives {d1!r}, {d2!r}, {d3!r} along the path neither settle nor diverge")


def derivative_limits(fun, e: Edge) -> list[Limit]:
    """The limits of the partial derivatives of ``fun(*point)`` along the path into ``e``."""
    rows = [central_differences(fun, e.at(t), e.steps(e.at(t), t)) for t in PATH]
    return [_limit(*column) for column in zip(*rows)]


def gradient_misses_limits(grad, limits, nan_allowed=False) -> list[str]:
    """The partial derivatives that are not their limits: a finite one to the differences'
    accuracy, an infinite one or NaN exactly (or NaN, where ``nan_allowed``)."""
    misses = []
    for i, (g, lim) in enumerate(zip(map(float, grad), limits)):
        if nan_allowed and np.isnan(g):
            continue
        if math.isfinite(lim.value):
            ok = math.isfinite(g) and abs(g - lim.value) <= 2 * lim.error
        else:
            ok = g == lim.value or (np.isnan(g) and np.isnan(lim.value))
        if not ok:
            misses.append(f"argument {i}: {g!r}, its limit {lim.value!r}")
    return misses
