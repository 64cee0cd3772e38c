"""hcc.backends.base — the Transport every backend implements, and the runtime's errors.

The executor (``backends/executor.py``) interprets any verified plan on one rank over a
Transport; backends move bytes only and never contain collective logic (design.md
"Runtime"). A backend registers itself by name (style.md habit 9).

Contract
- ``isend(peer, tag, data)`` / ``irecv(peer, tag, buf)``: non-blocking; ``data``/``buf`` are
  writable/readable memoryviews of contiguous bytes (usually slices of numpy arrays). The
  returned :class:`Request` completes when the send buffer may be reused / the bytes are in
  ``buf``. Messages between one ordered pair with one tag are matched exactly once.
- ``wait_any(requests, timeout)`` returns the indices of the requests that are complete
  (at least one) or raises :class:`CollectiveTimeout` after ``timeout`` seconds, or
  :class:`PeerFailed` as soon as the transport learns that a peer it depends on is gone.
- ``failed()`` is the set of ranks this transport knows to be dead.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from ..grammar.diagnostics import HccError


class RuntimeFault(HccError):
    """Base of every error a run raises."""


class CollectiveTimeout(RuntimeFault):
    def __init__(self, rank: int, peer: int, detail: str, timeout: float):
        super().__init__(
            f"rank {rank}: timed out after {timeout:g} s waiting on rank {peer} ({detail})"
        )
        self.rank, self.peer, self.detail, self.timeout = rank, peer, detail, timeout


class PeerFailed(RuntimeFault):
    def __init__(self, rank: int, peer: int, detail: str = ""):
        super().__init__(f"rank {rank}: peer rank {peer} failed" + (f" ({detail})" if detail else ""))
        self.rank, self.peer, self.detail = rank, peer, detail


class RankFailed(RuntimeFault):
    """``on_failure = abort``: a rank died; raised on every survivor."""

    def __init__(self, rank: int, by: int = -1, detail: str = ""):
        who = f"rank {by}: " if by >= 0 else ""
        super().__init__(f"{who}rank {rank} failed" + (f" ({detail})" if detail else ""))
        self.rank, self.by, self.detail = rank, by, detail


class RootFailed(RankFailed):
    """The root of a rooted collective died; no survivor can complete."""


class Request:
    """A handle on one non-blocking operation; backends subclass it."""

    done: bool = False


class Transport(ABC):
    name: ClassVar[str] = ""
    rank: int
    world: int

    @classmethod
    def available(cls) -> bool:
        return True

    @abstractmethod
    def isend(self, peer: int, tag: int, data: memoryview) -> Request: ...

    @abstractmethod
    def irecv(self, peer: int, tag: int, buf: memoryview) -> Request: ...

    @abstractmethod
    def wait_any(self, requests: list[Request], timeout: float) -> list[int]: ...

    def failed(self) -> frozenset[int]:
        return frozenset()

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


BACKENDS: dict[str, type[Transport]] = {}


def register(cls: type[Transport]) -> type[Transport]:
    BACKENDS[cls.name] = cls
    return cls
