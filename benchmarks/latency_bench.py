"""The latency-aware bound beside the cut bound (issue 17): for each topology, collective and size,
both bounds and what ``hcc compile`` (algorithm = auto) predicts, priced by the project's cost
model (1 us per message, 1 us per link unless the source declares a latency).

    .venv/bin/python benchmarks/latency_bench.py                     # compile where the bounds differ
    .venv/bin/python benchmarks/latency_bench.py --compile-all       # every row (slow: ~1 min a row)
    .venv/bin/python benchmarks/latency_bench.py --only nvswitch,dgx1 --sizes 256MB --kinds broadcast

Columns: ``cut`` = the cut bound (``bound_s``); ``lat`` = bounds.latency_bound (fixed-chunk
pipelines: every message between half a chunk and a chunk, for any chunk size), at least the
cut bound; ``lat/cut``: the most any such plan can reach of the cut bound; ``eff`` = cut /
predicted; ``eff_lat`` = lat / predicted; ``hops``: message times the last byte still needs
past the cut; ``chunk``: the chunk size where the latency bound is least. The bounds cost
milliseconds; a row is compiled (``pred``, ``eff``, ``eff_lat``) only where ``lat/cut`` is
below ``--compile-below`` (elsewhere ``eff_lat`` = ``eff`` x ``lat/cut`` differs from the
compile table's efficiency by less than that) unless ``--compile-all``. Topologies as
benchmarks/schedule_bench.py builds them (DGX-1 and its fragments, A100 and MI250 nodes,
samples/nvswitch.hcl). Writes benchmarks/results/latency_bound.csv after every row.
"""
from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from pathlib import Path

import hcc
from hcc.compiler import bounds
from hcc.compiler.cost import DEFAULT_MODEL
from hcc.compiler.pipeline import Bounds, Unit, compile_unit
from hcc.ir.files import atomic_write_text

from schedule_bench import parse_size, topologies

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "latency_bound.csv"
KINDS = ("broadcast", "reduce", "allgather", "reduce_scatter", "allreduce")
DEFAULT = ("dgx1", "dgx1:0123", "dgx1:03457", "dgx1:012456", "dgx1:1234567", "a100x2", "a100x4",
           "mi250x1", "mi250x2", "nvswitch")


def load(src: str, topo: str, ranks: str | None, kind: str, size: int):
    extra = f" ranks = {ranks}\n" if ranks else ""
    op = " op = sum\n" if kind in ("reduce", "allreduce", "reduce_scatter") else ""
    n = ranks.count(",") + 1 if ranks else len(hcc.load(src).topologies[topo].nodes)
    size -= size % (4 * n)  # whole float32 elements per rank
    return hcc.load(src + f"\ncollective c = {kind} on {topo} {{\n size = {size} B\n{extra}{op}}}\n")


def bounds_row(program) -> dict:
    """The cut bound (bound_s as the Bounds pass computes it) and the latency-aware bound."""
    spec = program.collectives[0]
    topo = program.topology_of(spec)
    u = Bounds().apply(Unit(program=program, spec=spec, topology=topo, model=DEFAULT_MODEL))
    root = spec.ranks[spec.root] if spec.root >= 0 else None
    cut = bounds.binding_cut(spec.kind, topo, spec.ranks, root, spec.size_bytes)
    lb = bounds.latency_bound(spec.kind, topo, spec.ranks, root, spec.size_bytes, DEFAULT_MODEL.per_message_s,
                              cut=cut, itemsize=4)
    return {"cut_s": u.bound_s, "lat_s": max(u.bound_s, lb.time_s), "hops": lb.hops, "chunk": lb.chunk_bytes,
            "hop_s": lb.hop_s, "rate_s": lb.rate_s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(DEFAULT))
    ap.add_argument("--sizes", default="64MB,256MB,1GB")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--compile-below", type=float, default=0.995)
    ap.add_argument("--compile-all", action="store_true")
    ap.add_argument("--csv", default=str(RESULTS))
    a = ap.parse_args(argv)
    only = a.only.split(",")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    kinds = a.kinds.split(",")
    rows: list[dict] = []
    print(f"{'topology':14s} {'kind':15s} {'size':>6s} {'cut':>9s} {'lat':>9s} {'lat/cut':>7s} {'pred':>9s} "
          f"{'eff':>6s} {'eff_lat':>7s} {'hops':>4s} {'chunk':>9s}", flush=True)
    for label, src, topo, ranks in topologies():
        if label not in only:
            continue
        for kind in kinds:
            for size in sizes:
                program = load(src, topo, ranks, kind, size)
                r = bounds_row(program)
                row = {"topology": label, "kind": kind, "size_bytes": program.collectives[0].size_bytes, **r,
                       "lat_over_cut": r["cut_s"] / r["lat_s"], "predicted_s": "", "eff": "", "eff_lat": "",
                       "cpu_s": ""}
                if a.compile_all or row["lat_over_cut"] < a.compile_below:
                    t0 = time.process_time()
                    pred = compile_unit(program, "c").plan.figures.predicted_s
                    row.update(predicted_s=pred, eff=r["cut_s"] / pred, eff_lat=r["lat_s"] / pred,
                               cpu_s=time.process_time() - t0)
                rows.append(row)
                cell = (lambda k, f: f.format(row[k]) if row[k] != "" else "-")
                print(f"{label:14s} {kind:15s} {size / 1e6:5.0f}M {r['cut_s'] * 1e3:8.4f}m {r['lat_s'] * 1e3:8.4f}m "
                      f"{row['lat_over_cut']:7.3f} {cell('predicted_s', '{:.4e}'):>9s} {cell('eff', '{:.3f}'):>6s} "
                      f"{cell('eff_lat', '{:.3f}'):>7s} {r['hops']:4d} {r['chunk'] / 2 ** 20:8.2f}M", flush=True)
                buf = io.StringIO()
                w = csv.DictWriter(buf, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
                atomic_write_text(a.csv, buf.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
