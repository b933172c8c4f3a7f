"""What generated code calls: vectorisable transcendental functions (``vecmath``, with the LLVM IR
vector forms of ``vecforms``), NumPy's division algorithms (``npymath``), the LAPACK and BLAS
kernels (``lapack``), SciPy's special-function kernels (``special``), a branch-free choice
(``select``), the counter-based random generator and the errors a step's range checks raise; and
the import lines by which generated code reaches them.
"""
from . import imports as imports, random as random, special as special, vecmath as vecmath
from .random import (GENERATORS as GENERATORS, draw as draw, replaying_generators as replaying_generators,
                     rewinding as rewinding, seed_of as seed_of, with_copied_generators as with_copied_generators)
from .step_errors import OUT_OF_RANGE as OUT_OF_RANGE, SliceOutOfRange as SliceOutOfRange
