"""Variants of a compiled function for slices with traced bounds that a call finds shorter.

``X[i * n:(i + 1) * n]`` is traced at its length ``n``. At a call where NumPy's slice ends at the
end of the axis (the last minibatch of data whose size ``n`` does not divide), the step refuses it
(`SliceOutOfRange`, naming the slice and the length of NumPy's slice); the call is then served by
a variant of the compiled function traced with that slice, and every slice with the same bounds,
step and axis length (``X[batch]``, ``y[batch]``), at that length (`api.shorter_slices`), compiled
once and kept. A variant refuses a call whose slice is not exactly as short, so it never
stands in for another length; the first step's refusal says which variant a call needs.
"""
from __future__ import annotations

import copy

from ..api import Shortening, shorter_slices
from ..native import GENERATORS, SliceOutOfRange, rewinding
from ..util import pytree
from .callsite import CallSite


class ShorterSlices:
    """What `Compiled` and `TrainStep` need to serve calls whose slices with traced bounds are
    shorter: ``_shortening`` (`api.Shortening`), the lengths this one is traced with and the
    slices its traces met, and ``_variants``, the variants by their lengths."""

    _shortening: Shortening
    _variants: dict
    _draws: bool | None = None   # whether a step takes generators (None: none compiled yet)

    def _rewinding(self, args: tuple):
        """`native.rewinding` of a call's ``args`` where it may take seeds from generators: captured
        ones, or arguments (before any step is compiled, or where a step compiled takes them)."""
        if self._draws is False:
            return None
        captured = self._captured is not None and self._captured.takes_generators
        draws = self._draws or captured or any(isinstance(a, GENERATORS) for a in args)
        return rewinding(args) if draws else None

    def _note_draws(self, args) -> None:
        """After a compile for ``args``: whether calls need `_rewinding` (steps taking generators)."""
        leaves = pytree.flatten(args)[0]
        self._draws = bool(self._draws) or any(isinstance(x, GENERATORS) for x in leaves) \
            or self._captured is not None and self._captured.takes_generators

    def _shorter_variant(self, error: SliceOutOfRange, rewind=None):
        """The variant for the slices the one ``error`` refuses stands for (those with its bounds,
        step and axis length) at the length of NumPy's slice, the call's generators put back
        (``rewind``); None for an empty slice, and for a slice this one is traced at already."""
        key = self._shortening.seen.get(error.args[0])
        if error.length == 0 or key is None or key in self._shortening.lengths:
            return None
        lengths = {**self._shortening.lengths, key: error.length}
        with self._site.compiling:
            variant = self._variants.get(frozenset(lengths.items()))
            if variant is None:
                variant = self._variants[frozenset(lengths.items())] = self._shortened(lengths)
        if rewind is not None:
            rewind()
        return variant

    def _shortened(self, lengths: dict):
        variant = copy.copy(self)
        variant._site, variant._bound, variant._variants = CallSite(self.static_shapes), {}, {}
        variant._captured, variant._shortening = None, Shortening(lengths)
        return variant

    def _tracing_shorter(self):
        """The context the pipeline runs in: the slices at this one's lengths, recorded."""
        return shorter_slices(self._shortening)

    def _variant_steps(self) -> list:
        return [s for variant in list(self._variants.values()) for s in variant.steps()]
