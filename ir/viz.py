"""hcc.ir.viz — pictures of a plan: its topology, its trees one panel each, and a timeline.

The pieces live in four modules; this one is the entry point and names them all:

- :mod:`hcc.ir.viz_scene` — what a picture shows (the **scene**: vertices, links, the
  bottleneck cut, one **panel** per tree; a plan of more than :data:`AGGREGATE_OVER` vertices
  drawn as host boxes, its trees' panels opening the root's host rank by rank).
- :mod:`hcc.ir.viz_dot` — the scene as Graphviz DOT text (:func:`to_dot`, every panel in one
  graph; each host a ``cluster``).
- :mod:`hcc.ir.viz_draw` — PNG/SVG (:func:`draw`): each panel laid out alone (one ``dot`` call
  per panel, or hcc's own layout without Graphviz) and composed in index order.
- :mod:`hcc.ir.viz_trace` — Chrome / Perfetto trace-event JSON: the predicted timeline
  (:func:`to_trace`) and a measured run beside it (:func:`measured_trace`).

No module of viz imports the compiler (timings come in as arguments) or matplotlib at load
(the ``viz`` extra, imported where a picture is drawn).
"""
from __future__ import annotations

import os
import shutil  # noqa: F401  (tests hide dot through viz.shutil.which)
from pathlib import Path

from .plan import Plan
from .viz_dot import TRAFFIC_MAX_RANKS, panel_dots, to_dot, traffic
from .viz_draw import LEGEND, VizError, grid, own_layout, render
from .viz_scene import (AGGREGATE_OVER, CUT_COLOR, MAX_TREE_PANELS, OPEN_HOST_MAX, PALETTE, _rate, _scene,
                        tree_edges)
from .viz_trace import MEASURED_PID, PREDICTED_PID, measured_slices, measured_trace, to_trace

__all__ = ["draw", "to_dot", "panel_dots", "to_trace", "measured_trace", "measured_slices", "traffic",
           "tree_edges", "grid", "own_layout", "VizError", "AGGREGATE_OVER", "MAX_TREE_PANELS",
           "OPEN_HOST_MAX", "TRAFFIC_MAX_RANKS", "PALETTE", "CUT_COLOR", "LEGEND", "MEASURED_PID",
           "PREDICTED_PID", "_rate", "_scene"]


def draw(plan: Plan, path: str | os.PathLike, fmt: str | None = None, *, engine: str | None = None) -> None:
    """Draw the plan to ``path`` (PNG or SVG), atomically. ``engine``: ``dot`` (Graphviz lays
    out each panel; the default when ``dot`` is on PATH) or ``matplotlib`` (hcc's own layout,
    the fallback)."""
    from .files import atomic_write_bytes

    fmt = fmt or Path(path).suffix.lstrip(".") or "png"
    atomic_write_bytes(path, render(plan, fmt, engine))
