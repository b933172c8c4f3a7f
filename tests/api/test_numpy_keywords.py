"""NumPy's keywords on traced arrays: every function morphjit dispatches for NumPy accepts every
keyword NumPy's signature has (implemented with NumPy's meaning, or refused by name), checked
against ``inspect.signature``; the implemented ones against NumPy on both backends."""
import inspect
import warnings
import zlib

import numpy as np
import pytest

import morphjit as mj
from morphjit.api import dispatch
from support.gradcheck import check_loss_grads_fd

BACKENDS = ["numba", "interp"]
# Keywords NumPy's documentation gives for a signature's ``**kwargs`` (einsum's).
DOCUMENTED_KWARGS = {np.einsum: ("dtype", "order", "casting")}


def signature_gaps(numpy_function, function) -> list[str]:
    """What of ``numpy_function``'s signature ``function`` does not accept: a keyword, a positional
    argument at NumPy's position (under NumPy's name), ``*args`` or ``**kwargs``."""
    theirs, ours = inspect.signature(numpy_function), inspect.signature(function)
    kinds = {p.kind for p in ours.parameters.values()}
    gaps = []
    for position, p in enumerate(theirs.parameters.values()):
        if p.kind is p.VAR_POSITIONAL:
            gaps += [] if p.VAR_POSITIONAL in kinds else ["*args"]
        elif p.kind is p.VAR_KEYWORD:
            for name in DOCUMENTED_KWARGS.get(numpy_function, ("**kwargs",)):
                gaps += [] if _accepts(ours, (), {name: None}) or p.VAR_KEYWORD in kinds else [f"{name}="]
        elif p.kind is p.KEYWORD_ONLY:
            gaps += [] if _accepts(ours, (), {p.name: None}) else [f"{p.name}="]
        else:
            bound = _accepts(ours, (None,) * (position + 1), {})
            named = p.kind is p.POSITIONAL_ONLY or (bound and list(bound.arguments)[-1] == p.name
                                                    and _accepts(ours, (), {p.name: None}))
            gaps += [] if bound and named else [f"{p.name} (positional {position})"]
    return gaps


def _accepts(signature, args, kwargs):
    try:
        return signature.bind_partial(*args, **kwargs)
    except TypeError:
        return None


def numpy_signature(function):
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):   # ufuncs: their keywords are refused by name (test below)
        return None


def test_every_dispatched_function_accepts_numpys_signature():
    functions = [(f, g) for f, g in dispatch.FUNCTIONS.items() if numpy_signature(f) is not None]
    assert len(functions) > 80
    gaps = {dispatch.dispatch_path(f): gap for f, g in functions if (gap := signature_gaps(f, g))}
    assert not gaps, gaps


def test_the_signature_check_sees_a_missing_keyword():
    def vstack(tup):
        return tup

    assert signature_gaps(np.vstack, vstack) == ["dtype=", "casting="]
    assert signature_gaps(np.tile, lambda A_, reps: A_) == ["A (positional 0)"]
    assert signature_gaps(np.einsum, lambda *operands, out=None, optimize=False: 0) == \
        ["dtype=", "order=", "casting="]


# ---------------------------------------------------------------------------------------------
# Implemented keywords: NumPy's values, and gradients against finite differences

MASK = np.arange(20).reshape(4, 5) % 3 != 1   # at least two elements in every row and column
IDX = np.array([[0, 4, 1, 3, 2], [3, 3, 0, 1, 4], [2, 0, 4, 4, 1], [1, 2, 3, 0, 0]])

KEYWORD_CALLS = {
    "sum initial where": lambda x: np.sum(x, axis=0, initial=2.0, where=MASK),
    "sum where row mask": lambda x: x.sum(axis=1, where=MASK[:1]),
    "mean where": lambda x: np.mean(x, axis=1, where=MASK),
    "var where ddof": lambda x: np.var(x, axis=0, where=MASK, ddof=1),
    "var mean=": lambda x: np.var(x, axis=1, mean=np.mean(x, axis=1, keepdims=True) + 0.1),
    "std correction": lambda x: np.std(x, axis=1, correction=1),
    "std where": lambda x: x.std(axis=0, where=MASK),
    "max initial": lambda x: np.max(x, axis=0, initial=0.5),
    "max where initial": lambda x: np.max(x, where=MASK, initial=-1.0, axis=1),
    "amin where initial": lambda x: np.amin(x, axis=0, where=MASK, initial=3.0),
    "method max initial": lambda x: x.max(initial=0.25),
    "prod where initial": lambda x: np.prod(x, axis=0, where=MASK, initial=2.0),
    "nansum where initial": lambda x: np.nansum(x, where=MASK, initial=1.0),
    "nanmean where": lambda x: np.nanmean(x, axis=0, where=MASK),
    "any all where": lambda x: x * np.any(x > 0.5, axis=0, where=MASK) + x * np.all(x > -1, axis=1, keepdims=True,
                                                                                    where=MASK[:, :1]),
    "concatenate dtype": lambda x: np.concatenate([x, x[:1]], dtype=np.float32),
    "stack dtype casting": lambda x: np.stack([x, 2 * x], axis=1, dtype=np.float32, casting="same_kind"),
    "vstack dtype": lambda x: np.vstack((x, x[0]), dtype=np.float32),
    "hstack casting": lambda x: np.hstack((x, x), casting="no"),
    "clip min max": lambda x: np.clip(x, min=-0.5, max=0.5),
    "clip min or max": lambda x: np.clip(x, min=-0.3) + x.clip(max=0.1) + np.clip(x, -0.2, None),
    "reshape shape copy": lambda x: np.reshape(x, shape=(-1, 2), copy=True) + x.reshape(10, 2, copy=False),
    "ravel F": lambda x: np.ravel(x, order="F") * np.arange(20.0) + x.ravel("A"),
    "reshape F": lambda x: np.reshape(x, (5, 4), order="F") * np.arange(4.0) + x.T.reshape(-1, order="A")[:4]
    + x[:, ::2].ravel("K")[:4].sum() + x.T.ravel("K")[1],
    "like shape device": lambda x: np.full_like(x, 2.0, shape=(5,), order="F", device="cpu") * x[0]
    + np.ones_like(x, shape=(4, 1), subok=False) * x + np.zeros_like(x, shape=()),
    "take wrap": lambda x: np.take(x, np.array([5, -7, 1, 12]), axis=1, mode="wrap"),
    "take clip": lambda x: np.take(x, np.array([[5, -7], [1, 2]]), mode="clip"),
    "take_along_axis default": lambda x: np.take_along_axis(x, IDX),
    "take_along_axis None": lambda x: np.take_along_axis(x, np.array([19, 0, 7]), axis=None),
    "choose wrap": lambda x: np.choose(np.array([0, 3, -1, 2, 1]), [x[0], x[1]], mode="wrap"),
    "choose clip": lambda x: np.choose(np.array([0, 3, -1, 2, 1]), [x[0], x[1]], mode="clip"),
    "einsum dtype": lambda x: np.einsum("ij,kj->ik", x, x, dtype=np.float32, casting="same_kind", order="C"),
    "diff prepend append": lambda x: np.diff(x, axis=0, prepend=0.5, append=x[:1]) + np.diff(x, n=2, append=x[:, :2]).sum(),
    "tile A=": lambda x: np.tile(A=x, reps=(2, 1)),
    "pad constant pairs": lambda x: np.pad(x, ((1, 2), (0, 1)), mode="constant", constant_values=((1, 2), (3, 4))),
    "pad reflect even": lambda x: np.pad(x, 1, mode="reflect", reflect_type="even"),
    "broadcast subok": lambda x: np.broadcast_to(x[:1], (3, 5), subok=True) * np.broadcast_arrays(x, x[:1], subok=True)[1][:3],
    "astype casting": lambda x: x.astype(np.float32, casting="same_kind", copy=False),
    "dot outer out=None": lambda x: np.dot(x, x.T, out=None) + np.outer(x[0, :4], x[1, :4], out=None),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(KEYWORD_CALLS))
def test_numpys_keywords_have_numpys_meaning(name, backend):
    call = KEYWORD_CALLS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))   # the same inputs in any order of the tests
    x = rng.uniform(0.5, 1.5, (4, 5)) * np.where(rng.random((4, 5)) < 0.5, -1, 1)
    weights = rng.normal(size=np.shape(call(x)))

    def loss(x):
        return np.sum(np.asarray(call(x), np.float64) * weights)

    value, grad = mj.compile_loss(lambda x: np.sum(call(x) * weights), backend=backend)(x)
    expected = call(x)
    terms = expected * weights   # float32 results: rounding relative to the terms, not to their (cancelling) sum
    rtol = 1e-6 if expected.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(value, np.sum(terms), rtol=rtol, atol=rtol * np.sum(np.abs(terms)))
    if expected.dtype == np.float64:
        check_loss_grads_fd(lambda xs: loss(xs[0]), [x], [grad], rng=np.random.default_rng(2), retries=2)


def test_row_stack_which_always_passes_dtype_and_casting():
    x = np.arange(6.0).reshape(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        value, grad = mj.compile_loss(lambda x: np.sum(np.row_stack((x, x[:1] * 2)) ** 2))(x)
        assert value == np.sum(np.row_stack((x, x[:1] * 2)) ** 2)
    np.testing.assert_array_equal(grad, 2 * x + np.array([[8.0], [0.0]]) * x[:1] * np.array([[1.0], [0.0]]))


CASTING_ERRORS = {   # NumPy refuses these conversions; so does morphjit, with NumPy's error type
    "concatenate float to int": lambda x: np.concatenate([x, x], dtype=np.int64),
    "stack casting no": lambda x: np.stack([x, x.astype(np.float32)], casting="no"),
    "vstack safe to float32": lambda x: np.vstack((x, x), dtype=np.float32, casting="safe"),
    "astype safe": lambda x: x.astype(np.int32, casting="safe"),
    "einsum safe": lambda x: np.einsum("ij->i", x, dtype=np.float32),
    "bad casting": lambda x: np.concatenate([x], casting="sometimes"),
    "var ddof and correction": lambda x: np.var(x, ddof=1, correction=1),
    "max where without initial": lambda x: np.max(x, where=x > 0),
    "clip min twice": lambda x: np.clip(x, -1.0, 1.0, min=-0.5),
    "pad keyword of another mode": lambda x: np.pad(x, 1, mode="edge", constant_values=2.0),
    "take mode": lambda x: np.take(x, [0], mode="bounce"),
    "like on a gpu": lambda x: np.zeros_like(x, device="cuda"),
}


@pytest.mark.parametrize("name", list(CASTING_ERRORS))
def test_what_numpy_refuses_is_refused_with_numpys_error_type(name):
    call, x = CASTING_ERRORS[name], np.ones((3, 2))
    with pytest.raises(Exception) as numpy_error:
        call(x)
    with pytest.raises(numpy_error.type):
        mj.trace(lambda x: np.sum(call(x)), x)


REFUSED = {   # keyword -> a call that gives it a value morphjit has no rule for
    "out=": lambda x: np.sum(x, out=np.empty(())),
    "out= of dot": lambda x: np.dot(x, x.T, out=np.empty((3, 3))),
    "out= of concatenate": lambda x: np.concatenate([x, x], out=np.empty((6, 2))),
    "out= of einsum": lambda x: np.einsum("ij->", x, out=np.empty(())),
    "out= of take": lambda x: np.take(x, [0], out=np.empty(1)),
    "dtype= of a ufunc": lambda x: np.add(x, x, dtype=np.float32),
    "where= of a ufunc": lambda x: np.exp(x, where=x > 0),
    "casting= of clip": lambda x: np.clip(x, 0, 1, casting="unsafe"),
    "reflect_type='odd'": lambda x: np.pad(x, 1, mode="reflect", reflect_type="odd"),
    "where of x[mask]": lambda x: np.sum(x[x > 0], where=True) + np.sum(x[x > 0], where=False),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_keywords_without_a_rule_are_refused_by_name(name):
    keyword = name.split(" ")[0].replace("'F'", "").replace("'odd'", "")
    with pytest.raises(mj.UnsupportedError, match=keyword.split("=")[0]):
        mj.trace(lambda x: np.sum(REFUSED[name](x)), np.ones((3, 2)))


def test_where_with_one_argument_is_refused_with_the_reason():
    with pytest.raises(mj.UnsupportedError, match=r"np.where\(condition\) with one argument"):
        mj.trace(lambda x: np.sum(np.where(x > 0)), np.ones(3))
