"""Kernels: the loop nests of generated steps, each compiled once per text and shared.

A step calls each of its loop nests as a kernel, a numba function of its own whose source is the
nest's text alone (arrays come in as data pointers, their shapes are in the text). `load` compiles
a kernel the first time its text is seen in this process (or loads its machine code from the disk
cache, where it is an entry of its own) and registers its C entry with LLVM under a symbol named
by the text's hash; the step declares that symbol as an external function and calls it. The step
therefore links no kernel code into its own module: repeated layers, time steps and models that
share layers with a model compiled before (an edit in a notebook, another process) reuse the
kernel's machine code, and the step itself stays one native call, a thin sequence of calls. The
step of a large program is a table of calls instead (``morphjit.table``), which reaches the same
C entry through a trampoline.

A kernel's data pointers are marked ``noalias`` (`NoAliasCompiler`), so its vector loops have no
run-time overlap check and which path runs depends on its extents only, never on addresses.

Kernels live as long as the process (a step's machine code holds their addresses).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from llvmlite import binding as llvm
from numba import types
from numba.core import compiler

from . import cache as disk_cache


@functools.cache
def source_digest(module: str) -> str:
    """A digest of ``morphjit/<module>.py``, whose numba functions a cached step or kernel has
    compiled in (numba's cache does not notice when a called function changes; the text must)."""
    return hashlib.sha256((Path(__file__).parent / f"{module}.py").read_bytes()).hexdigest()[:16]


HEADER = ("import math\nimport numpy as np\nimport numba\nfrom morphjit import vecmath as vm\n"
          "from morphjit.kernels import NoAliasCompiler\n"
          f"from morphjit import npymath as npm  # {source_digest('npymath')}\n\n\n")
NAME = "kernel"   # the function a kernel's source defines


class NoAliasCompiler(compiler.Compiler):
    """numba's pipeline with every pointer argument marked ``noalias``: a kernel's arrays never
    share memory it writes (``memory.writes_reach_one_pointer``), and without the mark LLVM
    checks their distance at run time and runs the scalar loop when they lie close, whose
    transcendental calls and sums round differently: the bits would depend on where the
    workspace's buffers happen to lie."""

    def __init__(self, typingctx, targetctx, library, args, return_type, flags, locals):
        flags = flags.copy()
        flags.noalias = True
        super().__init__(typingctx, targetctx, library, args, return_type, flags, locals)


@dataclass
class Loaded:
    function: types.ExternalFunction   # what the step calls
    dispatcher: object                 # keeps the machine code alive
    origin: str                        # "compiled", "disk", or "reused" (loaded before)
    symbol: str                        # of its C entry


_loaded: dict[str, Loaded] = {}        # kernel source -> its loaded kernel
_lock = threading.Lock()
_counts = {"compiled": 0, "disk": 0, "reused": 0}
_caching = contextvars.ContextVar("morphjit_kernel_caching", default=True)


@contextlib.contextmanager
def caching(enabled: bool):
    """Load the kernels of steps loaded in this scope through the disk cache, or not."""
    token = _caching.set(enabled)
    try:
        yield
    finally:
        _caching.reset(token)


def load(source: str, pointers: int, extents: int) -> types.ExternalFunction:
    """The kernel ``source`` (a decorated ``def kernel(p0, ..., e0, ...)`` taking ``pointers``
    data pointers then ``extents`` run-time extents), as a function the step calls by symbol with
    data addresses (``a.ctypes.data``) for the pointers."""
    return loaded(source, pointers, extents).function


def loaded(source: str, pointers: int, extents: int) -> Loaded:
    """The kernel ``source`` (see `load`), compiled or loaded from the disk cache the first time
    in this process; its ``origin`` says which, or "reused"."""
    with _lock:
        known = _loaded.get(source)
        if known is not None:
            _counts["reused"] += 1
            return replace(known, origin="reused")
        known = _loaded[source] = compile_kernel(source, (types.voidptr,) * pointers + (types.intp,) * extents)
        _counts[known.origin] += 1
        return known


def compile_kernel(source: str, signature: tuple) -> Loaded:
    dispatcher = getattr(disk_cache.load_module(HEADER + source, name_hint=NAME, cache=_caching.get()), NAME)
    dispatcher.compile(signature)
    overload = dispatcher.overloads[signature]
    symbol = f"morphjit_kernel_{hashlib.sha256(source.encode()).hexdigest()[:20]}"
    llvm.add_symbol(symbol, overload.library.get_pointer_to_function(overload.fndesc.llvm_cfunc_wrapper_name))
    origin = "disk" if disk_cache.loaded_from_disk(dispatcher) else "compiled"
    # The step passes data addresses as integers: the same machine type as the pointers.
    step_signature = tuple(types.uintp if t is types.voidptr else t for t in signature)
    return Loaded(types.ExternalFunction(symbol, types.intp(*step_signature)), dispatcher, origin, symbol)


def called_by(namespace: dict) -> list:
    """The dispatchers of the kernels a step's module (its ``namespace``) loaded, as the functions
    an unrolled step calls or the kernels of a table's rows (their ``function``)."""
    functions = {id(getattr(v, "function", v)) for v in namespace.values()}
    with _lock:
        return [k.dispatcher for k in _loaded.values() if id(k.function) in functions]


def statistics() -> dict[str, int]:
    """Kernels this process compiled, loaded from the disk cache, and reused from memory."""
    with _lock:
        return dict(_counts)
