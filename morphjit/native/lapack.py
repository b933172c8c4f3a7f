"""The numba kernels the generated step calls for ``Lapack`` instructions (one matrix each), and
the GEMM that kernels call.

Each kernel writes its result into the planned buffer ``out``. Cholesky and the triangular ops
call LAPACK's ``potrf``, ``trtri`` and ``lauum`` and BLAS's ``trsm`` and ``trmm`` from SciPy's bindings in
place in ``out`` (no allocation); the others go through numba's ``np.linalg``, which allocates its result, copied
into ``out``. A C-order matrix is its transpose in LAPACK's Fortran order, so a lower triangle is
an upper one there and a left solve is a right solve.

The routines are external symbols registered with LLVM when this module loads (which the
generated module's import does first), so steps calling them cache to disk like any other.
Failures raise ``numpy.linalg.LinAlgError`` with NumPy's and SciPy's messages; NaN input gives
NaN output, as in NumPy.

`gemm` calls BLAS's ``gemm`` directly: numba takes about 0.15 s over a kernel calling ``np.dot``
and 0.06 s over one calling `gemm` (compiled once and cached with the package).
"""
from __future__ import annotations

import ctypes

import numba
import numpy as np
from llvmlite import binding as llvm
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from scipy.linalg import cython_blas, cython_lapack


def _address(module, name: str) -> int:
    """The address of a function SciPy exports from its Cython BLAS/LAPACK module."""
    capsule = module.__pyx_capi__[name]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get_pointer(capsule, get_name(capsule))


def _external(module, name: str, arguments: int):
    """A Fortran routine (every argument by pointer) callable from nopython code."""
    symbol = f"morphjit_{name}"
    llvm.add_symbol(symbol, _address(module, name))
    return types.ExternalFunction(symbol, types.void(*[types.voidptr] * arguments))


_dgemm = _external(cython_blas, "dgemm", 13)
_sgemm = _external(cython_blas, "sgemm", 13)
_dgemv = _external(cython_blas, "dgemv", 11)
_sgemv = _external(cython_blas, "sgemv", 11)
_dtrsm = _external(cython_blas, "dtrsm", 11)
_strsm = _external(cython_blas, "strsm", 11)
_dtrmm = _external(cython_blas, "dtrmm", 11)
_strmm = _external(cython_blas, "strmm", 11)
_dtrtri = _external(cython_lapack, "dtrtri", 6)
_strtri = _external(cython_lapack, "strtri", 6)
_dlauum = _external(cython_lapack, "dlauum", 5)
_slauum = _external(cython_lapack, "slauum", 5)
_dpotrf = _external(cython_lapack, "dpotrf", 5)
_spotrf = _external(cython_lapack, "spotrf", 5)

JIT = dict(nogil=True, boundscheck=False, cache=True)


@numba.njit(**JIT)
def _characters(*codes):
    chars = np.empty(len(codes), np.uint8)
    for k, c in enumerate(codes):
        chars[k] = ord(c)
    return chars


@numba.njit(**JIT)
def _integers(*values):
    ints = np.empty(len(values), np.int32)
    for k, v in enumerate(values):
        ints[k] = v
    return ints


@intrinsic
def _by_reference(typingctx, value, like):
    """A pointer to a slot on the stack holding ``value`` as ``like``'s type (an array's dtype),
    for the Fortran routines, which take every argument by reference."""
    slot_type = like.dtype if isinstance(like, types.Array) else like

    def codegen(context, builder, signature, args):
        converted = context.cast(builder, args[0], signature.args[0], slot_type)
        return builder.bitcast(cgutils.alloca_once_value(builder, converted), cgutils.voidptr_t)
    return types.voidptr(value, like), codegen


@numba.njit(**JIT)
def _blas_operand(x):
    """How BLAS (column-major) sees a C-order matrix: as its transpose ('N', no flag) with the row
    stride as leading dimension; a transposed view of one ('T') with the column stride. The stride
    of an axis of length one says nothing: BLAS still wants the leading dimension at least the
    length of the other axis."""
    size, (rows, cols) = x.itemsize, x.shape
    if x.strides[1] == size:
        return ord("N"), max(x.strides[0] // size, cols, 1)
    return ord("T"), max(x.strides[1] // size, rows, 1)


@numba.njit(**JIT)
def gemm(a, b, out):
    """``out = a @ b`` for matrices that are C-ordered or transposed views of C-ordered ones:
    column-major ``out^T = b^T a^T``; a matrix times a vector through ``gemv`` (BLAS's ``gemm``
    takes 3-4x longer over a single column)."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return
    if k == 0:
        out[:] = 0
        return
    if n == 1:
        _gemv(a, b[:, 0], out[:, 0])
    elif m == 1:
        _gemv(b.T, a[0], out[0])
    else:
        (ta, lda), (tb, ldb) = _blas_operand(a), _blas_operand(b)
        char, int32 = np.uint8(0), np.int32(0)
        args = (_by_reference(tb, char), _by_reference(ta, char), _by_reference(n, int32), _by_reference(m, int32),
                _by_reference(k, int32), _by_reference(1, out), b.ctypes, _by_reference(ldb, int32), a.ctypes,
                _by_reference(lda, int32), _by_reference(0, out), out.ctypes,
                _by_reference(out.strides[0] // out.itemsize, int32))
        if out.itemsize == 8:
            _dgemm(*args)
        else:
            _sgemm(*args)


@numba.njit(**JIT)
def _gemv(a, x, y):
    """``y = a @ x``: BLAS sees a C-ordered ``a`` as its transpose ('T' undoes it), a transposed
    view as itself ('N')."""
    m, k = a.shape
    flag, lda = _blas_operand(a)
    size, char, int32 = y.itemsize, np.uint8(0), np.int32(0)
    trans, rows, columns = (ord("T"), k, m) if flag == ord("N") else (ord("N"), m, k)
    args = (_by_reference(trans, char), _by_reference(rows, int32), _by_reference(columns, int32),
            _by_reference(1, y), a.ctypes, _by_reference(lda, int32), x.ctypes,
            _by_reference(max(x.strides[0] // size, 1), int32), _by_reference(0, y), y.ctypes,
            _by_reference(max(y.strides[0] // size, 1), int32))
    if size == 8:
        _dgemv(*args)
    else:
        _sgemv(*args)


@numba.njit(**JIT)
def cholesky(a, out):
    """``out`` = the lower Cholesky factor of ``a`` (its lower triangle read)."""
    n = a.shape[0]
    for i in range(n):
        for j in range(i + 1):
            out[i, j] = a[i, j]
        for j in range(i + 1, n):
            out[i, j] = 0
    uplo, ints = _characters("U"), _integers(n, n, 0)
    if out.itemsize == 8:
        _dpotrf(uplo.ctypes, ints[0:].ctypes, out.ctypes, ints[1:].ctypes, ints[2:].ctypes)
    else:
        _spotrf(uplo.ctypes, ints[0:].ctypes, out.ctypes, ints[1:].ctypes, ints[2:].ctypes)
    if ints[2] != 0:
        raise np.linalg.LinAlgError("Matrix is not positive definite.")


@numba.njit(**JIT)
def solve_triangular(a, b, out, lower, trans):
    """``out`` = op(a)^-1 b for triangular ``a`` (op a transpose where ``trans``)."""
    for i in range(a.shape[0]):
        if a[i, i] == 0:
            raise np.linalg.LinAlgError("singular matrix: a diagonal element of the triangular matrix is zero")
    _triangular(a, b, out, lower, trans, True)


@numba.njit(**JIT)
def triangular_inverse(a, out, lower):
    """``out`` = the inverse of the triangular matrix in the ``lower`` or upper triangle of ``a``
    (LAPACK trtri in place in ``out``; the other triangle zero)."""
    n = a.shape[0]
    for i in range(n):
        if a[i, i] == 0:
            raise np.linalg.LinAlgError("singular matrix: a diagonal element of the triangular matrix is zero")
        for j in range(n):
            out[i, j] = a[i, j] if (j <= i) == lower or i == j else 0
    flags, ints = _characters("U" if lower else "L", "N"), _integers(n, n, 0)
    if out.itemsize == 8:
        _dtrtri(flags[0:].ctypes, flags[1:].ctypes, ints[0:].ctypes, out.ctypes, ints[1:].ctypes, ints[2:].ctypes)
    else:
        _strtri(flags[0:].ctypes, flags[1:].ctypes, ints[0:].ctypes, out.ctypes, ints[1:].ctypes, ints[2:].ctypes)


@numba.njit(**JIT)
def weighted_gram(w, e, out):
    """``out`` = w^T diag(e) w for lower-triangular ``w``: LAPACK lauum (a third of a trmm's work)
    on the rows scaled by sqrt(e), a second time into a scratch matrix only if a weight is
    negative; then the lower triangle mirrored."""
    _scaled_gram(w, e, out, 1.0)
    if np.any(e < 0):
        negative = np.empty_like(out)
        _scaled_gram(w, e, negative, -1.0)
        out -= negative
    _mirror_lower(out)


@numba.njit(**JIT)
def _scaled_gram(w, e, out, sign):
    """The lower triangle of ``out`` = w^T diag(max(sign e, 0)) w (lauum of the scaled rows)."""
    n = w.shape[0]
    for i in range(n):
        scale = np.sqrt(max(sign * e[i], 0))
        for j in range(i + 1):
            out[i, j] = scale * w[i, j]
        for j in range(i + 1, n):
            out[i, j] = 0
    _lauum(out)


@numba.njit(**JIT)
def _lauum(w):
    """The lower triangle of ``w`` = w^T w for the lower-triangular ``w``, in place."""
    n = w.shape[0]
    uplo, ints = _characters("U"), _integers(n, n, 0)
    if w.itemsize == 8:
        _dlauum(uplo.ctypes, ints[0:].ctypes, w.ctypes, ints[1:].ctypes, ints[2:].ctypes)
    else:
        _slauum(uplo.ctypes, ints[0:].ctypes, w.ctypes, ints[1:].ctypes, ints[2:].ctypes)


@numba.njit(**JIT)
def _mirror_lower(out):
    for i in range(out.shape[0]):
        for j in range(i):
            out[j, i] = out[i, j]


@numba.njit(**JIT)
def cho_solve(a, c, b, out, lower):
    """``out`` = a^-1 b given ``c``, the Cholesky factor of ``a`` in its ``lower`` or upper
    triangle (``a`` itself is not read): two triangular solves."""
    _triangular(c, b, out, lower, not lower, True)
    _triangular(c, out, out, lower, lower, True)


@numba.njit(**JIT)
def triangular_matmul(a, b, out, lower, trans):
    """``out`` = op(a) b reading one triangle of ``a`` (BLAS trmm: half a GEMM's work)."""
    _triangular(a, b, out, lower, trans, False)


@numba.njit(**JIT)
def _triangular(a, b, out, lower, trans, solve):
    """``out`` = op(a)^-1 b (BLAS trsm, where ``solve``) or op(a) b (trmm), computed in place in a
    copy of ``b`` (a right-side call on the transposes, see above)."""
    n, k = b.shape
    out[...] = b
    flags = _characters("R", "U" if lower else "L", "T" if trans else "N", "N")
    ints = _integers(k, n, n, k)
    one = np.ones(1, out.dtype)
    args = (flags[0:].ctypes, flags[1:].ctypes, flags[2:].ctypes, flags[3:].ctypes, ints[0:].ctypes,
            ints[1:].ctypes, one.ctypes, a.ctypes, ints[2:].ctypes, out.ctypes, ints[3:].ctypes)
    if solve and out.itemsize == 8:
        _dtrsm(*args)
    elif solve:
        _strsm(*args)
    elif out.itemsize == 8:
        _dtrmm(*args)
    else:
        _strmm(*args)


@numba.njit(**JIT)
def _finite(*arrays):
    """numba's np.linalg raises on a NaN or inf where NumPy returns NaN: the kernels below give
    NaN themselves for such input, so that it reaches the loss as it does in NumPy."""
    for x in arrays:
        if not np.all(np.isfinite(x)):
            return False
    return True


@numba.njit(**JIT)
def solve(a, b, out):
    if _finite(a, b):
        out[...] = np.linalg.solve(a, b)
    else:
        out[...] = np.nan


@numba.njit(**JIT)
def inv(a, out):
    if _finite(a):
        out[...] = np.linalg.inv(a)
    else:
        out[...] = np.nan


@numba.njit(**JIT)
def det(a, out):
    out[0] = np.linalg.det(a) if _finite(a) else np.nan


@numba.njit(**JIT)
def slogdet(a, out):
    if _finite(a):
        sign, logdet = np.linalg.slogdet(a)
        out[0] = sign
        out[1] = logdet
    else:
        out[...] = np.nan


@numba.njit(**JIT)
def factored_slogdet(a, c, out):
    """``out`` = (sign, logabsdet) of ``a``: from the diagonal of its lower Cholesky factor ``c``
    where ``a`` is symmetric to rounding, else by LU."""
    if _symmetric_to_rounding(a):
        logabsdet = 0.0
        for i in range(c.shape[0]):
            logabsdet += 2 * np.log(c[i, i])
        out[0] = 1
        out[1] = logabsdet
    else:
        slogdet(a, out)


@numba.njit(**JIT)
def factored_inv(a, c, out):
    """``out`` = a^-1: c^-T c^-1 from its lower Cholesky factor ``c`` (trtri and lauum, a third
    of LU's work) where ``a`` is symmetric to rounding, else by LU."""
    if _symmetric_to_rounding(a):
        triangular_inverse(c, out, True)
        _lauum(out)
        _mirror_lower(out)
    else:
        inv(a, out)


_TILE = 64   # the symmetry test's square tiles: 64 rows of 64 doubles stay in L1


@numba.njit(**JIT)
def _symmetric_to_rounding(a):
    """``linalg_ops``' test: finite, and ``|a_ij - a_ji| <= n eps sqrt(a_ii a_jj)``; tile by
    tile below the diagonal, so that the column ``a[:, i]`` is read from cache (one pass over
    memory: 3.4 ms at n = 2000, where reading it row by row takes 5)."""
    n = a.shape[0]
    tolerance = n * (2.220446049250313e-16 if a.itemsize == 8 else 1.1920928955078125e-07)
    scale = np.empty(n)
    for i in range(n):
        if not np.isfinite(a[i, i]):
            return False
        scale[i] = np.sqrt(abs(a[i, i]))
    for i0 in range(0, n, _TILE):
        for j0 in range(0, i0 + 1, _TILE):
            for i in range(i0, min(i0 + _TILE, n)):
                bound = tolerance * scale[i]
                for j in range(j0, min(j0 + _TILE, i)):
                    if not abs(a[i, j] - a[j, i]) <= bound * scale[j]:
                        return False
    return True


@numba.njit(**JIT)
def eigh(a, out):
    """``out[0]`` = the eigenvalues, ``out[1:]`` the eigenvectors (columns)."""
    if _finite(a):
        w, v = np.linalg.eigh(a)
        out[0] = w
        out[1:] = v
    else:
        out[...] = np.nan


@numba.njit(**JIT)
def qr(a, out):
    """``out[:, :m]`` = Q transposed, ``out[:, m:]`` = R (reduced)."""
    if _finite(a):
        m = a.shape[0]
        q, r = np.linalg.qr(a)
        out[:, :m] = q.T
        out[:, m:] = r
    else:
        out[...] = np.nan


@numba.njit(**JIT)
def svd(a, out, full):
    """``out``: the columns of U as rows, the singular values, the rows of Vh, each row padded with
    zeros (``morphjit.ops.svd``'s layout). NaN or inf input raises ``LinAlgError``, as NumPy's does."""
    if not _finite(a):
        raise np.linalg.LinAlgError("SVD did not converge")
    u, s, vh = np.linalg.svd(a, full_matrices=full)
    rows = u.shape[1]
    out[...] = 0
    out[:rows, :a.shape[0]] = u.T
    out[rows, :s.shape[0]] = s
    out[rows + 1:, :a.shape[1]] = vh
