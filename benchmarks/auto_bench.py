"""What `hcc compile` gives for every collective kind (issue 17's target matrix): per topology,
kind and size, the plan `algorithm = auto` picks and its efficiency (bound / predicted, the
bound `hcc compile` reports), by the project's cost model.

    .venv/bin/python benchmarks/auto_bench.py                      # → benchmarks/results/auto.csv
    .venv/bin/python benchmarks/auto_bench.py --only nvswitch --kinds broadcast --append   # those rows again
    .venv/bin/python benchmarks/auto_bench.py --table              # the markdown table of the CSV

Topologies: schedule_bench.py's (DGX-1 and four fragments of 4-7 GPUs, two and four A100
servers, one and two MI250 nodes, samples/hetero.hcl's two, samples/nvswitch.hcl, two random
heterogeneous graphs), each kind compiled alone at each size (MiB, float32, op sum). Unlike
schedule_bench.py, which prices the tree packings' own lowerings, this is the plan a user
gets. CPU seconds per compile are in the CSV.
"""
from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import hcc
from bench_util import write_csv
from schedule_bench import KINDS, topologies

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "auto.csv"
SIZES = ("64MiB", "256MiB", "1GiB")
FIELDS = ("topology", "kind", "size", "algorithm", "efficiency", "predicted_s", "bound_s", "cpu_s")


def compile_one(src: str, topo: str, ranks: str | None, kind: str, size: str, root: str | None = None):
    extra = (f" ranks = {ranks}\n" if ranks else "") + (f" root = {root}\n" if root else "")
    op = " op = sum\n" if kind in ("reduce", "allreduce", "reduce_scatter") else ""
    program = hcc.load(src + f"\ncollective c = {kind} on {topo} {{\n size = {size}\n{extra}{op}}}\n")
    t0 = time.process_time()
    plan = hcc.compile(program, "c")
    return plan, time.process_time() - t0


def table(path: Path) -> str:
    """The markdown table of a CSV this script wrote: one row per topology and kind, the
    algorithm at 256 MiB and the efficiency at each size."""
    rows = list(csv.DictReader(path.open()))
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    cells: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        cells.setdefault((r["topology"], r["kind"]), {})[r["size"]] = r
    out = ["| topology | kind | algorithm @256MiB | " + " | ".join(f"eff@{s}" for s in sizes) + " |",
           "|---|---|---|" + "---|" * len(sizes)]
    for (topo, kind), by in cells.items():
        alg = by.get("256MiB", next(iter(by.values())))["algorithm"]
        effs = " | ".join(f"{float(by[s]['efficiency']):.3f}" if s in by else "" for s in sizes)
        out.append(f"| {topo} | {kind} | {alg} | {effs} |")
    return "\n".join(out)


def merged(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with the rows of every (topology, kind) that ``new`` measured replaced by
    ``new``'s, at the place of the first of them (new pairs at the end).

    >>> old = [dict(topology="a", kind="x", size="1"), dict(topology="b", kind="x", size="1")]
    >>> [(r["topology"], r["size"]) for r in merged(old, [dict(topology="a", kind="x", size="2")])]
    [('a', '2'), ('b', '1')]
    """
    again: dict[tuple[str, str], list[dict]] = {}
    for r in new:
        again.setdefault((r["topology"], r["kind"]), []).append(r)
    out: list[dict] = []
    for r in old:
        key = (r["topology"], r["kind"])
        if key not in again:
            out.append(r)
        elif again[key]:
            out.extend(again[key])
            again[key] = []
    return out + [r for rs in again.values() for r in rs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated topology labels")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("-o", "--output", default=str(RESULTS))
    ap.add_argument("--table", action="store_true", help="print the markdown table of the CSV and exit")
    ap.add_argument("--append", action="store_true",
                    help="keep the CSV's other rows: the (topology, kind) pairs measured again replace theirs in place")
    args = ap.parse_args(argv)
    if args.table:
        print(table(Path(args.output)))
        return 0
    only = set(args.only.split(",")) if args.only else None
    rows = []
    for label, src, name, ranks in topologies():
        if only and label not in only:
            continue
        for kind in args.kinds.split(","):
            line = f"{label:16s} {kind:15s}"
            for size in args.sizes.split(","):
                plan, cpu = compile_one(src, name, ranks, kind, size)
                f = plan.figures
                rows.append(dict(topology=label, kind=kind, size=size, algorithm=plan.algorithm,
                                 efficiency=f.efficiency, predicted_s=f.predicted_s,
                                 bound_s=f.bound_s, cpu_s=round(cpu, 2)))
                line += f" | {size:>7s} {plan.algorithm:18s} {f.efficiency:5.3f}"
            print(line, flush=True)
    if rows:
        if args.append and Path(args.output).exists():
            rows = merged(list(csv.DictReader(Path(args.output).open())), rows)
        write_csv(args.output, FIELDS, rows)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
