"""What `hcc compile` gives on every DGX-1 allocation of 4 to 7 GPUs (issue 17's "every 4-7-GPU
fragment"): per allocation, kind and size, the plan `algorithm = auto` picks and its
efficiency (bound / predicted), as auto_bench.py measures its topologies.

    .venv/bin/python benchmarks/fragment_bench.py                  # → benchmarks/results/fragments.csv
    .venv/bin/python benchmarks/fragment_bench.py --table          # the summary of the CSV
    .venv/bin/python benchmarks/fragment_bench.py --only 0,1,2,3 --kinds allreduce

Allocations are taken up to the machine's symmetries: two GPU sets that a permutation of
the GPUs keeping every link (its capacity and latency, and which PCIe switch each GPU hangs
from) maps onto each other are the same machine to the compiler, so one of each class is
compiled (the least in sorted order) and the CSV counts the class's members (162
allocations of 4-7 GPUs, 48 classes). Broadcast and reduce take every root: their classes
are those of (allocation, root) pairs under the same permutations (784 pairs, 196 classes),
the root in the CSV's ``root`` column. ``pack_share`` is the chosen plan's packing rate over
the bound (``pack_rate_Bps / bound_rate_Bps``, 0 for a plan without one).
Compiles run in ``--jobs`` worker processes (CPU seconds per compile in the CSV).
"""
from __future__ import annotations

import argparse
import csv
import itertools
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from auto_bench import compile_one
from bench_util import write_csv
from schedule_bench import KINDS


ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "fragments.csv"
SIZES = ("64MiB", "256MiB", "1GiB")
TARGETS = {"256MiB": 0.90, "1GiB": 0.95}  # issue 17's
FIELDS = ("ranks", "root", "members", "kind", "size", "algorithm", "efficiency", "pack_share", "predicted_s",
          "bound_s", "cpu_s")
ROOTED = frozenset({"broadcast", "reduce"})


def dgx1_source() -> str:
    return (ROOT / "samples" / "dgx1.hcl").read_text().split("\ncollective")[0]


def symmetries(src: str) -> tuple[list[str], list[tuple[int, ...]]]:
    """The GPUs of the DGX-1 topology in ``src`` and every permutation of them that maps each
    link between two GPUs, and each link between a GPU and a switch, onto one of the same
    capacity and latency (switches may be exchanged among themselves)."""
    import hcc

    topo = hcc.load(src).topologies["dgx1"]
    gpus = sorted(topo.nodes)
    switches = sorted(topo.switches)
    links = {(l.src, l.dst): (l.capacity, l.latency) for l in topo.links}
    out = []
    for p in itertools.permutations(range(len(gpus))):
        name = {gpus[i]: gpus[p[i]] for i in range(len(gpus))}
        if any(links.get((a, b)) != links.get((name[a], name[b])) for a in gpus for b in gpus if a != b):
            continue
        for q in itertools.permutations(switches):
            name.update(zip(switches, q))
            if all(links.get((name[a], name[b])) == v for (a, b), v in links.items()):
                out.append(p)
                break
    return gpus, out


def allocations(src: str, sizes=range(4, 8), rooted: bool = False) -> list[tuple[tuple[str, ...], str | None, int]]:
    """One allocation per symmetry class (the least member), with ``rooted`` one (allocation,
    root) pair per class of pairs, and the class's size: ``(ranks, root or None, members)``."""
    gpus, perms = symmetries(src)
    classes: dict[tuple, int] = {}
    for k in sizes:
        for sub in itertools.combinations(range(len(gpus)), k):
            for r in sub if rooted else (None,):
                key = min((tuple(sorted(p[i] for i in sub)), -1 if r is None else p[r]) for p in perms)
                classes[key] = classes.get(key, 0) + 1
    order = sorted(classes.items(), key=lambda kv: (len(kv[0][0]), kv[0]))
    return [(tuple(gpus[i] for i in sub), None if r < 0 else gpus[r], n) for (sub, r), n in order]


def _one(args):
    src, ranks, root, members, kind, size = args
    plan, cpu = compile_one(src, "dgx1", f"gpu[{','.join(r[len('gpu'):] for r in ranks)}]", kind, size, root)
    f = plan.figures
    return dict(ranks=" ".join(ranks), root=root or "", members=members, kind=kind, size=size,
                algorithm=plan.algorithm,
                efficiency=f.efficiency, pack_share=f.pack_rate_Bps / f.bound_rate_Bps if f.bound_rate_Bps else 0.0,
                predicted_s=f.predicted_s, bound_s=f.bound_s, cpu_s=round(cpu, 2))


def summary(path: Path, misses_shown: int | None = None) -> str:
    """Per allocation size, the (allocation, kind) cells meeting both targets, counted by
    class and by allocation, and the cells that miss, worst first (the first
    ``misses_shown`` of them; None: all)."""
    rows = list(csv.DictReader(path.open()))
    cells: dict[tuple[str, str, str], dict[str, dict]] = {}
    for r in rows:
        cells.setdefault((r["ranks"], r.get("root", ""), r["kind"]), {})[r["size"]] = r
    out = ["| GPUs | allocations | kinds | cells (classes; with the root for broadcast and reduce) | "
           "cells meeting both | allocation cells meeting both |", "|---|---|---|---|---|---|"]
    misses = []
    by_n: dict[int, list] = {}
    for (ranks, root, kind), by in cells.items():
        ok = all(float(by[s]["efficiency"]) >= t for s, t in TARGETS.items() if s in by)
        by_n.setdefault(len(ranks.split()), []).append((ok, int(next(iter(by.values()))["members"]), ranks, root,
                                                        kind))
        if not ok:
            worst = min(float(by[s]["efficiency"]) / t for s, t in TARGETS.items() if s in by)
            misses.append((worst, ranks, root, kind, by))
    for n, got in sorted(by_n.items()):
        kinds = {k for *_, k in got}
        # allocations: the members of the unrooted classes of one kind, else of the pairs / n
        one = next(iter(sorted(kinds - ROOTED) or sorted(kinds)))
        allocs = sum(m for _, m, _, _, k in got if k == one) // (n if one in ROOTED else 1)
        met = sum(m for ok, m, *_ in got if ok)
        out.append(f"| {n} | {allocs} | {len(kinds)} | {len(got)} | {sum(ok for ok, *_ in got)} | "
                   f"{met} of {sum(m for _, m, *_ in got)} |")
    out += ["", "| allocation | root | kind | members | algorithm @256MiB | packing / bound | "
            + " | ".join(f"eff@{s}" for s in SIZES) + " |", "|---|---|---|---|---|---|" + "---|" * len(SIZES)]
    misses.sort(key=lambda m: m[0])
    for _, ranks, root, kind, by in misses[:misses_shown]:
        effs = " | ".join(f"{float(by[s]['efficiency']):.3f}" if s in by else "" for s in SIZES)
        at = by.get("256MiB", next(iter(by.values())))
        share = f"{float(at['pack_share']):.3f}" if float(at["pack_share"]) else "-"
        out.append(f"| {ranks.replace('gpu', '')} | {root.replace('gpu', '') or '-'} | {kind} | {at['members']} | "
                   f"{at['algorithm']} | {share} | {effs} |")
    if misses_shown is not None and len(misses) > misses_shown:
        out.append(f"\n{len(misses) - misses_shown} more cells miss (`--table` lists every one).")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="one allocation, comma-separated GPU numbers (e.g. 0,1,2,3)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("-o", "--output", default=str(RESULTS))
    ap.add_argument("--table", action="store_true", help="print the summary of the CSV and exit")
    ap.add_argument("--misses", type=int, help="with --table, list only the worst this many missing cells")
    args = ap.parse_args(argv)
    if args.table:
        print(summary(Path(args.output), args.misses))
        return 0
    src = dgx1_source()
    kinds = args.kinds.split(",")
    work = []
    for rooted in (False, True):
        mine = [k for k in kinds if (k in ROOTED) == rooted]
        if not mine:
            continue
        allocs = allocations(src, rooted=rooted)
        if args.only:
            want = tuple(f"gpu{i}" for i in args.only.split(","))
            allocs = [a for a in allocs if a[0] == want] or [(want, want[0] if rooted else None, 1)]
        work += [(src, ranks, root, n, kind, size) for ranks, root, n in allocs for kind in mine
                 for size in args.sizes.split(",")]
    rows = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for row in pool.map(_one, work):
            rows.append(row)
            print(f"{row['ranks']:40s} {row['root']:5s} {row['kind']:15s} {row['size']:>7s} {row['algorithm']:18s} "
                  f"{row['efficiency']:.3f}", flush=True)
    write_csv(args.output, FIELDS, rows)
    print(f"wrote {args.output}")
    print(summary(Path(args.output)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
