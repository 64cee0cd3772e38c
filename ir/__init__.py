"""hcc.ir — the plan IR: value types, verifier, serialization, visualisation."""
from .errors import PlanError, VerifyError
from .plan import DTYPE_SIZES, PLAN_VERSION, Figures, Plan, Tree, block_range, block_start, buffer_layout
from .plan import ChunkRef, Copy, Op, Recv, RecvReduce, Reduce, Scale, Send
from .topology import Link, Topology

__all__ = [
    "DTYPE_SIZES", "PLAN_VERSION", "ChunkRef", "Copy", "Figures", "Link", "Op", "Plan",
    "PlanError", "Recv", "RecvReduce", "Reduce", "Scale", "Send", "Topology", "Tree",
    "VerifyError", "block_range", "block_start", "buffer_layout",
]
