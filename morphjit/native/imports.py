"""The lines by which generated code imports the native modules it calls. A module of numba
functions is imported with a digest of its text in a comment: numba's cache does not notice when a
called function changes, so the text of a step or kernel (and the disk cache's key) must."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.cache
def source_digest(module: str) -> str:
    """A digest of ``morphjit/native/<module>.py``, whose numba functions a cached step or kernel
    has compiled in."""
    return hashlib.sha256((Path(__file__).parent / f"{module}.py").read_bytes()).hexdigest()[:16]


VECMATH = "from morphjit.native import vecmath as vm"
NPYMATH = f"from morphjit.native import npymath as npm  # {source_digest('npymath')}"
LAPACK = f"from morphjit.native import lapack  # kernels {source_digest('lapack')}"
SPECIAL = f"from morphjit.native import special as sps  # {source_digest('special')}"
SELECT = f"from morphjit.native.select import nanmaximum, nanminimum, select  # {source_digest('select')}"
STEP_ERRORS = "from morphjit.native import step_errors as rt"
