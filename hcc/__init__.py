"""hcc — a declarative schedule compiler for collective communication.

    import hcc
    program = hcc.load("samples/dgx1.hcl")       # parse and check (path or source text)
    plan = hcc.compile(program, "allreduce")      # bounds, tree packing, lowering, verify
    plan.figures.efficiency                       # bound_s / predicted_s
    plan.save("plan.json"); plan = hcc.Plan.load("plan.json")
    out = hcc.run(plan, comm, array)              # on one rank, over a backend communicator

Heavy dependencies (OR-Tools, networkx, mpi4py, Ray, matplotlib) load only when used.
"""
from __future__ import annotations

from .api import compile, compile_all, load, run
from .grammar.diagnostics import SourceError
from .grammar.errors import HccError
from .ir.errors import ArgumentError, ArgumentTypeError, ArgumentValueError, PlanError, VerifyError
from .ir.plan import Figures, Plan, Tree
from .ir.topology import Topology
from .compiler.program import CollectiveSpec, Program
from .compiler.cost import CostModel
from . import relax
from .backends.base import (
    CollectiveTimeout,
    PeerFailed,
    RankFailed,
    RootFailed,
    RuntimeFault,
)

__version__ = "0.1.0"

__all__ = [
    "ArgumentError", "ArgumentTypeError", "ArgumentValueError",
    "CollectiveSpec", "CollectiveTimeout", "CostModel", "Figures", "HccError", "PeerFailed", "Plan",
    "PlanError", "Program", "RankFailed", "RootFailed", "RuntimeFault", "SourceError",
    "Topology", "Tree", "VerifyError", "compile", "compile_all", "load", "relax", "run", "__version__",
]
