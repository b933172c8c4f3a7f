"""LLVM pass managers freed after use, which llvmlite 0.50 never frees.

numba optimises each function it compiles with new-style pass managers built by llvmlite, about
forty per function (one per function or declaration in its module, two per module). llvmlite's
``FunctionPassManager`` and ``ModulePassManager`` derive from ``ffi.ObjectRef`` before
``NewPassManager``, so ``ObjectRef._dispose`` (which does nothing) shadows the method that deletes
the C++ object, and every one of them stays allocated: about 0.75 MB per numba function compiled,
a plain ``njit`` function's included, two thirds of what a compiled function costs the process.
`free_after_use` gives both classes the disposal they were written with; where llvmlite resolves
the method itself, it changes nothing.
"""
from __future__ import annotations

from llvmlite.binding import ffi, newpassmanagers


def free_after_use() -> None:
    """Let llvmlite's new-style pass managers delete their C++ object when they are closed or
    collected (numba builds one per optimisation run and drops it after the run)."""
    for cls in (newpassmanagers.FunctionPassManager, newpassmanagers.ModulePassManager):
        if cls._dispose is ffi.ObjectRef._dispose:
            cls._dispose = newpassmanagers.NewPassManager._dispose
