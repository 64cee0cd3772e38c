"""Adaptive runtime figures (issue 4): one failure vs none, staggered arrivals adaptive vs static.

    .venv/bin/python benchmarks/fault_bench.py [--ranks 8] [--size-mib 64] [--reps 3] [--stagger 0.5]

8 local ranks over sockets (backends/adaptive.py's harness: one process per rank, reused
across cases). Times are seconds from a common start barrier to the moment a rank's run
returns; a case's time is the maximum over the ranks that survive it, the median over reps.

1. failure: allreduce and broadcast without failure, then with one rank SIGKILLed half-way
   through its chunks (``on_failure = continue``). Target: survivors within 1.5x the
   no-failure time plus the detection delay (an EOF on loopback: well under a millisecond;
   the agreement adds two store round trips).
2. staggered arrivals: start delays uniform in [0, T]; the adaptive executor (arrival-order
   trees) vs the static executor on the compiled programs (backends/executor.py) and vs the
   adaptive executor on the compiled trees (``adaptive = off``). Target: adaptive within 1.2x
   of (last arrival + one-hop time) and faster than static. The one-hop time is measured: a
   2-rank broadcast of the same size.

Writes benchmarks/results/fault_bench.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import hcc
from hcc.backends.adaptive import Case, run_local
from hcc.backends.reference import check, expected, make_inputs
from hcc.ir.files import atomic_write_text


def _src(n: int, mib: int) -> str:
    return f"""
topology t {{ node g[0..{n - 1}]
  g[0..{n - 1}] <-> g[0..{n - 1}] : 1 GB/s, 10 us }}
collective allreduce = allreduce on t {{ size = {mib} MiB  on_failure = continue }}
collective broadcast = broadcast on t {{ size = {mib} MiB  on_failure = continue }}
"""


def _time(out, survivors=None) -> float:
    ranks = [r for r in out.info if survivors is None or r in survivors]
    return max(out.info[r]["seconds"] for r in ranks)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--stagger", type=float, default=0.5, help="T: delays uniform in [0, T] seconds")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "fault_bench.json"))
    a = ap.parse_args(argv)
    n = a.ranks
    t0 = time.time()
    prog = hcc.load(_src(n, a.size_mib))
    plans = {c.name: hcc.compile(prog, c.name) for c in prog.collectives}
    two = hcc.compile(hcc.load(_src(2, a.size_mib)), "broadcast")
    print(f"compiled in {time.time() - t0:.1f} s; allreduce {plans['allreduce'].algorithm}, "
          f"broadcast {plans['broadcast'].algorithm} ({len(plans['broadcast'].trees)} trees)", flush=True)

    rng = np.random.default_rng(42)
    cases: list[tuple[str, Case]] = []
    for rep in range(a.reps):
        for name in ("broadcast", "allreduce"):
            # outputs are written back and checked for the first rep of the adaptive staggered runs
            # and the failure runs only: 64 MiB x 8 ranks = 512 MiB of .npy files per saved case
            cases.append((f"{name}/none/adaptive", Case(plans[name], seed=rep, adaptive=True, save=False)))
            cases.append((f"{name}/none/static-programs", Case(plans[name], seed=rep, engine="static",
                                                                save=False)))
            delays = tuple(float(d) for d in rng.uniform(0, a.stagger, n))
            for label, kw in (("adaptive", {"adaptive": True}), ("static-programs", {"engine": "static"}),
                              ("static-trees", {"adaptive": False})):
                save = rep == 0 and label == "adaptive"
                cases.append((f"{name}/stagger/{label}", Case(plans[name], seed=rep, delays=delays, save=save,
                                                              **kw)))
    # the failures come last: a killed rank stays dead for the rest of its job
    chunks = -(-a.size_mib // 1)  # 1 MiB adaptive chunks
    kill_job = [("allreduce/kill/adaptive", Case(plans["allreduce"], seed=99, adaptive=True,
                                                 kill=(n - 1, chunks)))]
    kill_job2 = [("broadcast/kill/adaptive", Case(plans["broadcast"], seed=98, adaptive=True,
                                                  kill=(n // 2, chunks // 2)))]
    results: dict[str, list[float]] = {}
    meta: dict[str, dict] = {}
    for job in (cases, kill_job, kill_job2):
        outs = run_local([c for _, c in job], timeout=60, overall=1800)
        for (label, case), out in zip(job, outs):
            died = {r for r, e in out.errors.items() if e == "died"}
            errs = {r: e for r, e in out.errors.items() if e != "died"}
            if errs:
                raise SystemExit(f"{label}: {errs}")
            plan = case.plan
            results.setdefault(label, []).append(_time(out))
            if case.delays:
                meta.setdefault(label, {}).setdefault("last_arrival", []).append(max(case.delays))
            if died:
                meta.setdefault(label, {})["died"] = sorted(died)
            if not case.save:
                continue
            ins = make_inputs(plan, case.seed)
            want = expected(plan, ins)
            if died:
                from hcc.backends.reference import _reduce

                contrib = out.info[min(out.info)]["contributors"]
                if plan.kind == "allreduce":
                    want = [_reduce(plan, [ins[r] for r in contrib])] * n
                want = [None if r in died else w for r, w in enumerate(want)]
            check(plan, out.outputs, want)
            meta.setdefault(label, {})["checked"] = True
        print(f"job of {len(job)} cases done", flush=True)
    hops = run_local([Case(two, seed=0, adaptive=True, save=False) for _ in range(a.reps)], timeout=60)
    one_hop = statistics.median(_time(h) for h in hops)

    med = {k: statistics.median(v) for k, v in results.items()}
    rows = []
    for name in ("broadcast", "allreduce"):
        base = med[f"{name}/none/adaptive"]
        kill = med.get(f"{name}/kill/adaptive")
        if kill is not None:
            rows.append((f"{name}: one failure vs none (adaptive)", kill, base, kill / base, "<= 1.5 + detection"))
        last = statistics.median(meta[f"{name}/stagger/adaptive"]["last_arrival"])
        ideal = last + one_hop
        for label in ("adaptive", "static-programs", "static-trees"):
            t = med[f"{name}/stagger/{label}"]
            rows.append((f"{name}: stagger [0,{a.stagger}] {label}", t, ideal, t / ideal,
                         "<= 1.2" if label == "adaptive" else "> adaptive"))
        rows.append((f"{name}: no delay, static programs", med[f"{name}/none/static-programs"], base,
                     med[f"{name}/none/static-programs"] / base, "(reference)"))
    print(f"\n{n} ranks, {a.size_mib} MiB, median of {a.reps}; one-hop (2-rank broadcast) = {one_hop:.3f} s")
    print(f"{'case':48s} {'time s':>8s} {'vs s':>8s} {'ratio':>6s}  target")
    for label, t, ref, ratio, target in rows:
        print(f"{label:48s} {t:8.3f} {ref:8.3f} {ratio:6.2f}  {target}")
    atomic_write_text(Path(a.out), json.dumps({
        "ranks": n, "size_mib": a.size_mib, "reps": a.reps, "stagger_s": a.stagger, "one_hop_s": one_hop,
        "times": results, "median": med, "meta": meta,
        "rows": [dict(case=r[0], seconds=r[1], reference_s=r[2], ratio=r[3], target=r[4]) for r in rows],
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
