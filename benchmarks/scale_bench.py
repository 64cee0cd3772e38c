"""Past one machine, by simulation (issue 6): predicted busbw of hcc against NCCL-style ring
and double binary tree on a 1024-rank fat tree and on 64 DGX-1s over a 100 Gbit/s fabric,
with the compiler's bound and its compile time.

    .venv/bin/python benchmarks/scale_bench.py                          # both, 1 16 256 1024 MiB
    .venv/bin/python benchmarks/scale_bench.py --topologies dgx1x64 --sizes 16
    .venv/bin/python benchmarks/scale_bench.py --plot-only              # PNG from the CSV
    .venv/bin/python benchmarks/scale_bench.py --samples                # `hcc compile` of each sample

``--samples`` runs ``hcc compile --json -c NAME samples/<topology>.hcl`` (the verifier on,
as a user would) in a child process per collective and reports its wall and CPU seconds and
its peak resident memory (``wait4``'s ``ru_maxrss``) against issue 17's targets, 60 CPU s and
4 GiB, with the plan chosen and its efficiency against its own bound and against the
reduce-scatter + allgather bound (:func:`rsag_bound_s`); the compile's own progress lines
pass through on stderr. Rows go to benchmarks/results/scale_compile.csv.

Topologies: samples/fattree1024.hcl (32 racks x 32 nodes, 100 Gbit/s node links, 16 spines,
full bisection) and samples/dgx1x64.hcl (64 DGX-1s: NVLink cube-mesh inside, 4 x 100 Gbit/s
EDR NICs per server on one non-blocking fabric switch). Collective: the sample's
``allreduce`` (float32, sum), its size replaced by each ``--sizes`` entry.

Each case is one ``compile_unit`` (hcc's pipeline, ``algorithm = auto``): it lowers hcc's
tree-packing candidates and the NCCL-style ``ring`` and ``tree`` (double binary tree)
baselines, each at the chunk size that minimises its predicted time, and prices every one
with the same event-driven cost model (``compiler.cost.simulate``); nothing is priced by a
formula. Columns:
- ``hcc_*``: the plan ``auto`` selects (which may be a baseline: ``hcc_algorithm`` says);
  ``treepack_*``: the best of hcc's own tree-packing candidates, whether selected or not;
  ``ring_*``, ``dbtree_*``: the baselines as lowered and simulated in the same compile.
- busbw = size / time x 2(n-1)/n (nccl-tests' allreduce factor); ``bound_busbw`` is the same
  figure at the compiler's lower bound (cut bound + least link latency), an upper limit for
  every plan's busbw.
- ``compile_s`` / ``cpu_s``: wall and CPU seconds of the whole compile (bounds, packing,
  lowering and simulating every candidate at every chunk size tried, verification unless
  ``--no-verify``: ``verified`` says; the symbolic check prices nothing and costs as much
  as the lowering at 1024 ranks). The
  packing memo is cleared before each case unless ``--warm`` (packings do not depend on the
  size, so a warm run measures what a second size costs).

Writes benchmarks/results/scale.csv (one row per case, appended as each finishes, so an
interrupted run keeps its rows) and scale.png (busbw against size, one panel per topology),
and prints the markdown table.
"""
from __future__ import annotations

import argparse
import csv
import io
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MiB = 1 << 20
TOPOLOGIES = {
    "fattree1024": ROOT / "samples" / "fattree1024.hcl",
    "dgx1x64": ROOT / "samples" / "dgx1x64.hcl",
}
FIELDS = ["topology", "ranks", "kind", "size_bytes", "bound_s", "bound_busbw_GBps",
          "hcc_algorithm", "hcc_s", "hcc_busbw_GBps", "hcc_chunk", "efficiency",
          "treepack_algorithm", "treepack_s", "treepack_busbw_GBps", "treepack_trees",
          "ring_s", "ring_busbw_GBps", "ring_chunk", "dbtree_s", "dbtree_busbw_GBps", "dbtree_chunk",
          "speedup_over_ring", "speedup_over_dbtree", "pack_method", "pack_gap",
          "compile_s", "cpu_s", "pack_s", "lower_s", "verify_s", "verified"]


def busbw(kind: str, n: int, size: float, t: float) -> float:
    from hcc.compiler.pipeline import BUSBW_FACTOR

    return size / t * BUSBW_FACTOR[kind](n) / 1e9 if t > 0 else math.inf


def run_case(label: str, size: int, kind: str, warm: bool, verify: bool = True) -> dict:
    import hcc
    from hcc.compiler import treepack
    from hcc.compiler.pipeline import PASSES, Unit, compile_unit, run_passes

    program = hcc.load(str(TOPOLOGIES[label]))
    spec = next(c for c in program.collectives if c.kind == kind)
    program = replace(program, collectives=(replace(spec, size_bytes=size),))
    if not warm:
        treepack.clear_cache()
    passes: dict[str, float] = {}
    hook = lambda name, s, _u: passes.__setitem__(name, s)  # noqa: E731
    t0, c0 = time.perf_counter(), time.process_time()
    if verify:
        u = compile_unit(program, spec.name, hook=hook)
    else:  # the same passes without the symbolic verification (it prices nothing)
        s = program.collectives[0]
        u = run_passes(Unit(program=program, spec=s, topology=program.topology_of(s)),
                       tuple(p for p in PASSES if p.name != "verify"), hook)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n = len(spec.ranks)
    f = u.plan.figures
    cand = {c.algorithm: c for c in u.candidates}
    tp = min((c for c in u.candidates if c.algorithm.startswith("treepack")), key=lambda c: c.predicted_s,
             default=None)
    ring, tree = cand.get("ring"), cand.get("tree")
    role = {"treepack": "trees", "treepack-rsag": "rsag"}.get(tp.algorithm) if tp else None
    pk = u.packing(role) if role else None
    row = {
        "topology": label, "ranks": n, "kind": kind, "size_bytes": size,
        "bound_s": f.bound_s, "bound_busbw_GBps": busbw(kind, n, size, f.bound_s),
        "hcc_algorithm": u.plan.algorithm, "hcc_s": f.predicted_s,
        "hcc_busbw_GBps": busbw(kind, n, size, f.predicted_s), "hcc_chunk": u.plan.chunk_bytes,
        "efficiency": f.efficiency,
        "treepack_algorithm": tp.algorithm if tp else "",
        "treepack_s": tp.predicted_s if tp else "",
        "treepack_busbw_GBps": busbw(kind, n, size, tp.predicted_s) if tp else "",
        "treepack_trees": len(tp.choice.plan.trees) if tp else "",
        "ring_s": ring.predicted_s if ring else "",
        "ring_busbw_GBps": busbw(kind, n, size, ring.predicted_s) if ring else "",
        "ring_chunk": ring.choice.chunk_bytes if ring else "",
        "dbtree_s": tree.predicted_s if tree else "",
        "dbtree_busbw_GBps": busbw(kind, n, size, tree.predicted_s) if tree else "",
        "dbtree_chunk": tree.choice.chunk_bytes if tree else "",
        "speedup_over_ring": ring.predicted_s / f.predicted_s if ring else "",
        "speedup_over_dbtree": tree.predicted_s / f.predicted_s if tree else "",
        "pack_method": pk.method if pk else "", "pack_gap": pk.gap if pk else "",
        "compile_s": wall, "cpu_s": cpu, "verified": verify,
        **{f"{k}_s": passes.get(k, 0.0) for k in ("pack", "lower", "verify")},
    }
    return row


# issue 17: each 1024-rank sample compiles in at most this long and this much memory
SAMPLE_TARGET_S = 60.0
SAMPLE_TARGET_BYTES = 4 << 30
SAMPLE_FIELDS = ["sample", "collective", "ranks", "exit", "wall_s", "cpu_s", "peak_rss_bytes", "algorithm",
                 "chunk_bytes", "predicted_s", "bound_s", "efficiency", "rsag_bound_s", "efficiency_vs_rsag",
                 "pack_over_bound", "within_targets"]


def rsag_bound_s(label: str, collective: str) -> float:
    """The reduce-scatter + allgather bound of an allreduce (bounds.py's two cut bounds
    added, plus the least link latency, as the pipeline's bound adds it); for the other
    kinds the collective's own bound (bounds.time_bound + least latency)."""
    import hcc
    from hcc.compiler import bounds
    from hcc.compiler.cost import least_latency

    prog = hcc.load(str(TOPOLOGIES[label]))
    spec = prog.collective(collective)
    topo, ranks, size = prog.topology_of(spec), spec.ranks, spec.size_bytes
    if spec.kind == "allreduce":
        t = bounds.reduce_scatter_time_bound(topo, ranks, size) + bounds.allgather_time_bound(topo, ranks, size)
    else:
        root = ranks[spec.root] if spec.root >= 0 else None
        t = bounds.time_bound(spec.kind, topo, ranks, root, size)
    return t + least_latency(topo, ranks)


def compile_sample(label: str, collective: str) -> dict:
    """``hcc compile --json -c collective`` of one sample in a child process (the verifier
    on, as a user runs it): wall, CPU (user + system) and peak RSS of that child alone, and
    the plan it chose with its efficiency against its own bound and against the RS+AG bound,
    and its packing rate over the bound's rate (``Figures.pack_rate_Bps``)."""
    import json
    import os
    import subprocess
    import tempfile

    path = TOPOLOGIES[label]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        # the child's progress goes straight to this terminal, as the user would see it
        child = subprocess.Popen([sys.executable, "-m", "hcc", "compile", "--json", "-c", collective, str(path)],
                                 stdout=out)
        _, status, use = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read().decode()
    code = os.waitstatus_to_exitcode(status)
    cpu = use.ru_utime + use.ru_stime
    rss = use.ru_maxrss * 1024  # kilobytes on Linux
    plan = json.loads(text)[0] if code == 0 else {}
    rsag = rsag_bound_s(label, collective)
    pred = plan.get("predicted_s", 0.0)
    return {"sample": label, "collective": collective, "ranks": plan.get("ranks", ""), "exit": code,
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "peak_rss_bytes": rss,
            "algorithm": plan.get("algorithm", ""), "chunk_bytes": plan.get("chunk_bytes", ""),
            "predicted_s": pred, "bound_s": plan.get("bound_s", ""), "efficiency": plan.get("efficiency", ""),
            "rsag_bound_s": rsag, "efficiency_vs_rsag": rsag / pred if pred else "",
            "pack_over_bound": (round(plan["pack_rate_Bps"] / plan["bound_rate_Bps"], 4)
                                if plan.get("pack_rate_Bps") and plan.get("bound_rate_Bps") else ""),
            "within_targets": code == 0 and cpu <= SAMPLE_TARGET_S and rss <= SAMPLE_TARGET_BYTES}


def sample_table(rows: list[dict]) -> str:
    """The markdown table of ``--samples`` rows (BENCHMARKS.md)."""
    lines = ["| sample | collective | ranks | plan | CPU s | peak RSS | eff (own bound) | eff vs RS+AG | "
             "within 60 CPU s and 4 GiB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        eff = f"{_num(r['efficiency']):.3f}" if r["efficiency"] != "" else ""
        rsag = f"{_num(r['efficiency_vs_rsag']):.3f}" if r["efficiency_vs_rsag"] != "" else ""
        lines.append(f"| {r['sample']} | {r['collective']} | {r['ranks']} | {r['algorithm'] or 'exit ' + str(r['exit'])} | "
                     f"{r['cpu_s']} | {_num(r['peak_rss_bytes']) / (1 << 30):.2f} GiB | {eff} | {rsag} | "
                     f"{'yes' if str(r['within_targets']) == 'True' else 'no'} |")
    return "\n".join(lines)


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _write(path: Path, rows: list[dict]) -> None:
    from hcc.ir.files import atomic_write_text

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, buf.getvalue())


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _size(b: float) -> str:
    return f"{b / (1 << 30):g} GiB" if b >= 1 << 30 else f"{b / MiB:g} MiB"


def table(rows: list[dict]) -> str:
    head = ["topology", "ranks", "size", "bound busbw", "hcc (auto)", "hcc busbw", "treepack busbw",
            "ring busbw", "dbtree busbw", "hcc/ring", "hcc/dbtree", "eff", "compile s (cpu)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        g = lambda k: f"{_num(r[k]):.2f}" if math.isfinite(_num(r[k])) else "-"
        out.append("| " + " | ".join([
            r["topology"], str(r["ranks"]), _size(_num(r["size_bytes"])), g("bound_busbw_GBps"),
            r["hcc_algorithm"], g("hcc_busbw_GBps"), g("treepack_busbw_GBps"), g("ring_busbw_GBps"),
            g("dbtree_busbw_GBps"), f"{_num(r['speedup_over_ring']):.2f}x", f"{_num(r['speedup_over_dbtree']):.2f}x",
            f"{_num(r['efficiency']):.3f}", f"{_num(r['compile_s']):.0f} ({_num(r['cpu_s']):.0f})",
        ]) + " |")
    return "\n".join(out) + "\n(busbw in GB/s, nccl-tests allreduce factor 2(n-1)/n; every figure from compiler.cost.simulate)"


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted({r["topology"] for r in rows})
    if not labels:
        return
    fig, axes = plt.subplots(1, len(labels), figsize=(6 * len(labels), 4.2), squeeze=False)
    for ax, label in zip(axes[0], labels):
        rs = sorted((r for r in rows if r["topology"] == label), key=lambda r: _num(r["size_bytes"]))
        x = [_num(r["size_bytes"]) / MiB for r in rs]
        for key, name, style in (("hcc_busbw_GBps", "hcc (auto)", "o-"), ("treepack_busbw_GBps", "hcc treepack", "s--"),
                                 ("ring_busbw_GBps", "ring", "^-"), ("dbtree_busbw_GBps", "double binary tree", "v-"),
                                 ("bound_busbw_GBps", "bound", "kx:")):
            ax.plot(x, [_num(r[key]) for r in rs], style, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("allreduce size (MiB)")
        ax.set_ylabel("predicted busbw (GB/s)")
        ax.set_title(f"{label} ({rs[0]['ranks']} ranks)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topologies", default="fattree1024,dgx1x64")
    ap.add_argument("--sizes", default="1,16,256,1024", help="MiB, comma-separated")
    ap.add_argument("--kind", default="allreduce", choices=("allreduce", "allgather", "broadcast"))
    ap.add_argument("--warm", action="store_true", help="keep packings memoised across sizes")
    ap.add_argument("--no-verify", action="store_true",
                    help="leave out the symbolic verification pass (compile_s then excludes it)")
    ap.add_argument("--append", action="store_true", help="keep the rows already in the CSV")
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--samples", action="store_true",
                    help="time `hcc compile` of each sample file (all its collectives), with peak memory")
    ap.add_argument("--collectives", default="", help="with --samples: only these (comma-separated)")
    ap.add_argument("--results", default=str(RESULTS))
    args = ap.parse_args(argv)
    out = Path(args.results)
    if args.samples:
        from hcc.ir.files import atomic_write_text

        found = []
        # a run of some collectives (--topologies, --collectives) replaces their rows and
        # keeps the others'
        kept = _read(out / "scale_compile.csv")
        for label in args.topologies.split(","):
            import hcc

            for c in hcc.load(str(TOPOLOGIES[label])).collectives:
                if args.collectives and c.name not in args.collectives.split(","):
                    continue
                print(f"  hcc compile samples/{label}.hcl -c {c.name} ...", file=sys.stderr, flush=True)
                found.append(compile_sample(label, c.name))
                kept = [r for r in kept if (r["sample"], r["collective"]) != (label, c.name)]
                buf = io.StringIO()
                w = csv.DictWriter(buf, fieldnames=SAMPLE_FIELDS, extrasaction="ignore")
                w.writeheader()
                order = [(lb, cn) for lb in TOPOLOGIES for cn in ("allreduce", "allgather", "broadcast")]
                rows = sorted(kept + found, key=lambda r: order.index((r["sample"], r["collective"]))
                              if (r["sample"], r["collective"]) in order else len(order))
                w.writerows(rows)
                atomic_write_text(out / "scale_compile.csv", buf.getvalue())
        print(sample_table(found))
        return 0 if all(r["within_targets"] for r in found) else 1
    csv_path = out / "scale.csv"
    rows = _read(csv_path) if (args.append or args.plot_only) else []
    if not args.plot_only:
        import networkx  # noqa: F401  (solver imports are not part of any compile time)
        from ortools.linear_solver import pywraplp  # noqa: F401

        for label in args.topologies.split(","):
            if label not in TOPOLOGIES:
                ap.error(f"unknown topology {label!r} (known: {', '.join(TOPOLOGIES)})")
            for mib in args.sizes.split(","):
                size = int(float(mib) * MiB)
                print(f"  {label} {args.kind} {_size(size)} ...", file=sys.stderr, flush=True)
                row = run_case(label, size, args.kind, args.warm, not args.no_verify)
                rows = [r for r in rows if not (r["topology"] == label and r["kind"] == args.kind
                                                and int(_num(r["size_bytes"])) == size)] + [row]
                _write(csv_path, rows)
                print(f"    {row['hcc_algorithm']} {row['hcc_busbw_GBps']:.2f} GB/s, ring "
                      f"{_num(row['ring_busbw_GBps']):.2f}, dbtree {_num(row['dbtree_busbw_GBps']):.2f}, "
                      f"bound {row['bound_busbw_GBps']:.2f}; compile {row['compile_s']:.1f} s",
                      file=sys.stderr, flush=True)
    rows.sort(key=lambda r: (r["topology"], r["kind"], _num(r["size_bytes"])))
    plot(rows, out / "scale.png")
    print(table(rows))
    print(f"wrote {csv_path} and {out / 'scale.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
