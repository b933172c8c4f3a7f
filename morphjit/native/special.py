"""SciPy's special functions for generated code (imported there as ``sps``): the compiled kernels
SciPy's ufuncs run, from ``scipy.special.cython_special``, called through their C capsules.

Each kernel's address is registered with LLVM as an external symbol when this module loads (which
the generated module's import does first), so steps calling them cache to disk like any other.
Every function here is a plain Python function too (calling the same kernel through ctypes, so
tests/ops/test_templates.py can evaluate the templates), which numba compiles, where the
generated step calls it, to a direct call of the kernel.

``KERNELS`` maps each function to its capsule: the real double variant of a fused function
(``__pyx_fuse_1iv``: ``double (double, double, int __pyx_skip_dispatch)``), and the float variant
``<name>_float32`` where SciPy's float32 ufunc loop computes in float (Boost's ``betainc``,
``betaincc`` and ``stdtr``; SciPy's other float32 loops compute in double and round, as the templates do).
"""
from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import binding as llvm
from numba import types
from numba.extending import overload, register_jitable
from scipy.special import cython_special

KERNELS = {
    "gamma": ("__pyx_fuse_1gamma", 1), "beta": ("beta", 2), "betaln": ("betaln", 2),
    "betainc": ("__pyx_fuse_0betainc", 3), "betainc_float32": ("__pyx_fuse_1betainc", 3),
    "betaincc": ("__pyx_fuse_0betaincc", 3), "betaincc_float32": ("__pyx_fuse_1betaincc", 3),
    "gammainc": ("gammainc", 2), "gammaincc": ("gammaincc", 2),
    "stdtr": ("__pyx_fuse_0stdtr", 2), "stdtr_float32": ("__pyx_fuse_1stdtr", 2),
    "i0": ("i0", 1), "i1": ("i1", 1), "j0": ("j0", 1), "j1": ("j1", 1), "y0": ("y0", 1), "y1": ("y1", 1),
    "iv": ("__pyx_fuse_1iv", 2), "kv": ("__pyx_fuse_1kv", 2),
}
# C type, ctypes type, numba type and NumPy type of each real variant
REAL = {"double": (ctypes.c_double, types.float64, np.float64), "float": (ctypes.c_float, types.float32, np.float32)}


def _capsule(name: str) -> tuple[int, str]:
    """The address and the C signature of a function ``cython_special`` exports."""
    capsule = cython_special.__pyx_capi__[name]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    signature = get_name(capsule)
    return get_pointer(capsule, signature), signature.decode()


def _real_type(signature: str, arity: int) -> str:
    """``double`` or ``float``: the one real type of a kernel's ``arity`` arguments and result."""
    for c_type in REAL:
        if signature == f"{c_type} ({', '.join([c_type] * arity)}, int __pyx_skip_dispatch)":
            return c_type
    raise TypeError(f"cython_special kernel of unexpected signature {signature!r}")


def _kernel(name: str, capsule: str, arity: int):
    """The function ``name``: the kernel called with ``__pyx_skip_dispatch`` 0, in Python and in numba."""
    address, signature = _capsule(capsule)
    c_type, numba_type, numpy_type = REAL[_real_type(signature, arity)]
    symbol = f"morphjit_special_{capsule}"
    llvm.add_symbol(symbol, address)
    external = types.ExternalFunction(symbol, numba_type(*[numba_type] * arity, types.intc))
    in_python = ctypes.CFUNCTYPE(c_type, *[c_type] * arity, ctypes.c_int)(address)

    def kernel(*args):
        return numpy_type(in_python(*args, 0))
    kernel.__name__ = name

    @overload(kernel, jit_options={"nogil": True})
    def _compiled(*args):
        return lambda *args: external(*args, 0)
    return kernel


FUNCTIONS = {name: _kernel(name, capsule, arity) for name, (capsule, arity) in KERNELS.items()}
globals().update(FUNCTIONS)   # module attributes: templates call ``sps.gamma``, which numba resolves as a global


# ---------------------------------------------------------------------------------------------
# polygamma(n, x) for n >= 1: SciPy's formula, (-1)^(n+1) n! zeta(n+1, x), with Cephes' Hurwitz
# zeta (which SciPy's zeta is; cython_special does not export it), in numba.

jit = register_jitable(error_model="numpy", fastmath=False, nogil=True)

# (2k)! / B_2k, the Euler-Maclaurin coefficients
ZETA_COEFFICIENTS = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
                     -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
                     1.8152105401943546773e17, -7.1661652561756670113e18)
MACHEP = 1.11022302462515654042e-16
ZETA_ASYMPTOTIC = 1e8   # q beyond which zeta(x, q) is its asymptotic expansion (DLMF 25.11.43)


@jit
def zeta(x, q):
    """Cephes' Hurwitz zeta ``sum_k (k + q)^-x``: the first terms, then Euler-Maclaurin."""
    if x == 1.0:
        return np.inf
    if x < 1.0 or np.isnan(q):
        return np.nan
    if q <= 0.0:
        if q == np.floor(q):
            return np.inf
        if x != np.floor(x):
            return np.nan   # q^-x is not real
    if q > ZETA_ASYMPTOTIC:
        return (1.0 / (x - 1.0) + 1.0 / (2.0 * q)) * q ** (1.0 - x)
    s, a, i, b = q ** -x, q, 0, 0.0
    while i < 9 or a <= 9.0:
        i += 1
        a += 1.0
        b = a ** -x
        s += b
        if abs(b / s) < MACHEP:
            return s
    w = a
    s += b * w / (x - 1.0)
    s -= 0.5 * b
    a, k = 1.0, 0.0
    for c in ZETA_COEFFICIENTS:
        a *= x + k
        b /= w
        t = a * b / c
        s += t
        if abs(t / s) < MACHEP:
            return s
        k += 1.0
        a *= x + k
        b /= w
        k += 1.0
    return s


@jit
def polygamma(n, x):
    """SciPy's ``polygamma`` for a whole ``n >= 1`` (a float), in double."""
    return (-1.0) ** (n + 1.0) * gamma(n + 1.0) * zeta(n + 1.0, x)
