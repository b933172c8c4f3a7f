"""NumPy comparisons and the trace checks the core tests share: trace + verify + text round trip + run."""
import numpy as np

import morphjit as mj
from morphjit.util import pytree
from morphjit.ir import Lit, parse


def trace_checked(fn, *args):
    """Trace ``fn``; the program verifies and its text form round-trips through ``parse``."""
    program = mj.trace(fn, *args)
    program.verify()
    text = str(program)
    reparsed = parse(text)
    assert str(reparsed) == text, f"text round trip changed the program:\n{text}\n{reparsed}"
    assert _structure(reparsed) == _structure(program), "text round trip changed parameter or literal types"
    reparsed.verify()
    return program


def _structure(program):
    """Ops, typed parameters and literal operands (``repr`` tells 1.0 from 1 and from 'inf')."""
    return [(b.op, repr(b.params), [repr(x) if isinstance(x, Lit) else str(x.type) for x in b.inputs])
            for b in program.bindings]


def trace_run(fn, *args):
    """Trace, verify and run ``fn`` on ``args``; returns (program, list of output arrays).

    Without captured constants the program read back from its text must compute the same bits.
    """
    program = trace_checked(fn, *args)
    leaves, _ = pytree.flatten(tuple(args))
    outputs = mj.run(program, *leaves)
    assert [(o.shape, o.dtype) for o in outputs] == [(v.shape, v.dtype) for v in program.outputs]
    if not program.consts:
        for a, b in zip(outputs, mj.run(parse(str(program)), *leaves)):
            np.testing.assert_array_equal(a, b)
    return program, outputs


def ops_of(program) -> set:
    return {b.op for b in program.bindings}


def assert_like_numpy(actual, expected, rtol=None, scale=1.0):
    """Same dtype and shape as NumPy's result, values equal (ints, bools) or close (floats).

    ``scale`` is the magnitude of the inputs: absolute errors are allowed relative to it.
    """
    expected = np.asarray(expected)
    actual = np.asarray(actual)
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype}, NumPy gives {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape}, NumPy gives {expected.shape}"
    if expected.dtype.kind in "fc":
        rtol = rtol if rtol is not None else (1e-5 if expected.dtype == np.float32 else 1e-12)
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale, equal_nan=True)
    else:
        np.testing.assert_array_equal(actual, expected)


def magnitude(*arrays) -> float:
    """The largest finite magnitude among the float inputs (at least 1)."""
    m = 1.0
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind == "f" and a.size:
            finite = np.abs(a[np.isfinite(a)])
            if finite.size:
                m = max(m, float(finite.max()))
    return m
