"""``morphjit.util.pytree``: None is a node without children (part of the structure, not a leaf)."""
from __future__ import annotations

import numpy as np

from morphjit.util import pytree


def test_none_is_structure_not_a_leaf():
    tree = {"a": None, "b": (np.ones(2), None, [None, 3.0])}
    leaves, treedef = pytree.flatten(tree)
    assert len(leaves) == 2 and treedef.num_leaves == 2
    assert pytree.unflatten(treedef, leaves) == {"a": None, "b": (leaves[0], None, [None, 3.0])}
    assert pytree.leaf_paths(treedef, "t") == ["t['b'][0]", "t['b'][2][1]"]
    assert str(treedef) == "{'a': None, 'b': (*, None, [None, *])}"


def test_none_and_a_leaf_have_different_structures():
    assert pytree.flatten((1.0, None))[1] != pytree.flatten((1.0, 2.0))[1]
    keyed = [pytree.keyed_flatten(t, [], type) for t in ((1.0, None), (1.0, 2.0))]
    assert keyed[0] != keyed[1]
