"""hcc.backends.state — the runtime's per-plan state, kept beside a plan, never on it.

A :class:`~hcc.ir.plan.Plan` is a frozen value: the runtime writes nothing into it. What the
runtime computes once per plan and reuses on every call — the executor's per-rank
:class:`~hcc.backends.executor.Schedule` and the bound MPI runs of backends/bound.py (persistent
requests on the caller's arrays) — lives in a :class:`PlanState`, found by the plan's
identity in a process-wide table and dropped when the plan is garbage-collected.

Why identity and not equality: a plan hashes and compares over every op of every rank (a
100k-op plan's hash is milliseconds), and a run of a 1 MiB allreduce costs about a
millisecond; looking the state up by ``id(plan)`` costs a dictionary probe. A weak reference
to the plan removes its entry when the plan goes (the reference's callback runs before the
object's memory, and so its id, can be reused), so the table never outgrows the live plans.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["PlanState", "state_of", "peek"]


class PlanState:
    """What the runtime keeps for one plan: ``schedules[(rank, fuse)]`` (executor.py) and
    ``bound``, the bound runs of backends/bound.py, most recently used first."""

    __slots__ = ("schedules", "bound", "__weakref__")

    def __init__(self) -> None:
        self.schedules: dict[tuple[int, int], Any] = {}
        self.bound: list = []


_STATES: dict[int, tuple[weakref.ref, PlanState]] = {}
_LOCK = threading.Lock()  # ranks run as threads of one process in tests and under Ray


def state_of(plan: Any) -> PlanState:
    """The :class:`PlanState` of ``plan``, made on first use."""
    key = id(plan)
    entry = _STATES.get(key)
    if entry is not None and entry[0]() is plan:
        return entry[1]
    with _LOCK:
        entry = _STATES.get(key)
        if entry is not None and entry[0]() is plan:
            return entry[1]
        ref = weakref.ref(plan, lambda _ref, key=key: _drop(key, _ref))
        state = PlanState()
        _STATES[key] = (ref, state)
        return state


def peek(plan: Any) -> PlanState | None:
    """The state of ``plan`` if the runtime has made one (tests look without making one)."""
    entry = _STATES.get(id(plan))
    return entry[1] if entry is not None and entry[0]() is plan else None


def _drop(key: int, ref: weakref.ref) -> None:
    with _LOCK:
        entry = _STATES.get(key)
        if entry is not None and entry[0] is ref:
            del _STATES[key]
