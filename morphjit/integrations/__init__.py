"""morphjit with other libraries: a compiled loss on a Dask cluster (``dask``, the client side, with
``dask_checks``; ``dask_worker``, what runs on the workers) and as SciPy's optimisers want it
(``scipy_adapter``).
"""
from .scipy_adapter import scipy_objective as scipy_objective
