"""hcc.backends.runtime — the one entry that runs a plan on one rank: ``run(plan, comm, x)``.

It decides, from the plan and from what the transport *declares* it can do
(:class:`~hcc.backends.base.Capabilities`, never the transport's name), which of the two
executors runs the call, and runs it:

- the **static executor** (backends/executor.py) interprets the plan's flattened per-rank
  programs; any transport runs it. Over a transport with persistent transfers (MPI), a call
  that passes plain numpy arrays and an ``out`` is bound to them once and then only restarted
  (backends/bound.py);
- the **adaptive runtime** (backends/adaptive/) runs from the plan's trees and decides at run
  time who sends what, so late ranks and dead ranks do not stall the others. It needs a
  transport that declares ``agreement`` (a rendezvous store for its agreement log).

The decision, in order (:func:`engine`):
1. a kind the adaptive runtime does not run, a compressed plan, or a transport without
   ``agreement``: static;
2. ``on_failure = continue`` or a ``quorum``: adaptive (only it survives deaths and late ranks);
3. ``adaptive`` said, in the plan or as a run option: adaptive when it is on, else static
   (the plan's flattened program, exactly as the static executor runs it);
4. ``adaptive`` unsaid: adaptive over a transport that declares ``arrival_order`` (ranks
   entering a collective at different times: sockets jobs, Ray actors) when the plan has at
   most ``MAX_FLOWS`` ranks, else static.
An adaptive call that is left to the default (4) with ``on_failure = abort`` and no quorum
then takes the adaptive runtime's *fast path*: the ranks first agree, on one store counter,
whether everyone arrived in time, and if so run the static program after all
(``adaptive.engine.Run.decide``): that last decision can only be made at run time.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.plan import Plan
from . import adaptive
from .base import Capabilities, Transport
from .bound import run_bound
from .executor import InputMismatch, static_call

__all__ = ["run", "engine", "adaptive_on", "capabilities", "ADAPTIVE_OPTIONS"]

# run options only the adaptive runtime knows; a call that (3.) ends up static drops them
ADAPTIVE_OPTIONS = frozenset({"adaptive", "quorum", "chunk_bytes", "progress", "trace"})
_NONE = Capabilities()


def capabilities(comm: Any) -> Capabilities:
    """What ``comm`` declares (nothing for an object that is not a Transport)."""
    return getattr(comm, "capabilities", _NONE)


def adaptive_on(plan: Plan, comm: Any, option: bool | None = None) -> bool:
    """Whether arrival-order scheduling is on: the ``adaptive`` run option if given, else the
    plan's ``adaptive`` (``adaptive = on|off`` in the source), else what the transport
    declares (``Capabilities.arrival_order``: on for sockets and ray, off for MPI)."""
    if option is not None:
        return bool(option)
    if plan.adaptive is not None:
        return bool(plan.adaptive)
    return capabilities(comm).arrival_order


def engine(plan: Plan, comm: Any, options: dict) -> str:
    """``"adaptive"`` or ``"static"``: which executor runs ``plan`` over ``comm`` with these
    run options (the module docstring gives the rules)."""
    if plan.kind not in adaptive.KINDS or plan.compress not in (None, "none"):
        return "static"
    if not capabilities(comm).agreement:
        return "static"
    if plan.on_failure == "continue" or options.get("quorum") is not None:
        return "adaptive"
    if "adaptive" in options or plan.adaptive:
        on = adaptive_on(plan, comm, options.get("adaptive"))
        return "adaptive" if on or options.get("progress") is not None else "static"
    # the transport's default never turns a plan the adaptive layout cannot hold (one flow per
    # rank in arrival order: at most MAX_FLOWS ranks) into an error; it stays static
    if plan.adaptive is None and plan.n <= adaptive.MAX_FLOWS and adaptive_on(plan, comm):
        return "adaptive"
    return "static"


def _refused(comm: Transport, error: Exception) -> None:
    """This rank's array was refused before any byte moved, so the others would wait for it
    until their deadline (then blame "rank -1"): a transport that can tell them at once
    (``announce_failure``: sockets sends a FAIL frame naming this rank) does so."""
    tell = getattr(comm, "announce_failure", None)
    if tell is not None:
        try:
            tell(str(error))
        except Exception:  # the caller's error is the one to raise; telling is best effort
            pass


def run(plan: Plan, comm: Transport, array=None, *, out=None, timeout: float = 60.0, step: int = 0,
        **options) -> np.ndarray:
    """Run ``plan`` on rank ``comm.rank``; returns ``out`` (allocated when not given) — from the
    adaptive runtime an :class:`~hcc.backends.adaptive.AdaptiveResult`, the output array with
    what the survivors agreed on (``contributors``, ``missing``, ``late``, ``dead``).

    ``array``: this rank's input, ``plan.buffer_elems(rank)["in"]`` elements of the plan's dtype
    (numpy storage dtype: bfloat16 as uint16), any shape, C-contiguous; ``None`` means zeros
    (for ranks whose input the collective ignores, e.g. non-roots of a broadcast). ``out``:
    optional preallocated output of ``buffer_elems(rank)["out"]`` elements (it may be
    ``array`` itself: in place). ``timeout``: the deadline of every wait, in seconds.
    ``step``: the training step (``neighbor_average`` with ``peers = shift_one`` changes
    partners every step). Options of the adaptive runtime: ``adaptive`` (force arrival-order
    scheduling on or off), ``quorum=K`` (reduce the first K inputs that arrive),
    ``chunk_bytes``, ``progress`` (called after every data chunk), ``trace``. Every check
    happens before any byte moves."""
    comm.bind_plan(plan.wire_id(), plan.largest_message_bytes())
    if engine(plan, comm, options) == "adaptive":
        said = options.pop("adaptive", None)
        on = adaptive_on(plan, comm, said)
        try:
            return adaptive.run(plan, comm, array, out=out, timeout=timeout, step=step, arrival_order=on,
                                fast=on and said is None, **options)
        except InputMismatch as e:
            _refused(comm, e)
            raise
    if capabilities(comm).agreement and ("adaptive" in options or plan.adaptive):
        # adaptive said and off (rule 3): the adaptive runtime's options mean nothing here
        options = {k: v for k, v in options.items() if k not in ADAPTIVE_OPTIONS}
    try:
        result, execution, bindable = static_call(plan, comm, array, out=out, timeout=timeout, step=step,
                                                  **options)
    except InputMismatch as e:
        _refused(comm, e)
        raise
    # bound once to these arrays over a transport with persistent transfers (MPI), then reused
    if bindable and run_bound(plan, comm, array, out, execution, float(timeout)):
        return result
    execution().execute()
    return result
