"""The scalar templates of element-wise ops against their NumPy reference ``impl``.

Codegen inlines ``op.scalar(K, *operands)`` in loops, so this is the templates' oracle: rendered
on NumPy scalars and evaluated in Python (with ``np``, ``math``, ``npm`` and ``sps`` in scope, and
NumPy's ``where`` for the compiled ``select``), each template must
give NumPy's value (NaN where NumPy gives NaN) in the dtype the op's shape rule declares, on
zeros of both signs, negatives, NaN, infinities, huge and tiny values and many random values,
in float32 and float64 (and the integer and boolean dtypes where the op accepts them).
"""
from __future__ import annotations

import ast
import inspect
import itertools
import math
import warnings

import numpy as np
import pytest

from morphjit.native import npymath, special, vecmath
from morphjit.ir import Constants, ELEMENTWISE, OPS, TensorType, dtype_name

F32, F64, I32, I64, BOOL = (np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64, np.bool_))
FLOATS, INTS = (F32, F64), (I32, I64)

# Signatures (operand dtypes, params) each template is checked on.
UNARY_FLOAT = ["neg", "exp", "log", "log1p", "sqrt", "abs", "sign", "sin", "cos", "tanh", "sigmoid",
               "relu", "square"]
BINARY_FLOAT = ["add", "sub", "mul", "div", "pow", "maximum", "minimum"]
COMPARISONS = ["lt", "le", "gt", "ge", "eq", "ne"]
# morphjit/numpy_ext.py
UNARY_FLOAT += ["expm1", "log2", "log10", "exp2", "sinh", "cosh", "tan", "arcsin", "arccos", "arctan", "arcsinh",
                "arccosh", "arctanh", "cbrt", "fabs", "rint", "floor", "ceil", "trunc"]
BINARY_FLOAT += ["hypot", "arctan2", "logaddexp", "logaddexp2", "copysign", "remainder", "fmod", "floor_divide",
                 "heaviside"]
UNARY_FLOAT += ["erf", "erfc", "gammaln"]   # morphjit/special.py
# SciPy's kernels (morphjit/native/special.py): their own values, so exactly
UNARY_FLOAT += ["gamma", "i0", "i1", "j0", "j1", "y0", "y1"]
BINARY_FLOAT += ["beta", "betaln", "gammainc", "gammaincc", "iv", "kv", "stdtr"]
# float32 in double, rounded back: SciPy's float32 loops of iv and kv compute in float (kernels
# cython_special does not export), which for orders near the float32 maximum gives NaN where the
# double kernel gives its limit; SciPy's float64 result, rounded, is accepted there.
ROUNDED_DOUBLE = {"iv", "kv"}
INTEGER_TOO = ["floor", "ceil", "trunc", "remainder", "fmod", "floor_divide"]
FLOAT_PREDICATES = ["isnan", "isinf", "isfinite"]
ALL_DTYPES = FLOATS + INTS + (BOOL,)

SIGNATURES: dict[str, list[tuple[tuple[np.dtype, ...], dict]]] = {
    **{op: [((dt,), {}) for dt in FLOATS] for op in UNARY_FLOAT},
    **{op: [((dt, dt), {}) for dt in FLOATS] for op in BINARY_FLOAT},
    **{op: [((dt, dt), {}) for dt in FLOATS + INTS] for op in COMPARISONS},
    **{op: [((dt,) * (1 if op in UNARY_FLOAT else 2), {}) for dt in FLOATS + INTS] for op in INTEGER_TOO},
    **{op: [((dt,), {}) for dt in ALL_DTYPES] for op in FLOAT_PREDICATES},
    "stop_gradient": [((dt,), {}) for dt in ALL_DTYPES],
    "identity": [((dt,), {}) for dt in FLOATS],
    "branch_gate": [((dt, BOOL), {}) for dt in ALL_DTYPES],
    "eq": [((dt, dt), {}) for dt in ALL_DTYPES],
    "ne": [((dt, dt), {}) for dt in ALL_DTYPES],
    "and": [((BOOL, BOOL), {})],
    "or": [((BOOL, BOOL), {})],
    "not": [((BOOL,), {})],
    "where": [((BOOL, dt, dt), {}) for dt in FLOATS + INTS],
    "clip": [((dt, dt, dt), {}) for dt in FLOATS],
    "betainc": [((dt, dt, dt), {}) for dt in FLOATS],
    "betaincc": [((dt, dt, dt), {}) for dt in FLOATS],
    "polygamma": [((dt,), {"n": n}) for dt in FLOATS for n in (1, 2, 5)],
    "check_parameter": [((dt, BOOL), {"what": "rng.normal: scale < 0", "error": "ParameterValueError"})
                        for dt in FLOATS],
    "cast": [((src,), {"dtype": dtype_name(dst)}) for src in ALL_DTYPES for dst in ALL_DTYPES if src != dst],
}

# A template may round differently from a reference that uses another formula (scipy's expit):
# allowed distance in units in the last place. Every other op must match exactly.
ULPS = {"sigmoid": 2, "tanh": 1,   # float32 tanh is a rational function (see perf/tools/fit_tanh.py)
        "pow": 1,
        # The C library's against SciPy's (Cephes) formulas, which drift apart in erfc's far tail;
        # Python's math.lgamma (which this test evaluates; compiled code calls the C library's) is
        # a Lanczos sum, tens of ulps off near lgamma's roots.
        "erf": 2, "erfc": 32, "gammaln": 128}   # NumPy 2.4's scalar ** and its power ufunc differ by an ulp


def special_values(dtype: np.dtype) -> list:
    if dtype == BOOL:
        return [False, True]
    if dtype.kind == "i":
        info = np.iinfo(dtype)
        return [0, 1, -1, 2, -7, 100, info.max, info.min, info.max - 1]
    info = np.finfo(dtype)
    return [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, -3.0, 100.0, -100.0, 1e30, -1e30, 1e-30, -1e-30,
            float(info.max), float(info.tiny), float(info.smallest_subnormal), np.nan, np.inf, -np.inf]


def random_values(rng, dtype: np.dtype, n: int):
    if dtype == BOOL:
        return rng.random(n) < 0.5
    if dtype.kind == "i":
        return rng.integers(-1000, 1000, size=n).astype(dtype)
    return (rng.standard_normal(n) * 10.0 ** rng.uniform(-4, 4, size=n)).astype(dtype)


def operand_tuples(rng, dtypes, params, n_random=150):
    """All combinations of special values, then random tuples (specials mixed with random values)."""
    pools = [np.array(special_values(dt), dtype=dt) for dt in dtypes]
    combos = [tuple(c) for c in itertools.product(*pools)]
    mixed = [np.concatenate([p, random_values(rng, dt, 3 * len(p))]) for p, dt in zip(pools, dtypes)]
    combos += [tuple(m[rng.integers(0, len(m))] for m in mixed) for _ in range(n_random)]
    return [c for c in combos if _defined(c, dtypes, params)]


def _defined(combo, dtypes, params) -> bool:
    """Float-to-integer casts of NaN, infinities or out-of-range values are undefined in C and NumPy."""
    if "dtype" not in params or dtypes[0].kind != "f":
        return True
    target = np.dtype(OPS["cast"].infer([TensorType((), dtypes[0])], **params).dtype)
    if target.kind != "i":
        return True
    info = np.iinfo(target)
    return bool(np.isfinite(combo[0]) and info.min < float(combo[0]) < info.max)


def references(op, combos, dtypes, params):
    """NumPy's results, one 0-d call per combination and one vectorised call over all of them.

    NumPy's own scalar and SIMD loops can disagree (e.g. power(-inf, 0.5)); either is accepted.
    """
    columns = [np.array([c[i] for c in combos], dtype=dt) for i, dt in enumerate(dtypes)]
    vectorised = np.asarray(op.impl(*columns, **params))
    scalar = [np.asarray(op.impl(*(np.asarray(v, dt) for v, dt in zip(c, dtypes)), **params))[()]
              for c in combos]
    return scalar, vectorised


def _rounded_double_references(op, combos, dtypes, params):
    """For an op of `ROUNDED_DOUBLE` on float32, SciPy's float64 result rounded to float32; else
    the float32 references again."""
    if op.name not in ROUNDED_DOUBLE or dtypes[0] != F32:
        return references(op, combos, dtypes, params)[0]
    wide = references(op, combos, (F64,) * len(dtypes), params)[0]
    return [np.float32(w) for w in wide]


def same_value(got, want, ulps: int) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype.kind == "f":
        if np.isnan(want):
            return bool(np.isnan(got))
        if ulps and np.isfinite(want) and np.isfinite(got):
            return bool(abs(got.astype(np.float64) - want) <= ulps * np.spacing(np.abs(want)))
    return bool(got == want)


def _template_ops():
    return sorted(name for name, op in OPS.items() if op.kind == ELEMENTWISE and op.scalar is not None)


def test_every_template_has_signatures():
    missing = sorted(set(_template_ops()) - set(SIGNATURES))
    assert not missing, f"element-wise ops with a scalar template but no entry in SIGNATURES: {missing}"


def test_elementwise_ops_have_templates():
    # one_hot and gather are element-wise in their output index, not scalar functions of scalar
    # operands (their loop bodies come from their ``body`` rules).
    without = sorted(name for name, op in OPS.items() if op.kind == ELEMENTWISE and op.scalar is None)
    assert without == ["gather", "one_hot"]


def _signature_ids():
    for op in sorted(SIGNATURES):
        for dtypes, params in SIGNATURES[op]:
            label = ",".join(dtype_name(d) for d in dtypes) + "".join(f"->{v}" for v in params.values())
            yield pytest.param(op, dtypes, params, id=f"{op}[{label}]")


@pytest.mark.parametrize("op_name, dtypes, params", list(_signature_ids()))
def test_template_matches_impl(op_name, dtypes, params, monkeypatch):
    # Evaluated by Python, so the scalar forms; tests/native/test_vecmath.py runs the vectorisable ones.
    monkeypatch.setattr(vecmath, "ENABLED", False)
    op = OPS[op_name]
    out_dtype = op.infer([TensorType((), dt) for dt in dtypes], **params).dtype
    K = Constants(out_dtype, lambda c, dt: f"np.{dt.name}({c!r})")  # constants in the op's dtype
    names = [f"x{i}" for i in range(len(dtypes))]
    source = op.scalar(K, *names, **params)
    code = compile(source, f"<{op_name} template>", "eval")
    rng = np.random.default_rng([sum(map(ord, op_name)), *(d.num for d in dtypes)])
    combos = operand_tuples(rng, dtypes, params)
    failures = []
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        scalar_refs, vector_refs = references(op, combos, dtypes, params)
        rounded_refs = _rounded_double_references(op, combos, dtypes, params)
        for combo, want_scalar, want_vector, want_rounded in zip(combos, scalar_refs, vector_refs, rounded_refs):
            args = {n: dt.type(v) for n, v, dt in zip(names, combo, dtypes)}
            got = eval(code, {"np": np, "math": math, "npm": npymath, "sps": special, "select": _select}, args)
            if np.asarray(got).dtype != out_dtype:
                failures.append(f"{combo}: template gives {np.asarray(got).dtype}, the op declares {out_dtype}")
            elif not any(same_value(got, w, ULPS.get(op_name, 0)) for w in (want_scalar, want_vector, want_rounded)):
                failures.append(f"{combo}: template gives {got!r}, NumPy gives {want_scalar!r}")
    assert np.asarray(scalar_refs[0]).dtype == out_dtype, "the reference impl disagrees with the shape rule"
    assert not failures, f"{op_name} template {source!r} on {len(failures)} of {len(combos)} inputs:\n" + \
        "\n".join(failures[:10])


def _select(condition, a, b):
    """Python's model of ``native.select``: one of two scalars, in the type both promote to."""
    return np.where(condition, a, b)[()]


def _explicitly_typed(node) -> bool:
    """``K_(c)``, or a deliberate ``np.float64(c)`` (a template computing in float64 on purpose)."""
    return isinstance(node, ast.Call) and (isinstance(node.func, ast.Name) and node.func.id == "K_" or
                                           ast.unparse(node.func) == "np.float64")


def _rendered(name):
    """The template of op ``name`` rendered on ``x0, x1, ...`` for each of its signatures, with
    constants as ``K_(c)``."""
    op = OPS[name]
    for dtypes, params in SIGNATURES[name]:
        arity = len(inspect.signature(op.scalar).parameters) - 1 - len(params)
        out_dtype = op.infer([TensorType((), dt) for dt in dtypes], **params).dtype
        yield op.scalar(Constants(out_dtype, lambda c, dt: f"K_({c!r})"), *[f"x{i}" for i in range(arity)], **params)


@pytest.mark.parametrize("name", _template_ops())
def test_templates_have_no_bare_numeric_constants(name):
    # In numba a float32 value times a bare 0.5 is float64: every constant must go through K.
    for source in _rendered(name):
        tree = ast.parse(source, mode="eval")
        wrapped = {id(a) for node in ast.walk(tree) if _explicitly_typed(node) for a in ast.walk(node)}
        bare = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Constant)
                and type(node.value) in (int, float) and id(node) not in wrapped]
        assert not bare, f"{name} template {source!r} has constants outside K: {bare}"


@pytest.mark.parametrize("name", _template_ops())
def test_templates_choose_without_branches(name):
    # A conditional expression or ``and``/``or`` is a branch numba rebuilds SSA form for, walking
    # the whole kernel each time: kernels of many such ops compiled in seconds, not milliseconds.
    for source in _rendered(name):
        assert not _branches(source), f"{name} template {source!r} branches: {_branches(source)} (use select, & and |)"


@pytest.mark.parametrize("name", sorted(name for name, op in OPS.items() if op.combine is not None))
def test_reductions_combine_without_branches(name):
    assert not _branches(OPS[name].combine("acc", "x"))


def _branches(source: str) -> list[str]:
    return [ast.unparse(node) for node in ast.walk(ast.parse(source, mode="eval"))
            if isinstance(node, (ast.IfExp, ast.BoolOp))]
