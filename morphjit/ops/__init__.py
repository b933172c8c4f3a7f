"""The op table: every op's declaration (shape/dtype rule, NumPy reference, scalar code template,
VJP rule and planner facts, one paragraph per op; the record is ``morphjit.ir.op``), by family.

The imports below are the one list of families, each declaring its ops into the registry
``morphjit.ir.OPS`` as it loads; nothing else declares an op, except ``custom_vjp`` functions
(``morphjit.api.custom``), each when it gets its rule. The VJP and lowering rules are written with
the array functions users call (``morphjit.api``), which is why this layer comes after the array
layer although the pipeline reads the table first.
"""
from . import composites, elementwise, matmul, reductions, shapes, sources   # noqa: F401 (the core ops)
from . import bessel, custom, gathers, linalg, random, special, svd, ufuncs, windows  # noqa: F401 (NumPy's and SciPy's families)
from .gathers import in_range as in_range, index_operands as index_operands, picked_extents as picked_extents
