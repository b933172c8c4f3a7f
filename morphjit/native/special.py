"""SciPy's special functions for generated code (imported there as ``sps``): the compiled kernels
SciPy's ufuncs run, from ``scipy.special.cython_special``, called through their C capsules.

Each kernel's address is registered with LLVM as an external symbol when this module loads (which
the generated module's import does first), so steps calling them cache to disk like any other.
Every function here is a plain Python function too (calling the same kernel through ctypes, so
tests/ops/test_templates.py can evaluate the templates), which numba compiles, where the
generated step calls it, to a direct call of the kernel.

``KERNELS`` maps each function to its capsule: the real double variant of a fused function
(``__pyx_fuse_1iv``: ``double (double, double, int __pyx_skip_dispatch)``), and the float variant
``<name>_float32`` where SciPy's float32 ufunc loop computes in float (Boost's ``betainc`` and
``stdtr``; SciPy's other float32 loops compute in double and round, as the templates do).
"""
from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import binding as llvm
from numba import types
from numba.extending import overload
from scipy.special import cython_special

KERNELS = {
    "gamma": ("__pyx_fuse_1gamma", 1), "beta": ("beta", 2), "betaln": ("betaln", 2),
    "betainc": ("__pyx_fuse_0betainc", 3), "betainc_float32": ("__pyx_fuse_1betainc", 3),
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
globals().update(FUNCTIONS)
