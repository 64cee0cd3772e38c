"""hcc.backends — the executor and the transports (sockets, mpi, ray) it runs plans over.

Submodules are imported where used: ``hcc.backends.sockets``, ``hcc.backends.mpi``,
``hcc.backends.ray`` (style.md habit 10: heavy dependencies stay out of ``hcc check``).
"""
from .base import (
    BACKENDS,
    Capabilities,
    CollectiveTimeout,
    PeerFailed,
    RankFailed,
    Request,
    RootFailed,
    RuntimeFault,
    Transport,
)

__all__ = [
    "BACKENDS", "Capabilities", "CollectiveTimeout", "PeerFailed", "RankFailed", "Request", "RootFailed",
    "RuntimeFault", "Transport",
]
