"""Adaptive, interleaved, time-boxed timing of several callables in one process.

Each case is calibrated to a batch of calls lasting at least ``min_sample_s`` (one call if it is
slower), then the cases take turns, one sample each per round, until the time box is spent and
every case has ``min_samples`` samples (or every case has ``max_samples``). Interleaving spreads
machine noise evenly over the cases, so their ratios are fair. Times are wall-clock
(``perf_counter``): some peers run threads.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

CLOCK = time.perf_counter


@dataclass
class Stats:
    median_s: float
    q1_s: float
    q3_s: float
    samples: int
    calls_per_sample: int

    @property
    def iqr_s(self) -> float:
        return self.q3_s - self.q1_s

    def as_dict(self) -> dict:
        return dict(asdict(self), iqr_s=self.iqr_s)


def _calibrate(fn, min_sample_s: float) -> int:
    number = 1
    while True:
        start = CLOCK()
        for _ in range(number):
            fn()
        elapsed = CLOCK() - start
        if elapsed >= min_sample_s or number >= 1 << 20:
            return number
        number = max(number * 2, int(number * min_sample_s / max(elapsed, 1e-9) * 1.2))


def measure(cases: dict, budget_s: float = 2.0, min_samples: int = 7, max_samples: int = 2000,
            min_sample_s: float = 2e-3) -> dict:
    """{name: Stats} of seconds per call of each ``cases[name]()``."""
    numbers = {k: _calibrate(fn, min_sample_s) for k, fn in cases.items()}
    samples = {k: [] for k in cases}
    deadline = CLOCK() + budget_s
    while True:
        for k, fn in cases.items():
            if len(samples[k]) >= max_samples:
                continue
            n = numbers[k]
            start = CLOCK()
            for _ in range(n):
                fn()
            samples[k].append((CLOCK() - start) / n)
        counts = [len(s) for s in samples.values()]
        if min(counts) >= max_samples or (CLOCK() >= deadline and min(counts) >= min_samples):
            break
    out = {}
    for k, s in samples.items():
        q1, med, q3 = np.percentile(s, [25, 50, 75])
        out[k] = Stats(float(med), float(q1), float(q3), len(s), numbers[k])
    return out
