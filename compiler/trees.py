"""hcc.compiler.trees — the compiler's one tree value.

Terms
- tree (:class:`PackedTree`): a spanning tree over a collective's ranks as every stage before
  lowering hands it on: ``root``, ``edges`` = ``(parent, child, path)`` triples listed parents
  first, ``path`` the topology vertices from parent to child (through switches, or through a
  relaying rank's vertex as treepack-wide's cut-through edges do; for an in-tree, whose data
  flows child -> parent, the data's route reversed), and ``rate``, the bytes/s the tree
  carries. Endpoints are rank names, or rank positions where a schedule is
  built over positions (the ring channels); lowering accepts both.
- Every producer builds this value: the packings (treepack.py, bidir.py), the broadcast and
  reduce trees (bcast_trees.py, bcast_wide.py), the NCCL-like schedules (baselines.py,
  channels.py) and the simple trees of routes.py.
- shape (:class:`TreeShape`): the tree resolved to rank positions, with children and a
  breadth-first order, as lowering (lower.py, schedule.py) walks it; made by ``TreeShape.of``
  and recorded in the plan as the IR's :class:`hcc.ir.plan.Tree` by ``to_tree``: the one
  conversion from the compiler's tree to the IR's.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

from ..ir.errors import PlanError
from ..ir.plan import Tree

__all__ = ["PackedTree", "TreeShape", "tree_levels"]


@dataclass(frozen=True)
class PackedTree:
    root: str
    # (parent_rank, child_rank, vertex path parent..child through switches or relaying ranks), parents first
    edges: tuple[tuple[str, str, tuple[str, ...]], ...]
    rate: float = 1.0  # bytes/s this tree carries


def tree_levels(tree: PackedTree) -> dict[str, int]:
    """Each rank's level below the root of ``tree`` (a route through switches is one level)."""
    level = {tree.root: 0}
    for parent, child, _ in tree.edges:  # parents come before their children
        level[child] = level[parent] + 1
    return level


@dataclass(frozen=True)
class TreeShape:
    """A :class:`PackedTree` resolved to rank positions (``of``: names checked, every rank
    reached once), with the traversal orders lowering needs; ``to_tree`` records it in the
    plan as the IR's :class:`hcc.ir.plan.Tree`."""

    root: int
    parent: tuple[int, ...]
    paths: tuple[tuple[str, ...], ...]
    rate: float
    children: tuple[tuple[int, ...], ...]
    order: tuple[int, ...]  # BFS from the root: parents before children

    @staticmethod
    def of(packed: Any, ranks: Sequence[str], index: int) -> "TreeShape":
        """The shape of ``packed`` over ``ranks`` (``index`` names it in errors); memoised:
        a chunk search lowers the same trees at every size, in two orders (one MI250 node's
        allgather: 48 trees, 8 lowerings)."""
        if len(ranks) > _MEMO_RANKS:
            return TreeShape._build(packed, ranks, index)
        try:
            return _shape(packed, tuple(ranks), index)
        except TypeError:  # unhashable parts (lists): build it, do not memoise
            return TreeShape._build(packed, ranks, index)

    @staticmethod
    def _build(packed: Any, ranks: Sequence[str], index: int) -> "TreeShape":
        n = len(ranks)
        rank_of = {v: i for i, v in enumerate(ranks)}

        def rank(x: Any) -> int:
            if isinstance(x, str):
                if x not in rank_of:
                    raise PlanError(f"tree {index} names {x!r}, which is not a rank of the collective")
                return rank_of[x]
            if isinstance(x, int) and 0 <= x < n:
                return x
            raise PlanError(f"tree {index} names rank {x!r}, outside 0..{n - 1}")

        root = rank(packed.root)
        parent = [-1] * n
        paths: list[tuple[str, ...]] = [()] * n
        kids: list[list[int]] = [[] for _ in range(n)]
        for edge in packed.edges:
            p, c = rank(edge[0]), rank(edge[1])
            path = tuple(edge[2]) if len(edge) > 2 else (ranks[p], ranks[c])
            if c == root or parent[c] != -1:
                raise PlanError(f"tree {index}: rank {ranks[c]} has two parents")
            parent[c] = p
            paths[c] = path
            kids[p].append(c)
        order, seen = [root], {root}
        i = 0
        while i < len(order):
            for c in kids[order[i]]:
                if c not in seen:
                    seen.add(c)
                    order.append(c)
            i += 1
        if len(order) != n:
            missing = next(r for r in range(n) if r not in seen)
            raise PlanError(f"tree {index} rooted at {ranks[root]} does not reach rank {ranks[missing]}")
        return TreeShape(root, tuple(parent), tuple(paths), float(packed.rate),
                         tuple(tuple(k) for k in kids), tuple(order))

    def to_tree(self, index: int, span: tuple[int, int]) -> Tree:
        return Tree(index, self.root, self.parent, self.rate, span, self.paths)

    def path_up(self, r: int) -> list[int]:
        """Ranks from ``r`` up to the root, inclusive."""
        out = [r]
        while out[-1] != self.root:
            out.append(self.parent[out[-1]])
        return out


# shapes are memoised up to this many ranks (a 1024-rank packing's 1472 trees would hold
# 1.5 M paths), the last _MEMO_SHAPES of them
_MEMO_RANKS = 64
_MEMO_SHAPES = 1024


@functools.lru_cache(maxsize=_MEMO_SHAPES)
def _shape(packed: Any, ranks: tuple[str, ...], index: int) -> TreeShape:
    return TreeShape._build(packed, ranks, index)
