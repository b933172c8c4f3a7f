"""Affine index functions: how a loop nest's indices address an array (MoA's psi).

``IndexMap(offsets, coeffs)`` sends loop indices ``i`` to array indices
``offsets[k] + sum_j coeffs[k][j] * i[j]``. Views (transpose, broadcasting, slicing,
inserting or removing unit axes) are index maps, and reading a view of a view composes them,
so a fused loop reads the original buffer directly and views cost nothing at run time.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IndexMap:
    offsets: tuple[int, ...]
    coeffs: tuple[tuple[int, ...], ...]   # [array axis][loop axis]

    @staticmethod
    def identity(ndim: int) -> "IndexMap":
        return IndexMap((0,) * ndim, tuple(tuple(int(j == k) for j in range(ndim)) for k in range(ndim)))

    @property
    def loop_ndim(self) -> int:
        return len(self.coeffs[0]) if self.coeffs else 0

    def then(self, view: "IndexMap") -> "IndexMap":
        """First this map (loop -> value), then ``view`` (value -> the array it views)."""
        n = self.loop_ndim
        offsets = tuple(o + sum(c * s for c, s in zip(row, self.offsets)) for o, row in zip(view.offsets, view.coeffs))
        coeffs = tuple(tuple(sum(row[m] * self.coeffs[m][j] for m in range(len(row))) for j in range(n))
                       for row in view.coeffs)
        return IndexMap(offsets, coeffs)

    def is_identity(self) -> bool:
        return len(self.coeffs) == self.loop_ndim and self == IndexMap.identity(self.loop_ndim)

    def is_identity_on(self, domain) -> bool:
        """Whether every index of ``domain`` is sent to itself: like ``is_identity``, except that
        an axis of extent 1 (which a broadcast reads at 0, coefficient 0) counts as its own."""
        unit = [d == 1 for d in domain]
        return len(self.coeffs) == len(domain) == self.loop_ndim and not any(self.offsets) and all(
            c == int(j == k) or (j == k and unit[k]) for k, row in enumerate(self.coeffs) for j, c in enumerate(row))

    def render(self, loop_vars: list[str]) -> list[str]:
        return [_affine(o, row, loop_vars) for o, row in zip(self.offsets, self.coeffs)]


def _affine(offset: int, row, loop_vars) -> str:
    terms = [v if c == 1 else f"{c} * {v}" for c, v in zip(row, loop_vars) if c]
    if offset or not terms:
        terms.append(str(offset))
    return " + ".join(terms).replace("+ -", "- ")


def broadcast_map(src_shape, out_shape) -> IndexMap:
    """Read an operand of ``src_shape`` broadcast (NumPy rules) to ``out_shape``."""
    lead = len(out_shape) - len(src_shape)
    rows = tuple(tuple(int(j == k + lead and d != 1) for j in range(len(out_shape)))
                 for k, d in enumerate(src_shape))
    return IndexMap((0,) * len(src_shape), rows)


def transpose_map(perm) -> IndexMap:
    """Read the operand of ``transpose(perm)``: output axis j is operand axis perm[j]."""
    n = len(perm)
    return IndexMap((0,) * n, tuple(tuple(int(perm[j] == k) for j in range(n)) for k in range(n)))


def slice_map(starts, steps) -> IndexMap:
    n = len(starts)
    return IndexMap(tuple(starts), tuple(tuple(steps[k] if j == k else 0 for j in range(n)) for k in range(n)))


def is_unit_reshape(src_shape, out_shape) -> bool:
    """Does the reshape only insert or remove axes of size 1?"""
    return [d for d in src_shape if d != 1] == [d for d in out_shape if d != 1]


def unit_reshape_map(src_shape, out_shape) -> IndexMap:
    """Read the operand of a reshape that only inserts or removes unit axes."""
    big_out = iter(j for j, d in enumerate(out_shape) if d != 1)
    rows = []
    for d in src_shape:
        j = next(big_out) if d != 1 else None
        rows.append(tuple(int(j == m) for m in range(len(out_shape))))
    return IndexMap((0,) * len(src_shape), tuple(rows))


def element(name: str, imap: IndexMap, loop_vars: list[str]) -> str:
    """Source text of the element of array ``name`` that ``imap`` addresses (``[0]`` for 0-d)."""
    return f"{name}[{', '.join(imap.render(loop_vars)) or '0'}]"


def loop_vars(n: int, start: int = 0) -> list[str]:
    """The loop index names i0, i1, ... of a nest."""
    return [f"i{k}" for k in range(start, start + n)]
