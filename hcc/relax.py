"""hcc.relax — delayed and asynchronous synchronisation for training loops (BAGUA's relaxations).

Two helpers on top of any averaging plan (an ``allreduce`` with ``op = avg`` or ``sum``, or a
``neighbor_average``, compressed or not):

- :func:`every` — *delayed* synchronisation ("local SGD"): communicate only every k steps.
  ``sync = hcc.relax.every(4)``; ``if sync(step): w[:] = hcc.run(plan, comm, w)``. Or wrap the
  communicate function: ``average = sync.wrap(lambda w: hcc.run(plan, comm, w))``;
  ``w = average(step, w)`` returns its input unchanged on the steps that skip.

- :class:`AsyncAverager` — *asynchronous* model averaging. ``start(x)`` takes a snapshot of
  ``x`` and runs the collective on it in a background thread while training goes on; when it
  is done, ``apply(x)`` does ``x ← x + (avg(snapshot) − snapshot)``: the average replaces the
  snapshot's share of ``x`` and the local progress made meanwhile (``x − snapshot``) is kept.
  ``step(x)``, called once per training iteration, folds in a finished average as soon as it
  is there and launches a new collective every ``period`` iterations, so a loop needs one
  call per iteration and one :meth:`~AsyncAverager.finish` at the end::

      avg = hcc.relax.AsyncAverager(plan, comm, period=4)
      for step in range(steps):
          w -= lr * grad(w)
          avg.step(w)          # blocks only if the previous average is not done 4 steps later
      avg.finish(w)            # wait for the last average and apply it

Lock-step rule: every rank must launch the same sequence of collectives, or a rank waits for
a peer that never comes. ``step`` therefore launches at fixed iterations (0, period,
2·period, …), never "whenever the last one finished" (BAGUA's time-based interval): with the
same number of ``step`` calls on every rank, every rank launches the same collectives, in the
same order. Staleness is bounded: an average is folded in at most ``period`` iterations
after its snapshot. Messages of consecutive runs are told apart by the transport's
per-(peer, tag) FIFO order, which TCP and MPI keep. ``neighbor_average`` plans get the launch
index as their ``step`` argument (``shift_one`` partners rotate with it).

Threading: an :class:`AsyncAverager` owns ``comm`` while a collective is in flight — do not
run other plans over the same communicator meanwhile. Its methods may be called from any
thread; a lock guards its state. A failure of the background run (a dead peer, a timeout) is
raised by the next :meth:`apply`, :meth:`step` or :meth:`finish` on the caller's thread.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .grammar.errors import HccError
from .ir.plan import Plan

if TYPE_CHECKING:  # numpy loads when an averager runs, so `import hcc` (and `hcc check`) stays light
    import numpy as np

__all__ = ["AsyncAverager", "Every", "RelaxError", "every"]


class RelaxError(HccError):
    """Misuse of the relaxation helpers (a plan that does not average, two collectives in
    flight at once, a buffer of the wrong shape)."""


@dataclass(frozen=True)
class Every:
    """True on the last step of every period of ``k`` steps: steps k−1, 2k−1, …
    (0-based), so each sync follows k local updates.

    >>> sync = every(3)
    >>> [s for s in range(9) if sync(s)]
    [2, 5, 8]
    """

    k: int

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise RelaxError(f"every(k) needs an integer k >= 1, not {self.k!r}")

    def __call__(self, step: int) -> bool:
        return (step + 1) % self.k == 0

    def wrap(self, communicate: Callable[..., Any]) -> Callable[..., Any]:
        """``f(step, x, *args, **kw)``: ``communicate(x, *args, **kw)`` on sync steps, else
        ``x`` unchanged."""

        def delayed(step: int, x, *args, **kw):
            return communicate(x, *args, **kw) if self(step) else x

        delayed.__doc__ = f"{getattr(communicate, '__name__', 'communicate')} every {self.k} steps"
        return delayed


def every(k: int) -> Every:
    """A predicate ``sync(step)`` that is true once every ``k`` steps (see :class:`Every`)."""
    return Every(k)


def _averaging_divisor(plan: Plan) -> int:
    """What to divide the plan's output by to get a mean."""
    if plan.kind == "neighbor_average":
        return 1
    if plan.kind == "allreduce" and plan.op == "avg":
        return 1
    if plan.kind == "allreduce" and plan.op == "sum":
        return plan.n
    raise RelaxError(
        f"plan {plan.name!r} ({plan.kind}, op {plan.op}) does not average; use an allreduce "
        "with op = avg or sum, or a neighbor_average"
    )


class AsyncAverager:
    """Averages snapshots of a model in a background thread (see the module docstring).

    ``period``: :meth:`step` launches a collective every ``period`` calls. ``run_options``
    (e.g. ``timeout=30``) are passed to every ``hcc.run``.
    """

    def __init__(self, plan: Plan, comm, period: int = 1, **run_options):
        if not isinstance(period, int) or period < 1:
            raise RelaxError(f"period must be an integer >= 1, not {period!r}")
        self.plan, self.comm, self.period = plan, comm, period
        self.calls = 0  # step() calls so far
        self._divisor = _averaging_divisor(plan)
        self._options = run_options
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._snapshot: np.ndarray | None = None
        self._result: np.ndarray | None = None
        self._error: BaseException | None = None
        self.launched = 0  # collectives started (the neighbor_average step of the next one)
        self.applied = 0  # averages folded into the model

    # -- the background run ------------------------------------------------------------------
    def _work(self, snapshot: np.ndarray, step: int) -> None:
        import numpy as np

        from .backends.runtime import run

        try:
            opts = dict(self._options)
            if self.plan.kind == "neighbor_average":
                opts["step"] = step
            out = run(self.plan, self.comm, snapshot, **opts)
            with self._lock:
                self._result = np.asarray(out).reshape(snapshot.shape)
        except BaseException as e:  # handed to the caller's thread by apply/finish
            with self._lock:
                self._error = e

    def _as_float(self, a: np.ndarray) -> np.ndarray:
        if self.plan.dtype == "bfloat16":
            from .backends.kernels import to_float32

            return to_float32(a, "bfloat16").reshape(a.shape)
        return a

    # -- public ----------------------------------------------------------------------------
    @property
    def in_flight(self) -> bool:
        with self._lock:
            return self._thread is not None

    def ready(self) -> bool:
        """True when a collective was started and has finished (successfully or not)."""
        with self._lock:
            return self._thread is not None and (self._result is not None or self._error is not None)

    def start(self, x: np.ndarray) -> None:
        """Snapshot ``x`` and start averaging it in the background."""
        import numpy as np

        with self._lock:
            if self._thread is not None:
                raise RelaxError("a collective is already in flight; apply() or finish() it first")
            snapshot = np.array(x, copy=True)
            self._snapshot, self._result, self._error = snapshot, None, None
            step = self.launched
            self.launched += 1
            self._thread = threading.Thread(
                target=self._work, args=(snapshot, step), name=f"hcc-async-{self.plan.name}", daemon=True
            )
            self._thread.start()

    def apply(self, x: np.ndarray, wait: bool = False, timeout: float | None = None) -> bool:
        """Fold a finished average into ``x`` in place: ``x += avg(snapshot) − snapshot``.

        Returns False (and leaves ``x`` alone) when nothing finished yet, unless ``wait``,
        which blocks up to ``timeout`` seconds (None: until the run's own deadline ends it)."""
        import numpy as np

        with self._lock:
            thread = self._thread
        if thread is None:
            return False
        if wait:
            thread.join(timeout)
        if thread.is_alive():
            return False
        thread.join()
        with self._lock:
            if self._thread is not thread:  # another thread applied this one meanwhile
                return False
            self._thread = None
            err, res, snap = self._error, self._result, self._snapshot
            self._error = self._result = self._snapshot = None
            if err is not None:
                raise err
            if np.shape(x) != snap.shape:
                raise RelaxError(f"apply: x has shape {np.shape(x)}, the snapshot {snap.shape}")
            avg = self._as_float(res)
            if self._divisor != 1:
                avg = avg / self._divisor
            delta = avg - self._as_float(snap)
            if self.plan.dtype == "bfloat16":
                from .backends.kernels import from_float32

                from_float32((self._as_float(x) + delta).astype(np.float32), "bfloat16", out=x)
            else:
                x += delta.astype(x.dtype, copy=False)
            self.applied += 1
        return True

    def step(self, x: np.ndarray) -> bool:
        """One call per training iteration: fold in a finished average (if any); on every
        ``period``-th call, wait for the one in flight (if still running) and launch the next
        on a snapshot of ``x``. Returns whether an average was applied."""
        applied = self.apply(x)
        if self.calls % self.period == 0:
            if self.in_flight:
                applied = self.apply(x, wait=True) or applied
            self.start(x)
        self.calls += 1
        return applied

    def finish(self, x: np.ndarray, timeout: float | None = None) -> bool:
        """Wait for the collective in flight (if any) and apply it."""
        if not self.in_flight:
            return False
        if not self.apply(x, wait=True, timeout=timeout):
            raise RelaxError(f"the background collective did not finish within {timeout} s")
        return True
