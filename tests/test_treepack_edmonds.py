"""Chu-Liu/Edmonds (compiler/treepack_master.py): the list-of-columns version, the numpy
version and the native one (compiler/_simcore.c) give the same parent list, ties included,
and the minimum cost networkx finds."""
from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

from hcc.compiler import treepack_master as tm


def _matrix(rng, n: int) -> tuple[np.ndarray, int]:
    # few distinct costs, so ties (and cycles of equal arcs) are common
    w = rng.choice([1.0, 2.0, 3.0, 0.5], size=(n, n))
    w[rng.random((n, n)) < 0.3] = math.inf
    root = int(rng.integers(n))
    for v in range(n):  # a path from the root keeps every vertex reachable
        if v != root:
            w[root if v == (root + 1) % n else (v - 1) % n, v] = 1.0
    w[:, root] = math.inf
    np.fill_diagonal(w, math.inf)
    return w, root


@pytest.mark.parametrize("n", [2, 3, 7, 16, 33, 57])
def test_columns_arrays_and_native_agree_and_are_minimum(monkeypatch, n):
    rng = np.random.default_rng(n)
    for _ in range(6):
        w, root = _matrix(rng, n)
        cols = tm._edmonds_cols(w.T.tolist(), root)
        monkeypatch.setattr(tm, "_LIST_EDMONDS_MAX", 0)
        arrays = tm._edmonds_py(w, root)
        monkeypatch.undo()
        assert cols == arrays
        if tm._arborescence is not None:
            assert tm._edmonds(w, root) == cols
        if n > 16:  # networkx's own search takes seconds from here on
            continue
        g = nx.DiGraph()
        g.add_weighted_edges_from((u, v, w[u, v]) for u in range(n) for v in range(n) if math.isfinite(w[u, v]))
        ref = nx.minimum_spanning_arborescence(g).size(weight="weight")
        assert sum(w[p, v] for v, p in enumerate(cols) if p >= 0) == pytest.approx(ref)


@pytest.mark.skipif(tm._arborescence is None, reason="the native core is not built")
def test_native_finds_no_arborescence_where_a_vertex_has_no_in_arc():
    rng = np.random.default_rng(5)
    w, root = _matrix(rng, 9)
    w[:, (root + 4) % 9] = math.inf
    assert tm._edmonds_py(w, root) is None
    assert tm._edmonds(w, root) is None
    assert tm.min_arborescence(w.tolist(), root) is None
