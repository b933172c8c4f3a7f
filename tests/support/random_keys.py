"""Random shapes and NumPy indexing keys (basic and integer-array) for the op and indexing tests."""
import numpy as np


def rand_shape(rng, min_ndim=0, max_ndim=3, max_dim=4):
    ndim = int(rng.integers(min_ndim, max_ndim + 1))
    return tuple(int(d) for d in rng.integers(1, max_dim + 1, size=ndim))


def broadcast_family(rng, n, min_ndim=0, max_ndim=3):
    """``n`` shapes that broadcast together: suffixes of one shape, some dimensions set to 1."""
    full = rand_shape(rng, min_ndim, max_ndim)
    shapes = []
    for _ in range(n):
        k = int(rng.integers(0, len(full) + 1))
        shapes.append(tuple(1 if rng.random() < 0.35 else d for d in full[len(full) - k:]))
    return shapes


def rand_index(rng, shape):
    """A basic index: ints (maybe negative), slices with steps (maybe negative), None, ..."""
    key = []
    for d in shape:
        r = rng.random()
        if r < 0.25:
            key.append(int(rng.integers(-d, d)))
        else:
            start = rng.choice([None, int(rng.integers(-d, d))])
            stop = rng.choice([None, int(rng.integers(-d - 1, d + 1))])
            key.append(slice(start, stop, rng.choice([None, 1, 2, -1, -2, 3])))
        if rng.random() < 0.15:
            key.append(None)
    if key and rng.random() < 0.3:
        i = int(rng.integers(0, len(key)))
        key = key[:i] + [Ellipsis] + [k for k in key[i:] if k is None]
    return tuple(key)


def advanced_index(rng, shape):
    """An integer-array index: index arrays (negative and repeated entries, broadcasting shapes)
    on some axes, adjacent or separated, with ints, slices, None and ... elsewhere."""
    arrays = int(rng.integers(1, min(3, len(shape)) + 1))
    picked = sorted(rng.permutation(len(shape))[:arrays])
    family = broadcast_family(rng, arrays, 0, 2)
    key = []
    for k, d in enumerate(shape):
        if k in picked:
            key.append(rng.integers(-d, d, size=family[picked.index(k)]))
        elif rng.random() < 0.2:
            key.append(int(rng.integers(-d, d)))
        else:
            key.append(slice(rng.choice([None, 1]), None, rng.choice([None, 2, -1])))
        if rng.random() < 0.1:
            key.append(None)
    if rng.random() < 0.3 and not isinstance(key[-1], np.ndarray):
        key = key[:-1] + [Ellipsis]
    return tuple(key)
