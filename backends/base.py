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
- ``wait_change(requests, timeout, ignore=, woken=)`` / ``wake()``: the adaptive runtime's
  wait, which returns on completion, on a new death or on an outside event, and never raises
  for a dead peer.
- ``capabilities``: what the transport declares it can do (:class:`Capabilities`); the
  runtime (backends/runtime.py) decides from it, never from the transport's ``name``, how a
  plan runs over it.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import AbstractSet, Callable, ClassVar

from ..grammar.errors import HccError


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


@dataclass(frozen=True)
class Capabilities:
    """What a transport declares it offers the runtime (style.md habit 14).

    ``arrival_order``: the ranks of this transport's jobs enter a collective at different
    times (task-based systems: a sockets job of independent processes, Ray actors), so a plan
    whose source does not say ``adaptive`` runs with arrival-order scheduling (the adaptive
    runtime, whose fast path still runs on-time calls as the static program). Off (MPI's
    ranks run in lockstep), such a plan runs static.
    ``agreement``: the transport carries a rendezvous store client (``store``) and the job's
    ``token``, on which the adaptive runtime keeps its agreement log; without them only the
    static executor runs (no death can be survived, no rank can be waited for)."""

    arrival_order: bool = False
    agreement: bool = False


class BackendUnavailable(RuntimeFault, ImportError):
    """A backend's optional dependency is not installed; the message names the extra that
    installs it (mpi4py: ``hcc[mpi]``, Ray: ``hcc[ray]``)."""

    def __init__(self, backend: str, module: str, extra: str, cause: BaseException | None = None):
        super().__init__(f"the {backend} backend needs {module}, which is not installed"
                         + (f" ({cause})" if cause is not None else "")
                         + f"; install it with: pip install 'hcc[{extra}]'")
        self.backend, self.module, self.extra = backend, module, extra


class Request:
    """A handle on one non-blocking operation; backends subclass it."""

    done: bool = False


class MessageRequest(Request):
    """A request for one message to or from ``peer`` with ``tag`` (``what``: "send" or
    "recv"), holding the memory ``buf`` it reads or writes alive until it completes; the
    base of the MPI and Ray backends' requests."""

    __slots__ = ("peer", "tag", "what", "buf", "nbytes", "done")

    def __init__(self, peer: int, tag: int, what: str, buf: memoryview):
        self.peer, self.tag, self.what, self.buf = peer, tag, what, buf
        self.nbytes = buf.nbytes
        self.done = False

    def describe(self) -> str:
        return f"{self.what} tag {self.tag}, {self.nbytes} B"


class Transport(ABC):
    name: ClassVar[str] = ""
    # a class default; a transport whose offer depends on how it was made (a Ray transport
    # with or without a coordinator's store) sets its own value on the instance
    capabilities: Capabilities = Capabilities()
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

    def wait_change(self, requests: list[Request], timeout: float, *,
                    ignore: AbstractSet[int] = frozenset(),
                    woken: Callable[[], bool] = lambda: False) -> list[int]:
        """Indices of completed ``requests``; ``[]`` when ``woken()`` turns true, a peer not in
        ``ignore`` is newly known dead (see :meth:`failed`), or ``timeout`` passes. Unlike
        :meth:`wait_any` it never raises for a dead peer: the adaptive runtime waits this way
        while it repairs around deaths. This default polls ``wait_any`` in 20 ms slices;
        transports with a condition variable override it (and :meth:`wake`)."""
        end = time.monotonic() + timeout
        for _ in range(max(1, int(timeout / 0.02) + 2)):
            done = [i for i, r in enumerate(requests) if r.done]
            if done:
                return done
            if woken() or (self.failed() - ignore):
                return []
            left = end - time.monotonic()
            if left <= 0:
                return []
            live = [r for r in requests if getattr(r, "peer", -1) not in ignore]
            if not live:
                time.sleep(min(left, 0.02))
                continue
            try:
                self.wait_any(live, min(left, 0.02))
            except (CollectiveTimeout, PeerFailed):
                pass
        return [i for i, r in enumerate(requests) if r.done]

    def wake(self) -> None:
        """Make a thread blocked in :meth:`wait_change` re-check ``woken()`` now."""

    def bind_plan(self, plan_id: int, max_message: int) -> None:
        """The plan the next messages belong to, called by the runtime before it posts any:
        ``plan_id`` is :meth:`Plan.wire_id`, ``max_message`` :meth:`Plan.largest_message_bytes`.
        A transport that frames its messages (sockets) stamps the id on every data frame,
        refuses a frame of another plan for a posted receive (the ranks run different plans)
        and bounds an early frame of this plan by ``max_message``. This default ignores it:
        MPI and Ray's object store carry no frames of hcc's own."""

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
