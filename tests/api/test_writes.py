"""NumPy's in-place semantics under tracing (issue 32), one behaviour at a time: ``x[key] = v``
and ``x[key] op= v`` for basic, integer-array, mask and range keys; ``x op= v`` seen by every
alias and view (slices, transposes, reshapes that NumPy makes views, ``[..., None]``, squeeze,
views of views) and by no copy; buffers made inside the function; ``out=`` and ``np.add.at``;
and the writes refused: into an argument (or a view of one), into a captured array.

Each function is written once and run both ways, compiled and by NumPy on copies of the inputs
(its own writes cannot reach the reference inputs); gradients against central differences of NumPy.
"""
import copy
import operator
import re

import numpy as np
import pytest

import morphjit as mj

from support.gradcheck import check_loss_grads_fd, flat_leaves, unflatten_like

X4 = np.array([0.0, 1.0, 2.0, 3.0])
W23 = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.5]])
W6 = np.linspace(0.5, 3.0, 6)


def run_numpy(f, args):
    return f(*copy.deepcopy(args))


def check(f, *args, backend="interp", step=None):
    """The compiled value equals NumPy's, the gradient (of the first argument) agrees with
    central differences of NumPy's; returns the compiled ``(value, grads)``."""
    before = copy.deepcopy(args)
    value, grads = (step or mj.compile_loss(f, backend=backend))(*args)
    for a, b in zip(flat_leaves(args), flat_leaves(before)):
        np.testing.assert_array_equal(a, b, err_msg="the compiled loss modified its inputs")
    np.testing.assert_allclose(value, run_numpy(f, args), rtol=1e-12, atol=1e-12)
    first = args[0]

    def loss(leaves):
        return run_numpy(f, (unflatten_like(first, leaves),) + tuple(args[1:]))
    check_loss_grads_fd(loss, flat_leaves(first), flat_leaves(grads), rng=np.random.default_rng(0), eps=1e-6)
    return value, grads


def assert_refused_argument_write(fn, args, name):
    with pytest.raises(mj.UnsupportedError) as info:
        mj.compile_loss(fn, backend="interp")(*args)
    message = str(info.value)
    assert type(info.value).__name__ == "ArgumentWriteError", type(info.value)
    assert re.search(rf"(?<!\w){re.escape(name)}(?!\w)", message.splitlines()[0]), message  # not the source line
    assert "copy" in message, message


# ---------------------------------------------------------------------------------------------
# Aliases and views see in-place writes; arguments may not be written

def test_a_slice_taken_before_an_in_place_add_sees_the_add():
    def f(x):
        z = x * 1.0
        w = z[1:]
        z += 1.0
        return np.sum(w)
    value, grad = check(f, X4.copy())
    assert value == run_numpy(f, (X4,)) == 9.0
    np.testing.assert_array_equal(grad, [0.0, 1.0, 1.0, 1.0])


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_an_array_written_into_itself_by_index_after_a_view_write_is_written(backend):
    """``z[idx] = z`` once ``z`` has been written through a view: the value is ``z`` itself, not the
    view of the write (which a copy, ``z[idx]``, is not); repeated indices keep the last row."""
    def f(P, idx):
        z = P * 1.0
        z[:1] += 0.5
        z[idx] = z
        return np.sum((z * np.linspace(0.6, 1.5, 9).reshape(3, 3) - 0.25) ** 2)
    P = np.random.default_rng(2).normal(size=(3, 3))
    for idx in (np.array([0, 0, 0]), np.array([2, 0, 1])):
        check(f, P, idx, backend=backend)


def alias_then_add(x):
    y = x
    x += 1.0
    return np.sum(y * x)


def copy_alias_then_add(x):
    x = x.copy()
    y = x
    x += 1.0
    return np.sum(y * x)


def test_an_in_place_add_to_an_argument_is_refused_and_says_to_copy_it():
    assert_refused_argument_write(alias_then_add, (X4.copy(),), "x")


def test_after_a_copy_the_in_place_add_changes_the_copy_and_its_alias():
    value, grad = check(copy_alias_then_add, X4.copy())
    assert value == run_numpy(copy_alias_then_add, (X4,)) == 30.0
    np.testing.assert_allclose(grad, 2 * (X4 + 1.0), rtol=1e-12)


def write_x_item(x, d):
    x[0] = 1.0
    return np.sum(x)


def write_x_transpose(x, d):
    v = x.T
    v[0] = 0.0
    return np.sum(x)


def write_x_slice_of_slice(x, d):
    v = x[1:][::-1]
    v[:, 0] *= 2.0
    return np.sum(x * x)


def exp_into_x(x, d):
    np.exp(x, out=x)
    return np.sum(x)


def add_at_x(x, d):
    np.add.at(x, [0, 0], 1.0)
    return np.sum(x)


def mask_write_x(x, d):
    x[d > 0] = 0.0
    return np.sum(x)


def write_d_row(x, d):
    r = d[0]
    r += x[0]
    return np.sum(x * d)


def write_params_leaf(p, d):
    W = p["W"]
    W[1:] -= 0.5 * d[:1]
    return np.sum(p["W"] ** 2)


@pytest.mark.parametrize("fn, name", [
    (write_x_item, "x"), (write_x_transpose, "x"), (write_x_slice_of_slice, "x"), (exp_into_x, "x"),
    (add_at_x, "x"), (mask_write_x, "x"), (write_d_row, "d"), (write_params_leaf, "p['W']"),
], ids=lambda v: v.__name__ if callable(v) else None)
def test_a_write_into_an_argument_or_a_view_of_one_is_refused_naming_it(fn, name):
    x, d = W23.copy(), np.array([[1.0, -1.0, 2.0], [0.5, 3.0, -2.0]])
    args = ({"W": x}, d) if name.startswith("p") else (x, d)
    assert_refused_argument_write(fn, args, name)
    np.testing.assert_array_equal(x, W23)
    np.testing.assert_array_equal(d, [[1.0, -1.0, 2.0], [0.5, 3.0, -2.0]])
    run_numpy(fn, args)         # NumPy runs it (and writes into its copy)


def test_an_in_place_add_through_a_transpose_changes_its_base():
    def f(x):
        z = x * 1.0
        v = z.T
        v += np.array([1.0, 2.0])   # (3, 2) + (2,): row i of z gets i + 1
        return np.sum(z * W23)
    value, grad = check(f, W23 * 0.5)
    np.testing.assert_allclose(value, np.sum((W23 * 0.5 + [[1.0], [2.0]]) * W23), rtol=1e-12)
    np.testing.assert_allclose(grad, W23, rtol=1e-12)


def test_a_write_through_a_reshape_view_changes_its_base_but_a_reshape_copy_does_not_see_it():
    z = W23 * 1.0    # the oracle: NumPy reshapes the contiguous z in place, copies its transpose
    assert np.shares_memory(z.reshape(-1), z) and not np.shares_memory(z.T.reshape(-1), z)

    def f(x):
        z = x * 1.0
        v = z.reshape(-1)
        c = z.T.reshape(-1)
        v[0] = 5.0
        z[1, 2] = -1.0
        return np.sum(z * W23) + np.sum(v * W6) + np.sum(c * W6 ** 2)
    _, grad = check(f, W23 * 0.5)
    # x[0, 0] and x[1, 2] are overwritten in z (and so in v): they reach the loss only through c,
    # at c[0] and c[5]
    np.testing.assert_allclose([grad[0, 0], grad[1, 2]], W6[[0, 5]] ** 2, rtol=1e-12)


def spelled(*texts):
    """``{text: lambda z: text}``: the parametrisations' ids are the expressions."""
    return {text: eval(f"lambda z: {text}") for text in texts}


VIEWS = spelled("z[:]", "z[::-1]", "z[1:, ::-2]", "z[..., None]", "z[None]", "z.T", "np.transpose(z)", "z.T.T",
                "z.reshape(3, 2)", "z.reshape(-1)[1:]", "z[1:][:, ::-1]", "z[None].squeeze()",
                "z[:, None, :][..., 1:]")
COPIES = spelled("z.copy()", "np.copy(z)", "np.array(z)", "z.astype(np.float64)", "z[[1, 0]]", "z[:, [2, 0, 2]]",
                 "z.T.reshape(-1)", "z[::-1].reshape(-1)", "z + 0.0")


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_a_view_sees_later_writes_to_its_base_and_its_base_sees_writes_through_it(view):
    assert np.shares_memory(VIEWS[view](W23), W23), view      # the oracle: NumPy makes a view

    def f(x):
        z = x * 1.0
        v = VIEWS[view](z)
        z *= 2.0
        v[..., -1:] = 7.0
        z[0] += 1.0
        return np.sum(z * W23) + np.sum(v ** 2)
    check(f, W23 * 0.5)


@pytest.mark.parametrize("copied", sorted(COPIES))
def test_a_copy_does_not_see_later_writes_and_writes_to_it_do_not_reach_its_source(copied):
    assert not np.shares_memory(COPIES[copied](W23), W23), copied    # the oracle: NumPy copies

    def f(x):
        z = x * 1.0
        c = COPIES[copied](z)
        z *= 2.0
        z[0, 1:] = -3.0
        c[..., :1] += 10.0
        return np.sum(z * W23) + np.sum(c ** 2)
    check(f, W23 * 0.5)


def test_a_full_integer_index_reads_a_copy_but_with_an_ellipsis_a_view():
    def f(x):
        z = x * 1.0
        s = z[0, 1]          # a NumPy scalar: += rebinds s
        s += 10.0
        t = z[1, 2, ...]     # a 0-d view: += writes into z
        t += 100.0
        return np.sum(z * W23) + s * 2.0 + t * 3.0
    value, _ = check(f, W23 * 0.5)
    z = W23 * 0.5
    np.testing.assert_allclose(value, np.sum(z * W23) + 100.0 * W23[1, 2] + (z[0, 1] + 10.0) * 2.0
                               + (z[1, 2] + 100.0) * 3.0, rtol=1e-12)


def test_an_assignment_from_an_overlapping_view_reads_before_it_writes():
    def f(x):
        z = x * 1.0
        z[1:] = z[:-1]           # z = [x0, x0, x1, x2]
        w = x * 1.0
        w[1:] += w[:-1]          # w[i] = x[i] + x[i - 1], as if the right side were copied first
        return np.sum(z * W6[:4]) + np.sum(w * W6[2:] ** 2)
    value, _ = check(f, X4 + 1.0)
    x = X4 + 1.0
    np.testing.assert_allclose(value, np.sum(np.r_[x[0], x[:-1]] * W6[:4]) + np.sum(np.r_[x[0], x[1:] + x[:-1]]
                                                                                    * W6[2:] ** 2), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# Keys

INPLACE = {"+=": operator.iadd, "-=": operator.isub, "*=": operator.imul}


def write(z, key, op, v):
    """``z[key] = v`` or ``z[key] op= v`` (which Python runs as ``z[key] = iop(z[key], v)``)."""
    z[key] = v if op == "=" else INPLACE[op](z[key], v)


KEYS = {
    "int": (1,), "negative int": (-1,), "slice with a step": (slice(None, None, 2),),
    "negative step": (slice(None, None, -2), slice(None, None, -1)), "rows and a column": (slice(1, 3), 2),
    "None": (None, 2), "ellipsis": (Ellipsis, 0), "None and ellipsis": (1, Ellipsis, None),
    "int array": ([3, 0],), "int array on axis 1": (slice(None), [2, 0]), "int arrays paired": ([0, 3], [1, 2]),
    "int arrays broadcast": (np.array([[0], [2]]), [0, 2]), "range": (range(1, 4),),
    "range and int array": (range(2), [2, -1]),
}


@pytest.mark.parametrize("op", ["=", "+=", "-=", "*="])
@pytest.mark.parametrize("key", sorted(KEYS))
def test_a_write_at_a_key_matches_numpy(key, op):
    k = KEYS[key]
    shape = np.zeros((4, 3))[k].shape
    v = np.linspace(-1.0, 2.0, int(np.prod(shape))).reshape(shape)

    def f(p):
        z = p["x"] * 1.0
        write(z, k, op, p["v"])
        return np.sum(z * np.arange(1.0, 13.0).reshape(4, 3)) + np.sum(z ** 2)
    check(f, {"x": np.linspace(-2.0, 1.5, 12).reshape(4, 3), "v": v})


def repeated(how):
    def f(p):
        z = p["x"] * 1.0
        if how == "=":
            z[[0, 0, 1]] = p["v"]
        elif how == "+=":
            z[[0, 0, 1]] += p["v"]
        else:
            np.add.at(z, [0, 0, 1], p["v"])
        return np.sum(z * np.array([1.0, 10.0, 100.0]))
    return f


@pytest.mark.parametrize("how, expected, grad_v", [
    ("=", 5.0 + 60.0 + 300.0, [0.0, 1.0, 10.0]),          # z[0] = v[1]: v[0] is overwritten
    ("+=", 6.0 + 80.0 + 300.0, [0.0, 1.0, 10.0]),         # z[0] = x[0] + v[1]
    ("add.at", 10.0 + 80.0 + 300.0, [1.0, 1.0, 10.0]),    # z[0] = x[0] + v[0] + v[1]
])
def test_repeated_indices_keep_the_last_write_and_add_at_accumulates(how, expected, grad_v):
    p = {"x": np.array([1.0, 2.0, 3.0]), "v": np.array([4.0, 5.0, 6.0])}
    assert run_numpy(repeated(how), (p,)) == expected      # NumPy: the last of the repeats wins
    value, grads = check(repeated(how), p)
    assert value == expected
    np.testing.assert_array_equal(grads["v"], grad_v)


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_repeated_indices_of_a_data_argument_keep_the_last_write_at_run_time(backend):
    def f(p, idx):
        z = p["x"] * 1.0
        z[idx] += p["v"]
        w = np.zeros(3)
        w[idx] = p["v"] * 2.0
        np.add.at(w, idx, 1.0)
        return np.sum(z * np.array([1.0, 10.0, 100.0])) + np.sum(w * np.array([1.0, -2.0, 3.0]))
    p = {"x": np.array([1.0, 2.0, 3.0]), "v": np.array([4.0, 5.0, 6.0])}
    step = mj.compile_loss(f, backend=backend)
    for idx in ([2, 0, 2], [1, 1, 1], [0, -1, 2], [-3, 1, 0]):
        check(f, p, np.array(idx), step=step)
    assert step.cache_info().misses == 1


def test_a_mask_write_changes_only_the_masked_elements():
    def f(x, mask):
        z = x * 1.0
        z[mask] = 0.0
        z[z > 0.5] *= 3.0
        z[~mask] += np.exp(x[~mask])
        return np.sum(z * W23) + np.sum(z ** 2)
    mask = np.array([[True, False, True], [False, False, True]])
    _, grad = check(f, W23 * 0.3, mask)
    np.testing.assert_array_equal(grad[mask], 0.0)


# ---------------------------------------------------------------------------------------------
# Buffers, out= and captured arrays

BUFFERS = {text: eval(f"lambda: {text}") for text in (
    "np.zeros((2, 3))", "np.ones((2, 3))", "np.full((2, 3), 0.5)", "np.empty((2, 3))", "np.zeros_like(W23)",
    "np.eye(2, 3)")}


@pytest.mark.parametrize("make", sorted(BUFFERS))
def test_a_buffer_made_inside_becomes_traced_when_a_traced_value_is_written_into_it(make):
    def f(x):
        buf = BUFFERS[make]()
        if make.startswith("np.empty"):
            buf[...] = 0.25
        row = buf[1]
        buf[0, ::2] = x[:2] * 2.0
        row += x[1:]
        buf *= x[0]
        return np.sum(buf * W23) + np.sum(row ** 2)
    check(f, np.array([0.5, -1.0, 2.0, 1.5]))


def test_exp_with_out_equal_to_its_input_changes_it_and_its_aliases():
    def f(x):
        p = x * 1.0
        a, v = p, p[1:]
        r = np.exp(p, out=p)
        same = 1.0 if r is p else 100.0
        return np.sum(a * W6[:4]) + np.sum(v ** 2) + np.sum(r) + same
    value, _ = check(f, X4 * 0.5)
    e = np.exp(X4 * 0.5)
    np.testing.assert_allclose(value, np.sum(e * W6[:4]) + np.sum(e[1:] ** 2) + np.sum(e) + 1.0, rtol=1e-12)


def test_multiply_with_out_returns_out_and_changes_it():
    def f(x):
        c = np.zeros(3)
        tail = c[1:]
        r = np.multiply(x[:3], x[1:], out=c)
        np.add(c[:2], 1.0, out=tail)    # overlapping: as if c[:2] were read first
        same = 1.0 if r is c else 100.0
        return np.sum(r * W6[:3]) + np.sum(tail ** 2) + same
    value, _ = check(f, X4 + 0.5)
    x = X4 + 0.5
    c = x[:3] * x[1:]
    c = np.r_[c[0], c[:2] + 1.0]
    np.testing.assert_allclose(value, np.sum(c * W6[:3]) + np.sum(c[1:] ** 2) + 1.0, rtol=1e-12)


CAPTURED = np.zeros(4)


def write_captured(x):
    CAPTURED[0] = x[0]
    return np.sum(CAPTURED)


def add_into_captured(x):
    buf = CAPTURED
    buf += x
    return np.sum(buf)


def closure_writer():
    buffer = np.zeros(4)

    def f(x):
        buffer[1:] = x[1:] * 2.0
        return np.sum(buffer * x)
    return f, buffer


@pytest.mark.parametrize("make", [lambda: (write_captured, CAPTURED), lambda: (add_into_captured, CAPTURED),
                                  closure_writer], ids=["item of a global", "in-place add to a global",
                                                        "slice of a closure"])
def test_a_write_into_an_array_captured_from_outside_is_refused_and_leaves_it_unchanged(make):
    fn, captured = make()
    # A 0-d traced value written into a NumPy array's element: NumPy converts it and replaces the
    # conversion's error with its own ValueError, which morphjit cannot reach (open, issue 32).
    refused = (mj.UnsupportedError, ValueError) if fn is write_captured else mj.UnsupportedError
    with pytest.raises(refused):
        mj.compile_loss(fn, backend="interp")(X4 + 1.0)
    np.testing.assert_array_equal(captured, np.zeros(4))
    run_numpy(fn, (X4 + 1.0,))          # NumPy writes into it
    assert np.any(captured != 0.0)
    captured[...] = 0.0


def test_an_overwritten_slice_gets_no_gradient_and_the_written_value_gets_it():
    def f(p):
        z = p["x"] * 2.0
        z[1:3] = p["y"]
        return np.sum(z ** 2)
    p = {"x": np.array([1.0, -2.0, 3.0, 0.5]), "y": np.array([0.25, -4.0])}
    value, grads = check(f, p)
    assert value == 4.0 + 0.0625 + 16.0 + 1.0
    np.testing.assert_array_equal(grads["x"], [8.0, 0.0, 0.0, 4.0])
    np.testing.assert_array_equal(grads["y"], [0.5, -8.0])


def every_write(p, idx, mask):
    """Views, aliases, repeated indices, masks, out= and add.at in one program, for both backends."""
    z = p["x"] * 1.0
    a, v, t = z, z[:, ::-2], z.T
    buf = np.zeros((3, 2))
    buf[idx] = t[1:, :1] * 2.0
    t[[0, 0, 2]] += p["w"][:, None]
    v *= 1.5
    a[mask] = np.tanh(z[mask])
    np.add.at(buf, idx, 0.5)
    r = np.multiply(buf, buf, out=buf)
    np.exp(v, out=v)
    return np.sum(a * W23) + np.sum(v ** 2) + np.sum(r * np.arange(6.0).reshape(3, 2)) + np.sum(t[0])


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_every_kind_of_write_in_one_program_matches_numpy(backend):
    p = {"x": np.linspace(-1.0, 1.0, 6).reshape(2, 3), "w": np.array([0.5, -0.25, 1.0])}
    check(every_write, p, np.array([1, 1]), np.array([[True, False, False], [True, True, False]]),
          backend=backend)


def test_an_index_out_of_range_in_a_write_raises_indexerror_naming_the_argument():
    def f(p, idx):
        z = p * 1.0
        z[idx] = 5.0
        return np.sum(z ** 2)
    step = mj.compile_loss(f)
    np.testing.assert_allclose(step(np.ones(4), np.array([0, 3]))[0], run_numpy(f, (np.ones(4), np.array([0, 3]))))
    with pytest.raises(IndexError, match=r"index argument idx .* must lie in \[-4, 4\), got 7"):
        step(np.ones(4), np.array([0, 7]))


X34 = np.arange(12.0).reshape(3, 4) / 8.0
X234 = np.arange(24.0).reshape(2, 3, 4) / 16.0


@pytest.mark.parametrize("x, key, outcome", [
    (X34, ([2, 0, 1],), "numpy"),             # C-ordered: the ravel is a view
    (X34, (slice(None), [1, 0, 3]), "numpy"),  # F-ordered: the ravel is a copy
    (X34.T, ([3, 0],), "numpy"),
    (X234, ([1, 0],), "numpy"),
    (X234, (slice(None), [1, 0]), "refused"),  # NumPy's order is neither C nor F
    (X234, (slice(None), slice(None), [1, 0]), "refused"),
])
def test_a_reshape_of_an_integer_array_index_is_a_view_where_numpy_makes_it_one(x, key, outcome):
    """NumPy's memory order of ``x[idx]`` decides whether a later reshape is a view, which a write
    then shows; where morphjit cannot tell the order, the write is refused, never guessed."""
    def f(x):
        z = x[key]
        r = z.reshape(-1)
        z += 1.0
        return np.sum(r * np.linspace(0.5, 2.0, r.size)) + np.sum(z ** 2)
    if outcome == "numpy":
        check(f, x * 1.0)
    else:
        with pytest.raises(mj.LayoutError, match="ascontiguousarray"):
            mj.compile_loss(f, backend="interp")(x * 1.0)


@pytest.mark.parametrize("backend", ["interp", "numba"])
def test_an_arguments_layout_decides_as_in_numpy_and_each_layout_has_its_step(backend):
    """``x * 1.0`` and ``np.copy(x)`` keep an F-ordered argument's order in NumPy, so a reshape of
    them is a copy, which a later write shows; a step traced for one layout never serves another."""
    def f(x):
        z = x * 1.0
        w = np.copy(x)
        r, s = z.reshape(-1), w.reshape(-1)
        z[0, 1] = 50.0
        w[1, 0] = -20.0
        return np.sum(r * W6) + np.sum(s * W6 ** 2) + np.sum(z * W23) + np.sum(w * W23 ** 2)
    step = mj.compile_loss(f, backend=backend)
    c = W23 * 0.5 + 1.0
    for x in (c, np.asfortranarray(c), c, np.asfortranarray(c)):
        value, grad = step(x)
        np.testing.assert_allclose(value, run_numpy(f, (x,)), rtol=1e-12)
        order = "F" if x.flags.f_contiguous else "C"   # the differences keep the layout
        check_loss_grads_fd(lambda xs: run_numpy(f, (np.asarray(xs[0], order=order),)), [x], [grad],
                            rng=np.random.default_rng(0), eps=1e-6)
    assert step.cache_info().misses == 2
    strided = np.tile(c, (1, 2))[:, ::2]
    with pytest.raises(mj.LayoutError, match="ascontiguousarray"):
        step(strided)
