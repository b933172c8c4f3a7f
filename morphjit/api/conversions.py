"""Library code that meets a traced array: NumPy's and SciPy's functions that convert their
arguments to NumPy arrays (``Tracer.__array__`` asks which one is on the stack, to name it and the
traceable function to call instead), and ``array_api_extra.at``, the one writer allowed to update
a tracer in place (SciPy's array-API code calls it, see ``morphjit.api.namespace``)."""
from __future__ import annotations

import importlib
import inspect
import sys

from ..tracing import ANY_TRACE
from ..util import UnsupportedError, user_location


def frames_where(matches) -> list:
    """The frames on the stack for which ``matches(frame)`` holds, innermost first."""
    frame, found = inspect.currentframe(), []
    while frame is not None:
        if matches(frame):
            found.append(frame)
        frame = frame.f_back
    return found


def in_module(prefix: str):
    return lambda frame: frame.f_globals.get("__name__", "").startswith(prefix)


def scipy_caller():
    """The public module and name of the outermost public SciPy function on the stack (inside the
    wrappers SciPy's decorators and dispatchers put around it), and the frame that called SciPy,
    if any."""
    frames = frames_where(in_module("scipy."))
    if not frames:
        return None
    named = [public_name(f) for f in reversed(frames)]
    public = [(module, name) for module, name in named if has_path(sys.modules.get(module), name)]
    return (public or named)[0] + (frames[-1].f_back,)


def public_name(frame) -> tuple[str, str]:
    """The public module and name of the SciPy function running in ``frame``; for the wrapper of a
    ``scipy._lib`` decorator, of the public function in its closure."""
    module, name = frame.f_globals["__name__"], frame.f_code.co_name
    owner = frame.f_locals.get("self")
    owner = getattr(owner, "dist", getattr(owner, "_dist", owner))   # a frozen distribution's
    owner_name = getattr(owner, "name", None) if owner is not None else None
    if not isinstance(owner_name, str) and owner is not None:
        owner_name = public_instance_name(owner, module.split("._")[0])
    if isinstance(owner_name, str):
        name = f"{owner_name}.{name}"   # a method of a named object: scipy.stats.norm.logpdf, dirichlet.logpdf
    if module.startswith("scipy._lib"):
        wrapped = [f for f in frame.f_locals.values() if callable(f) and is_public_scipy(f)]
        module, name = (wrapped[0].__module__, wrapped[0].__name__) if wrapped else (module, name)
    return module.split("._")[0], name


def public_instance_name(owner, module: str) -> str | None:
    """The name the public ``module`` gives an object of ``owner``'s class (``dirichlet`` in scipy.stats,
    whose frozen distributions hold another instance), if any."""
    namespace = vars(sys.modules[module]) if module in sys.modules else {}
    return next((name for name, value in namespace.items()
                 if type(value) is type(owner) and not isinstance(value, type) and not name.startswith("_")), None)


def has_path(namespace, path: str) -> bool:
    """Whether ``namespace.path`` exists (``path`` may be dotted: ``norm.logpdf``)."""
    for name in path.split("."):
        namespace = getattr(namespace, name, None)
    return namespace is not None


def is_public_scipy(function) -> bool:
    module = getattr(function, "__module__", None) or ""
    return module.startswith("scipy.") and not module.startswith("scipy._lib")


# The module with the traceable twins of a SciPy module's functions (in this package), by the SciPy
# module's public path, and how users spell it (imported when an error names them: ``mj.signal``
# and ``mj.stats`` load on first use); the others' twins are this package's array functions
# (``mj.<name>``). A twin module's ``CONVERSION_HINT`` says what to do where a function has no twin.
TWIN_MODULES = {"scipy.linalg": ("linalg", "mj.linalg"), "scipy.signal": ("scipy.signal", "mj.signal"),
                "scipy.stats": ("scipy.stats", "mj.stats")}


def scipy_conversion_error(module: str, name: str, caller) -> UnsupportedError:
    """``module.name``, called from the frame ``caller``, converts its arguments with
    ``np.asarray``: the ``mj`` function to call instead, at the line that called it."""
    late = ANY_TRACE.pending(module)
    twins, prefix = TWIN_MODULES.get(module, (None, "mj"))
    namespace = importlib.import_module(f".{twins}", __package__) if twins else sys.modules[__package__]
    hint = (f"call {prefix}.{name} instead, which traces" if has_path(namespace, name)
            else getattr(namespace, "CONVERSION_HINT", None))
    if (sys.modules.get(module), name) in ANY_TRACE.attributes():
        hint = (f"{module}.{name} traces when looked up in its module as the trace runs; this call reached SciPy's "
                f"own function, taken from the module before (`from {module} import {name}`): write "
                f"{module}.{name}(...) or {prefix}.{name}(...)")
    if late:
        hint = (f"{module} was first imported while this trace ran, too late for morphjit to make its functions "
                f"trace: import it before the function is traced (at the top of your module)")
    return UnsupportedError(f"{module}.{name} does not trace: it converts its arguments to NumPy arrays, which "
                            f"a traced array cannot become{'; ' + hint if hint else ''}", user_location(caller))


def updates_through_at(frame) -> bool:
    """Whether the frame writing ``x[key] = v`` is ``array_api_extra.at`` (SciPy's in-place-or-copy
    update; its caller uses the result instead of the input): the tracer object then stands for the
    updated value, a copy (the array it viewed, an argument perhaps, is not written). ``copy=False`` asks for the write to reach every view of the input, which a
    traced array cannot do."""
    if not frame.f_globals.get("__name__", "").endswith("array_api_extra._lib._at"):
        return False
    if frame.f_locals.get("copy") is False:
        raise UnsupportedError("array_api_extra.at(x, ...).set(v, copy=False) on a traced array is not "
                               "supported: a traced array cannot be written in place (copy=None or True can)",
                               user_location())
    return True


def as_strided_caller():
    """The frame that called NumPy's ``as_strided`` (which converts its argument to an array), if
    it is on the call stack."""
    in_numpy = in_module("numpy.")
    frames = frames_where(lambda f: f.f_code.co_name == "as_strided" and in_numpy(f))
    return frames[-1].f_back if frames else None
