"""Plan quality and compile time (issue 17): per topology and collective, the packing's rate
against the cut bound, the plan's efficiency at 64 MiB / 256 MiB / 1 GiB, the best NCCL-like
baseline and hcc's predicted speedup over it, and the compile time, with ForestColl's compile
time for the same allgather beside hcc's.

    .venv/bin/python benchmarks/compile_bench.py                 # the whole table
    .venv/bin/python benchmarks/compile_bench.py --quick         # DGX-1, 2xA100, 1xMI250, allgather
    .venv/bin/python benchmarks/compile_bench.py --compile-scale # the 512/1024-rank samples compiled too
    .venv/bin/python benchmarks/compile_bench.py --no-scale      # without the 512/1024-rank samples
    .venv/bin/python benchmarks/compile_bench.py --no-forestcoll
    .venv/bin/python benchmarks/compile_bench.py --only a100x2,a100x4,mi250x1,mi250x2 --kinds allgather --append

Topologies: DGX-1 (samples/dgx1.hcl); 2 and 4 A100 servers and 1 and 2 MI250 nodes as
ForestColl (Zhao et al. 2024) describes them, written here in hcc's language (A100: 8 GPUs on
an NVSwitch at 300 GB/s, GPU i's 25 GB/s NIC on InfiniBand switch i mod 2; MI250: 16 GCDs on
the xGMI mesh of ForestColl's adjacency matrix, 50 GB/s per link, each GCD's 16 GB/s NIC on
one InfiniBand switch); and every collective of samples/*.hcl. The 512- and 1024-rank
samples (fattree1024, dgx1x64) take minutes and GiBs per collective, so their rows are by
default copied from benchmarks/results/scale_compile.csv (``benchmarks/scale_bench.py
--samples``, one process per collective: the plan, its 256 MiB efficiency and the compile CPU
seconds; the table marks them ``scale_bench``); ``--compile-scale`` compiles them here instead
(at 256 MiB and 1 GiB), ``--no-scale`` leaves them out. Links get 1 us (NVLink, NVSwitch, xGMI) or 2 us (NIC and
switch hops); the cost model is the compiler's default, 1 us per message.

Figures, all from the compiler's own cost model (compiler/cost.py):
- ``pack/bound``: the packing's rate (``Figures.pack_rate_Bps``) over the cut bound's rate;
- ``eff@X``: bound / predicted of the plan ``algorithm = auto`` picks at size X (it may be a
  baseline: ``algorithm`` says which at 256 MiB);
- ``NCCL-like`` and ``vs NCCL-like``: the fastest NCCL-like baseline (NCCL's multi-channel
  rings, the single ring, the double binary tree, recursive doubling / Bruck; compiler/
  baselines.py) at 256 MiB and its predicted time over hcc's;
- ``compile``: CPU seconds of the 256 MiB compile from a cold packing memo (bounds, packing,
  lowering of every candidate with its chunk search, baselines, verification);
- ``ForestColl``: CPU seconds of ForestColl's ``optimal_pipeline_spanning_trees`` on its own
  graph of the same topology (allgather rows of the A100 and MI250 topologies), measured in
  a child process beside hcc's 256 MiB compile (:data:`REPEATS` pairs, each hcc compile
  followed by a ForestColl run, where both take under :data:`SHORT_S`; the least of each
  side kept), and ``hcc/FC`` the ratio of the two; ``same algbw`` whether its
  optimal algbw equals hcc's allgather bound (relative 1e-6). The peer's unmodified code is
  imported from ``../shared/peers/forestcoll`` beside the repository; without it the columns
  say so.

Writes benchmarks/results/compile.csv (one row per case) and prints the markdown table.
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

import hcc
from bench_util import close_topology, parser
from hcc.compiler import treepack
from hcc.compiler.pipeline import compile_unit
from hcc.ir.files import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "compile.csv"
FORESTCOLL = ROOT.parent / "shared" / "peers" / "forestcoll"
MiB = 1 << 20
SIZES = (64 * MiB, 256 * MiB, 1024 * MiB)
KINDS = ("allgather", "broadcast", "allreduce")
SCALE_SAMPLES = {"fattree1024", "dgx1x64"}
SCALE_CSV = ROOT / "benchmarks" / "results" / "scale_compile.csv"

# ForestColl's MI250 xGMI adjacency: links between GCDs in units of 50 GB/s (their paper's
# figure of one MI250 node), the same numbers as the peer's topologies.py
MI250_LINKS = {
    (0, 1): 4, (0, 4): 2, (0, 8): 1, (1, 5): 1, (1, 9): 1, (1, 10): 1, (2, 3): 4, (2, 6): 1,
    (2, 9): 1, (2, 10): 1, (3, 7): 2, (3, 11): 1, (4, 5): 4, (4, 6): 1, (5, 6): 1, (5, 7): 1,
    (6, 7): 4, (8, 9): 4, (8, 12): 2, (9, 13): 1, (10, 11): 4, (10, 14): 1, (11, 15): 2,
    (12, 13): 4, (12, 14): 1, (13, 14): 1, (13, 15): 1, (14, 15): 4,
}


def a100_source(nodes: int) -> str:
    """``nodes`` A100 servers as ForestColl's a100_topology describes them."""
    lines = [f"topology a100x{nodes} {{", f"    host node[0..{nodes - 1}] {{",
             "        node gpu[0..7]", "        switch nvs, nic[0..7]",
             "        gpu[0..7] <-> nvs : 300 GB/s, 1 us"]
    lines += [f"        gpu{i} <-> nic{i} : 25 GB/s, 2 us" for i in range(8)]
    lines.append("    }")
    return close_topology(lines, "ib0, ib1", [f"    node{a}.nic{i} <-> ib{i % 2} : 25 GB/s, 2 us"
                                              for a in range(nodes) for i in range(8)])


def mi250_source(nodes: int) -> str:
    """``nodes`` MI250 nodes as ForestColl's mi250_topology describes them."""
    lines = [f"topology mi250x{nodes} {{", f"    host node[0..{nodes - 1}] {{", "        node gcd[0..15]"]
    lines += [f"        gcd{a} <-> gcd{b} : {50 * m} GB/s, 1 us" for (a, b), m in sorted(MI250_LINKS.items())]
    lines.append("    }")
    return close_topology(lines, "ib", [f"    node{a}.gcd{g} <-> ib : 16 GB/s, 2 us"
                                        for a in range(nodes) for g in range(16)] if nodes > 1 else [])


def with_collectives(topology_src: str, name: str, kinds=KINDS) -> str:
    out = [topology_src]
    for k in kinds:
        extra = "\n    op = sum" if k in ("allreduce", "reduce", "reduce_scatter") else ""
        out.append(f"collective {k} = {k} on {name} {{\n    size = 256 MiB{extra}\n}}")
    return "\n".join(out)


def forestcoll_graph(label: str):
    """ForestColl's own graph of a topology, or None (no peer, or not one of its topologies)."""
    if not FORESTCOLL.is_dir():
        return None
    if str(FORESTCOLL) not in sys.path:
        sys.path.insert(0, str(FORESTCOLL))
    import topologies  # the peer's module, unmodified

    fam, _, n = label.partition("x")
    if fam == "a100":
        return topologies.a100_topology(int(n))
    if fam == "mi250":
        return topologies.mi250_topology(int(n))
    return None


def forestcoll_child(label: str) -> None:
    """Run in a child process: ForestColl's allgather on its graph of ``label``; prints
    ``cpu wall algbw_Bps`` (its own process CPU time, so nothing else is counted)."""
    graph = forestcoll_graph(label)
    import pipeline_allgather  # the peer's module, unmodified

    G, gpus = graph
    t0, c0 = time.perf_counter(), time.process_time()
    (U, k), _ = pipeline_allgather.optimal_pipeline_spanning_trees(G, compute_nodes=gpus)
    print(time.process_time() - c0, time.perf_counter() - t0, len(gpus) * k / U * 1e9)


# compiles compared with ForestColl's that take under SHORT_S CPU seconds (both sides) are
# timed REPEATS times, each hcc compile followed at once by a ForestColl run so that both see
# the same load, and the least of each is kept: a sub-second compile on this shared machine
# varies by 2x between runs (ForestColl on one MI250 node: 0.52 and 0.94 s in two runs of
# the table)
SHORT_S = 10.0
REPEATS = 5


def compared(label: str, kind: str, args) -> bool:
    """Whether the row is timed beside ForestColl (the allgathers of its own topologies)."""
    return kind == "allgather" and bool(args.forestcoll) and label.startswith(("a100", "mi250"))


def time_forestcoll(label: str, timeout_s: float):
    """(CPU seconds, wall seconds, optimal algbw in B/s) of ForestColl on ``label``, run in a
    child process so a slow peer can be stopped at ``timeout_s`` (then None)."""
    import subprocess

    cmd = [sys.executable, str(Path(__file__).resolve()), "--forestcoll-child", label]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except subprocess.TimeoutExpired:
        return None
    cpu, wall, algbw = (float(x) for x in out.split()[-3:])
    return cpu, wall, algbw


def scale_rows(only: set[str] | None = None) -> list[dict]:
    """The 512- and 1024-rank samples' rows from scale_compile.csv (what it measured: the plan,
    its packing rate over the bound's, its 256 MiB efficiency, compile CPU seconds),
    ``source`` naming the file; [] without it."""
    if not SCALE_CSV.exists():
        return []
    with open(SCALE_CSV, newline="") as fh:
        got = list(csv.DictReader(fh))
    rows = []
    for r in got:
        if r["sample"] not in SCALE_SAMPLES or (only is not None and r["sample"] not in only) or r["exit"] != "0":
            continue
        rows.append({"topology": r["sample"], "collective": r["collective"], "kind": r["collective"],
                     "ranks": int(r["ranks"]), "algorithm": r["algorithm"], "chunk_bytes": int(r["chunk_bytes"]),
                     "eff_256MiB": round(float(r["efficiency"]), 4), "predicted_s_256MiB": float(r["predicted_s"]),
                     "eff_vs_rsag_256MiB": round(float(r["efficiency_vs_rsag"]), 4), "cpu_s": float(r["cpu_s"]),
                     "pack_over_bound": r.get("pack_over_bound", ""),
                     "peak_rss_GiB": round(int(r["peak_rss_bytes"]) / 2**30, 2), "source": SCALE_CSV.name})
    return rows


def cases(quick: bool, scale: bool, only: set[str] | None = None):
    """(label, program, collective names) in table order (``only``: these labels)."""
    for label, program, names in _cases(quick, scale):
        if only is None or label in only:
            yield label, program, names


def _cases(quick: bool, scale: bool):
    named = [("dgx1", hcc.load(ROOT / "samples" / "dgx1.hcl"), ["allgather", "broadcast", "allreduce"]),
             ("a100x2", hcc.load(with_collectives(a100_source(2), "a100x2")), None),
             ("a100x4", hcc.load(with_collectives(a100_source(4), "a100x4")), None),
             ("mi250x1", hcc.load(with_collectives(mi250_source(1), "mi250x1")), None),
             ("mi250x2", hcc.load(with_collectives(mi250_source(2), "mi250x2")), None)]
    if quick:
        yield from ((l, p, ["allgather"]) for l, p, _ in named if l in ("dgx1", "a100x2", "mi250x1"))
        return
    yield from named
    for path in sorted((ROOT / "samples").glob("*.hcl")):
        if path.stem == "dgx1" or (path.stem in SCALE_SAMPLES and not scale):
            continue
        program = hcc.load(path)
        names = [c.name for c in program.collectives
                 if c.kind in ("broadcast", "reduce", "allgather", "reduce_scatter", "allreduce")
                 and c.compress == "none"]
        if names:
            yield path.stem, program, names


def warm_imports() -> None:
    """Import the solver libraries before any timing (paid once per process)."""
    import networkx  # noqa: F401
    from ortools.linear_solver import pywraplp  # noqa: F401
    from ortools.sat.python import cp_model  # noqa: F401


def clear_memos() -> None:
    from hcc.compiler import bounds, channels

    treepack.clear_cache()
    channels.ring_channels_memo.cache_clear()
    bounds._allgather_parametric.cache_clear()
    bounds._narrowest.cache_clear()
    bounds._group_cuts.cache_clear()


def write_rows(path: str, rows: list[dict], keep_others: bool) -> list[dict]:
    """Write ``rows`` to the CSV at ``path`` (atomically), keeping the file's rows of other
    (topology, collective) pairs when ``keep_others``; returns what was written, in table order."""
    if keep_others and Path(path).exists():
        with open(path, newline="") as fh:
            old = list(csv.DictReader(fh))
        fresh = {(r["topology"], r["collective"]) for r in rows}
        rows = [r for r in old if (r["topology"], r["collective"]) not in fresh] + rows
    order = ["dgx1", "a100x2", "a100x4", "mi250x1", "mi250x2"] + sorted(
        p.stem for p in (ROOT / "samples").glob("*.hcl") if p.stem != "dgx1")
    rows = sorted(rows, key=lambda r: order.index(r["topology"]) if r["topology"] in order else len(order))
    for r in rows:  # rows read back from a CSV: both algbw columns rounded to 1 MB/s
        if r.get("forestcoll_algbw_GBps") not in ("", None) and isinstance(r["forestcoll_algbw_GBps"], str):
            r["same_algbw"] = math.isclose(float(r["forestcoll_algbw_GBps"]), float(r["bound_rate_GBps"]), rel_tol=1e-5)
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, restval="")
    w.writeheader()
    w.writerows(rows)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, buf.getvalue())
    return rows


def run(args) -> list[dict]:
    warm_imports()
    rows = []
    only = set(args.only.split(",")) if args.only else None
    for label, program, names in cases(args.quick, args.scale == "compile", only):
        for c in program.collectives:
            if names is not None and c.name not in names:
                continue
            if args.kinds and c.kind not in args.kinds.split(","):
                continue
            row = {"topology": label, "collective": c.name, "kind": c.kind, "ranks": len(c.ranks)}
            # the 512- and 1024-rank samples at the sizes their targets name (>= 256 MiB): a
            # compile there takes a minute
            for size in (SIZES[1:] if label in SCALE_SAMPLES else SIZES):
                spec = replace(c, size_bytes=size)
                prog = replace(program, collectives=tuple(spec if x.name == c.name else x for x in program.collectives))
                if size == 256 * MiB:
                    clear_memos()  # the timed compile packs from scratch
                t0, c0 = time.perf_counter(), time.process_time()
                plan = compile_unit(prog, c.name).plan
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                if size == 256 * MiB and compared(label, c.kind, args):
                    fc = time_forestcoll(label, args.forestcoll_timeout) if FORESTCOLL.is_dir() else None
                    # both short: REPEATS pairs, each hcc compile then ForestColl (SHORT_S)
                    for _ in range(REPEATS - 1 if fc is not None and max(cpu, fc[0]) < SHORT_S else 0):
                        clear_memos()
                        t0, c0 = time.perf_counter(), time.process_time()
                        compile_unit(prog, c.name)
                        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
                        again = time_forestcoll(label, args.forestcoll_timeout)
                        if again is not None:
                            fc = min(fc, again)
                f = plan.figures
                tag = f"{size // MiB}MiB"
                row[f"eff_{tag}"] = round(f.efficiency, 4)
                row[f"predicted_s_{tag}"] = f.predicted_s
                if str(size // MiB) in args.treepack_sizes.split(","):
                    # hcc's own schedules, searched fully (auto stops a candidate's chunk
                    # search once it cannot beat the best so far, a baseline included)
                    forced = replace(spec, algorithm="treepack")
                    own = compile_unit(replace(prog, collectives=tuple(forced if x.name == c.name else x
                                                                       for x in prog.collectives)), c.name).plan
                    row[f"treepack_eff_{tag}"] = round(own.figures.efficiency, 4)
                    row[f"treepack_algorithm_{tag}"] = own.algorithm
                    if f.baseline_predicted_s:
                        row[f"treepack_vs_baseline_{tag}"] = round(f.baseline_predicted_s / own.figures.predicted_s, 3)
                if size == 256 * MiB:
                    bound_Bps = f.bound_rate_Bps
                    row.update({
                        "algorithm": plan.algorithm, "trees": len(plan.trees), "chunk_bytes": plan.chunk_bytes,
                        "bound_rate_GBps": round(f.bound_rate_Bps / 1e9, 3),
                        "pack_over_bound": round(f.pack_rate_Bps / f.bound_rate_Bps, 4) if f.pack_rate_Bps else "",
                        "baseline": f.baseline, "baseline_s": f.baseline_predicted_s,
                        "ring_channels": f.ring_channels,
                        "speedup_over_baseline": round(f.baseline_predicted_s / f.predicted_s, 3)
                        if f.baseline_predicted_s else "",
                        "compile_s": round(wall, 2), "cpu_s": round(cpu, 2),
                        "cut_GBps": round(f.cut_capacity_Bps / 1e9, 3),
                        "fill_share": round(f.fill_s / f.predicted_s, 4),
                        "message_share": round(f.message_s / f.predicted_s, 4),
                        "contention_share": round(f.contention_s / f.predicted_s, 4),
                        "load_share": round(f.load_s / f.predicted_s, 4),
                    })
                print(f"  {label:12s} {c.name:22s} {tag:>8s} {plan.algorithm:16s} eff {f.efficiency:.3f} "
                      f"{wall:7.2f} s", file=sys.stderr, flush=True)
            row.update({"forestcoll_cpu_s": "", "hcc_over_forestcoll": "", "same_algbw": ""})
            if compared(label, c.kind, args):  # fc: timed beside the 256 MiB compile (above)
                if not FORESTCOLL.is_dir():
                    row["forestcoll_cpu_s"] = "absent"
                elif fc is None:
                    row["forestcoll_cpu_s"] = f"> {args.forestcoll_timeout:.0f} wall"
                    row["hcc_over_forestcoll"] = f"< {row['cpu_s'] / args.forestcoll_timeout:.3f}"
                else:
                    fc_cpu, fc_wall, fc_algbw = fc
                    row["forestcoll_cpu_s"] = round(fc_cpu, 2)
                    row["hcc_over_forestcoll"] = round(row["cpu_s"] / fc_cpu, 3)
                    row["same_algbw"] = math.isclose(fc_algbw, bound_Bps, rel_tol=1e-6)
                    row["forestcoll_algbw_GBps"] = round(fc_algbw / 1e9, 3)
                    print(f"  {label:12s} ForestColl {fc_cpu:7.2f} CPU s, algbw {fc_algbw / 1e9:.3f} GB/s",
                          file=sys.stderr, flush=True)
            rows.append(row)
            # every finished row is on disk at once: an interrupted run keeps its rows
            write_rows(args.output, rows, args.append)
    return rows


def with_scale_rows(rows: list[dict], args) -> list[dict]:
    """``rows`` and, by default (``--no-scale``, ``--compile-scale``, ``--quick`` and
    ``--kinds`` aside), the 512/1024-rank samples' rows from scale_compile.csv that ``rows``
    lacks (within ``--only``)."""
    if args.scale != "list" or args.quick or args.kinds:
        return rows
    only = set(args.only.split(",")) if args.only else None
    have = {r["topology"] for r in rows}
    return rows + [r for r in scale_rows(only) if r["topology"] not in have]


TABLE = [("topology", "topology"), ("collective", "collective"), ("ranks", "ranks"),
         ("algorithm", "algorithm @256M"), ("pack_over_bound", "pack/bound"), ("eff_64MiB", "eff@64M"),
         ("eff_256MiB", "eff@256M"), ("eff_1024MiB", "eff@1G"), ("baseline", "NCCL-like"),
         ("speedup_over_baseline", "vs NCCL-like"), ("treepack_eff_1024MiB", "treepack eff@1G"),
         ("treepack_vs_baseline_1024MiB", "treepack vs NCCL-like @1G"),
         ("cpu_s", "compile CPU s"),
         ("forestcoll_cpu_s", "ForestColl CPU s"), ("hcc_over_forestcoll", "hcc/FC"), ("same_algbw", "same algbw")]


def markdown(rows: list[dict]) -> str:
    out = ["| " + " | ".join(h for _, h in TABLE) + " |", "|" + "---|" * len(TABLE)]
    for r in rows:
        cells = []
        for k, _ in TABLE:
            v = r.get(k, "")
            if k == "same_algbw" and r.get("forestcoll_algbw_GBps") not in ("", None):
                # both algbw columns are rounded to 1 MB/s in the CSV
                v = math.isclose(float(r["forestcoll_algbw_GBps"]), float(r["bound_rate_GBps"]), rel_tol=1e-5)
            if k == "baseline" and v:
                v = f"{v} ({r['ring_channels']} ch)" if v == "rings" else v
            if k in ("speedup_over_baseline", "treepack_vs_baseline_1024MiB") and v not in ("", None):
                v = f"{float(v):.2f}x"
            if k == "cpu_s" and r.get("source"):
                v = f"{v} (scale_bench)"
            cells.append(str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


OPTIONS = (
    (("--quick",), dict(action="store_true", help="DGX-1, 2xA100 and 1xMI250 allgather only")),
    (("--no-scale",), dict(dest="scale", action="store_const", const="skip", default="list",
                           help="leave the 512/1024-rank samples out (default: their rows from scale_compile.csv)")),
    (("--compile-scale",), dict(dest="scale", action="store_const", const="compile",
                                help="compile the 512/1024-rank samples here (minutes and GiBs each)")),
    (("--no-forestcoll",), dict(dest="forestcoll", action="store_false", help="do not run ForestColl")),
    (("--forestcoll-timeout",), dict(type=float, default=1800.0,
                                     help="stop ForestColl after this many wall seconds (default 1800)")),
    (("--forestcoll-child",), dict(help=argparse.SUPPRESS)),
    (("-o", "--output"), dict(default=str(RESULTS))),
    (("--only",), dict(help="comma-separated topology labels (dgx1, a100x2, ..., sample names)")),
    (("--kinds",), dict(help="comma-separated collective kinds to compile (default: every one of a case)")),
    (("--append",), dict(action="store_true",
                         help="keep the CSV's rows of other topologies (replace the ones measured again)")),
    (("--table",), dict(action="store_true", help="print the markdown table of the CSV and exit")),
    (("--merge",), dict(help="comma-separated CSVs of earlier runs to merge into --output (no compiles)")),
    (("--treepack-sizes",), dict(default="1024", help="sizes in MiB at which hcc's own treepack schedules "
                                                      "are also compiled (default 1024)")),
)


def main(argv=None) -> int:
    ap = parser(__doc__.splitlines()[0], OPTIONS)
    args = ap.parse_args(argv)
    if args.forestcoll_child:
        forestcoll_child(args.forestcoll_child)
        return 0
    if args.table:
        with open(args.output, newline="") as fh:
            print(markdown(list(csv.DictReader(fh))))
        return 0
    if args.forestcoll and not FORESTCOLL.is_dir():
        print(f"ForestColl not found at {FORESTCOLL}: its columns say 'absent'", file=sys.stderr)
    if args.merge:
        rows = []
        for path in args.merge.split(","):
            with open(path, newline="") as fh:
                rows += list(csv.DictReader(fh))
        rows = write_rows(args.output, with_scale_rows(rows, args), args.append)
    else:
        rows = write_rows(args.output, with_scale_rows(run(args), args), args.append)
    print(markdown(rows))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
