"""Transcendental functions the loop vectoriser can vectorise: calls served by glibc's libmvec.

A generated loop that calls ``np.exp`` makes one scalar call into the C library per element, and
LLVM cannot vectorise the loop around it. The intrinsics here emit the same scalar call, but the
declaration carries the ``vector-function-abi-variant`` attribute naming libmvec's vector forms
(x86-64 vector function ABI names such as ``_ZGVdN4v_exp``), so the loop vectoriser replaces the
call with one per 4, 8 or 16 elements. Only the forms the running CPU can execute are offered:
an AVX-512 form reached on an AVX2 machine dies with SIGILL.

Where libmvec is absent (macOS, musl, other CPUs) or ``MORPHJIT_VECMATH=0``, :func:`call` renders
the NumPy call the loops always made. :func:`cache_key` names the choice, so machine code built
against libmvec is never loaded where the choice differs.
"""
from __future__ import annotations

import ctypes
import platform
import re
import sys
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import config
from numba.extending import intrinsic

from ..util import vecmath_enabled
from . import vecforms

# The op name, its C library name and its arity. float32 forms append "f" to the C name.
FUNCTIONS = {"exp": ("exp", 1), "log": ("log", 1), "log1p": ("log1p", 1), "sin": ("sin", 1),
             "cos": ("cos", 1), "tanh": ("tanh", 1), "pow": ("pow", 2)}
# The renderings of the scalar fallback: today's NumPy calls, and Python's `**` for pow.
_FALLBACK = {"pow": "({0} ** {1})"}

# x86-64 vector function ABI: ISA letter, the CPU feature it needs, its vector register bits.
# The best ISA per register width is offered; the vectoriser picks the width.
_ISAS = (("e", "avx512f", 512), ("d", "avx2", 256), ("c", "avx", 256), ("b", "sse2", 128))
_LIBMVEC = "libmvec.so.1"   # glibc's soname since 2.22


@dataclass(frozen=True)
class Variant:
    """One vector form of a C function: its ABI name and its number of lanes."""
    name: str
    lanes: int


def target_features() -> set[str]:
    """The CPU features numba compiles for: the host's, narrowed by NUMBA_CPU_NAME/FEATURES."""
    if config.CPU_NAME and config.CPU_NAME != "host":
        # A portable target (e.g. "generic" for a cache shared between machines): only what
        # NUMBA_CPU_FEATURES turns on explicitly.
        return {f[1:] for f in (config.CPU_FEATURES or "").split(",") if f.startswith("+")}
    return {name for name, on in llvm.get_host_cpu_features().items() if on}


def choose_isas(features: set[str]) -> list[tuple[str, int]]:
    """The ISA letters (with register bits) to offer on a CPU with `features`, widest first."""
    chosen: dict[int, str] = {}
    for letter, feature, bits in _ISAS:
        if feature in features and bits not in chosen:
            chosen[bits] = letter
    return [(letter, bits) for bits, letter in chosen.items()]


def variants(cname: str, arity: int, element_bits: int, isas, exported) -> list[Variant]:
    """The vector forms of `cname` (suffixed for float32) among the names `exported` accepts."""
    found = []
    for letter, bits in isas:
        lanes = bits // element_bits
        name = f"_ZGV{letter}N{lanes}{'v' * arity}_{cname}"
        if exported(name):
            found.append(Variant(name, lanes))
    return found


def _libmvec():
    """glibc's libmvec loaded into the process for LLVM's linker, or None where it is absent."""
    if not vecmath_enabled():
        return None
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return None
    try:
        library = ctypes.CDLL(_LIBMVEC)
        llvm.load_library_permanently(_LIBMVEC)
    except (OSError, RuntimeError):
        return None
    return library


def _detect() -> dict[str, list[Variant]]:
    """Vector forms per C name (e.g. "expf") usable here; empty where libmvec is not."""
    library = _libmvec()
    if library is None:
        return {}
    isas = choose_isas(target_features())
    table = {}
    for cname, arity in FUNCTIONS.values():
        for suffixed, element_bits in ((cname, 64), (cname + "f", 32)):
            found = variants(suffixed, arity, element_bits, isas, lambda name: hasattr(library, name))
            if found:
                table[suffixed] = found
    return table


def _compile_own_forms(forms) -> dict:
    """Compile `forms` (vecforms') into the process and make their symbols resolvable by the
    steps' machine code; `forms` again, or {} where the CPU has no fused multiply-add (the forms
    rely on it)."""
    if not forms or "fma" not in target_features():
        return {}
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target
    library = cpu_target.target_context.codegen().create_library("morphjit_vecforms")
    with global_compiler_lock:
        library.add_llvm_module(llvm.parse_assembly(vecforms.module_text(forms)))
        library.finalize()
    for form in vecforms.each(forms):
        llvm.add_symbol(form.name, library.get_pointer_to_function(form.name))
    _keep.append(library)
    return forms


_keep: list = []   # the compiled forms' library: its machine code must outlive every step
VARIANTS: dict[str, list[Variant]] = _detect()
# Per C name ("sincos[f]", "powf", "expf"): our own vector forms (vecforms), with their scalar form where
# it is not the C library's function of that name.
OWN_FORMS: dict = _compile_own_forms({**vecforms.sincos_forms(VARIANTS), **vecforms.powf_forms(VARIANTS),
                                       **vecforms.expf_forms(VARIANTS)})
# Switched off by the tests and perf.tools.vecmath_figures to render the scalar fallback in this process.
ENABLED = bool(VARIANTS)


def available(op: str) -> bool:
    """Whether generated loops call the vectorisable form of `op` (both dtypes must have one)."""
    cname = FUNCTIONS[op][0]
    return ENABLED and cname in VARIANTS and cname + "f" in VARIANTS


def call(op: str, *operands: str) -> str:
    """The source of `op` applied to scalar `operands` in a generated loop."""
    if available(op):
        return f"vm.{op}({', '.join(operands)})"
    return _FALLBACK.get(op, f"np.{op}({{0}})").format(*operands)


_TRIGONOMETRIC_CALL = re.compile(r"\bvm\.(sin|cos)\((\w+)\)")


def pair_sin_cos(source: str) -> str:
    """`source` (a kernel's) with ``vm.sin(x)`` and ``vm.cos(x)`` of one name ``x`` as halves of
    one ``sincos`` (``vm.sin_paired(x)``, ``vm.cos_paired(x)``). Either way each is sin or cos of
    its argument: a name used for two values in one kernel at worst pairs calls needlessly."""
    arguments = {"sin": set(), "cos": set()}
    for op, argument in _TRIGONOMETRIC_CALL.findall(source):
        arguments[op].add(argument)
    both = arguments["sin"] & arguments["cos"]
    return _TRIGONOMETRIC_CALL.sub(lambda m: f"vm.{m[1]}_paired({m[2]})" if m[2] in both else m[0], source)


def cache_key() -> str:
    """Names what the generated machine code links against; part of the disk cache key."""
    if not VARIANTS:
        return "vecmath=scalar"
    forms = sorted(v.name for found in VARIANTS.values() for v in found)
    own = sorted(v.name for _, vectors in OWN_FORMS.values() for v in vectors)
    return "vecmath=libmvec:" + ",".join(forms) + f";own:{','.join(own)}:{vecforms.digest(OWN_FORMS)}"


# ---------------------------------------------------------------------------------------------
# The intrinsics


_BYTE_POINTER = ir.IntType(8).as_pointer()


def _keep_alive(module: ir.Module, function: ir.Function) -> None:
    """List `function` in llvm.compiler.used: the vectoriser looks a vector form up in the module,
    and an unused declaration would be dropped before it runs (silently losing the mapping)."""
    used = module.globals.get("llvm.compiler.used")
    items = list(used.initializer.constant) if used is not None else []
    items.append(function.bitcast(_BYTE_POINTER))   # one element type under typed pointers too
    array = ir.ArrayType(_BYTE_POINTER, len(items))
    if used is None:
        used = ir.GlobalVariable(module, array, "llvm.compiler.used")
        used.linkage = "appending"
        used.section = "llvm.metadata"
    used.value_type = array
    used.initializer = ir.Constant(array, items)


def _declare(module: ir.Module, name: str, fntype: ir.FunctionType, keep_alive: bool = False) -> ir.Function:
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    function = ir.Function(module, fntype, name)
    if keep_alive:
        _keep_alive(module, function)
    return function


def _scalar_with_vector_forms(module: ir.Module, cname: str, element: ir.Type, arity: int) -> ir.Function:
    """The C function `cname`, declared pure and mapped to its vector forms."""
    function = _declare(module, cname, ir.FunctionType(element, [element] * arity))
    mappings = []
    for v in OWN_FORMS[cname][1] if cname in OWN_FORMS else VARIANTS.get(cname, ()):
        vector = ir.VectorType(element, v.lanes)
        _declare(module, v.name, ir.FunctionType(vector, [vector] * arity), keep_alive=True)
        mappings.append(f"_ZGV_LLVM_N{v.lanes}{'v' * arity}_{cname}({v.name})")
    _mark_pure(function, mappings)
    return function


def _mark_pure(function: ir.Function, mappings: list[str]) -> None:
    """Declare `function` pure and name its vector forms (VFABI `mappings`) for the vectoriser."""
    # noduplicate: LLVM would fully unroll a short loop of known trip count (32 hidden units)
    # into scalar calls before the loop vectoriser sees it, and the SLP vectoriser cannot bundle
    # them (the arrays may overlap); the loop vectoriser does not mind the attribute.
    for attribute in ("nounwind", "readnone", "noduplicate"):
        function.attributes.add(attribute)
    if mappings:
        # llvmlite knows no string attributes; its attribute set renders entries verbatim.
        set.add(function.attributes, f'"vector-function-abi-variant"="{",".join(mappings)}"')


def _codegen(cname: str, arity: int):
    def codegen(context, builder, sig, llargs):
        element = context.get_value_type(sig.return_type)
        suffixed = cname + ("f" if sig.return_type == types.float32 else "")
        function = _scalar_with_vector_forms(builder.module, suffixed, element, arity)
        operands = [context.cast(builder, a, t, sig.return_type) for a, t in zip(llargs, sig.args)]
        return builder.call(function, operands)
    return codegen


def _signature(*args):
    """float32 when every operand is, else float64; None (no match) for a non-number."""
    if not all(isinstance(a, (types.Float, types.Integer)) for a in args):
        return None
    return (types.float32 if all(a == types.float32 for a in args) else types.float64)(*args)


def _unary(cname: str):
    """A numba intrinsic calling C's `cname` (or its float32 form)."""
    def typer(typingctx, x):
        return _signature(x), _codegen(cname, 1)
    typer.__name__ = typer.__qualname__ = cname
    return intrinsic(typer)


def _binary(cname: str):
    def typer(typingctx, x, y):
        return _signature(x, y), _codegen(cname, 2)
    typer.__name__ = typer.__qualname__ = cname
    return intrinsic(typer)


def _sincos_with_vector_forms(module: ir.Module, cname: str, element: ir.Type) -> ir.Function:
    """Our ``sincos`` (C name `cname`, e.g. "sincosf") returning the pair, declared pure and
    mapped to its vector forms."""
    scalar, vectors = OWN_FORMS[cname]
    function = _declare(module, scalar.name, ir.FunctionType(ir.LiteralStructType([element, element]), [element]))
    for v in vectors:
        vector = ir.VectorType(element, v.lanes)
        _declare(module, v.name, ir.FunctionType(ir.LiteralStructType([vector, vector]), [vector]),
                 keep_alive=True)
    _mark_pure(function, [f"_ZGV_LLVM_N{v.lanes}v_{scalar.name}({v.name})" for v in vectors])
    return function


def _half_of_sincos(cname: str, which: int):
    """``sin`` (which=0) or ``cos`` (1) as a half of our ``sincos`` where we have its forms, so
    that LLVM merges a loop's two halves of one argument into one call; else libmvec's function.
    For loops with both (:func:`pair_sin_cos`): alone, libmvec's float64 ``sin`` is faster."""
    libmvec_codegen = _codegen(cname, 1)

    def codegen(context, builder, sig, llargs):
        suffix = "f" if sig.return_type == types.float32 else ""
        if "sincos" + suffix not in OWN_FORMS:
            return libmvec_codegen(context, builder, sig, llargs)
        element = context.get_value_type(sig.return_type)
        function = _sincos_with_vector_forms(builder.module, "sincos" + suffix, element)
        pair = builder.call(function, [context.cast(builder, llargs[0], sig.args[0], sig.return_type)])
        return builder.extract_value(pair, which)

    def typer(typingctx, x):
        return _signature(x), codegen
    typer.__name__ = typer.__qualname__ = f"{cname}_paired"
    return intrinsic(typer)


exp = _unary("exp")
log = _unary("log")
log1p = _unary("log1p")
sin = _unary("sin")
cos = _unary("cos")
sin_paired = _half_of_sincos("sin", 0)
cos_paired = _half_of_sincos("cos", 1)
tanh = _unary("tanh")
pow = _binary("pow")   # noqa: A001 - the op's name; only ever used as vm.pow


# ---------------------------------------------------------------------------------------------
# What vectorised


_C_NAMES = "|".join(cname for cname, _ in FUNCTIONS.values())
# libmvec's vector forms, our vector forms, our sincos's scalar form, the C library's functions.
_CALLEE = re.compile(rf"\$(?:_ZGV[bcde]N\d+v+_(\w+?)|morphjit_([a-z]+)_[bcde]\d+|morphjit_(sincosf?)"
                     rf"|((?:{_C_NAMES})f?))\b")


def math_calls(asm: str) -> tuple[set[str], set[str]]:
    """The C math functions machine code `asm` calls in vector form and in scalar form (our
    forms count as the functions they compute, ``sincos`` as ``sin`` and ``cos``).

    numba calls through a register loaded with the callee's address (``movabsq $expf, %rax``)."""
    vector, scalar = set(), set()
    for libmvec, own_vector, own_scalar, c_scalar in _CALLEE.findall(asm):
        if libmvec or own_vector:
            vector.update(_computed_by(libmvec or own_vector))
        if own_scalar or c_scalar:
            scalar.update(_computed_by(own_scalar or c_scalar))
    return vector, scalar


def _computed_by(cname: str) -> list[str]:
    """The C functions a call of `cname` computes: "sincosf" -> ["sinf", "cosf"], "expf" -> ["expf"]."""
    if "sincos" not in cname:
        return [cname]
    return [cname.replace("sincos", "sin"), cname.replace("sincos", "cos")]


def describe(dispatchers) -> str:
    """Which transcendental calls of a compiled step's loops vectorised, for ``loss.explain``;
    ``dispatchers`` are the step's and its kernels'.

    Read from the machine code of the whole step (not loop by loop): a function listed as
    vectorised may still be called one element at a time in a loop that did not vectorise."""
    libraries = [d.overloads[s].library for d in dispatchers for s in d.signatures]
    if any(library._disable_inspection for library in libraries):
        return "not known for machine code loaded from the disk cache (MORPHJIT_CACHE=0 shows it)"
    vector, scalar = set(), set()
    for library in libraries:
        v, s = math_calls(library.get_asm_str())
        vector |= {_op_name(c) for c in v}
        scalar |= {_op_name(c) for c in s}
    if not vector | scalar:
        return "no transcendental calls"
    parts = [f"vectorised {', '.join(sorted(vector))} (libmvec)"] if vector else []
    if scalar - vector:
        reason = "" if ENABLED else " (no vector math library: MORPHJIT_VECMATH or the platform)"
        parts.append(f"one element at a time: {', '.join(sorted(scalar - vector))}{reason}")
    return "; ".join(parts)


def _op_name(cname: str) -> str:
    return next(op for op, (c, _) in FUNCTIONS.items() if cname in (c, c + "f"))
