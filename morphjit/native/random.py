"""The counter-based generator of the random numbers drawn inside a compiled step.

Element ``n`` of draw number ``s`` of a call is a pure function of (seed, s, n): SplitMix64's
output mixer over ``key(seed, s) + n * golden gamma``. Any loop can therefore compute any
element on its own, in any order: ``render`` writes the source of one element for a loop body,
``draw`` computes the very same numbers with NumPy (the reference executor's). Each call of the
step takes one 64-bit draw from the user's generator as its seed (``seed_of``, advancing it), in
the generator's place; ``with_copied_generators`` and ``replaying_generators`` let a report or the
rows of a Hessian run a step without advancing the user's generators.
"""
from __future__ import annotations

import copy
import math

import numpy as np

from ..util import pytree

GENERATORS = (np.random.Generator, np.random.RandomState)
RAW_64_BITS = (np.random.PCG64, np.random.PCG64DXSM, np.random.Philox, np.random.SFC64)   # random_raw() widths

GOLDEN = 0x9E3779B97F4A7C15      # SplitMix64's increment: consecutive elements of a draw
STREAM = 0xD1B54A32D192ED03      # separates the draws of one call
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
UNIFORM_BITS = {np.dtype(np.float64): 53, np.dtype(np.float32): 24}
DISTRIBUTIONS = ("uniform", "normal")   # [0, 1) and N(0, 1); the others are formulas of them


def seed_of(generator) -> np.ndarray:
    """The seed of one call: 64 random bits taken from (and advancing) the user's generator,
    whatever its bit generator, as the int64 array of one element the step takes in its place.
    The raw output of most bit generators has 64 bits; NumPy's full-range uint64 draw (slower)
    joins two of MT19937's, which have 32, and serves any other kind."""
    if isinstance(generator, np.random.Generator):
        bits = generator.bit_generator
        if type(bits) in RAW_64_BITS:
            return np.array([bits.random_raw()], np.uint64).view(np.int64)
        return np.array([generator.integers(2 ** 64, dtype=np.uint64)]).view(np.int64)
    return np.array([generator.randint(2 ** 64, dtype=np.uint64)]).view(np.int64)


def with_copied_generators(tree):
    """``tree`` with each random generator among its leaves replaced by a copy in the same state:
    a step given the copy draws the seed the generator would give next, and leaves it as it was."""
    leaves, treedef = pytree.flatten(tree)
    if not any(isinstance(x, GENERATORS) for x in leaves):
        return tree
    return pytree.unflatten(treedef, [copy.deepcopy(x) if isinstance(x, GENERATORS) else x for x in leaves])


def replaying_generators(tree):
    """A function returning ``tree`` with each random generator among its leaves replaced by a
    copy, put back at every call into the generator's present state: each step given it draws
    the seed the generator would give next, and the generator stays as it was."""
    copied = with_copied_generators(tree)
    rewind = rewinding(copied)

    def replayed():
        rewind()
        return copied
    return replayed


def rewinding(tree):
    """A function putting each random generator among the leaves of ``tree`` back into its
    present state (undoing the seeds a call took from them)."""
    generators = [x for x in pytree.flatten(tree)[0] if isinstance(x, GENERATORS)]
    states = [_state(g) for g in generators]

    def rewind():
        for generator, state in zip(generators, states):
            _set_state(generator, state)
    return rewind


def _state(generator):
    return generator.bit_generator.state if isinstance(generator, np.random.Generator) else generator.get_state()


def _set_state(generator, state) -> None:
    if isinstance(generator, np.random.Generator):
        generator.bit_generator.state = state
    else:
        generator.set_state(state)


def as_input(x, dtype) -> np.ndarray:
    """An argument leaf as a program input for the reference executor (a generator: its seed)."""
    return seed_of(x).reshape(()) if isinstance(x, GENERATORS) else np.asarray(x, dtype)


# ---------------------------------------------------------------------------------------------
# The numbers, in NumPy (the reference) and as generated source (the compiled step)


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
    return z ^ (z >> np.uint64(31))


def _bits(seed, stream: int, counter: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        key = _mix(np.asarray(seed).astype(np.uint64) + np.uint64((stream + 1) * STREAM % 2 ** 64))
        return _mix(key + (counter.astype(np.uint64) + np.uint64(1)) * np.uint64(GOLDEN))


def draw(seed, stream: int, dist: str, dtype, counter: np.ndarray) -> np.ndarray:
    """Elements ``counter`` (flat indices) of draw ``stream`` of distribution ``dist``."""
    dtype = np.dtype(dtype)
    if dist == "uniform":
        bits = UNIFORM_BITS[dtype]
        return ((_bits(seed, stream, counter) >> np.uint64(64 - bits)).astype(np.float64) * 2.0 ** -bits).astype(dtype)
    # Box-Muller on two uniforms of 53 bits: u1 in (0, 1], u2 in [0, 1).
    u1 = ((_bits(seed, stream, 2 * counter) >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0 ** -53
    u2 = (_bits(seed, stream, 2 * counter + 1) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)).astype(dtype)


def _u64(value: int) -> str:
    return f"np.uint64({value % 2 ** 64})"


def render(bind, seed: str, stream: int, dist: str, dtype, counter: str, call) -> str:
    """The source of one element, as ``draw`` computes it: ``bind(code)`` names a step in a new
    local, ``call(fn, x)`` renders a transcendental function."""
    def mix(z: str) -> str:
        z = bind(f"({z} ^ ({z} >> {_u64(30)})) * {_u64(MIX1)}")
        z = bind(f"({z} ^ ({z} >> {_u64(27)})) * {_u64(MIX2)}")
        return bind(f"{z} ^ ({z} >> {_u64(31)})")

    key = mix(bind(f"np.uint64({seed}) + {_u64((stream + 1) * STREAM)}"))   # loop-invariant: LLVM hoists it

    def bits(n: str) -> str:
        return mix(bind(f"{key} + (np.uint64({n}) + {_u64(1)}) * {_u64(GOLDEN)}"))

    dtype = np.dtype(dtype)
    if dist == "uniform":
        width = UNIFORM_BITS[dtype]
        return f"np.{dtype.name}(np.float64({bits(counter)} >> {_u64(64 - width)}) * {2.0 ** -width!r})"
    u1 = bind(f"(np.float64({bits(f'2 * ({counter})')} >> {_u64(11)}) + 1.0) * {2.0 ** -53!r}")
    u2 = bind(f"np.float64({bits(f'2 * ({counter}) + 1')} >> {_u64(11)}) * {2.0 ** -53!r}")
    radius = f"np.sqrt(-2.0 * {call('log', u1)})"
    return f"np.{dtype.name}({radius} * {call('cos', f'{2.0 * math.pi!r} * {u2}')})"
