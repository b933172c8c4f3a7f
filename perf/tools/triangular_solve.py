"""Derives the choice of BLAS trsm for triangular solves (perf/results/GP_RESULTS.md, last section).

A numba loop nest (forward substitution) against the kernel ``morphjit.native.lapack.solve_triangular``
at n = 100, 500, 2000, one and n right-hand sides; a tool, since that kernel is internal.

Run:  OPENBLAS_NUM_THREADS=1 python -m perf.tools.triangular_solve
"""
import time

import numba
import numpy as np

from morphjit.native import lapack


@numba.njit(fastmath=True, boundscheck=False)
def forward_substitution(L, B, out):
    n, k = B.shape
    for i in range(n):
        for j in range(k):
            out[i, j] = B[i, j]
        for p in range(i):
            f = L[i, p]
            for j in range(k):
                out[i, j] -= f * out[p, j]
        d = 1.0 / L[i, i]
        for j in range(k):
            out[i, j] *= d


def median_seconds(fn, reps: int, samples: int = 5) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - start) / reps)
    return float(np.median(times))


def main():
    rng = np.random.default_rng(0)
    for n in (100, 500, 2000):
        m = rng.standard_normal((n, n))
        L = np.linalg.cholesky(m @ m.T / n + np.eye(n))
        for k in (1, n):
            b = rng.standard_normal((n, k))
            loops, blas = np.empty_like(b), np.empty_like(b)
            forward_substitution(L, b, loops)
            lapack.solve_triangular(L, b, blas, lower=True, trans=False)
            assert np.allclose(loops, blas)
            reps = max(1, int(2e7 / (n * n * k)))
            t_loops = median_seconds(lambda: forward_substitution(L, b, loops), reps)
            t_blas = median_seconds(lambda: lapack.solve_triangular(L, b, blas, lower=True, trans=False), reps)
            print(f"n={n:5d} rhs={k:5d}: loops {t_loops * 1e3:9.3f} ms  trsm {t_blas * 1e3:9.3f} ms  "
                  f"loops/trsm {t_loops / t_blas:5.2f}")


if __name__ == "__main__":
    main()
