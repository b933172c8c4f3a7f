"""CS231n-style layers written the way the published NumPy code writes them: outputs filled
element by element in nested loops, margins and masks written through, a copy of the
probabilities updated at ``[range(N), y]``, running statistics updated in place, one-hot columns
written into fresh buffers (issue 32).

Each layer is a loss ``f(params, *data)``. Its compiled value must equal NumPy running the same
function on copies of the same arrays (dtype included: a float32 value written into an
``np.zeros`` buffer is stored in float64, as NumPy stores it), and its gradients must agree with
central finite differences of that NumPy run in float64 (a float32 run is checked against the
float64 differences at the float32 point, at float32 tolerances).
"""
import copy
import zlib

import numpy as np
import pytest

import morphjit as mj

from support.gradcheck import assert_same_structure, check_loss_grads_fd, flat_leaves, unflatten_like

BACKENDS = ["interp", "numba"]
DTYPES = [np.float64, np.float32]
REG = 0.1


# ---------------------------------------------------------------------------------------------
# The layers, as the assignments write them

def svm_loss_vectorized(p, X, y):
    W = p["W"]
    num_train = X.shape[0]
    scores = X.dot(W)
    correct_class_scores = scores[np.arange(num_train), y]
    margins = np.maximum(0, scores - correct_class_scores[:, np.newaxis] + 1)
    margins[np.arange(num_train), y] = 0
    loss = np.sum(margins) / num_train
    loss += REG * np.sum(W * W)
    return loss


def softmax_loss_naive(p, X, y):
    W = p["W"]
    loss = 0.0
    num_train = X.shape[0]
    num_classes = W.shape[1]
    for i in range(num_train):
        scores = X[i].dot(W)
        scores -= np.max(scores)
        correct_class_score = scores[y[i]]
        sum_exp = 0.0
        for j in range(num_classes):
            sum_exp += np.exp(scores[j])
        loss += -correct_class_score + np.log(sum_exp)
    loss /= num_train
    loss += REG * np.sum(W * W)
    return loss


def softmax_with_dscores(p, X, y):
    """The two-layer net's softmax: the loss, then its gradient on the scores as
    ``dscores = probs.copy(); dscores[range(N), y] -= 1``; the loss returned adds the squared
    norm of the weight gradient computed from dscores (a gradient penalty)."""
    W, b = p["W"], p["b"]
    N = X.shape[0]
    scores = X.dot(W) + b
    scores -= np.max(scores, axis=1, keepdims=True)
    exp_scores = np.exp(scores)
    probs = exp_scores / np.sum(exp_scores, axis=1, keepdims=True)
    data_loss = -np.sum(np.log(probs[range(N), y])) / N
    dscores = probs.copy()
    dscores[range(N), y] -= 1
    dscores /= N
    dW = X.T.dot(dscores)
    db = np.sum(dscores, axis=0)
    return data_loss + 0.5 * np.sum(dW * dW) + 0.5 * np.sum(db * db)


def conv_forward_naive(x, w, b, conv_param):
    stride, pad = conv_param["stride"], conv_param["pad"]
    N, C, H, W = x.shape
    F, _, HH, WW = w.shape
    H_out = 1 + (H + 2 * pad - HH) // stride
    W_out = 1 + (W + 2 * pad - WW) // stride
    out = np.zeros((N, F, H_out, W_out))
    x_pad = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), mode="constant")
    for n in range(N):
        for f in range(F):
            for i in range(H_out):
                for j in range(W_out):
                    window = x_pad[n, :, i * stride:i * stride + HH, j * stride:j * stride + WW]
                    out[n, f, i, j] = np.sum(window * w[f]) + b[f]
    return out


def conv_loss(p, target):
    out = conv_forward_naive(p["x"], p["w"], p["b"], {"stride": 2, "pad": 1})
    return 0.5 * np.sum((out - target) ** 2)


def max_pool_forward_naive(x, pool_param):
    N, C, H, W = x.shape
    ph, pw, stride = pool_param["pool_height"], pool_param["pool_width"], pool_param["stride"]
    H_out = 1 + (H - ph) // stride
    W_out = 1 + (W - pw) // stride
    out = np.zeros((N, C, H_out, W_out))
    for n in range(N):
        for c in range(C):
            for i in range(H_out):
                for j in range(W_out):
                    window = x[n, c, i * stride:i * stride + ph, j * stride:j * stride + pw]
                    out[n, c, i, j] = np.max(window)
    return out


def max_pool_loss(p, weights):
    out = max_pool_forward_naive(p["x"], {"pool_height": 2, "pool_width": 2, "stride": 2})
    return np.sum(out * weights) + 0.5 * np.sum(out ** 2)


def rnn_forward(x, h0, Wx, Wh, b):
    N, T, D = x.shape
    H = h0.shape[1]
    h = np.zeros((N, T, H))
    for t in range(T):
        prev = h0 if t == 0 else h[:, t - 1, :]
        h[:, t, :] = np.tanh(prev @ Wh + x[:, t, :] @ Wx + b)
    return h


def rnn_loss(p, x, target):
    h = rnn_forward(x, p["h0"], p["Wx"], p["Wh"], p["b"])
    return 0.5 * np.sum((h - target) ** 2)


def sigmoid(x):
    """The numerically stable sigmoid of the assignment's rnn_layers.py."""
    pos_mask = x >= 0
    neg_mask = x < 0
    z = np.zeros_like(x)
    z[pos_mask] = np.exp(-x[pos_mask])
    z[neg_mask] = np.exp(x[neg_mask])
    top = np.ones_like(x)
    top[neg_mask] = z[neg_mask]
    return top / (1 + z)


def lstm_step_forward(x, prev_h, prev_c, Wx, Wh, b):
    H = prev_h.shape[1]
    a = x.dot(Wx) + prev_h.dot(Wh) + b
    i = sigmoid(a[:, :H])
    f = sigmoid(a[:, H:2 * H])
    o = sigmoid(a[:, 2 * H:3 * H])
    g = np.tanh(a[:, 3 * H:])
    next_c = f * prev_c + i * g
    next_h = o * np.tanh(next_c)
    return next_h, next_c


def lstm_forward(x, h0, Wx, Wh, b):
    N, T, D = x.shape
    H = h0.shape[1]
    h = np.zeros((N, T, H))
    prev_h = h0
    prev_c = np.zeros_like(h0)
    for t in range(T):
        next_h, next_c = lstm_step_forward(x[:, t, :], prev_h, prev_c, Wx, Wh, b)
        h[:, t, :] = next_h
        prev_h, prev_c = next_h, next_c
    return h


def lstm_loss(p, x, target):
    h = lstm_forward(x, p["h0"], p["Wx"], p["Wh"], p["b"])
    return 0.5 * np.sum((h - target) ** 2)


def batchnorm_forward(x, gamma, beta, bn_param):
    mode = bn_param["mode"]
    eps = bn_param.get("eps", 1e-5)
    momentum = bn_param.get("momentum", 0.9)
    N, D = x.shape
    running_mean = bn_param.get("running_mean", np.zeros(D, dtype=x.dtype))
    running_var = bn_param.get("running_var", np.zeros(D, dtype=x.dtype))
    if mode == "train":
        sample_mean = np.mean(x, axis=0)
        sample_var = np.var(x, axis=0)
        x_hat = (x - sample_mean) / np.sqrt(sample_var + eps)
        out = gamma * x_hat + beta
        running_mean *= momentum
        running_mean += (1 - momentum) * sample_mean
        running_var *= momentum
        running_var += (1 - momentum) * sample_var
    else:
        out = gamma * (x - running_mean) / np.sqrt(running_var + eps) + beta
    bn_param["running_mean"] = running_mean
    bn_param["running_var"] = running_var
    return out


def batchnorm_loss(p, weights):
    bn_param = {"mode": "train"}
    out = batchnorm_forward(p["x"], p["gamma"], p["beta"], bn_param)
    return np.sum(out * weights) + np.sum(bn_param["running_mean"] ** 2) + 3.0 * np.sum(bn_param["running_var"])


CHARS = "hel!"                       # min-char-rnn: the text "hell!" read one character at a time
VOCAB = len(CHARS)
INPUTS = [CHARS.index(c) for c in "hell"]
TARGETS = [CHARS.index(c) for c in "ell!"]


def min_char_rnn_loss(p):
    """Karpathy's min-char-rnn lossFun (forward pass), its inputs a Python list of ints."""
    Wxh, Whh, Why, bh, by = p["Wxh"], p["Whh"], p["Why"], p["bh"], p["by"]
    xs, hs, ys, ps = {}, {}, {}, {}
    hs[-1] = np.copy(p["hprev"])
    loss = 0
    for t in range(len(INPUTS)):
        xs[t] = np.zeros((VOCAB, 1))
        xs[t][INPUTS[t]] = 1
        hs[t] = np.tanh(np.dot(Wxh, xs[t]) + np.dot(Whh, hs[t - 1]) + bh)
        ys[t] = np.dot(Why, hs[t]) + by
        ps[t] = np.exp(ys[t]) / np.sum(np.exp(ys[t]))
        loss += -np.log(ps[t][TARGETS[t], 0])
    return loss


# ---------------------------------------------------------------------------------------------
# Inputs (float64; cast to the dtype under test), and the cases

def classifier_inputs(rng, bias=False):
    params = {"W": 0.5 * rng.standard_normal((4, 3))}
    if bias:
        params["b"] = 0.1 * rng.standard_normal(3)
    return params, (rng.standard_normal((5, 4)), np.array([0, 2, 1, 2, 0]))


def conv_inputs(rng):
    params = {"x": rng.standard_normal((1, 2, 4, 4)), "w": 0.5 * rng.standard_normal((2, 2, 3, 3)),
              "b": 0.1 * rng.standard_normal(2)}
    return params, (rng.standard_normal((1, 2, 2, 2)),)


def max_pool_inputs(rng):
    return {"x": rng.standard_normal((1, 2, 4, 4))}, (rng.standard_normal((1, 2, 2, 2)),)


def recurrent_inputs(rng, gates):
    N, T, D, H = 2, 3, 3, 2
    params = {"h0": 0.5 * rng.standard_normal((N, H)), "Wx": 0.5 * rng.standard_normal((D, gates * H)),
              "Wh": 0.5 * rng.standard_normal((H, gates * H)), "b": 0.1 * rng.standard_normal(gates * H)}
    return params, (rng.standard_normal((N, T, D)), 0.5 * rng.standard_normal((N, T, H)))


def batchnorm_inputs(rng):
    params = {"x": 2.0 + rng.standard_normal((5, 3)), "gamma": 1.0 + 0.1 * rng.standard_normal(3),
              "beta": 0.1 * rng.standard_normal(3)}
    return params, (rng.standard_normal((5, 3)),)


def min_char_rnn_inputs(rng):
    H = 3
    return {"Wxh": 0.5 * rng.standard_normal((H, VOCAB)), "Whh": 0.5 * rng.standard_normal((H, H)),
            "Why": 0.5 * rng.standard_normal((VOCAB, H)), "bh": np.zeros((H, 1)), "by": np.zeros((VOCAB, 1)),
            "hprev": 0.5 * rng.standard_normal((H, 1))}, ()


# name -> (loss, inputs). The inputs are drawn from a generator seeded by the name; at those
# points the kinks of the SVM's margins and of the pools' maxima lie far further than the
# finite-difference step (so no step needs retrying, which would loosen the tolerance).
CASES = {
    "svm_loss_vectorized": (svm_loss_vectorized, classifier_inputs),
    "softmax_loss_naive": (softmax_loss_naive, classifier_inputs),
    "softmax_with_dscores": (softmax_with_dscores, lambda rng: classifier_inputs(rng, bias=True)),
    "conv_forward_naive": (conv_loss, conv_inputs),
    "max_pool_forward_naive": (max_pool_loss, max_pool_inputs),
    "rnn_forward": (rnn_loss, lambda rng: recurrent_inputs(rng, 1)),
    "lstm_forward": (lstm_loss, lambda rng: recurrent_inputs(rng, 4)),
    "batchnorm_forward": (batchnorm_loss, batchnorm_inputs),
    "min_char_rnn": (min_char_rnn_loss, min_char_rnn_inputs),
}


def cast(tree, dtype):
    """Float leaves in ``dtype``; integer arrays and non-arrays as they are."""
    if isinstance(tree, dict):
        return {k: cast(v, dtype) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(cast(v, dtype) for v in tree)
    if isinstance(tree, np.ndarray) and tree.dtype.kind == "f":
        return tree.astype(dtype)
    return tree


def numpy_loss(fn, params, data):
    """``fn`` run by NumPy on copies: an in-place write in it cannot reach the caller's arrays."""
    return fn(copy.deepcopy(params), *copy.deepcopy(data))


def check_layer(name, backend, dtype):
    fn, inputs = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    params64, data64 = inputs(rng)
    params, data = cast(params64, dtype), cast(data64, dtype)
    before = copy.deepcopy((params, data))

    value, grads = mj.compile_loss(fn, backend=backend)(params, *data)

    for a, b in zip(flat_leaves((params, data)), flat_leaves(before)):
        np.testing.assert_array_equal(a, b, err_msg=f"{name}: the compiled loss modified its inputs")
    expected = numpy_loss(fn, params, data)
    assert np.asarray(value).dtype == np.asarray(expected).dtype, (name, np.asarray(value).dtype)
    f32 = dtype == np.float32
    np.testing.assert_allclose(value, expected, rtol=1e-5 if f32 else 1e-10, atol=1e-6 if f32 else 1e-12,
                               err_msg=f"{name}: value against NumPy")
    assert_same_structure(grads, params)

    # the point in float64 (the float32 values exactly), and the loss NumPy computes there
    at64 = cast(params, np.float64)
    data_at64 = cast(data, np.float64)

    def loss(leaves):
        return numpy_loss(fn, unflatten_like(at64, leaves), data_at64)
    check_loss_grads_fd(loss, flat_leaves(at64), flat_leaves(grads), rng=rng, eps=1e-6,
                        rtol=1e-4 if f32 else 1e-6, atol=1e-6 if f32 else 1e-9,
                        what=f"{name} ({backend}, {np.dtype(dtype).name})")


# The cases whose numba compilation takes more than ~5 s (a functional spelling of each, with
# mj.at(...).set, took 7-8 s for the convolution and the LSTM and 5 s for the pool, the others
# 1-2 s, on two cores with a cold cache)
SLOW_ON_NUMBA = {"conv_forward_naive", "lstm_forward", "max_pool_forward_naive"}


LAYER_CASES = [pytest.param(name, backend, dtype, id=f"{name}-{backend}-{np.dtype(dtype).name}",
                            marks=[pytest.mark.slow] if backend == "numba" and name in SLOW_ON_NUMBA else [])
               for name in CASES for backend in BACKENDS for dtype in DTYPES]


@pytest.mark.parametrize("name, backend, dtype", LAYER_CASES)
def test_layer_value_matches_numpy_and_gradients_match_finite_differences(name, backend, dtype):
    check_layer(name, backend, dtype)


# ---------------------------------------------------------------------------------------------
# What the layers' writes mean, one at a time

def test_svm_margins_overwritten_at_the_labels_leave_the_regulariser_alone():
    """``margins[np.arange(N), y] = 0`` replaces the margin 1 of each correct class: with a single
    sample and every other margin negative, the loss is the regulariser alone (6.0 without the
    write)."""
    W = np.zeros((2, 3))
    X, y = np.array([[1.0, 0.0]]), np.array([1])
    W[0] = [-5.0, 0.0, -5.0]          # scores [-5, 0, -5]: margins [-4, 1 -> 0, -4] -> 0
    value, grads = mj.compile_loss(svm_loss_vectorized, backend="interp")({"W": W}, X, y)
    assert value == numpy_loss(svm_loss_vectorized, {"W": W}, (X, y)) == REG * 50.0
    np.testing.assert_allclose(grads["W"], 2 * REG * W, rtol=1e-12)


def test_the_one_hot_buffers_of_min_char_rnn_pick_the_columns_of_wxh():
    """``xs[t] = np.zeros((V, 1)); xs[t][INPUTS[t]] = 1`` is a one-hot column: the gradient of
    Wxh is zero in the columns of characters never read ("!" is only a target)."""
    params, _ = min_char_rnn_inputs(np.random.default_rng(0))
    value, grads = mj.compile_loss(min_char_rnn_loss, backend="interp")(params)
    np.testing.assert_allclose(value, numpy_loss(min_char_rnn_loss, params, ()), rtol=1e-12)
    unread = sorted(set(range(VOCAB)) - set(INPUTS))
    assert unread == [CHARS.index("!")]
    np.testing.assert_array_equal(grads["Wxh"][:, unread], 0.0)
    assert np.all(grads["Wxh"][:, sorted(set(INPUTS))] != 0.0)


def test_the_running_mean_buffer_made_inside_batchnorm_holds_the_update():
    """The running statistics start as ``np.zeros`` buffers, are scaled in place by the momentum
    and then receive ``(1 - momentum) * batch statistic``: 0.1 times the batch mean and variance."""
    params, (weights,) = batchnorm_inputs(np.random.default_rng(1))

    def running(p):
        bn_param = {"mode": "train", "momentum": 0.9}
        batchnorm_forward(p["x"], p["gamma"], p["beta"], bn_param)
        return np.sum(bn_param["running_mean"] * np.arange(1.0, 4.0)) + np.sum(bn_param["running_var"])
    value, grads = mj.compile_loss(running, backend="interp")(params)
    x = params["x"]
    np.testing.assert_allclose(value, 0.1 * np.sum(x.mean(0) * np.arange(1.0, 4.0)) + 0.1 * np.sum(x.var(0)),
                               rtol=1e-12)
    np.testing.assert_allclose(value, numpy_loss(running, params, ()), rtol=1e-12)
    expected = 0.1 * np.arange(1.0, 4.0) / len(x) + 0.1 * 2 * (x - x.mean(0)) / len(x)
    np.testing.assert_allclose(grads["x"], expected, rtol=1e-10)
    np.testing.assert_array_equal(grads["gamma"], 0.0)


def test_batchnorm_updating_a_running_mean_passed_in_is_refused():
    """In the assignment the running mean comes back in ``bn_param`` from the previous step: when
    it is an argument of the traced function, ``running_mean *= momentum`` writes into it."""
    params, (weights,) = batchnorm_inputs(np.random.default_rng(2))

    def loss(p, running_mean):
        bn_param = {"mode": "train", "running_mean": running_mean}
        return np.sum(batchnorm_forward(p["x"], p["gamma"], p["beta"], bn_param) * weights)
    with pytest.raises(mj.UnsupportedError) as info:
        mj.compile_loss(loss, backend="interp")(params, np.zeros(3))
    message = str(info.value)
    assert type(info.value).__name__ == "ArgumentWriteError" and "copy" in message, message
    assert "running_mean" in message.splitlines()[0], message    # the argument, not only its source line
    # NumPy itself runs it, updating the caller's array
    running_mean = np.zeros(3)
    loss(copy.deepcopy(params), running_mean)
    np.testing.assert_allclose(running_mean, 0.1 * params["x"].mean(0), rtol=1e-12)


def test_the_stable_sigmoid_written_through_masks_equals_the_logistic_function():
    """Both branches of the masked sigmoid, and its gradient, at inputs of both signs and 0."""
    x = np.array([[-30.0, -2.0, -0.5, 0.0], [0.5, 2.0, 30.0, 1e-3]])
    value, grad = mj.compile_loss(lambda x: np.sum(sigmoid(x) * np.arange(1.0, 9.0).reshape(2, 4)),
                                  backend="interp")(x)
    weights = np.arange(1.0, 9.0).reshape(2, 4)
    e = np.exp(-np.abs(x))               # s (1 - s) = e / (1 + e)^2, without 1 - s losing digits
    np.testing.assert_allclose(value, np.sum(sigmoid(x.copy()) * weights), rtol=1e-13)
    np.testing.assert_allclose(value, np.sum(weights / (1 + np.exp(-x))), rtol=1e-13)
    np.testing.assert_allclose(grad, weights * e / (1 + e) ** 2, rtol=1e-12)
