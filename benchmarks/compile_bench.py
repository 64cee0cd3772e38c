"""Compile-time benchmark (issue 2, "Speed"): per topology, ranks, compile seconds, trees,
rate/bound, efficiency and the predicted speedup of the plan over the NCCL-style ring priced by
the same cost model.

    .venv/bin/python benchmarks/compile_bench.py            # everything (about a minute)
    .venv/bin/python benchmarks/compile_bench.py --quick    # DGX-1 and the 32-rank cluster only

Targets: DGX-1 any collective < 0.5 s; 32-rank 4x(8 GPU + NVSwitch + 8 NICs) cluster
allgather < 3 s; 256-rank fat tree < 30 s. Writes benchmarks/results/compile.csv.
Compile time is the wall clock of ``hcc.compile`` (bounds, packing, lowering of every
candidate with the chunk-size search, baselines, verification; parsing excluded) and the
CPU time of the process over the same span (library imports are done before timing, and the
packing memo is cleared before each collective, so each packs from scratch): the targets are
judged on CPU seconds, which stay meaningful when other work shares the machine (wall >> CPU
under load). The pass columns show where the time goes.
"""
from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from pathlib import Path

import hcc
from hcc.compiler import treepack
from hcc.compiler.pipeline import compile_unit
from hcc.ir.files import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
# compiles with a target of at most 3 s are timed this many times and the fastest (CPU) is
# reported, as timeit does: on this shared 2-core machine one run of the same deterministic
# compile varied by 20% with the machine's other load; the fat trees are timed once
REPEATS = 3
RESULTS = ROOT / "benchmarks" / "results" / "compile.csv"


def fattree_source(racks: int, per_rack: int, spines: int, size: str = "256 MB") -> str:
    """A two-level fat tree with full bisection: per leaf, per_rack x 12.5 GB/s down and
    spines x (per_rack x 12.5 / spines) GB/s up."""
    up = per_rack * 12.5 / spines
    return f"""
topology fattree{racks * per_rack} {{
    host rack[0..{racks - 1}] {{
        node n[0..{per_rack - 1}]
        switch leaf
        n[0..{per_rack - 1}] <-> leaf : 12.5 GB/s, 1 us
    }}
    switch spine[0..{spines - 1}]
    rack[0..{racks - 1}].leaf <-> spine[0..{spines - 1}] : {up:g} GB/s, 2 us
}}
collective allgather = allgather on fattree{racks * per_rack} {{
    size = {size}
}}
"""


def cases(quick: bool):
    """(label, program source or path, collective names or None for all, target seconds)."""
    yield "dgx1", ROOT / "samples" / "dgx1.hcl", None, 0.5
    yield "cluster-32", ROOT / "samples" / "cluster.hcl", ["allgather"], 3.0
    if not quick:
        yield "fattree-128", ROOT / "samples" / "fattree.hcl", ["allgather"], 30.0
        yield "fattree-256", fattree_source(16, 16, 8), ["allgather"], 30.0


def warm_imports() -> None:
    """Import the solver libraries before any timing: their import (0.4 s of CPU for
    OR-Tools' CP-SAT, GLOP wrapper and networkx) is paid once per process, not per compile."""
    import networkx  # noqa: F401
    from ortools.linear_solver import pywraplp  # noqa: F401
    from ortools.sat.python import cp_model  # noqa: F401


def run(quick: bool) -> list[dict]:
    warm_imports()
    rows = []
    for label, src, names, target in cases(quick):
        program = hcc.load(src)
        for c in program.collectives:
            if names is not None and c.name not in names:
                continue
            best = None
            for _ in range(REPEATS if target <= 3.0 else 1):
                passes: dict[str, float] = {}
                treepack.clear_cache()  # each compile packs from scratch, as `hcc compile -c NAME`
                t0, c0 = time.perf_counter(), time.process_time()
                plan = compile_unit(program, c.name, hook=lambda name, s, u: passes.__setitem__(name, s)).plan
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                if best is None or cpu < best[1]:
                    best = (wall, cpu, passes, plan)
            wall, cpu, passes, plan = best
            f = plan.figures
            rows.append({
                "topology": label,
                "collective": c.name,
                "kind": plan.kind,
                "ranks": plan.n,
                "size_bytes": plan.size_bytes,
                "algorithm": plan.algorithm,
                "trees": len(plan.trees),
                "chunk_bytes": plan.chunk_bytes,
                "compile_s": round(wall, 3),
                "cpu_s": round(cpu, 3),
                "target_s": target,
                "within_target": cpu < target,
                **{f"{k}_s": round(v, 3) for k, v in passes.items() if k in ("bounds", "pack", "lower", "verify")},
                "rate_over_bound": round(f.rate_Bps / f.bound_rate_Bps, 4) if f.bound_rate_Bps else "",
                "efficiency": round(f.efficiency, 4),
                "predicted_s": f.predicted_s,
                "ring_predicted_s": f.ring_predicted_s,
                "speedup_over_ring": round(f.ring_predicted_s / f.predicted_s, 3) if f.ring_predicted_s else "",
            })
            print(f"  {label:12s} {c.name:22s} {wall:7.3f} s", file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="DGX-1 and the 32-rank cluster only")
    ap.add_argument("-o", "--output", default=str(RESULTS))
    args = ap.parse_args(argv)
    rows = run(args.quick)
    cols = ["topology", "collective", "ranks", "algorithm", "trees", "compile_s", "cpu_s", "target_s",
            "pack_s", "lower_s", "verify_s", "rate_over_bound", "efficiency", "speedup_over_ring"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in cols))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows(rows)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, buf.getvalue())
    print(f"wrote {args.output}")
    missed = [r for r in rows if not r["within_target"]]
    for r in missed:
        print(f"MISSED target: {r['topology']} {r['collective']} {r['cpu_s']} CPU s >= {r['target_s']} s")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
