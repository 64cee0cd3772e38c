"""hcc.commands — ``hcc check | compile | viz | simulate`` (flags are defined in hcc/cli.py).

Each command returns an exit status and raises typed errors for the CLI to render:
SourceError/PlanError (bad input, exit 2), HccError (a failed run, exit 1).

``hcc compile -o PLAN.json`` writes exactly one plan (the format ``Plan.load`` reads): with a
program of several collectives it needs ``-c NAME``. Every collective is compiled and
verified before the file is written, atomically, so a failing compile leaves no file.

Cost model: ``hcc compile`` and ``hcc simulate`` price plans with the compiler's
``CostModel`` (compiler/cost.py: 1 us per message, free local reductions and copies) unless
``--per-message-us``, ``--reduce-GBps`` or ``--copy-GBps`` say otherwise. The chunk search
minimises the predicted time under that model, so a costlier message gives larger chunks
(fewer messages) and a longer prediction. Both print the model they used. A plan file does
not record its model: ``hcc simulate plan.json`` prices it with the flags given (the chunk
is the one it was compiled with).
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from .grammar.diagnostics import Source, SourceError, Span
from .ir.files import atomic_write_text
from .ir.plan import Plan
from .ir.serialize import summary

__all__ = ["cmd_check", "cmd_compile", "cmd_viz", "cmd_simulate", "cost_model", "explain", "human_bytes",
           "human_time", "human_rate"]


# ---------------------------------------------------------------- human units
def human_bytes(b: float) -> str:
    """Bytes in binary units.

    >>> human_bytes(500e6), human_bytes(4096), human_bytes(100)
    ('476.8 MiB', '4 KiB', '100 B')
    """
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            v = b / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(b)} B"


def human_time(s: float) -> str:
    """Seconds in the unit that keeps 3-4 significant digits.

    >>> human_time(0.0123), human_time(2.5e-5), human_time(3.0)
    ('12.30 ms', '25.00 us', '3.000 s')
    """
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.2f} us"
    return f"{s * 1e9:.1f} ns"


def human_rate(bps: float) -> str:
    """Bytes per second in decimal units, as link speeds are quoted.

    >>> human_rate(150e9), human_rate(12.5e6)
    ('150.0 GB/s', '12.5 MB/s')
    """
    if not math.isfinite(bps):
        return "inf"
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} B/s"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


# ---------------------------------------------------------------- loading
def _load_program(path: str):
    from .compiler.frontend import load_program

    return load_program(path)


def _is_plan_file(path: str) -> bool:
    return path.endswith(".json")


def _cmdline_error(text: str, col: int, width: int, message: str) -> SourceError:
    return SourceError(Span(Source("<command line>", text), 1, col, 1, col + width), message)


def cost_model(args, base=None):
    """The cost model a command uses: ``base`` (default: the compiler's, 1 us per message)
    with whatever of ``--per-message-us``, ``--reduce-GBps``, ``--copy-GBps`` was given.
    A negative or non-finite value is bad input (exit 2, pointing at the flag)."""
    from .compiler.cost import DEFAULT_MODEL, model_with

    knobs = {k: getattr(args, k, None) for k in ("per_message_us", "reduce_GBps", "copy_GBps")}
    for k, v in knobs.items():
        if v is not None and not (0 <= v < math.inf):
            flag = "--" + k.replace("_", "-")
            raise _cmdline_error(f"{flag} {v}", len(flag) + 2, len(str(v)), f"{flag} must be a finite number >= 0")
    return model_with(base or DEFAULT_MODEL, **knobs)


def _plans_for(args, model=None) -> list[Plan]:
    """The plans a viz/simulate command works on: a plan.json, or compiled from a .hcl
    (with ``model``, the compiler's default cost model when None)."""
    if _is_plan_file(args.file):
        from .ir.serialize import load

        plan = load(args.file)
        name = getattr(args, "collective", None)
        if name and name != plan.name:
            raise _cmdline_error(f"-c {name}", 4, len(name),
                                 f"{args.file} holds collective {plan.name!r}, not {name!r}")
        return [plan]
    from .compiler.cost import DEFAULT_MODEL
    from .compiler.pipeline import compile_unit

    program = _load_program(args.file)
    return [compile_unit(program, getattr(args, "collective", None), model=model or DEFAULT_MODEL).plan]


# ---------------------------------------------------------------- check
def cmd_check(args) -> int:
    program = _load_program(args.file)
    print(f"{args.file}: ok ({len(program.topologies)} topologies, {len(program.collectives)} collectives)")
    return 0


# ---------------------------------------------------------------- compile
def _model_fields(model) -> dict:
    """The cost model of a JSON row, in the flags' units."""
    return {"per_message_us": model.per_message_s * 1e6, "reduce_GBps": model.reduce_Bps / 1e9,
            "copy_GBps": model.copy_Bps / 1e9}


def _json_safe(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def cmd_compile(args) -> int:
    from .compiler.cost import describe_model
    from .compiler.pipeline import compile_unit, resolve

    model = cost_model(args)
    program = _load_program(args.file)
    if args.collective:
        names = [resolve(program, args.collective).name]
    else:
        names = [c.name for c in program.collectives]
    if args.output and len(names) != 1:
        raise _cmdline_error(
            f"-o {args.output}", 4, len(args.output),
            f"-o writes one plan but {args.file} declares {len(names)} collectives "
            f"({', '.join(names)}); choose one with -c NAME",
        )
    header = ["collective", "kind", "ranks", "size", "algorithm", "trees", "chunk", "predicted",
              "bound", "msg bound", "lat bound", "eff", "algbw", "busbw", "NCCL-like", "vs NCCL-like", "compile"]
    # compressed plans: their wire bytes and the predicted speedup over the best exact plan
    lossy = any(c.compress != "none" for c in program.collectives if c.name in names)
    if lossy:
        header[5:5] = ["compress", "wire", "vs exact"]
    # each collective's row is printed as soon as it is compiled (a 1024-rank program takes
    # minutes), in columns sized in advance; compiles past 2 s report progress on stderr
    table = None if args.json else _RowStream(header, names, [c.kind for c in program.collectives if c.name in names])
    from .compiler.progress import StderrProgress, listening

    plans = []
    status = StderrProgress()
    with listening(status):
        for n in names:
            try:
                plan = compile_unit(program, n, model=model).plan
            finally:
                status.close()
            if table is not None:
                table.row(_row(plan, lossy))
            if not args.output:
                # the table, --json and the explanations read figures only: a 1024-rank plan's
                # millions of ops are let go before the next collective compiles
                plan = replace(plan, programs=tuple(() for _ in plan.programs))
            plans.append(plan)
    if args.output:
        atomic_write_text(args.output, plans[0].to_json())
    if args.json:
        rows = [{**{k: _json_safe(v) for k, v in summary(p).items()}, **_model_fields(model)} for p in plans]
        print(json.dumps(rows, indent=2))
        return 0
    print(f"cost model: {describe_model(model)}")
    print("NCCL-like: the fastest of the single ring, NCCL's multi-channel rings (x the channels its search "
          "found), the double binary tree and recursive doubling, priced by the same model")
    print()
    print("why: the bound is the time the named cut's links need; predicted = bandwidth bound + load above it "
          "on the bottleneck link + pipeline fill + per-message cost + contention (docs/plan-format.md)")
    for p in plans:
        print(explain(p))
    if args.output:
        print(f"wrote {args.output}")
    return 0


# widths of the compile table's columns, fixed before the first row is known (the longest
# each human_* formatter writes, e.g. "476.8 MiB", "12.30 ms", "150.0 GB/s"); a longer cell
# only shifts the rest of its own row
_WIDTHS = {"ranks": 5, "size": 9, "algorithm": 13, "trees": 5, "chunk": 9, "predicted": 9, "bound": 9,
           "msg bound": 9, "lat bound": 9,
           "eff": 5, "algbw": 10, "busbw": 10, "NCCL-like": 19, "vs NCCL-like": 12, "compile": 9,
           "compress": 8, "wire": 9, "vs exact": 8}


class _RowStream:
    """The compile table printed a row at a time: header first, then each row as it comes."""

    def __init__(self, header: list[str], names: list[str], kinds: list[str]):
        fixed = {"collective": max(map(len, names), default=0), "kind": max(map(len, kinds), default=0)}
        self.widths = [max(len(h), fixed.get(h, _WIDTHS.get(h, 0))) for h in header]
        self._line(header)
        self._line(["-" * w for w in self.widths])

    def _line(self, cells: list[str]) -> None:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, self.widths))),
              flush=True)

    def row(self, cells: list[str]) -> None:
        self._line(cells)


def _row(p: Plan, lossy: bool) -> list[str]:
    """One plan's cells of the compile table."""
    f = p.figures
    row = [
        p.name, p.kind, str(p.n), human_bytes(p.size_bytes), p.algorithm, str(len(p.trees)),
        human_bytes(p.chunk_bytes), human_time(f.predicted_s), human_time(f.bound_s),
        human_time(f.message_bound_s) if f.message_bound_s else "-",
        human_time(f.latency_bound_s) if f.latency_bound_s else "-", f"{f.efficiency:.3f}", human_rate(f.algbw_Bps), human_rate(f.busbw_Bps),
        (f.baseline + (f"x{f.ring_channels}" if f.baseline == "rings" else "")
         + f" {human_time(f.baseline_predicted_s)}") if f.baseline_predicted_s else "-",
        f"{f.baseline_predicted_s / f.predicted_s:.2f}x" if f.baseline_predicted_s and f.predicted_s else "-",
        human_time(f.compile_s),
    ]
    if lossy:
        row[5:5] = [p.compress, human_bytes(f.wire_bytes),
                    f"{f.exact_predicted_s / f.predicted_s:.2f}x" if f.exact_predicted_s else "-"]
    return row


def _names(items: list[str], limit: int = 6) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", +{len(items) - limit} more" if len(items) > limit else "")


def explain(plan: Plan) -> str:
    """Two or three lines on why ``plan`` is as fast as it is: the cut that sets its bound
    (vertex set and links, in the source's names), the packing's rate, and the predicted
    time's breakdown (compiler/pipeline.py ``breakdown``)."""
    f = plan.figures
    lines = [f"  {plan.name}:"]
    if f.cut_direction:
        way = "out of" if f.cut_direction == "out" else "into"
        lines.append(f"    bound {human_time(f.bandwidth_bound_s)}: {f.cut_note}; "
                     f"S = {{{_names(list(f.cut_vertices))}}} ({len(f.cut_vertices)} vertices), "
                     f"{len(f.cut_links)} links {way} S, {human_rate(f.cut_capacity_Bps)}: "
                     f"{_names([f'{a}->{b}' for a, b in f.cut_links])}")
    else:
        lines.append(f"    bound {human_time(f.bound_s)}")
    if f.pack_rate_Bps:
        rel = "= bound" if f.pack_rate_Bps >= f.bound_rate_Bps * (1 - 1e-6) else \
            f"{f.pack_rate_Bps / f.bound_rate_Bps:.3f} of the bound {human_rate(f.bound_rate_Bps)}"
        pack = f"packing {human_rate(f.pack_rate_Bps)} ({rel}); "
    else:
        pack = ""
    if f.bottleneck_link:
        ms = lambda s: "0" if abs(s) < 1e-12 else f"{s * 1e3:.3g}"  # float noise of the sums
        lines.append(f"    {pack}predicted {human_time(f.predicted_s)} = bound {ms(f.bandwidth_bound_s)} "
                     f"+ load {ms(f.load_s)} + fill {ms(f.fill_s)} + per-message {ms(f.message_s)} "
                     f"+ contention {ms(f.contention_s)} ms; bottleneck link "
                     f"{f.bottleneck_link[0]}->{f.bottleneck_link[1]}")
    elif pack:
        lines.append(f"    {pack.rstrip('; ')}")
    if f.latency_bound_s:
        lines.append("    " + _latency_line(f))
    return "\n".join(lines)


def _latency_line(f) -> str:
    """The latency-aware bound with its arithmetic (compiler/bounds.py ``latency_bound``)."""
    ms = lambda s: f"{s * 1e3:.4g}"
    head = (f"lat bound {human_time(f.latency_bound_s)} for fixed-chunk pipelines (every message between half a "
            f"chunk and a chunk; the plan runs at {f.latency_bound_s / f.predicted_s:.3f} of it): "
            f"least at {human_bytes(int(f.latency_chunk_bytes))} chunks, where the cut's links take "
            f"{ms(f.latency_rate_s)} ms")
    if f.latency_hops:
        tail = (f", then the last byte to cross needs {f.latency_hops} more message time(s) of >= "
                f"{f.latency_hop_s * 1e6:.3g} us (latency + per-message cost + half a chunk / link) to reach "
                f"the {f.latency_beyond} ranks beyond over {f.latency_fanout} cut link(s), <= "
                f"{f.latency_degree} link(s) per rank: {ms(f.latency_rate_s)} + {f.latency_hops} x "
                f"{f.latency_hop_s * 1e3:.3g} ms")
    else:
        tail = " (no hop after the cut binds: one rank beyond it per cut link, or a kind without that tail)"
    return head + tail


# ---------------------------------------------------------------- viz
# hcc viz's format when --format is not given, by the output's suffix (dot for any other)
VIZ_SUFFIXES = {".png": "png", ".svg": "svg", ".json": "trace"}


def cmd_viz(args) -> int:
    from .ir import viz

    plan = _plans_for(args)[0]
    out = Path(args.output)
    fmt = args.format or VIZ_SUFFIXES.get(out.suffix.lower(), "dot")
    if fmt == "dot":
        atomic_write_text(out, viz.to_dot(plan))
    elif fmt == "trace":
        # viz draws timings it is given (ir imports nothing from the compiler); the CLI runs them
        from .compiler.cost import simulate

        atomic_write_text(out, json.dumps(viz.to_trace(plan, simulate(plan, detail=True))))
    else:
        viz.draw(plan, out, fmt=fmt)
    print(f"wrote {out} ({fmt})")
    return 0


# ---------------------------------------------------------------- simulate
def cmd_simulate(args) -> int:
    from .compiler.cost import describe_model, simulate

    model = cost_model(args)
    plan = _plans_for(args, model)[0]
    sim = simulate(plan, model=model)
    if args.json:
        print(json.dumps({
            "name": plan.name,
            "kind": plan.kind,
            "chunk_bytes": plan.chunk_bytes,
            **_model_fields(model),
            "predicted_s": sim.time,
            "messages": sim.messages,
            "wire_bytes": sim.wire_bytes,
            "ranks": [{"rank": r, "vertex": plan.ranks[r], "finish_s": t} for r, t in enumerate(sim.rank_finish)],
            "links": [{"src": l.src, "dst": l.dst, "capacity_Bps": l.capacity, "bytes": l.bytes,
                       "busy_s": l.busy_s, "utilisation": l.utilisation} for l in sim.links],
        }, indent=2))
        return 0
    d = sim.digest(limit=8)  # every rank and link when few, else quantiles and the extremes
    print(f"{plan.name} ({plan.kind}, {plan.n} ranks, {human_bytes(plan.size_bytes)}, {plan.algorithm}): "
          f"predicted {human_time(sim.time)}, {sim.messages} messages, {human_bytes(sim.wire_bytes)} on the wire")
    print(f"cost model: {describe_model(model)}; chunk {human_bytes(plan.chunk_bytes)}")
    print()
    if d.truncated:
        print("rank finish: " + ", ".join(f"{k} {human_time(t)}" for k, t in d.finish_quantiles))
        print(f"latest {len(d.ranks)} of {d.n_ranks} ranks:")
    print(_table(["rank", "vertex", "finish"], [[str(r), plan.ranks[r], human_time(t)] for r, t in d.ranks]))
    print()
    if d.truncated:
        print(f"{d.n_links} links used; utilisation: " + ", ".join(
            f"<={100 * e:.0f}%: {k}" for e, k in d.utilisation))
        print(_table(["capacity", "links", "mean util", "max util"],
                     [[human_rate(c), str(k), f"{100 * m:.1f}%", f"{100 * x:.1f}%"]
                      for c, k, m, x in d.by_capacity]))
        print()
        print(f"busiest {len(d.links)} links:")
    print(_table(["link", "capacity", "bytes", "busy", "utilisation"],
                 [[f"{l.src}->{l.dst}", human_rate(l.capacity), human_bytes(l.bytes), human_time(l.busy_s),
                   f"{100 * l.utilisation:.1f}%"] for l in d.links]))
    return 0
