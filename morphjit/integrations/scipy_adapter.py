"""A compiled loss as SciPy's optimisers want it: functions of one flat float64 vector.

``scipy.optimize.minimize`` passes the parameters as a flat vector ``x`` and wants
``fun(x) -> (value, gradient)`` (with ``jac=True``) and, for the Newton-type methods,
``hessp(x, p) -> H p``. `ScipyObjective` makes the parameter tree out of views into ``x`` and
has the compiled step write the gradient (or ``H p``) straight into the vector it returns
(``out=``), so a call copies nothing beyond that flatten/unflatten.
"""
from __future__ import annotations

import numpy as np

from ..jit import HVP, MAX_HESSIAN_PARAMETERS, CompiledLoss, Hessian, compile_loss
from ..util import DtypeError, TracingError, pytree


class ScipyObjective:
    """``fun``, ``hessp`` and ``hess`` of a loss over the flat vector of its parameters; ``x0`` is
    the example parameters flattened, ``unravel(x)`` the tree of ``x`` (views into it). Extra
    positional arguments (SciPy's ``args=``) follow the data given here."""

    def __init__(self, loss, example_params, data=(), backend=None, cache=None,
                 max_parameters=MAX_HESSIAN_PARAMETERS):
        self.x0, self.unravel = pytree.ravel_pytree(example_params, "example_params")
        if self.x0.dtype != np.float64:
            raise DtypeError(f"example_params are {self.x0.dtype}: SciPy's optimisers work in float64; "
                             f"pass the parameters cast with .astype(np.float64)")
        if isinstance(loss, CompiledLoss):
            if loss.argnums != 0:
                raise TracingError(f"mj.scipy_objective differentiates with respect to the first argument; "
                                   f"{loss.__name__} was compiled with argnums={loss.argnums!r}")
            if backend is not None or cache is not None:
                raise TypeError("backend= and cache= are those of the compiled loss given")
        else:
            loss = compile_loss(loss, backend=backend or "numba", cache=True if cache is None else cache)
        self.loss, self.data = loss, tuple(data)
        self._hvp = self._hessian = None
        self.max_parameters = max_parameters

    def fun(self, x, *args) -> tuple[float, np.ndarray]:
        """``(value, gradient)`` at ``x``: pass with ``jac=True``."""
        grad = np.empty_like(self.x0)
        value, _ = self.loss(self.unravel(x), *self.data, *args, out=self.unravel(grad))
        return float(value[0] if self.loss.has_aux else value), grad

    def hessp(self, x, p, *args) -> np.ndarray:
        """``H p``, the Hessian of the loss at ``x`` times ``p``."""
        product = np.empty_like(self.x0)
        self.hvp(self.unravel(x), self.unravel(p), *self.data, *args, out=self.unravel(product))
        return product

    def hess(self, x, *args) -> np.ndarray:
        """The dense Hessian at ``x`` (``mj.hessian``: at most ``max_parameters`` parameters)."""
        if self._hessian is None:
            self._hessian = Hessian(self.hvp, self.max_parameters)
        return self._hessian(self.unravel(x), *self.data, *args)

    @property
    def hvp(self) -> HVP:
        """The compiled Hessian-vector product, made at the first call that needs it."""
        if self._hvp is None:
            self._hvp = HVP(self.loss)
        return self._hvp

    def __repr__(self) -> str:
        return f"<SciPy objective of {self.loss.__name__!r} over {self.x0.size} parameters>"


def scipy_objective(loss, example_params, *data, backend=None, cache=None,
                    max_parameters=MAX_HESSIAN_PARAMETERS) -> ScipyObjective:
    """``loss(params, *data) -> scalar`` (a function or a `CompiledLoss`) over the flat float64
    vector of ``params`` (``mj.ravel_pytree`` order), for ``scipy.optimize.minimize``::

        f = mj.scipy_objective(loss, params, x, y)
        result = scipy.optimize.minimize(f.fun, f.x0, jac=True, hessp=f.hessp, method="trust-ncg")
        fitted = f.unravel(result.x)
    """
    return ScipyObjective(loss, example_params, data, backend, cache, max_parameters)
