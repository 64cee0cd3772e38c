"""hcc.runner — ``hcc run``: execute compiled plans on local ranks and check every result.

    hcc run samples/demo.hcl [-c NAME] [--backend sockets|mpi|ray] [--iters N] [--json]

For each collective (``-c NAME``, or every collective of the file; or the one plan of a
``plan.json``): draw random inputs (:func:`reference.make_inputs`, ``--seed``), run the plan
with the backend's ``run_local`` (``warmup`` untimed then ``iters`` timed iterations), compare
every rank's output of the last iteration with the numpy reference, and print measured time
(median and min over iterations), algbw and busbw beside the compiler's predicted time and
bound.

Definitions (nccl-tests, PERFORMANCE.md): ``algbw = size / time`` with ``size`` the per-rank
output buffer (the ``size`` of the collective); ``busbw = algbw × factor`` with factor
2(n−1)/n for allreduce; (n−1)/n for allgather, reduce_scatter, alltoall, gather, scatter;
1 for broadcast, reduce and neighbor_average.

With ``--netem`` each rank runs in its namespace of the ``hcc netem`` emulation that holds the
collective's ranks, and the plan is compiled against that emulation's topology as it is built
(:meth:`Netem.model_topology`: capacities times ``--scale``, latencies plus the delay line's
measured cost per crossing), so its predicted time and bound are those of the links that
exist. A ``plan.json`` cannot be recompiled: its prediction and bound are recomputed on the
emulated topology (``compiler.cost.simulate``, ``compiler.bounds.time_bound``) instead.

Exit status: 0 when every result is verified; 1 when a result is wrong or a rank failed
(printed as a typed error, never a traceback).
"""
from __future__ import annotations

import importlib
import json
import statistics
import sys
from dataclasses import replace

from .backends.base import RuntimeFault

__all__ = ["cmd_run", "busbw_factor", "load_plans", "netem_for", "run_and_check"]


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of a collective on ``n`` ranks."""
    if n <= 1:
        return 1.0
    if kind == "allreduce":
        return 2.0 * (n - 1) / n
    if kind in ("allgather", "reduce_scatter", "alltoall", "gather", "scatter"):
        return (n - 1) / n
    return 1.0


def load_plans(path: str, name: str | None = None, netem: bool = False) -> list:
    """The plans ``hcc run`` works on: a plan.json, or every (or one) collective of a .hcl.
    ``netem``: compiled against (a .json: re-priced on) the emulated topology that holds
    each collective's ranks (:func:`netem_for`)."""
    from . import api
    from .ir.plan import Plan

    if path.endswith(".json"):
        plan = Plan.load(path)
        if name and name != plan.name:
            raise RuntimeFault(f"{path} holds collective {plan.name!r}, not {name!r}")
        return [_repriced(plan, netem_for(plan.ranks, plan.topology.name)) if netem else plan]
    program = api.load(path)
    if not netem:
        if name is not None:
            return [api.compile(program, name)]
        return list(api.compile_all(program).values())
    if name is not None and all(c.name != name for c in program.collectives):
        return [api.compile(program, name)]  # raises the compiler's "unknown collective" error
    plans = []
    for spec in program.collectives:
        if name is not None and spec.name != name:
            continue
        emu = netem_for(spec.ranks, spec.topology)
        emulated = replace(program, topologies={**program.topologies, spec.topology: emu.model_topology()})
        plans.append(api.compile(emulated, spec.name))
    return plans


def netem_for(ranks, topology_name: str = ""):
    """The emulation that is up and holds every vertex of ``ranks``; of several, the one
    built from the topology named ``topology_name``. Raises :class:`RuntimeFault` if none."""
    from .backends import netem

    up = netem.names()
    chosen = [nm for nm in (netem.load(x) for x in up) if set(ranks) <= set(nm.topology.nodes)]
    if not chosen:
        raise RuntimeFault(f"--netem: no emulation is up with the vertices {', '.join(ranks)} "
                           f"(up: {', '.join(up) or 'none'}; run `hcc netem up FILE`)")
    return next((nm for nm in chosen if nm.topology.name == topology_name), chosen[0])


def _repriced(plan, emu):
    """A compiled plan with its predicted time and bound recomputed on the emulated topology."""
    from .compiler.bounds import time_bound
    from .compiler.cost import simulate

    model = emu.model_topology()
    try:
        predicted = simulate(replace(plan, topology=model)).time
    except Exception as e:  # the plan's paths use a vertex or link the emulation lacks
        raise RuntimeFault(f"--netem: plan {plan.name!r} does not fit emulation {emu.name}: {e}") from None
    bound = time_bound(plan.kind, model.restricted(plan.ranks), plan.ranks, plan.root, plan.size_bytes,
                       peers=plan.peers or "ring")
    return replace(plan, topology=model, figures=replace(plan.figures, predicted_s=predicted, bound_s=bound))


def _netem_kwargs(plan):
    """(context manager, launch kwargs) placing each rank in its `hcc netem` namespace."""
    nm = netem_for(plan.ranks, plan.topology.name)
    return nm.inside(plan.ranks[0]), nm.launch_kwargs(plan.ranks)


def _row(plan, backend: str, iters: int) -> dict:
    return {
        "name": plan.name, "kind": plan.kind, "backend": backend, "ranks": plan.n,
        "size_bytes": plan.size_bytes, "dtype": plan.dtype, "iters": iters,
        "predicted_s": plan.figures.predicted_s, "bound_s": plan.figures.bound_s,
    }


def run_and_check(plan, backend: str = "sockets", iters: int = 5, warmup: int = 1, timeout: float = 60.0,
                  seed: int = 0, netem: bool = False) -> dict:
    """Run ``plan`` on local ranks over ``backend``, check it; returns one result row (a dict)."""
    from .backends.reference import make_inputs

    mod = importlib.import_module(f"hcc.backends.{backend}")
    inputs = make_inputs(plan, seed)
    try:
        if netem:
            ctx, kw = _netem_kwargs(plan)
            with ctx:
                res = mod.run_local(plan, inputs, iters=iters, warmup=warmup, timeout=timeout, **kw)
        else:
            res = mod.run_local(plan, inputs, iters=iters, warmup=warmup, timeout=timeout)
    except RuntimeFault as e:
        return dict(_row(plan, backend, iters), verified=False, error=str(e))
    return _checked_row(plan, backend, iters, inputs, res)


def _run_batch_sockets(plans, iters, warmup, timeout, seed) -> list[dict]:
    """Plans with the same rank count share one set of rank processes (one launch)."""
    from .backends.launch import run_cases_local
    from .backends.reference import make_inputs

    rows: dict[int, dict] = {}
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(plans):
        groups.setdefault(p.n, []).append(i)
    for idx in groups.values():
        # each rank draws its own input from the seed (no input files); the same draws here
        # give the reference
        try:
            results = run_cases_local("sockets", [(plans[i], seed) for i in idx], iters=iters, warmup=warmup,
                                      timeout=timeout)
        except RuntimeFault as e:
            for i in idx:
                rows[i] = dict(_row(plans[i], "sockets", iters), verified=False, error=str(e))
            continue
        for i, res in zip(idx, results):
            rows[i] = _checked_row(plans[i], "sockets", iters, make_inputs(plans[i], seed), res)
    return [rows[i] for i in range(len(plans))]


def _checked_row(plan, backend: str, iters: int, inputs, res) -> dict:
    from .backends.reference import check, expected

    row = _row(plan, backend, iters)
    try:
        check(plan, res.outputs, expected(plan, inputs))
    except RuntimeFault as e:
        row.update(verified=False, error=str(e))
        return row
    med, best = statistics.median(res.times), min(res.times)
    algbw = plan.size_bytes / med if med > 0 else 0.0
    row.update(
        verified=True, time_median_s=med, time_min_s=best, times_s=list(res.times),
        algbw_Bps=algbw, busbw_Bps=algbw * busbw_factor(plan.kind, plan.n),
    )
    return row


def _fmt_size(b: float) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return f"{b / k:.3g} {unit}"
    return f"{int(b)} B"


def _fmt_s(s: float) -> str:
    if not s:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def _fmt_bw(b: float) -> str:
    return f"{b / 1e9:.3f} GB/s" if b else "-"


def _table(rows: list[dict]) -> str:
    header = ["collective", "backend", "ranks", "size", "iters", "median", "min", "algbw", "busbw",
              "predicted", "bound", "verified"]
    body = []
    for r in rows:
        body.append([
            r["name"], r["backend"], str(r["ranks"]), _fmt_size(r["size_bytes"]), str(r["iters"]),
            _fmt_s(r.get("time_median_s", 0)), _fmt_s(r.get("time_min_s", 0)), _fmt_bw(r.get("algbw_Bps", 0)),
            _fmt_bw(r.get("busbw_Bps", 0)), _fmt_s(r["predicted_s"]), _fmt_s(r["bound_s"]),
            "verified: ok" if r["verified"] else "verified: FAILED",
        ])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(header), line(["-" * w for w in widths])] + [line(b) for b in body]
    for r in rows:
        if not r["verified"]:
            out.append(f"{r['name']}: error: {r['error']}")
    return "\n".join(out)


def cmd_run(args) -> int:
    if args.iters < 1 or args.warmup < 0:
        raise RuntimeFault("--iters must be >= 1 and --warmup >= 0")
    plans = load_plans(args.file, args.collective, netem=args.netem)
    if args.backend == "sockets" and not args.netem:
        rows = _run_batch_sockets(plans, args.iters, args.warmup, args.timeout, args.seed)
    else:
        rows = [run_and_check(p, args.backend, args.iters, args.warmup, args.timeout, args.seed, args.netem)
                for p in plans]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(_table(rows))
    failed = [r for r in rows if not r["verified"]]
    if failed and args.json:
        for r in failed:
            print(f"hcc run: {r['name']}: error: {r['error']}", file=sys.stderr)
    return 1 if failed else 0
