"""Vector forms of our own, in LLVM IR, where libmvec's are slower than they need to be.

- ``sin`` and ``cos`` of one argument (the curve fit's forward and backward, a rotation) are two
  libmvec calls, each reducing the argument by pi/2; libmvec's ``sincos`` does both at once but
  its vector form returns through vectors of pointers and ran 2x slower than ``sin`` and ``cos``
  apart. ``morphjit_sincos[f]`` returns both as a pair: the loop vectoriser maps the scalar
  function to the vector forms here, and LLVM merges a loop's ``sin(x)`` and ``cos(x)`` into one
  call (kernels with both call them so: ``vecmath.pair_sin_cos``; alone, libmvec's are as fast
  in float32 and faster in float64). In range, the argument is reduced by a three-part pi/2 with fused multiply-adds (the first
  step is exact, the other two round once each) and the quadrant's polynomials are swapped and
  negated by the quadrant.
- float32 ``pow`` (libmvec's is 5x slower than its ``expf``) as ``exp(y log x)`` in float64, and
  float32 ``exp`` (libmvec's is 2x slower than this one).

Each vector form checks its lanes first: if any is outside the range its polynomial serves (or is
inf or NaN), the whole vector takes libmvec's function, whose results are then the answer. So the
polynomials need no special cases and ordinary data never pays for the rare path. The IR carries
no fast-math flags, so LLVM keeps it as written; tests/native/test_vecmath.py checks every form to the
ulp bar.
"""
from __future__ import annotations

import decimal
import hashlib
import math
import struct
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Form:
    """One form: its IR function name, the element type, the lanes and its IR text."""
    name: str
    element: str
    lanes: int
    text: str


# pi/2 to 110 digits: the reduction's three parts are cut from it.
_HALF_PI = decimal.Decimal("1.5707963267948966192313216916397514420985846996875529104874722961539082031431044993140"
                           "174126710585339910740432566411533235")


def _three_parts(dtype) -> list[float]:
    """pi/2 as three numbers of `dtype`, each the rounding of what the previous ones leave."""
    parts, rest = [], _HALF_PI
    with decimal.localcontext(decimal.Context(prec=120)):
        for _ in range(3):
            part = float(dtype(float(rest)))
            parts.append(part)
            rest -= decimal.Decimal(part)
    return parts


# Per IR element type: its NumPy dtype, the integer of its width, the largest argument reduced
# here, and the polynomials' coefficients from the highest power of z = r^2 down.
# float32: Taylor coefficients suffice (truncation under 2^-28 on |r| <= pi/4).
# float64: fdlibm's __kernel_sin / __kernel_cos minimax coefficients.
_TYPES = {
    "float": dict(
        dtype=np.float32, int="i32", bound=2.0 ** 16,
        sin=[1 / 362880, -1 / 5040, 1 / 120, -1 / 6],
        cos=[-1 / 3628800, 1 / 40320, -1 / 720, 1 / 24, -1 / 2]),
    "double": dict(
        dtype=np.float64, int="i64", bound=2.0 ** 20,
        sin=[1.58969099521155010221e-10, -2.50507602534068634195e-08, 2.75573137070700676789e-06,
             -1.98412698298579493134e-04, 8.33333333332248946124e-03, -1.66666666666666324348e-01],
        cos=[-1.13596475577881948265e-11, 2.08757232129817482790e-09, -2.75573143513906633035e-07,
             2.48015872894767294178e-05, -1.38888888888741095749e-03, 4.16666666666666019037e-02, -0.5]),
}


def _constant(value: float, element: str, lanes: int) -> str:
    """A splat vector constant; IR writes floats as the hex of their double value."""
    bits = struct.unpack("<Q", struct.pack("<d", value))[0]
    return "<" + ", ".join([f"{element} 0x{bits:016X}"] * lanes) + ">"


class _Body:
    """IR instructions for one function, numbered temporaries."""

    def __init__(self, element: str, lanes: int):
        self.element, self.lanes, self.lines, self.count = element, lanes, [], 0
        self.vector = f"<{lanes} x {element}>"
        self.suffix = f"v{lanes}f{32 if element == 'float' else 64}"

    def emit(self, text: str) -> str:
        self.count += 1
        name = f"%t{self.count}"
        self.lines.append(f"  {name} = {text}")
        return name

    def const(self, value: float) -> str:
        return _constant(float(_TYPES[self.element]["dtype"](value)), self.element, self.lanes)

    def fma(self, a: str, b: str, c: str) -> str:
        v = self.vector
        return self.emit(f"call {v} @llvm.fma.{self.suffix}({v} {a}, {v} {b}, {v} {c})")

    def horner(self, z: str, coefficients: list[float]) -> str:
        p = self.const(coefficients[0])
        for c in coefficients[1:]:
            p = self.fma(p, z, self.const(c))
        return p


def _sincos_text(name: str, element: str, lanes: int, vector_sin: str, vector_cos: str) -> str:
    t = _TYPES[element]
    b = _Body(element, lanes)
    v, iv, mask = b.vector, f"<{lanes} x {t['int']}>", f"<{lanes} x i1>"
    bits = 32 if element == "float" else 64
    # Out of range (or NaN): the whole vector goes to libmvec.
    ax = b.emit(f"call {v} @llvm.fabs.{b.suffix}({v} %x)")
    far = b.emit(f"fcmp ugt {v} {ax}, {b.const(t['bound'])}")
    any_far = b.emit(f"bitcast {mask} {far} to i{lanes}")
    b.lines.append(f"  %far = icmp ne i{lanes} {any_far}, 0")
    b.lines.append("  br i1 %far, label %libmvec, label %reduce")
    b.lines.append("reduce:")
    k = b.emit(f"call {v} @llvm.rint.{b.suffix}({v} " + b.emit(f"fmul {v} %x, {b.const(2 / math.pi)}") + ")")
    minus_k = b.emit(f"fneg {v} {k}")
    r = "%x"
    for part in _three_parts(t["dtype"]):
        r = b.fma(minus_k, b.const(part), r)
    z = b.emit(f"fmul {v} {r}, {r}")
    sin = b.fma(b.emit(f"fmul {v} {r}, {z}"), b.horner(z, t["sin"]), r)      # r + r z S(z)
    # sin(-0) is -0: the reduction and the sum above give +0.
    sin = b.emit(f"select {mask} " + b.emit(f"fcmp oeq {v} %x, zeroinitializer") + f", {v} %x, {v} {sin}")
    if element == "float":
        cos = b.fma(z, b.horner(z, t["cos"]), b.const(1.0))                   # 1 + z C(z)
    else:   # fdlibm: 1 - z/2 + z^2 C(z), with the rounding of 1 - z/2 carried separately
        half_z = b.emit(f"fmul {v} {z}, {b.const(0.5)}")
        w = b.emit(f"fsub {v} {b.const(1.0)}, {half_z}")
        lost = b.emit(f"fsub {v} " + b.emit(f"fsub {v} {b.const(1.0)}, {w}") + f", {half_z}")
        tail = b.fma(b.emit(f"fmul {v} {z}, {z}"), b.horner(z, t["cos"][:-1]), lost)
        cos = b.emit(f"fadd {v} {w}, {tail}")
    # Quadrant q = k mod 4: sin, cos = (s, c), (c, -s), (-s, -c), (-c, s).
    q = b.emit(f"fptosi {v} {k} to {iv}")
    odd = b.emit(f"icmp ne {iv} " + b.emit(f"and {iv} {q}, {_int_splat(t['int'], 1, lanes)}") +
                 ", zeroinitializer")
    results = []
    for first, second, shift in ((sin, cos, q), (cos, sin, None)):
        if shift is None:
            shift = b.emit(f"add {iv} {q}, {_int_splat(t['int'], 1, lanes)}")
        picked = b.emit(f"select {mask} {odd}, {v} {second}, {v} {first}")
        sign = b.emit(f"shl {iv} " + b.emit(f"and {iv} {shift}, {_int_splat(t['int'], 2, lanes)}") +
                      f", {_int_splat(t['int'], bits - 2, lanes)}")
        flipped = b.emit(f"xor {iv} " + b.emit(f"bitcast {v} {picked} to {iv}") + f", {sign}")
        results.append(b.emit(f"bitcast {iv} {flipped} to {v}"))
    pair = f"{{{v}, {v}}}"
    one = b.emit(f"insertvalue {pair} undef, {v} {results[0]}, 0")
    b.lines.append(f"  ret {pair} " + b.emit(f"insertvalue {pair} {one}, {v} {results[1]}, 1"))
    b.lines.append("libmvec:")
    s = b.emit(f"call {v} @{vector_sin}({v} %x)")
    c = b.emit(f"call {v} @{vector_cos}({v} %x)")
    one = b.emit(f"insertvalue {pair} undef, {v} {s}, 0")
    b.lines.append(f"  ret {pair} " + b.emit(f"insertvalue {pair} {one}, {v} {c}, 1"))
    declarations = [f"declare {v} @{vector_sin}({v})", f"declare {v} @{vector_cos}({v})",
                    f"declare {v} @llvm.fma.{b.suffix}({v}, {v}, {v})",
                    f"declare {v} @llvm.fabs.{b.suffix}({v})", f"declare {v} @llvm.rint.{b.suffix}({v})"]
    body = "\n".join(b.lines)
    return "\n".join(declarations) + f"\ndefine {pair} @{name}({v} %x) nounwind {{\n{body}\n}}\n"


def _int_splat(int_type: str, value: int, lanes: int) -> str:
    return "<" + ", ".join([f"{int_type} {value}"] * lanes) + ">"


def _scalar_sincos_text(name: str, element: str, cname: str) -> str:
    """The scalar form (loops that do not vectorise, and the vector loops' remainders): C's sincos."""
    pair = f"{{{element}, {element}}}"
    return (f"declare void @{cname}({element}, ptr, ptr)\n"
            f"define {pair} @{name}({element} %x) nounwind {{\n"
            f"  %s = alloca {element}\n  %c = alloca {element}\n"
            f"  call void @{cname}({element} %x, ptr %s, ptr %c)\n"
            f"  %sv = load {element}, ptr %s\n  %cv = load {element}, ptr %c\n"
            f"  %p = insertvalue {pair} undef, {element} %sv, 0\n"
            f"  %q = insertvalue {pair} %p, {element} %cv, 1\n  ret {pair} %q\n}}\n")


def sincos_forms(libmvec_variants: dict) -> dict[str, tuple[Form, list[Form]]]:
    """Per C name ("sincos", "sincosf"): the scalar form and the vector forms, one per libmvec
    ISA that has both ``sin`` and ``cos`` at that width (``libmvec_variants`` as vecmath's)."""
    forms = {}
    for element, suffix in (("double", ""), ("float", "f")):
        name = f"morphjit_sincos{suffix}"
        sins = {v.lanes: v.name for v in libmvec_variants.get("sin" + suffix, ())}
        coss = {v.lanes: v.name for v in libmvec_variants.get("cos" + suffix, ())}
        vectors = []
        for lanes, vector_sin in sins.items():
            if lanes in coss:
                isa = vector_sin[4]
                form_name = f"{name}_{isa}{lanes}"
                vectors.append(Form(form_name, element, lanes,
                                    _sincos_text(form_name, element, lanes, vector_sin, coss[lanes])))
        if vectors:
            scalar = Form(name, element, 1, _scalar_sincos_text(name, element, "sincos" + suffix))
            forms["sincos" + suffix] = (scalar, vectors)
    return forms


def _powf_text(name: str, lanes: int, vector_pow: str) -> str:
    """float32 pow(x, y) = exp(y log x) in float64 (x > 0 finite, y finite; else libmvec's).

    log x = k ln 2 + 2 atanh(s), s = (m - 1) / (m + 1) for x = 2^k m, m in [sqrt(1/2), sqrt(2)):
    the series to s^13 is within 2^-39 (|s| <= 0.172). t = y log x, clamped to +-200 (beyond,
    float32 overflows or underflows anyway); exp t = 2^n exp(r), |r| <= ln(2)/2, by Taylor to r^8
    (within 2^-32). Float64 carries the error of t far below a float32 ulp."""
    b = _Body("double", lanes)
    v, fv, iv, mask = b.vector, f"<{lanes} x float>", f"<{lanes} x i64>", f"<{lanes} x i1>"
    f32 = f"v{lanes}f32"

    def single(value):
        return _constant(value, "float", lanes)

    def ints(value):
        return _int_splat("i64", value, lanes)

    # Every lane ordinary (0 < x < inf, |y| < inf; false for NaN), or the whole vector to libmvec.
    ordinary = b.emit(f"and {mask} " + b.emit(f"fcmp ogt {fv} %x, zeroinitializer") + ", " +
                      b.emit(f"fcmp olt {fv} %x, {single(math.inf)}"))
    y_finite = b.emit(f"fcmp olt {fv} " + b.emit(f"call {fv} @llvm.fabs.{f32}({fv} %y)") + f", {single(math.inf)}")
    ordinary = b.emit(f"and {mask} {ordinary}, {y_finite}")
    b.lines.append(f"  %all = icmp eq i{lanes} " + b.emit(f"bitcast {mask} {ordinary} to i{lanes}") + ", -1")
    b.lines.append("  br i1 %all, label %fast, label %libmvec")
    b.lines.append("fast:")
    x = b.emit(f"fpext {fv} %x to {v}")
    bits = b.emit(f"bitcast {v} {x} to {iv}")
    half_root_bits = struct.unpack("<q", struct.pack("<d", math.sqrt(0.5)))[0]
    k = b.emit(f"ashr {iv} " + b.emit(f"sub {iv} {bits}, {ints(half_root_bits)}") + f", {ints(52)}")
    m = b.emit(f"bitcast {iv} " + b.emit(f"sub {iv} {bits}, " + b.emit(f"shl {iv} {k}, {ints(52)}")) + f" to {v}")
    s = b.emit(f"fdiv {v} " + b.emit(f"fsub {v} {m}, {b.const(1.0)}") + ", " +
               b.emit(f"fadd {v} {m}, {b.const(1.0)}"))
    series = b.horner(b.emit(f"fmul {v} {s}, {s}"), [1 / 13, 1 / 11, 1 / 9, 1 / 7, 1 / 5, 1 / 3, 1.0])
    log_m = b.emit(f"fmul {v} " + b.emit(f"fmul {v} {s}, {b.const(2.0)}") + f", {series}")
    log_x = b.fma(b.emit(f"sitofp {iv} {k} to {v}"), b.const(math.log(2)), log_m)
    t = b.emit(f"fmul {v} " + b.emit(f"fpext {fv} %y to {v}") + f", {log_x}")
    t = b.emit(f"call {v} @llvm.maxnum.{b.suffix}({v} {t}, {v} {b.const(-200.0)})")
    t = b.emit(f"call {v} @llvm.minnum.{b.suffix}({v} {t}, {v} {b.const(200.0)})")
    n = b.emit(f"call {v} @llvm.rint.{b.suffix}({v} " + b.emit(f"fmul {v} {t}, {b.const(1 / math.log(2))}") + ")")
    minus_n = b.emit(f"fneg {v} {n}")
    ln2_high = float(np.float32(math.log(2)))
    r = b.fma(minus_n, b.const(ln2_high), t)
    r = b.fma(minus_n, b.const(float(decimal.Decimal(2).ln(decimal.Context(prec=40)) - decimal.Decimal(ln2_high))), r)
    exp_r = b.horner(r, [1 / math.factorial(i) for i in range(8, -1, -1)])
    scale = b.emit(f"shl {iv} " + b.emit(f"add {iv} " + b.emit(f"fptosi {v} {n} to {iv}") + f", {ints(1023)}") +
                   f", {ints(52)}")
    result = b.emit(f"fmul {v} {exp_r}, " + b.emit(f"bitcast {iv} {scale} to {v}"))
    b.lines.append(f"  ret {fv} " + b.emit(f"fptrunc {v} {result} to {fv}"))
    b.lines.append("libmvec:")
    b.lines.append(f"  ret {fv} " + b.emit(f"call {fv} @{vector_pow}({fv} %x, {fv} %y)"))
    declarations = [f"declare {fv} @{vector_pow}({fv}, {fv})", f"declare {fv} @llvm.fabs.{f32}({fv})",
                    f"declare {v} @llvm.fma.{b.suffix}({v}, {v}, {v})", f"declare {v} @llvm.rint.{b.suffix}({v})",
                    f"declare {v} @llvm.maxnum.{b.suffix}({v}, {v})", f"declare {v} @llvm.minnum.{b.suffix}({v}, {v})"]
    body = "\n".join(b.lines)
    return "\n".join(declarations) + f"\ndefine {fv} @{name}({fv} %x, {fv} %y) nounwind {{\n{body}\n}}\n"


def _expf_text(name: str, lanes: int, vector_exp: str) -> str:
    """float32 exp x = 2^n exp(r), r = x - n ln 2 (two parts, fused), exp(r) by Taylor to r^7
    (within 2^-27 on |r| <= ln(2)/2); for -87 <= x <= 88, where 2^n and the result are normal.
    A vector with any other lane (or NaN) takes libmvec's expf."""
    b = _Body("float", lanes)
    v, iv, mask = b.vector, f"<{lanes} x i32>", f"<{lanes} x i1>"
    normal = b.emit(f"and {mask} " + b.emit(f"fcmp oge {v} %x, {b.const(-87.0)}") + ", " +
                    b.emit(f"fcmp ole {v} %x, {b.const(88.0)}"))
    b.lines.append(f"  %all = icmp eq i{lanes} " + b.emit(f"bitcast {mask} {normal} to i{lanes}") + ", -1")
    b.lines.append("  br i1 %all, label %fast, label %libmvec")
    b.lines.append("fast:")
    n = b.emit(f"call {v} @llvm.rint.{b.suffix}({v} " + b.emit(f"fmul {v} %x, {b.const(1 / math.log(2))}") + ")")
    minus_n = b.emit(f"fneg {v} {n}")
    ln2_high = float(np.float32(math.log(2)))
    r = b.fma(minus_n, b.const(ln2_high), "%x")
    r = b.fma(minus_n, b.const(float(decimal.Decimal(2).ln(decimal.Context(prec=40)) - decimal.Decimal(ln2_high))), r)
    exp_r = b.horner(r, [1 / math.factorial(i) for i in range(7, -1, -1)])
    scale = b.emit(f"shl {iv} " + b.emit(f"add {iv} " + b.emit(f"fptosi {v} {n} to {iv}") + f", {_int_splat('i32', 127, lanes)}") +
                   f", {_int_splat('i32', 23, lanes)}")
    b.lines.append(f"  ret {v} " + b.emit(f"fmul {v} {exp_r}, " + b.emit(f"bitcast {iv} {scale} to {v}")))
    b.lines.append("libmvec:")
    b.lines.append(f"  ret {v} " + b.emit(f"call {v} @{vector_exp}({v} %x)"))
    declarations = [f"declare {v} @{vector_exp}({v})", f"declare {v} @llvm.fma.{b.suffix}({v}, {v}, {v})",
                    f"declare {v} @llvm.rint.{b.suffix}({v})"]
    body = "\n".join(b.lines)
    return "\n".join(declarations) + f"\ndefine {v} @{name}({v} %x) nounwind {{\n{body}\n}}\n"


def expf_forms(libmvec_variants: dict) -> dict[str, tuple[None, list[Form]]]:
    """{"expf": (None, vector forms)}, one per ISA libmvec has ``expf`` for."""
    vectors = [Form(f"morphjit_expf_{v.name[4]}{v.lanes}", "float", v.lanes,
                    _expf_text(f"morphjit_expf_{v.name[4]}{v.lanes}", v.lanes, v.name))
               for v in libmvec_variants.get("expf", ())]
    return {"expf": (None, vectors)} if vectors else {}


def powf_forms(libmvec_variants: dict) -> dict[str, tuple[None, list[Form]]]:
    """{"powf": (None, vector forms)}, one per ISA libmvec has ``powf`` for; the scalar form stays
    the C library's ``powf``."""
    vectors = [Form(f"morphjit_powf_{v.name[4]}{v.lanes}", "float", v.lanes,
                    _powf_text(f"morphjit_powf_{v.name[4]}{v.lanes}", v.lanes, v.name))
               for v in libmvec_variants.get("powf", ())]
    return {"powf": (None, vectors)} if vectors else {}


def each(forms) -> list[Form]:
    """Every form of `forms` ({C name: (scalar form or None, vector forms)})."""
    return [f for scalar, vectors in forms.values() for f in (*vectors, *([scalar] if scalar else []))]


def module_text(forms) -> str:
    """The IR of `forms` as one module: each declaration once, then the definitions."""
    lines = [line for f in each(forms) for line in f.text.splitlines()]
    declarations = dict.fromkeys(line for line in lines if line.startswith("declare "))
    return "\n".join([*declarations, *(line for line in lines if not line.startswith("declare "))]) + "\n"


def digest(forms) -> str:
    """A digest of the forms' IR (part of the disk cache key, with their names)."""
    text = module_text(forms)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
