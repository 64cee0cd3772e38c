"""Wire bytes and time of a compressed allreduce (int8 / fp16 / none), 4 ranks, 64 MiB float32.

    python benchmarks/relax_bench.py                     # loopback, and the shaped link when root
    python benchmarks/relax_bench.py --no-netem --iters 3
    python benchmarks/relax_bench.py --link "20 MB/s"    # the emulated link's bandwidth
    python benchmarks/relax_bench.py --chunk auto        # the compiler's chunk choice

Two settings, each a real run of 4 sockets-backend processes (backends/launch.py):
- ``loopback``: the ranks talk over 127.0.0.1. The links are memory copies, several GB/s; the
  2 shared cores, not the network, bound the time, so compression mostly costs CPU here.
- ``netem``: the same 4 ranks, each in its own network namespace, every pair joined by a
  veth link shaped by ``tc`` to ``--link`` (hcc/netem.py, ``hcc netem``): the link is the
  bottleneck, which is where BAGUA's relaxation pays. Needs root; otherwise it is skipped and
  the CSV says why.

Every plan is what ``hcc compile`` gives for the collective (``algorithm = auto``, ``chunk``
from ``--chunk``, the same for all three): ``none`` may pick any algorithm; ``int8``/``fp16``
are priced with their wire bytes and may use the compressed lowering
(compiler/lower_relax.py). Per row: wire bytes (Σ of every message put
on a link, from the plan and the codec's sizes), their ratio to ``none``, the predicted time,
the median and best measured time over ``--iters`` runs after one warm-up, the speed-up over
``none`` in the same setting, and the largest error against the float64 sum of the inputs.

Targets (issue 5): int8 wire bytes ≤ 0.26x of float32, and ≥ 2.5x faster than ``none``
when the link is the bottleneck. Results: ``benchmarks/results/relax.csv``.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WORLD = 4
MODES = ("none", "fp16", "int8")
FIELDS = ["setting", "compress", "algorithm", "chunk_bytes", "size_bytes", "wire_bytes", "wire_ratio",
          "predicted_s", "median_s", "best_s", "speedup_vs_none", "max_abs_err", "note"]


def source(size: str, link: str, chunk: str = "auto") -> str:
    cols = "\n".join(
        f"collective ar_{m} = allreduce on quad {{ size = {size}  op = sum  compress = {m}  chunk = {chunk} }}"
        for m in MODES)
    return f"""
topology quad {{
    node r[0..{WORLD - 1}]
    r[0..{WORLD - 1}] <-> r[0..{WORLD - 1}] : {link}
}}
{cols}
"""


def compile_plans(size: str, link: str, chunk: str = "auto"):
    import hcc

    program = hcc.load(source(size, link, chunk))
    return program, {m: hcc.compile(program, f"ar_{m}") for m in MODES}


def measure(plans: dict, setting: str, iters: int, timeout: float, launch_kw: dict | None = None) -> list[dict]:
    from hcc.backends.launch import run_cases_local
    from hcc.backends.reference import make_inputs

    seed = 7
    cases = [(plans[m], seed) for m in MODES]
    results = run_cases_local("sockets", cases, iters=iters, warmup=1, timeout=timeout, **(launch_kw or {}))
    inputs = make_inputs(plans["none"], seed)
    exact = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    rows = []
    base_wire = plans["none"].figures.wire_bytes
    for m, res in zip(MODES, results):
        plan = plans[m]
        err = max(float(np.max(np.abs(o.astype(np.float64) - exact))) for o in res.outputs)
        rows.append({
            "setting": setting, "compress": m, "algorithm": plan.algorithm, "chunk_bytes": plan.chunk_bytes,
            "size_bytes": plan.size_bytes, "wire_bytes": plan.figures.wire_bytes,
            "wire_ratio": plan.figures.wire_bytes / base_wire if base_wire else 0.0,
            "predicted_s": plan.figures.predicted_s, "median_s": statistics.median(res.times),
            "best_s": min(res.times), "max_abs_err": err, "note": "",
        })
    none_t = rows[0]["median_s"]
    for r in rows:
        r["speedup_vs_none"] = none_t / r["median_s"] if r["median_s"] > 0 else 0.0
    return rows


def netem_rows(size: str, link: str, chunk: str, iters: int, timeout: float) -> list[dict]:
    from hcc import netem

    if os.geteuid() != 0:
        return [{"setting": "netem", "note": "skipped: needs root for network namespaces"}]
    try:
        netem.check_permitted()
    except netem.NetemError as e:
        return [{"setting": "netem", "note": f"skipped: {e}"}]
    program, _ = compile_plans(size, link, chunk)
    topo = program.topologies["quad"]
    name = f"relax{os.getpid() % 100000}"
    emu = netem.up(topo, name=name, scale=1.0)
    try:
        import hcc
        from dataclasses import replace

        # compile against the topology as emulated (same capacities at scale 1)
        prog = replace(program, topologies={"quad": emu.topology})
        plans = {m: hcc.compile(prog, f"ar_{m}") for m in MODES}
        ranks = plans["none"].ranks
        with emu.inside(ranks[0]):
            kw = emu.launch_kwargs(ranks)
            rows = measure(plans, "netem", iters, timeout, kw)
        for r in rows:
            r["note"] = f"every link {link} (tc htb), 4 namespaces"
        return rows
    finally:
        netem.down(name, kill=True)


def table(rows: list[dict]) -> str:
    head = f"{'setting':<9}{'compress':<9}{'algorithm':<15}{'chunk':>10}{'wire MiB':>10}{'ratio':>7}" \
           f"{'predicted':>11}{'median':>10}{'best':>10}{'speedup':>9}{'max err':>10}"
    out = [head, "-" * len(head)]
    for r in rows:
        if "median_s" not in r:
            out.append(f"{r['setting']:<9}{r['note']}")
            continue
        out.append(
            f"{r['setting']:<9}{r['compress']:<9}{r['algorithm']:<15}{r['chunk_bytes'] / 2**20:>8.2f}Mi"
            f"{r['wire_bytes'] / 2**20:>10.1f}{r['wire_ratio']:>7.3f}{r['predicted_s']:>10.3f}s"
            f"{r['median_s']:>9.3f}s{r['best_s']:>9.3f}s{r['speedup_vs_none']:>8.2f}x{r['max_abs_err']:>10.2g}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="64 MiB")
    ap.add_argument("--link", default="20 MB/s", help="bandwidth of every emulated link")
    ap.add_argument("--iters", type=int, default=3)
    # 1 MiB, not "auto": the cost model charges no codec CPU, so auto sends one 16 MiB message
    # per block, encoded whole before its first byte leaves; 1 MiB chunks let the sockets
    # writer threads send chunk k while chunk k+1 is encoded (loopback int8: 0.57 s vs 1.56 s).
    ap.add_argument("--chunk", default="1 MiB", help="chunk size of every plan (\"auto\": the compiler's choice)")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--no-netem", action="store_true", help="loopback only")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "relax.csv"))
    a = ap.parse_args(argv)

    t0 = time.perf_counter()
    _, plans = compile_plans(a.size, "1 GB/s", a.chunk)
    rows = measure(plans, "loopback", a.iters, a.timeout)
    if a.no_netem:
        rows.append({"setting": "netem", "note": "skipped: --no-netem"})
    else:
        rows += netem_rows(a.size, a.link, a.chunk, a.iters, a.timeout)
    print(f"allreduce sum, {WORLD} ranks, {a.size} float32, sockets backend; "
          f"{a.iters} timed runs after 1 warm-up ({time.perf_counter() - t0:.0f} s in all)")
    print(table(rows))

    from hcc.ir.files import atomic_write_text
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    atomic_write_text(a.out, buf.getvalue())
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
