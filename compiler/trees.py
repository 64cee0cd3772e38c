"""hcc.compiler.trees — the compiler's one tree value.

Terms
- tree (:class:`PackedTree`): a spanning tree over a collective's ranks as every stage before
  lowering hands it on: ``root``, ``edges`` = ``(parent, child, path)`` triples listed parents
  first, ``path`` the topology vertices from parent to child (through switches; for an
  in-tree, whose data flows child -> parent, the data's route reversed), and ``rate``, the
  bytes/s the tree carries. Endpoints are rank names, or rank positions where a schedule is
  built over positions (the ring channels); lowering accepts both.
- Every producer builds this value: the packings (treepack.py, bidir.py), the NCCL-like
  schedules (baselines.py, channels.py) and the simple trees of routes.py. Lowering resolves it
  once to rank positions (lower.py ``TreeShape.of``) and records it in the plan as the IR's
  :class:`hcc.ir.plan.Tree` (``TreeShape.to_tree``): the one conversion.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PackedTree"]


@dataclass(frozen=True)
class PackedTree:
    root: str
    # (parent_rank, child_rank, vertex path parent..child through switches only), parents first
    edges: tuple[tuple[str, str, tuple[str, ...]], ...]
    rate: float = 1.0  # bytes/s this tree carries
