"""Second derivatives: Hessian-vector products (`hvp`) and small dense Hessians (`hessian`).

Reverse over reverse. The gradient of ``fn`` is traced into the caller's program by the same
reverse sweep that ``compile_loss`` runs (`vjp.backward`): the VJP rules emit traced ops, so the
gradient is an ordinary traced value. An HVP step is then the compiled loss of
``sum(grad(params) * v)`` differentiated with respect to ``params`` (giving ``H v``, as ``H`` is
symmetric) and ``v`` (giving the gradient, for free). Being a compiled loss, it is
batch-polymorphic, disk-cached, shown by ``explain`` and runs on both backends.
"""
from __future__ import annotations

import functools
import inspect

import numpy as np

from .. import api as A
from ..native import replaying_generators
from ..tracing import argument_names, current_trace
from ..transforms import backward
from ..util import DtypeError, ShapeError, TracingError, pytree, user_location
from . import nest
from .compiled import CompiledLoss, compile, compile_loss
from .forward import NotLinearError, traced_jvp
from .static_args import StaticArguments

MAX_HESSIAN_PARAMETERS = 2000   # a dense Hessian of more costs too many HVPs (and 32 MB and up)


def traced_grad(fn, params, *data, **static):
    """The gradient of ``fn(params, *data, **static)`` with respect to ``params``, traced into the
    trace being recorded (``nest``: at fresh points)."""
    call = functools.wraps(fn)(functools.partial(fn, **static)) if static else fn
    args = (params,) + data
    return nest.value_and_grad(nest.enclosing_trace(args, {}), call, args, 0, False, "mj.hvp")[1]


def check_tangent(params, v, names: tuple[str, str]) -> None:
    """``v`` must be shaped like ``params``: the same tree, shapes and dtypes."""
    p_leaves, p_tree = pytree.flatten(params)
    v_leaves, v_tree = pytree.flatten(v)
    if v_tree != p_tree:
        raise TracingError(f"{names[1]} must have the structure of {names[0]}, {p_tree}; got {v_tree}",
                           user_location())
    for path, p, t in zip(pytree.leaf_paths(v_tree, names[1]), p_leaves, v_leaves):
        if (p.shape, p.dtype) != (t.shape, t.dtype):
            error = ShapeError if p.shape != t.shape else DtypeError
            raise error(f"{path} is {t.type}, but the parameter it is a direction for is {p.type}",
                        user_location())


def tangent_name(names: list[str]) -> str:
    return next(n for n in ("v", "tangent", "direction") if n not in names)


def directional_gradient(fn):
    """``(params, v, *data) -> sum(grad(params) * v)``: its gradients are ``H v`` and ``grad``."""
    names = argument_names(fn, len(signature_parameters(fn)) or 1)
    v_name = tangent_name(names)

    def directional(params, v, *data, **static):
        check_tangent(params, v, (names[0], v_name))
        grads, directions = pytree.flatten(traced_grad(fn, params, *data, **static))[0], pytree.flatten(v)[0]
        return sum((A.sum(g * t) for g, t in zip(grads, directions)), 0.0)
    return with_tangent(directional, fn, v_name, directional_gradient)


def hessian_vector_product(fn):
    """``((params, v), *data) -> H v``: the gradient of ``fn`` differentiated forward along ``v``
    (forward over reverse: no gradient is returned, so none of it is kept that ``H v`` does not
    need). ``params`` and ``v`` come as one argument, the first, which has no batch axis."""
    names = argument_names(fn, len(signature_parameters(fn)) or 1)
    v_name = tangent_name(names)

    def product(pair, *data, **static):
        params, v = pair
        check_tangent(params, v, (names[0], v_name))

        def gradient(p):
            return traced_grad(fn, p, *data, **static)
        gradient.__name__ = getattr(fn, "__name__", "fn")
        t = nest.enclosing_trace((params, v), {})
        return traced_jvp(t, gradient, (params,), (v,), False, "mj.hvp")[1]
    made = with_tangent(product, fn, v_name, hessian_vector_product)
    parameters = signature_parameters(fn)
    if parameters:
        pair = inspect.Parameter(f"{names[0]}_and_{v_name}", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        made.__signature__ = inspect.Signature([pair] + parameters[1:])
    return made


def with_tangent(made, fn, v_name: str, maker):
    """``made`` named and signed like ``fn`` with the tangent ``v_name`` after the parameters
    (argument paths in errors, the module name), capturing what ``fn`` captures (``maker``
    wraps another function the same way: `Captured.of`)."""
    made.__name__ = made.__qualname__ = f"hvp_{getattr(fn, '__name__', 'fn')}"
    made.traces = (fn, maker)
    parameters = signature_parameters(fn)
    if parameters:
        tangent = inspect.Parameter(v_name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        made.__signature__ = inspect.Signature(parameters[:1] + [tangent] + parameters[1:])
    return made


def signature_parameters(fn) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def settings_of(fn, backend, cache, static_shapes) -> tuple:
    """The function to differentiate, the positions of its static arguments and its settings: those
    given here (not None), else those of a `CompiledLoss` ``fn`` (whose aux output, with
    ``has_aux``, is dropped), else ``compile_loss``'s defaults."""
    static = ()
    if isinstance(fn, CompiledLoss):
        if fn.argnums != 0:
            raise TracingError(f"mj.hvp and mj.hessian differentiate with respect to the first argument; "
                               f"{fn.__name__} was compiled with argnums={fn.argnums!r}")
        static, inherited = fn.static_argnums, (fn.backend, fn.cache, fn.static_shapes)
        user = fn.fn if fn._captured is None else fn._captured.fn   # not the copy that takes what it captures
        fn = loss_part(user) if fn.has_aux else user
    else:
        inherited = ("numba", True, False)
    given = (backend, cache, static_shapes)
    return (fn, static) + tuple(inherited[k] if given[k] is None else given[k] for k in range(3))


def loss_part(fn):
    """``fn`` returning ``(loss, aux)``, as a function returning the loss."""
    @functools.wraps(fn)
    def loss(*args, **kwargs):
        return fn(*args, **kwargs)[0]
    return loss


def static_positions(fn, inherited, static_argnums, static_argnames) -> tuple[int, ...]:
    """The positions of ``fn``'s static arguments (given here, or those of the compiled loss),
    which cannot include the parameters."""
    given = StaticArguments.of(fn, static_argnums, static_argnames)
    positions = tuple(sorted(set(inherited) | set(given.positions if given else ())))
    if 0 in positions:
        raise TypeError(f"the parameters (argument 0) of {fn.__name__} are differentiated, so they cannot "
                        f"be static; remove 0 from static_argnums/static_argnames")
    return positions


class HVP:
    """``hvp(params, v, *data) -> H v``: the Hessian of ``fn`` with respect to ``params`` times a
    direction ``v`` shaped like ``params``, in one compiled step (see `hvp`)."""

    def __init__(self, fn, backend=None, cache=None, static_shapes=None, static_argnums=(), static_argnames=()):
        fn, inherited, backend, cache, static_shapes = settings_of(fn, backend, cache, static_shapes)
        functools.update_wrapper(self, fn)
        self.fn = fn
        static = static_positions(fn, inherited, static_argnums, static_argnames)
        # The steps' arguments are (params, v, *data): each static position moves one to the right.
        self._settings = dict(backend=backend, cache=cache, static_shapes=static_shapes,
                              static_argnums=tuple(i + 1 for i in static))
        self.forward = compile(hessian_vector_product(fn), backend=backend, cache=cache,
                               static_shapes=static_shapes, static_argnums=static)   # ((params, v), *data)
        self._directional = directional_gradient(fn)
        self._with_gradient = None    # the step of (grad, H v), made when first needed
        self.step = self.forward      # the one H v comes from: reverse over reverse where forward is refused

    def __call__(self, params, v, *data, out=None, **static):
        """``H v`` in the structure of ``params``; with ``out=`` (a tree like it) ``H v`` is written
        there and ``out`` returned. Static arguments may be passed by name."""
        __tracebackhide__ = True  # noqa: F841
        if current_trace() is not None:
            nest.refuse_out("mj.hvp", out)
            return self._nested(params, v, data, static, 0)
        product = self._product(params, v, data, static)
        if out is None:
            return product
        for target, value in zip(pytree.flatten(out)[0], pytree.flatten(product)[0]):
            np.copyto(target, value)
        return out

    def grad_and_hvp(self, params, v, *data, **static):
        """``(grad, H v)`` at ``params`` (reverse over reverse: one step computes both)."""
        __tracebackhide__ = True  # noqa: F841
        if current_trace() is not None:
            hv, grad = self._nested(params, v, data, static, (0, 1))
        else:
            hv, grad = self.gradient_step()(params, v, *data, **static)[1]
        return grad, hv

    def gradient_step(self) -> CompiledLoss:
        """The step of ``(grad, H v)``: reverse over reverse, made at its first use."""
        if self._with_gradient is None:
            self._with_gradient = compile_loss(self._directional, argnums=(0, 1), **self._settings)
        return self._with_gradient

    def _product(self, params, v, data, static):
        """``H v`` by the forward-over-reverse step, or by reverse over reverse once forward mode
        is refused (a backward rule that tests its cotangent, as ``svd``'s)."""
        if self.step is self.forward:
            try:
                return self.forward((params, v), *data, **static)
            except NotLinearError:
                self.step = self.gradient_step()
        return self.step(params, v, *data, **static)[1][0]

    def _nested(self, params, v, data, static, argnums):
        """``H v`` (argnums 0), or ``(H v, grad)`` (argnums (0, 1)), traced into the trace being
        recorded: the gradients of ``sum(grad * v)``."""
        args = nest.positional(self._directional, self.__name__, (params, v) + data, static)
        return nest.value_and_grad(nest.enclosing_trace(args, {}), self._directional, args, argnums, False,
                                   "mj.hvp")[1]

    @property
    def backend(self) -> str:
        return self.step.backend

    @property
    def traced_function(self):
        """The function whose HVP a call inside a traced function traces."""
        return self.fn

    def rebound(self, fn) -> HVP:
        """The HVP of ``fn`` with these settings (see `Compiled.rebound`)."""
        settings = dict(self._settings, static_argnums=tuple(i - 1 for i in self._settings["static_argnums"]))
        return HVP(fn, **settings)

    def explain(self, params, v, *data):
        """The report on the compiled step: its program computes the gradient and differentiates it
        forward along ``v`` (``CompiledFunction.explain``; the step takes ``(params, v)`` as its
        first argument)."""
        return self.step.explain(*self._arguments(params, v, data))

    def cache_info(self):
        return self.step.cache_info()

    def program(self, params, v, *data):
        return self.step.program(*self._arguments(params, v, data))

    def _arguments(self, params, v, data) -> tuple:
        """The arguments of `step` for a call."""
        return ((params, v),) + tuple(data) if self.step is self.forward else (params, v) + tuple(data)

    def __repr__(self) -> str:
        from .explain import summary
        return f"<compiled Hessian-vector product of {self.__name__!r}: {summary(self.step)}>"


def flat_vector(leaves):
    """Traced arrays raveled into one vector (`pytree.ravel_pytree`'s order)."""
    return A.concatenate([A.reshape(x, (-1,)) for x in leaves]) if leaves else A.zeros(0)


def tree_like(tree, make=np.empty_like):
    """A tree of new arrays shaped like the leaves of ``tree``."""
    leaves, treedef = pytree.flatten(tree)
    return pytree.unflatten(treedef, [make(x) for x in leaves])


def hvp(fn=None, *, backend=None, cache=None, static_shapes=None, static_argnums=(),
        static_argnames=()) -> HVP:
    """Compile the Hessian-vector product of ``fn(params, *data) -> scalar loss``:
    ``mj.hvp(fn)(params, v, *data)`` is ``H v``, ``H`` the Hessian of the loss with respect to
    ``params`` and ``v`` a tree shaped like ``params``, computed in one step (reverse over reverse;
    about 2-2.6 times a gradient step's time on the MLPs of ``perf/results/HVP_RESULTS.md``).
    ``fn`` may be a `CompiledLoss`, whose settings (static arguments included; with ``has_aux``,
    the aux output is dropped) are used unless given here. Static arguments are numbered as in
    ``fn``. The step is batch-polymorphic and disk-cached like ``compile_loss``'s."""
    if fn is None:
        return lambda f: HVP(f, backend, cache, static_shapes, static_argnums, static_argnames)
    return HVP(fn, backend, cache, static_shapes, static_argnums, static_argnames)


class Hessian:
    """``hessian(params, *data)``: the dense Hessian of ``fn`` over the flat parameter vector
    (``mj.ravel_pytree(params)[0]``), one HVP per basis vector through the one compiled step. A
    random generator among the data gives one seed for the whole Hessian."""

    def __init__(self, hvp: HVP, max_parameters=MAX_HESSIAN_PARAMETERS):
        self.hvp, self.max_parameters = hvp, max_parameters
        functools.update_wrapper(self, hvp.fn)

    def __call__(self, params, *data, **static) -> np.ndarray:
        __tracebackhide__ = True  # noqa: F841
        if current_trace() is not None:
            return self._nested(params, data, static)
        flat, unravel = pytree.ravel_pytree(params, "params")
        n = flat.size
        self._check_size(n, flat.itemsize)
        hessian = np.empty((n, n), flat.dtype)
        basis = np.zeros(n, flat.dtype)
        same_noise = replaying_generators(data)
        for i in range(n):
            basis[i] = 1
            # One seed for every row, so that every row sees the same noise: the rows but the
            # last draw it from copies of the generators, the last from them (advancing them once).
            row_data = data if i == n - 1 else same_noise()
            self.hvp(params, unravel(basis), *row_data, out=unravel(hessian[i]), **static)
            basis[i] = 0
        return hessian

    @property
    def traced_function(self):
        return self.hvp.fn

    def rebound(self, fn) -> Hessian:
        return Hessian(self.hvp.rebound(fn), self.max_parameters)

    def _check_size(self, n: int, itemsize: int) -> None:
        if n > self.max_parameters:
            raise ValueError(f"mj.hessian: params has {n} parameters, above max_parameters="
                             f"{self.max_parameters}: the dense Hessian would take {n} Hessian-vector "
                             f"products and {n * n * itemsize / 1e6:.0f} MB. Use mj.hvp (e.g. as "
                             f"SciPy's hessp), or pass max_parameters= if you mean it")

    def _nested(self, params, data, static):
        """The Hessian traced into the trace being recorded: the function traced once, its gradient
        at fresh points, then one reverse sweep per element of the gradient (a row)."""
        fn = self.hvp.fn
        args = (params,) + data
        t = nest.enclosing_trace(args, static)
        with nest.transformation("mj.hessian", fn, nest.argnums_text(fn, args, 0), user_location()):
            args, points, _ = nest.with_points(t, fn, args, 0, "mj.hessian")
            wrt = [p.operand for p in points]
            self._check_size(sum(p.size for p in points), points[0].dtype.itemsize if points else 8)
            start = len(t.bindings)
            gradient = flat_vector(pytree.flatten(traced_grad(fn, *args, **static))[0])
            rows = []
            for i in range(gradient.shape[0]):
                element = t.operand(gradient[i], lift_literals=True)
                rows.append(flat_vector(backward(t, t.bindings[start:], element, wrt)))
        return A.stack(rows) if rows else A.reshape(gradient, (0, 0))

    def explain(self, params, *data):
        """The report on the HVP step that computes each row."""
        return self.hvp.explain(params, tree_like(params, np.zeros_like), *data)


def hessian(fn=None, *, backend=None, cache=None, static_shapes=None, static_argnums=(), static_argnames=(),
            max_parameters=MAX_HESSIAN_PARAMETERS) -> Hessian:
    """Compile the dense Hessian of ``fn(params, *data) -> scalar loss`` for small parameter
    counts: ``mj.hessian(fn)(params, *data)`` is an ``(n, n)`` array over the flat parameter
    vector ``mj.ravel_pytree(params)[0]`` (row ``i`` is ``H e_i``, from the compiled HVP step). It
    refuses more than ``max_parameters`` parameters (default 2000). A loss that draws from a
    generator argument draws the same noise for every row (one seed per Hessian, taken from the
    generator as one call takes it), so the Hessian is that of the loss with the noise fixed."""
    if fn is None:
        return lambda f: hessian(f, backend=backend, cache=cache, static_shapes=static_shapes,
                                 static_argnums=static_argnums, static_argnames=static_argnames,
                                 max_parameters=max_parameters)
    return Hessian(HVP(fn, backend, cache, static_shapes, static_argnums, static_argnames), max_parameters)
