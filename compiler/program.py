"""hcc.compiler.program — a checked program: the frontend's output, the passes' input.

The frontend (``compiler/frontend.py``) turns the AST into these values after every check of
language.md's error list has passed; nothing downstream re-validates user input.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..grammar.diagnostics import Span
from ..ir.topology import Topology


@dataclass(frozen=True)
class CollectiveSpec:
    name: str
    kind: str  # one of hcc.ir.plan.KINDS
    topology: str  # name of the Topology it runs on
    ranks: tuple[str, ...]  # vertex names, in rank order
    root: int  # index into ranks; -1 for unrooted kinds
    size_bytes: int  # the per-rank output buffer, as nccl-tests counts it
    dtype: str = "float32"
    op: str | None = None  # reducing kinds: sum | prod | min | max | avg (default sum)
    algorithm: str = "auto"  # auto | treepack | ring | tree | direct
    chunk_bytes: int | None = None  # None = auto
    compress: str = "none"  # none | fp16 | int8
    on_failure: str = "abort"  # abort | continue
    adaptive: bool | None = None  # None = backend default (on for sockets and ray)
    peers: str | None = None  # neighbor_average: ring | all | shift_one
    span: Span | None = None  # where the collective is declared (for late errors)


@dataclass(frozen=True)
class Program:
    path: str
    topologies: dict[str, Topology]
    collectives: tuple[CollectiveSpec, ...]

    def collective(self, name: str) -> CollectiveSpec:
        for c in self.collectives:
            if c.name == name:
                return c
        raise KeyError(name)

    def topology_of(self, spec: CollectiveSpec) -> Topology:
        return self.topologies[spec.topology]
