"""Kernels: the loop nests of generated steps, each compiled once per text and shared.

A step calls each of its loop nests as a kernel, a numba function of its own whose source is the
nest's text alone (arrays come in as data pointers, their shapes are in the text). `load` compiles
a kernel the first time its text is seen in this process (or loads its machine code from the disk
cache, where it is an entry of its own) and registers its C entry with LLVM under a symbol named
by the text's hash; the step declares that symbol as an external function and calls it. The step
therefore links no kernel code into its own module: repeated layers, time steps and models that
share layers with a model compiled before (an edit in a notebook, another process) reuse the
kernel's machine code, and the step itself stays one native call, a thin sequence of calls. The
step of a large program is a table of calls instead (``morphjit.runtime.table``), which reaches the same
C entry through a trampoline.

A kernel's data pointers are marked ``noalias`` (`NoAliasCompiler`), so its vector loops have no
run-time overlap check and which path runs depends on its extents only, never on addresses.

A kernel stays loaded while a step module holds it (`hold`: a step's machine code calls its
address), and the `KEPT` kernels loaded last stay after that, for the programs compiled next.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from llvmlite import binding as llvm
from numba import types
from numba.core import compiler

from ..backend import KERNEL
from ..cache import load_module, loaded_from_disk
from ..native import imports
from . import passmanagers

passmanagers.free_after_use()   # every numba compilation of ours comes through here


HEADER = "\n".join(["import math", "import numpy as np", "import numba", imports.VECMATH,
                    "from morphjit.runtime.kernels import NoAliasCompiler", imports.NPYMATH, imports.SPECIAL,
                    imports.SELECT]) + "\n\n\n"


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


@dataclass(eq=False)
class Loaded:
    function: types.ExternalFunction   # what the step calls
    dispatcher: object                 # its machine code
    symbol: str                        # of its C entry


KEPT = 64              # kernels no step holds that stay loaded: the ones loaded last
HELD = "__kernels__"   # the name under which a step's module holds the kernels it calls
_loaded: weakref.WeakValueDictionary = weakref.WeakValueDictionary()   # source -> kernel, while held
_recent: OrderedDict = OrderedDict()   # source -> kernel, the `KEPT` loaded last at the end
_lock = threading.Lock()
_counts = {"compiled": 0, "disk": 0, "reused": 0}
_caching = contextvars.ContextVar("morphjit_kernel_caching", default=True)
_taken = contextvars.ContextVar("morphjit_kernels_taken", default=None)


@contextlib.contextmanager
def loading(cache: bool):
    """Load the kernels of a step module executed in this scope through the disk cache, or not;
    yields the list of the kernels it loads, for the step to `hold`."""
    taken: list[Loaded] = []
    caching, taking = _caching.set(cache), _taken.set(taken)
    try:
        yield taken
    finally:
        _taken.reset(taking)
        _caching.reset(caching)


def hold(namespace: dict, taken: list) -> None:
    """Keep the kernels ``taken`` loaded as long as the step module whose ``namespace`` it is
    (a module the disk cache hands out again, not executed again, keeps the kernels it holds)."""
    namespace.setdefault(HELD, []).extend(taken)


def load(source: str, pointers: int, extents: int) -> types.ExternalFunction:
    """The kernel ``source`` (a decorated ``def kernel(p0, ..., e0, ...)`` taking ``pointers``
    data pointers then ``extents`` run-time extents), as a function the step calls by symbol with
    data addresses (``a.ctypes.data``) for the pointers."""
    return loaded(source, pointers, extents)[0].function


def loaded(source: str, pointers: int, extents: int) -> tuple[Loaded, str]:
    """The kernel ``source`` (see `load`) and how it came: "compiled" or "disk" (from the disk
    cache) when no step held it and it was not among the `KEPT` loaded last, else "reused"."""
    with _lock:
        known, origin = _loaded.get(source), "reused"
        if known is None:
            known = _loaded[source] = compile_kernel(source, (types.voidptr,) * pointers + (types.intp,) * extents)
            origin = "disk" if loaded_from_disk(known.dispatcher) else "compiled"
        _counts[origin] += 1
        _recent[source] = known
        _recent.move_to_end(source)
        while len(_recent) > KEPT:
            _recent.popitem(last=False)
    taken = _taken.get()
    if taken is not None:
        taken.append(known)
    return known, origin


def compile_kernel(source: str, signature: tuple) -> Loaded:
    dispatcher = getattr(load_module(HEADER + source, name_hint=KERNEL, cache=_caching.get()), KERNEL)
    dispatcher.compile(signature)
    release_with_holder(dispatcher)
    overload = dispatcher.overloads[signature]
    symbol = f"morphjit_kernel_{hashlib.sha256(source.encode()).hexdigest()[:20]}"
    llvm.add_symbol(symbol, overload.library.get_pointer_to_function(overload.fndesc.llvm_cfunc_wrapper_name))
    # The step passes data addresses as integers: the same machine type as the pointers.
    step_signature = tuple(types.uintp if t is types.voidptr else t for t in signature)
    return Loaded(types.ExternalFunction(symbol, types.intp(*step_signature)), dispatcher, symbol)


def release_with_holder(dispatcher) -> None:
    """Let ``dispatcher`` die with what holds it (a step, a loaded kernel).

    Numba keeps the namespace of a compiled function's module alive as long as its machine code
    (for plain ``njit`` functions too); the function's own name in that namespace would keep the
    dispatcher, and all it refers to, alive forever. Its machine code is in hand, so the name goes.
    """
    namespace, name = dispatcher.py_func.__globals__, dispatcher.py_func.__name__
    if namespace.get(name) is dispatcher:
        namespace.pop(name, None)   # another thread's first call may have removed it meanwhile


def called_by(namespace: dict) -> list:
    """The dispatchers of the kernels a step's module (its ``namespace``) holds."""
    return [k.dispatcher for k in namespace.get(HELD, ())]


def statistics() -> dict[str, int]:
    """Kernels this process compiled, loaded from the disk cache, and reused from memory."""
    with _lock:
        return dict(_counts)
