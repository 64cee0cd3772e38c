"""Schedule efficiency benchmark (issue 17, item 1): how close the lowered treepack plans come
to the cut bound and to the latency-aware bound, priced by the project's cost model.

    .venv/bin/python benchmarks/schedule_bench.py                  # every topology below
    .venv/bin/python benchmarks/schedule_bench.py --only dgx1,mi250x1 --sizes 256MB,1GB

Per topology, collective kind and size: the packing's trees, then the chunk-size search of
the pipeline (chunks.choose_chunk, patience 2 as the pipeline gives the treepack candidates) over
the treepack lowering, once with the plain chunk-major
order (``fifo``) and once with the timed schedule (``timed``, what ``hcc compile`` uses).
Columns: ``fifo``/``timed`` = cut bound / predicted (the bound ``hcc compile`` reports;
allreduce: min(2 x allgather, pipeline.allreduce_floor)); ``lat`` = the latency-aware bound / predicted for the timed plan
(bounds.latency_aware_bound, largest over the trees; only where no link carries two trees,
broadcast and reduce packings, where it is a bound; "-" elsewhere); ``depth`` = the deepest
tree (twice for allreduce). Allreduce's fifo/timed columns are the reduce-scatter + allgather
form (``treepack-rsag``); ``split`` = cut bound / predicted for the split-tree allreduce
(compiler/splitpack.py, ``treepack-split``; "-" above splitpack.SPLIT_MAX_RANKS ranks);
``msg`` = bounds.message_bound / predicted for the timed plan: the bound of every plan whose
messages carry at most its chunk (the cut bound plus the per-message cost on the cut's links). Writes
benchmarks/results/schedule.csv. Topologies: DGX-1 (samples/dgx1.hcl, 8 GPUs and fragments
of 4-7), A100 servers (8 GPUs on an NVSwitch at 300 GB/s, one 25 GB/s NIC per GPU, NICs on
two IB switches by parity) and MI250 nodes (16 GCDs, xGMI mesh of 50 GB/s links, 16 GB/s
per GCD to one IB switch) as ForestColl models them, samples/hetero.hcl and
samples/nvswitch.hcl, and random heterogeneous graphs. 1 us latency per link unless the
source declares one.
"""
from __future__ import annotations

import argparse
import csv
import io
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import hcc
from bench_util import close_topology
from hcc.compiler.bounds import latency_aware_bound, message_bound
from hcc.compiler.chunks import choose_chunk, chunk_candidates
from hcc.compiler.cost import DEFAULT_MODEL
from hcc.compiler.lower import lower
from hcc.compiler.pipeline import Bounds, Pack, Unit, run_passes
from hcc.compiler.splitpack import split_priced
from hcc.ir.files import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "schedule.csv"
KINDS = ("broadcast", "reduce", "allgather", "reduce_scatter", "allreduce")

# ForestColl's MI250 node (topologies.py there): xGMI links per GCD pair, in 50 GB/s units
MI250 = (
    "0400200010000000", "4000010001100000", "0004001001100000", "0040000200010000",
    "2000041000000000", "0100401100000000", "0010110400000000", "0002014000000000",
    "1000000004002000", "0110000040000100", "0110000000040010", "0001000000400002",
    "0000000020000411", "0000000001004011", "0000000000101104", "0000000000020140",
)


def parse_size(text: str) -> int:
    """``64MB`` / ``1GB`` / ``256MiB`` in bytes (powers of 1000, or 1024 with ``i``)."""
    t = text.strip().replace(" ", "")
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("GB", 10 ** 9), ("MB", 10 ** 6),
                       ("KB", 10 ** 3)):
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * mult) // 4 * 4
    return int(t) // 4 * 4


def a100(nodes: int) -> str:
    out = [f"topology a100x{nodes} {{"]
    for a in range(nodes):
        out.append(f"  host h{a} {{ node gpu[0..7]  switch nvs" + ("  switch nic[0..7]" if nodes > 1 else ""))
        out.append("    gpu[0..7] <-> nvs : 300 GB/s, 1 us")
        if nodes > 1:
            out += [f"    gpu{b} <-> nic{b} : 25 GB/s, 1 us" for b in range(8)]
        out.append("  }")
    return close_topology(out, "ib0, ib1", [f"  h{a}.nic{b} <-> ib{b % 2} : 25 GB/s, 1 us"
                                            for a in range(nodes) for b in range(8)] if nodes > 1 else [], "  ")


def mi250(nodes: int) -> str:
    out = [f"topology mi250x{nodes} {{"]
    for a in range(nodes):
        out.append(f"  host h{a} {{ node gpu[0..15]")
        for b in range(16):
            for c in range(b + 1, 16):
                k = int(MI250[b][c])
                if k:
                    out.append(f"    gpu{b} <-> gpu{c} : {k * 50} GB/s, 1 us")
        out.append("  }")
    return close_topology(out, "ib", [f"  h{a}.gpu[0..15] <-> ib : 16 GB/s, 1 us"
                                      for a in range(nodes)] if nodes > 1 else [], "  ")


def random_graph(n: int, seed: int) -> str:
    """A ring plus n random chords, 1-8 GB/s per direction, 1-5 us."""
    rng = random.Random(seed)
    pairs = {tuple(sorted((i, (i + 1) % n))) for i in range(n)}
    while len(pairs) < 2 * n:
        a, b = rng.sample(range(n), 2)
        pairs.add(tuple(sorted((a, b))))
    out = [f"topology rand{seed} {{", f"  node r[0..{n - 1}]"]
    for a, b in sorted(pairs):
        for x, y in ((a, b), (b, a)):
            out.append(f"  r{x} -> r{y} : {rng.choice((1, 2, 4, 8))} GB/s, {rng.randint(1, 5)} us")
    out.append("}")
    return "\n".join(out)


def topologies():
    """(label, topology source, topology name, ranks or None)."""
    dgx = (ROOT / "samples" / "dgx1.hcl").read_text().split("\ncollective")[0]
    yield "dgx1", dgx, "dgx1", None
    for sel in ("0,1,2,3", "0,3,4,5,7", "0,1,2,4,5,6", "1,2,3,4,5,6,7"):
        yield f"dgx1:{sel.replace(',', '')}", dgx, "dgx1", f"gpu[{sel}]"
    yield "a100x2", a100(2), "a100x2", None
    yield "a100x4", a100(4), "a100x4", None
    yield "mi250x1", mi250(1), "mi250x1", None
    yield "mi250x2", mi250(2), "mi250x2", None
    het = (ROOT / "samples" / "hetero.hcl").read_text().split("\ncollective")[0]
    yield "hetero.mesh", het, "mesh", None
    yield "hetero.ring6", het, "ring6", None
    yield "nvswitch", (ROOT / "samples" / "nvswitch.hcl").read_text().split("\ncollective")[0], "nvswitch", None
    for seed in range(2):
        yield f"rand{seed}", random_graph(6, seed), f"rand{seed}", None


def packed_unit(src: str, topo_name: str, ranks: str | None, kind: str) -> Unit:
    extra = f"ranks = {ranks}\n" if ranks else ""
    op = "op = sum\n" if kind in ("reduce", "allreduce", "reduce_scatter") else ""
    program = hcc.load(src + f"\ncollective c = {kind} on {topo_name} {{\n size = 1 GB\n {extra}{op}"
                             f" algorithm = treepack\n}}\n")
    spec = program.collectives[0]
    u = Unit(program=program, spec=spec, topology=program.topology_of(spec), model=DEFAULT_MODEL)
    return run_passes(u, (Pack(),))


def latency_bound(u: Unit, trees, cut_s: float) -> float | None:
    """bounds.latency_aware_bound, the largest over the trees, when no link carries two trees
    (where it is a bound); None otherwise. Per tree: its depth, per-hop cost = per-message
    cost + the least latency on its paths, capacity ratio = its rate / its widest link."""
    sub = u.topology.restricted(u.spec.ranks)
    cap = {}
    lat = {}
    for l in sub.links:
        cap[(l.src, l.dst)] = cap.get((l.src, l.dst), 0.0) + l.capacity
        lat[(l.src, l.dst)] = max(lat.get((l.src, l.dst), 0.0), l.latency)
    used: set = set()
    best = 0.0
    for t in trees:
        hops = [(a, b) for _, _, path in t.edges for a, b in zip(path, path[1:])]
        if used & set(hops) or len(set(hops)) < len(hops):
            return None
        used |= set(hops)
        depth = {t.root: 0}
        for p, c, _ in t.edges:  # parents first (treepack.PackedTree)
            depth[c] = depth[p] + 1
        per_hop = u.model.per_message_s + min(lat[h] for h in hops)
        best = max(best, latency_aware_bound(cut_s, max(depth.values()), per_hop,
                                             t.rate / max(cap[h] for h in hops)))
    return best


def measure(u: Unit, kind: str, size: int) -> dict:
    spec = replace(u.spec, size_bytes=size)
    # the bound `hcc compile` reports; for allreduce min(2 x allgather, allreduce_floor):
    # reduce-scatter + allgather pipelined chunk by chunk overlaps its two phases on full-
    # duplex links, so the sum of their bounds is no bound of it (samples/hetero.hcl's ring6
    # runs 1.4x faster than that sum)
    b = Bounds().apply(replace(u, spec=spec))
    role = "rsag" if kind == "allreduce" else "trees"
    alg = "treepack-rsag" if kind == "allreduce" else "treepack"
    p = u.packing(role)
    cands = chunk_candidates(size, 4)
    row = {}
    for sched in ("fifo", "timed"):
        ch = choose_chunk(lambda c: lower(spec, u.topology, p.trees, c, algorithm=alg, schedule=sched,
                                          model=u.model), cands, model=u.model, patience=2)
        row[sched] = ch
    plan = row["timed"].plan
    depth = max(t.depth() for t in plan.trees) * (2 if kind == "allreduce" else 1)
    lat = latency_bound(u, p.trees, b.bound_s) if kind in ("broadcast", "reduce") else None
    t_fifo, t_timed = row["fifo"].simulation.time, row["timed"].simulation.time
    split = ""
    sp = u.packing("split") if kind == "allreduce" else None
    if sp is not None:
        ch = choose_chunk(lambda c: split_priced(spec, u.topology, sp, c, model=u.model), cands, model=u.model,
                          patience=2, fitted=False)
        split = round(b.bound_s / ch.simulation.time, 3)
    mb = msg_bound(u, kind, size, row["timed"].chunk_bytes)
    return {
        "trees": len(p.trees), "rate_over_bound": round(p.rate / p.bound, 4) if p.bound else "",
        "bound_s": b.bound_s, "latency_bound_s": lat, "depth": depth,
        "fifo_eff": round(b.bound_s / t_fifo, 3), "timed_eff": round(b.bound_s / t_timed, 3),
        "timed_lat": round(lat / t_timed, 3) if lat else "", "chunk_bytes": row["timed"].chunk_bytes,
        "predicted_s": t_timed, "split_eff": split, "msg_bound_s": mb,
        "timed_msg": round(mb / t_timed, 3),
    }


def msg_bound(u: Unit, kind: str, size: int, chunk_bytes: int) -> float:
    """bounds.message_bound at the timed plan's chunk size (its messages carry at most one
    chunk), with the pipeline's bound size and the model's per-message cost."""
    root = u.spec.ranks[u.spec.root] if kind in ("broadcast", "reduce") else None
    return message_bound(kind, u.topology, u.spec.ranks, root, size, chunk_bytes, u.model.per_message_s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated topology labels")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--sizes", default="64MB,256MB,1GB")
    ap.add_argument("-o", "--output", default=str(RESULTS))
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    sizes = [(s, parse_size(s)) for s in args.sizes.split(",")]
    rows = []
    head = f"{'topology':16s} {'kind':15s} {'trees':>5s} {'depth':>5s}" + "".join(
        f" | {s:>6s} fifo  timed   msg   lat split" for s, _ in sizes)
    print(head, flush=True)
    for label, src, name, ranks in topologies():
        if only and label not in only:
            continue
        for kind in args.kinds.split(","):
            t0 = time.perf_counter()
            u = packed_unit(src, name, ranks, kind)
            cells, depth, trees = [], 0, 0
            for text, size in sizes:
                r = measure(u, kind, size)
                rows.append({"topology": label, "kind": kind, "size": text, **r})
                depth, trees = r["depth"], r["trees"]
                lat = f"{r['timed_lat']:5.3f}" if r["timed_lat"] != "" else "    -"
                split = f"{r['split_eff']:5.3f}" if r["split_eff"] != "" else "    -"
                cells.append(f" | {'':6s} {r['fifo_eff']:5.3f}  {r['timed_eff']:5.3f} {r['timed_msg']:5.3f} {lat} {split}")
            print(f"{label:16s} {kind:15s} {trees:5d} {depth:5d}" + "".join(cells)
                  + f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
    if rows:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.output, buf.getvalue())
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
