"""hcc.backends.tracing — record when every transfer of a real run starts and ends.

:class:`TraceTransport` wraps a rank's transport for ``hcc run --trace``: each ``isend`` /
``irecv`` / ``irecv_fold`` is stamped when the executor posts it, and each request when a
wait hands it back completed. The stamps are ``time.monotonic()``: Linux's CLOCK_MONOTONIC,
one clock for every process of a host, so the ranks of a local run share one time axis
without any exchange of clocks.

Terms:

- **event**: ``(kind, peer, tag, posted, done)`` — ``kind`` ``"send"`` or ``"recv"`` (a
  RecvReduce is a receive), ``posted`` when the executor posted the op (its dependencies had
  completed), ``done`` when a wait returned it. A plan has one op per ``(kind, peer, tag)`` on
  a rank, so the parent maps events back to ops (:func:`hcc.ir.viz.measured_trace`).
- **local event**: ``("local", op, 0, start, end)`` — the executor's own work on op ``op``
  (its index in the rank's program): a Copy, Reduce or Scale, or the reduction of a staged
  RecvReduce's message after its receive completed. A receive reduced while it arrives
  (``irecv_fold``, TCP peers) is inside the receive's own span and has no event of its own.

What it changes in the run: the wrapper hides ``native_run`` (the native core runs a whole
program without returning to Python, so it has no per-op stamps to give) and ``send_init``
(a bound, persistent run starts requests without posting them), so a traced run is always
the pure-Python executor over the same transport — the reference executor, slower per
message than the native core. Everything else is the wrapped transport's own.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

__all__ = ["TraceTransport"]


class TraceTransport:
    """``inner`` with every transfer's post and completion time recorded in ``events``."""

    native_run = None  # the native core keeps no per-op stamps: the Python executor runs
    send_init = None  # no bound runs: every op goes through isend/irecv

    def __init__(self, inner: Any):
        self._inner = inner
        self._posted: dict[int, tuple[str, int, int, float]] = {}
        self.events: list[tuple[str, int, int, float, float]] = []
        # only what the inner transport offers: the executor asks with getattr
        if getattr(inner, "irecv_fold", None) is not None:
            self.irecv_fold = self._irecv_fold
        if getattr(inner, "wait_completed", None) is not None:
            self.wait_completed = self._wait_completed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def clear(self) -> None:
        """Forget what was recorded (each iteration starts afresh; the last one is kept)."""
        self._posted.clear()
        self.events = []

    def record_local(self, op: int, start: float, end: float) -> None:
        """The executor ran op ``op``'s local work from ``start`` to ``end`` (its clock)."""
        self.events.append(("local", op, 0, start, end))

    def _stamp(self, req: Any, kind: str, peer: int, tag: int, t: float) -> Any:
        self._posted[id(req)] = (kind, peer, tag, t)
        return req

    def isend(self, peer: int, tag: int, data) -> Any:
        t = time.monotonic()
        return self._stamp(self._inner.isend(peer, tag, data), "send", peer, tag, t)

    def irecv(self, peer: int, tag: int, buf) -> Any:
        t = time.monotonic()
        return self._stamp(self._inner.irecv(peer, tag, buf), "recv", peer, tag, t)

    def _irecv_fold(self, peer: int, tag: int, nbytes: int, fold) -> Any:
        t = time.monotonic()
        return self._stamp(self._inner.irecv_fold(peer, tag, nbytes, fold), "recv", peer, tag, t)

    def _done(self, reqs) -> None:
        t = time.monotonic()
        for r in reqs:
            p = self._posted.pop(id(r), None)
            if p is not None:
                self.events.append((p[0], p[1], p[2], p[3], t))

    def _wait_completed(self, timeout: float) -> list:
        done = self._inner.wait_completed(timeout)
        self._done(done)
        return done

    def wait_any(self, requests: Sequence[Any], timeout: float) -> list[int]:
        idx = self._inner.wait_any(requests, timeout)
        self._done([requests[i] for i in idx])
        return idx
