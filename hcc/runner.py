"""hcc.runner — ``hcc run``: execute compiled plans on local ranks and check every result.

    hcc run samples/demo.hcl [-c NAME] [--backend sockets|mpi|ray] [--iters N] [--json] [--netem]
            [--per-message-us US] [--reduce-GBps R] [--copy-GBps R]

For each collective (``-c NAME``, or every collective of the file; or the one plan of a
``plan.json``): draw random inputs (:func:`reference.make_inputs`, ``--seed``), run the plan
with the backend's ``run_local`` (``warmup`` untimed then ``iters`` timed iterations), compare
every rank's output of the last iteration with the numpy reference, and print measured time
(median and min over iterations), algbw and busbw beside the compiler's predicted time and
bound.

Checks (the table's ``check`` column; backends/reference.py): ``exact`` (integers, min/max,
data movement), ``rounding`` (float reductions: the rounding of n operations), or a
compressed collective's codec and its stated error bound (``int8 ≤ 0.0157``: the largest
per-element error ``hcc.ir.wire.error_bound`` allows for these inputs, plus rounding).

Progress and memory: each collective's row is printed as soon as it is checked (columns sized
in (a status line on a terminal, plain lines otherwise). The launcher's parent never holds a
rank's buffer: ranks draw their inputs from ``--seed`` (``--backend ray``: the parent draws
them, its driver needs arrays), and the parent checks each rank's output a block at a time
from its file (mpi: its memory map, each block's pages dropped once compared), then deletes it
(:func:`reference.check_seeded`).

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

Cost model: the plans are compiled (a ``plan.json``: re-priced) with the cost model of the
runtime that runs them, :data:`RUN_MODELS` per backend, unless ``--per-message-us``,
``--reduce-GBps`` or ``--copy-GBps`` say otherwise; the chunk search minimises the predicted
time under it. ``hcc compile`` keeps the compiler's default (1 us per message, an MPI/NCCL
launch), so ``hcc run`` may pick larger chunks than ``hcc compile`` prints for the same
source: the Python executor pays ~100 times more per message. ``hcc run --netem`` with the
sockets default predicts exactly what ``benchmarks/netem_bench.py`` prints for the same case
(the bench takes its per-message cost from here).

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
from .compiler.cost import CostModel

__all__ = ["cmd_run", "write_trace", "run_model_key", "busbw_factor", "load_plans", "netem_for", "run_and_check", "RUN_MODELS",
           "compile_on"]

# The cost model ``hcc run`` compiles with, per backend: what one message costs the runtime
# that carries it. All three backends run the same Python executor (backends/executor.py);
# what differs is the transport under it.
# - sockets (and ray, whose actors exchange data over the sockets transport): 100 us. On the
#   emulated 8-rank ring (10 MB/s links, netem_bench) the compiler's 1 us default chose 8 KiB
#   chunks for a 16 MiB allreduce, 3584 messages per rank, and the run took 0.46 s longer
#   than predicted: ~128 us per message on the critical path (the executor's ~30 us of CPU
#   per message, ranks 4 to a core); at 100 us the compiler picked 64 KiB and the run landed
#   within 1% of its prediction. On loopback (`netem_bench.py messages`: 16 MiB in small
#   against 1 MiB chunks, the added time over the added critical-path messages) a 2-rank
#   broadcast, a core per rank, costs 10-14 us per message; a 4-rank allreduce, two ranks
#   per core, 64-134 us in 16 KiB chunks and 113-338 us in 64 KiB (3 reps, machine shared):
#   100 us is the cost when ranks share cores, as they do on this 2-core machine.
# - mpi: 300 us. MPICH's Isend/Irecv under the same executor, measured the same way: the
#   4-rank allreduce 165-281 us per message in 64 KiB chunks, 574-689 us in 16 KiB (MPICH's
#   ranks poll, two to a core, and its matching grows with the requests outstanding); the
#   2-rank broadcast 37-43 us in 16 KiB, 146-358 us in 4 KiB. The model is linear in the
#   message count, so the default is the cost near the chunks it then picks.
# Both from `python benchmarks/netem_bench.py messages` (no root; results/netem_messages.csv).
SOCKETS_PER_MESSAGE_S = 100e-6
# - shm: 50 us. The sockets backend between ranks of one host when the native core is built
#   (backends/shm.py: shared-memory channels, the program run by the native runner), measured
#   the same way (`netem_bench.py messages --backends sockets`, its ``shm`` rows,
#   `netem_messages_shm.csv`) on this 2-core machine shared with other jobs: the median of 12
#   cases x reps is 51 us per message (a 2-rank broadcast 2-50 us, a 4-rank allreduce
#   52-862 us: four ranks on two cores wait for a core at every hop), of which the runner's
#   own CPU is 1.4-5.2 us per message handled (``cpu_per_message_s``).
SHM_PER_MESSAGE_S = 50e-6
MPI_PER_MESSAGE_S = 300e-6
RUN_MODELS: dict[str, CostModel] = {
    "sockets": CostModel(per_message_s=SOCKETS_PER_MESSAGE_S),
    "ray": CostModel(per_message_s=SOCKETS_PER_MESSAGE_S),
    "mpi": CostModel(per_message_s=MPI_PER_MESSAGE_S),
    "shm": CostModel(per_message_s=SHM_PER_MESSAGE_S),
}


def run_model_key(backend: str, netem: bool = False) -> str:
    """The :data:`RUN_MODELS` entry ``hcc run`` compiles with: ``shm`` for sockets ranks
    launched on this host without ``--netem`` when their channels will engage (the native
    core is built, ``HCC_SHM`` is not ``off``), else the backend's own."""
    if backend == "sockets" and not netem:
        import os

        from .backends import native

        if native.available() and os.environ.get("HCC_SHM", "auto").lower() != "off":
            return "shm"
    return backend


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of a collective on ``n`` ranks (the compiler's
    table, :data:`hcc.compiler.pipeline.BUSBW_FACTOR`; 1 on one rank)."""
    from .compiler.pipeline import BUSBW_FACTOR

    return BUSBW_FACTOR[kind](n) if n > 1 else 1.0


def compile_on(program, name: str, topology=None, model: CostModel = RUN_MODELS["sockets"]):
    """Collective ``name`` of ``program`` compiled with ``model``; on ``topology`` (an
    emulation's :meth:`Netem.model_topology`) in place of the one it names, when given."""
    from .compiler.pipeline import compile_unit, resolve

    if topology is not None:
        spec = resolve(program, name)
        program = replace(program, topologies={**program.topologies, spec.topology: topology})
    return compile_unit(program, name, model=model).plan


def load_plans(path: str, name: str | None = None, netem: bool = False,
               model: CostModel = RUN_MODELS["sockets"]) -> list:
    """The plans ``hcc run`` works on: a plan.json, or every (or one) collective of a .hcl,
    compiled with ``model`` (a .json is re-priced with it). ``netem``: compiled against (a
    .json: re-priced on) the emulated topology that holds each collective's ranks
    (:func:`netem_for`)."""
    from . import api
    from .ir.plan import Plan

    if path.endswith(".json"):
        plan = Plan.load(path)
        if name and name != plan.name:
            raise RuntimeFault(f"{path} holds collective {plan.name!r}, not {name!r}")
        if netem:
            return [_repriced(plan, netem_for(plan.ranks, plan.topology.name), model)]
        return [_with_prediction(plan, model)]
    program = api.load(path)
    if name is not None:
        names = [name]  # an unknown name raises the compiler's "unknown collective" error
    else:
        names = [c.name for c in program.collectives]
    plans = []
    for nm in names:
        topology = None
        if netem:
            spec = next((c for c in program.collectives if c.name == nm), None)
            if spec is not None:
                topology = netem_for(spec.ranks, spec.topology).model_topology()
        plans.append(compile_on(program, nm, topology, model))
    return plans


def _with_prediction(plan, model: CostModel):
    """``plan`` with its predicted time under ``model`` (a plan file does not record the
    model it was compiled with)."""
    from .compiler.cost import simulate

    return replace(plan, figures=replace(plan.figures, predicted_s=simulate(plan, model=model).time))


def netem_for(ranks, topology_name: str = ""):
    """The emulation that is up and holds every vertex of ``ranks``; of several, the one
    built from the topology named ``topology_name``. Raises :class:`RuntimeFault` if none."""
    from . import netem

    up = netem.names()
    chosen = [nm for nm in (netem.load(x) for x in up) if set(ranks) <= set(nm.topology.nodes)]
    if not chosen:
        raise RuntimeFault(f"--netem: no emulation is up with the vertices {', '.join(ranks)} "
                           f"(up: {', '.join(up) or 'none'}; run `hcc netem up FILE`)")
    return next((nm for nm in chosen if nm.topology.name == topology_name), chosen[0])


def _repriced(plan, emu, costs: CostModel):
    """A compiled plan with its predicted time (under ``costs``) and bound recomputed on the
    emulated topology."""
    from .compiler.bounds import time_bound
    from .compiler.cost import simulate

    model = emu.model_topology()
    try:
        predicted = simulate(replace(plan, topology=model), model=costs).time
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
        "algorithm": plan.algorithm, "chunk_bytes": plan.chunk_bytes,
        "predicted_s": plan.figures.predicted_s, "bound_s": plan.figures.bound_s,
    }


def run_and_check(plan, backend: str = "sockets", iters: int = 5, warmup: int = 1, timeout: float = 60.0,
                  seed: int = 0, netem: bool = False, traces: list | None = None) -> dict:
    """Run ``plan`` on local ranks over ``backend``, check it; returns one result row (a dict).
    ``traces``: a list to which the run's measured transfers are appended as ``(plan,
    records)`` (sockets and mpi; the Python executor runs every iteration)."""
    from .backends.reference import make_inputs

    mod = importlib.import_module(f"hcc.backends.{backend}")
    kw = {"trace": True} if traces is not None else {}
    if traces is not None and backend == "ray":
        raise RuntimeFault("--trace records sockets and mpi runs, not ray (its actors run the adaptive runtime)")
    # the sockets and mpi launchers take a seed, from which each rank draws its own input
    # (launch.prepare_job); ray's driver needs the arrays
    inputs = make_inputs(plan, seed) if backend == "ray" else seed
    try:
        if netem:
            ctx, nkw = _netem_kwargs(plan)
            kw.update(nkw)
            with ctx:
                res = mod.run_local(plan, inputs, iters=iters, warmup=warmup, timeout=timeout, **kw)
        else:
            res = mod.run_local(plan, inputs, iters=iters, warmup=warmup, timeout=timeout, **kw)
    except RuntimeFault as e:
        return dict(_row(plan, backend, iters), verified=False, error=str(e))
    if traces is not None and res.detail.get("traces"):
        traces.append((plan, res.detail["traces"]))
    del inputs  # the check draws them again a block at a time
    return _checked_row(plan, backend, iters, seed, res, res.outputs)


def _run_batch_sockets(plans, iters, warmup, timeout, seed, emit=None, progress=None,
                       traces: list | None = None) -> list[dict]:
    """Plans with the same rank count share one set of rank processes (one launch). Each
    case is checked, and passed to ``emit(row)``, as soon as every rank has finished it;
    ``progress(name, iteration, total)`` hears which iteration the ranks have entered."""
    from .backends.launch import npy_reader, run_cases_local

    rows: dict[int, dict] = {}
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(plans):
        groups.setdefault(p.n, []).append(i)
    for idx in groups.values():
        # each rank draws its own input from the seed (no input files); the checker draws the
        # same values a block at a time

        def on_case(k: int, res, idx=idx) -> None:
            plan = plans[idx[k]]
            readers = [npy_reader(p) if p is not None else None for p in res.detail["out_paths"]]
            rows[idx[k]] = row = _checked_row(plan, "sockets", iters, seed, res, readers)
            if traces is not None and res.detail.get("traces"):
                traces.append((plan, res.detail["traces"]))
            if emit is not None:
                emit(row)

        def on_progress(k: int, it: int, total: int, idx=idx) -> None:
            if progress is not None:
                progress(plans[idx[k]].name, it, total)

        try:
            opts = {"trace": True} if traces is not None else {}
            run_cases_local("sockets", [(plans[i], seed, opts) for i in idx], iters=iters, warmup=warmup,
                            timeout=timeout, on_case=on_case, on_progress=on_progress)
        except RuntimeFault as e:
            for i in idx:
                if i not in rows:
                    rows[i] = dict(_row(plans[i], "sockets", iters), verified=False, error=str(e))
                    if emit is not None:
                        emit(rows[i])
    return [rows[i] for i in range(len(plans))]


def _checked_row(plan, backend: str, iters: int, seed: int, res, outputs) -> dict:
    """The result row of one run: ``outputs`` (arrays or block readers) checked against the
    inputs drawn from ``seed``."""
    from .backends.reference import check_seeded

    row = _row(plan, backend, iters)
    try:
        row["check"] = check_seeded(plan, seed, outputs)
    except RuntimeFault as e:
        row.update(verified=False, error=str(e))
        return row
    rss = [m for m in res.detail.get("rank_maxrss", ()) if m]
    if rss:  # the largest rank's peak resident set by the end of this collective (--json)
        row["rank_peak_rss_bytes"] = max(rss)
    med, best = statistics.median(res.times), min(res.times)
    algbw = plan.size_bytes / med if med > 0 else 0.0
    row.update(
        verified=True, time_median_s=med, time_min_s=best, times_s=list(res.times),
        algbw_Bps=algbw, busbw_Bps=algbw * busbw_factor(plan.kind, plan.n),
    )
    return row


def write_trace(path: str, traces: list, model: CostModel) -> None:
    """Write the measured runs ``traces`` (``(plan, records)`` each) as one Perfetto trace at
    ``path`` (atomically), each beside its prediction under ``model``
    (:func:`hcc.ir.viz.measured_trace`)."""
    from .compiler.cost import simulate
    from .ir import viz
    from .ir.files import atomic_write_text

    runs = [(plan, records, simulate(plan, model=model, detail=True)) for plan, records in traces]
    atomic_write_text(path, json.dumps(viz.measured_trace(runs)))


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


_HEADER = ["collective", "backend", "ranks", "size", "chunk", "iters", "median", "min", "algbw", "busbw",
           "predicted", "bound", "check", "verified"]
# widths fixed before the first row is known (the longest each formatter writes: "476 MiB",
# "123.456 ms", "12.345 GB/s", "int8 ≤ 0.0157"); a longer cell only shifts its own row
_WIDTHS = {"backend": 7, "ranks": 5, "size": 9, "chunk": 9, "iters": 5, "median": 10, "min": 10, "algbw": 11,
           "busbw": 11, "predicted": 10, "bound": 10, "check": 13, "verified": 16}


def _cells(r: dict) -> list[str]:
    return [
        r["name"], r["backend"], str(r["ranks"]), _fmt_size(r["size_bytes"]), _fmt_size(r["chunk_bytes"]),
        str(r["iters"]),
        _fmt_s(r.get("time_median_s", 0)), _fmt_s(r.get("time_min_s", 0)), _fmt_bw(r.get("algbw_Bps", 0)),
        _fmt_bw(r.get("busbw_Bps", 0)), _fmt_s(r["predicted_s"]), _fmt_s(r["bound_s"]), r.get("check", "-"),
        "verified: ok" if r["verified"] else "verified: FAILED",
    ]


class _Table:
    """The run table printed a row at a time, as each collective is checked."""

    def __init__(self, names: list[str], out=None):
        self.out = out if out is not None else sys.stdout
        self.widths = [max(len(h), max(map(len, names), default=0) if i == 0 else _WIDTHS.get(h, 0))
                       for i, h in enumerate(_HEADER)]
        self._line(_HEADER)
        self._line(["-" * w for w in self.widths])

    def _line(self, cells: list[str]) -> None:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, self.widths))),
              file=self.out, flush=True)

    def row(self, r: dict) -> None:
        self._line(_cells(r))


def _table(rows: list[dict]) -> str:
    """The whole table at once (rows, then each failure's error)."""
    import io

    buf = io.StringIO()
    t = _Table([r["name"] for r in rows], buf)
    for r in rows:
        t.row(r)
    out = [buf.getvalue().rstrip("\n")]
    for r in rows:
        if not r["verified"]:
            out.append(f"{r['name']}: error: {r['error']}")
    return "\n".join(out)


def cmd_run(args) -> int:
    if args.iters < 1 or args.warmup < 0:
        raise RuntimeFault("--iters must be >= 1 and --warmup >= 0")
    from .commands import cost_model
    from .compiler.cost import describe_model
    from .compiler.progress import StderrProgress, listening

    model = cost_model(args, base=RUN_MODELS[run_model_key(args.backend, args.netem)])
    status = StderrProgress()
    try:
        with listening(status):
            plans = load_plans(args.file, args.collective, netem=args.netem, model=model)
    finally:
        status.close()
    table = None if args.json else _Table([p.name for p in plans])
    done = [0]

    def emit(row: dict) -> None:
        done[0] += 1
        status.close()
        if table is not None:
            table.row(row)

    def progress(name: str, it: int, total: int) -> None:
        status(name, "run", f"collective {done[0] + 1} of {len(plans)}, iteration", it + 1, total)

    traces = [] if getattr(args, "trace", None) else None
    if traces is not None and args.backend == "ray":
        raise RuntimeFault("--trace records sockets and mpi runs, not ray")
    try:
        if args.backend == "sockets" and not args.netem:
            rows = _run_batch_sockets(plans, args.iters, args.warmup, args.timeout, args.seed, emit, progress,
                                      traces)
        else:
            rows = []
            for p in plans:
                status(p.name, "run", f"collective {done[0] + 1} of {len(plans)} on {args.backend}", None, None)
                rows.append(run_and_check(p, args.backend, args.iters, args.warmup, args.timeout, args.seed,
                                          args.netem, traces))
                emit(rows[-1])
    finally:
        status.close()
    if traces:
        write_trace(args.trace, traces, model)
    elif traces is not None:
        print(f"hcc run: no trace written: no collective finished on every rank", file=sys.stderr)
    for r in rows:
        r["per_message_us"] = model.per_message_s * 1e6
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            if not r["verified"]:
                print(f"{r['name']}: error: {r['error']}")
        given = any(getattr(args, k, None) is not None for k in ("per_message_us", "reduce_GBps", "copy_GBps"))
        print(f"predicted with {describe_model(model)} ({'as given' if given else args.backend + ' default'})")
    failed = [r for r in rows if not r["verified"]]
    if failed and args.json:
        for r in failed:
            print(f"hcc run: {r['name']}: error: {r['error']}", file=sys.stderr)
    return 1 if failed else 0
