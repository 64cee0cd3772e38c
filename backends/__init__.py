"""hcc.backends — the executor and the transports (sockets, mpi, ray) it runs plans over.

Submodules are imported where used: ``hcc.backends.sockets``, ``hcc.backends.mpi``,
``hcc.backends.ray`` (style.md habit 10: heavy dependencies stay out of ``hcc check``); each
imports its dependency on first use and raises :class:`BackendUnavailable`, naming the extra
to install, when it is missing. ``hcc.backends.runtime.run`` (``hcc.run``) runs a plan.
"""
from .base import (
    BACKENDS, BackendUnavailable, Capabilities, CollectiveTimeout, PeerFailed, RankFailed, Request, RootFailed,
    RuntimeFault, Transport,
)

__all__ = [
    "BACKENDS", "BackendUnavailable", "Capabilities", "CollectiveTimeout", "PeerFailed", "RankFailed", "Request", "RootFailed",
    "RuntimeFault", "Transport",
]
