"""DDP and all_reduce through torch.distributed: the "hcc" backend against "gloo", same run.

    .venv/bin/python benchmarks/ddp_bench.py [--ranks 4] [--steps 12] [--warmup 3] [--width 2048]
                                             [--layers 4] [--sizes 1,16,64] [--iters 8] [--quick]

One job of ``--ranks`` processes (env://) holds both process groups: the default group is gloo,
a second is ``dist.new_group(backend="hcc")``. Two copies of one model (the same seed) are
wrapped in ``DistributedDataParallel``, one per group, and trained on the same batches with
their steps alternating (hcc, gloo, hcc, ...), so both see the same load on this shared
machine; then ``all_reduce`` at each size alternates the same way. Every timed call starts
after a barrier on the gloo group; a step's time is the slowest rank's.

- model: ``--layers`` Linear(width, width) layers with ReLU (width 2048, 4 layers: 16.8 M
  parameters, 64 MiB of gradients, in DDP's default 25 MiB buckets) on a batch of 8 rows: the
  backward pass is short next to the gradient all-reduce, so communication dominates the step.
- busbw: nccl-tests' all_reduce bus bandwidth, algbw x 2(n-1)/n, on the median time.
- first call: the first hcc all_reduce of a size this job has not used, with an empty plan
  cache (the compile) and again in a second job that finds the plan on disk.
- ratio: gloo time / hcc time (> 1: hcc faster), median over the alternated iterations.

Topology: loopback, hcc's default (every rank is a process on this host: shared-memory channels
and the native core, plans compiled on a star of 8 GB/s, 20 us links with the ``shm`` cost
model; hcc/collectives.py). gloo runs as torchrun starts it (``LOCAL_WORLD_SIZE``,
``LOCAL_RANK``, ``GROUP_RANK``, ... set). ``--topology FILE.hcl`` passes ``HCC_TOPOLOGY`` instead. ``--netem b|c``
(root) builds BENCHMARKS.md's emulated topology (b) (a ring, one link 10x slower) or (c) (two
hosts joined by one slow link) with ``hcc netem``, runs every rank in its namespace (gloo bound
to the rank's link, hcc listening on the rank's address) and removes the emulation afterwards.

``--burners N`` starts N CPU burners (one busy process each, benchmarks/runtime_bench.py) beside
the measured job: a loaded machine, reproducibly.

Prints a table and writes benchmarks/results/ddp_bench.csv.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


# ------------------------------------------------------------------------------ one rank

def worker(args) -> int:
    import torch
    import torch.distributed as dist

    import hcc.torch  # noqa: F401  (registers "hcc")

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    t0 = time.perf_counter()
    hcc_pg = dist.new_group(backend="hcc")
    join_s = time.perf_counter() - t0
    gloo_pg = dist.new_group(backend="gloo")
    out: dict = {"rank": rank, "n": n, "join_s": join_s}
    comm = hcc_pg.comm  # the group is hcc.torch.ProcessGroupHCC itself
    local = len(getattr(comm.transport, "local_peers", ()))
    tcp = ("" if local == n - 1 else "TCP in the native core, " if getattr(comm.transport, "concurrent_runs", False)
           else "TCP in Python, ")
    out["hcc_path"] = (f"{local} of {n - 1} peers over shared memory, "
                       f"{tcp}{len(comm._lanes)} lane(s), plans for {comm.cache.topo_name} with "
                       f"{comm.cache.model.per_message_s * 1e6:g} us per message")

    def timed(fn) -> float:
        dist.barrier()  # on the default (gloo) group: both systems start from the same line
        t = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        return float(dt)

    # first calls: a size no one used yet (compile, or a plan found on disk by a second job),
    # right after joining (the process is still importing the compiler and the runtime) and
    # again at the end with a second new size (what a new bucket size costs mid-run)
    probe = torch.ones(args.probe_elems)
    out["first_call_s"] = timed(lambda: dist.all_reduce(probe, group=hcc_pg))
    out["second_call_s"] = timed(lambda: dist.all_reduce(probe, group=hcc_pg))

    if args.steps:
        def make_model():
            torch.manual_seed(0)
            layers = []
            for _ in range(args.layers):
                layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
            return torch.nn.Sequential(*layers)

        models = {"hcc": make_model(), "gloo": make_model()}
        ddps = {k: torch.nn.parallel.DistributedDataParallel(m, process_group=hcc_pg if k == "hcc" else gloo_pg)
                for k, m in models.items()}
        opts = {k: torch.optim.SGD(d.parameters(), lr=1e-3) for k, d in ddps.items()}
        gen = torch.Generator().manual_seed(100 + rank)
        batches = [(torch.randn(args.batch, args.width, generator=gen), torch.randn(args.batch, args.width, generator=gen))
                   for _ in range(args.warmup + args.steps)]
        step_times: dict[str, list[float]] = {"hcc": [], "gloo": []}
        calls: list = []  # (issued at, handle) of the hcc calls of the step timed last
        submit = comm.submit

        def traced(info, body, runs=1):
            h = submit(info, body, runs)
            calls.append((time.perf_counter(), h))
            return h

        if args.profile:
            comm.submit = traced
        for i, (x, y) in enumerate(batches):
            for k in (("hcc", "gloo") if i % 2 == 0 else ("gloo", "hcc")):
                def step(k=k, x=x, y=y):
                    opts[k].zero_grad()
                    torch.nn.functional.mse_loss(ddps[k](x), y).backward()
                    opts[k].step()
                calls.clear()
                t_step = time.perf_counter()
                dt = timed(step)
                if i >= args.warmup:
                    step_times[k].append(dt)
                if args.profile and k == "hcc" and calls:
                    # per bucket: issued, started, finished (s from the step's start), MiB
                    out.setdefault("profile", []).append(
                        [(round(t - t_step, 3), round(h.started_at - t_step, 3),
                          round(h.started_at + h.elapsed_s - t_step, 3), round(h.info.count * 4 / 2**20, 1))
                         for t, h in calls])
        pa = torch.cat([p.detach().reshape(-1) for p in models["hcc"].parameters()])
        pb = torch.cat([p.detach().reshape(-1) for p in models["gloo"].parameters()])
        out["params"] = int(pa.numel())
        out["max_param_diff"] = float((pa - pb).abs().max())
        out["step_s"] = step_times

    sizes = [int(s) for s in args.sizes.split(",") if s]
    ar: dict[str, dict[str, list[float]]] = {}
    for mib in sizes:
        elems = (mib << 20) // 4
        bufs = {"hcc": torch.ones(elems), "gloo": torch.ones(elems)}
        times: dict[str, list[float]] = {"hcc": [], "gloo": []}
        for i in range(args.warmup + args.iters):
            for k in (("hcc", "gloo") if i % 2 == 0 else ("gloo", "hcc")):
                pg = hcc_pg if k == "hcc" else gloo_pg
                dt = timed(lambda: dist.all_reduce(bufs[k], group=pg))
                bufs[k].fill_(1.0)
                if i >= args.warmup:
                    times[k].append(dt)
        ar[str(mib)] = times
    out["allreduce_s"] = ar
    late = torch.ones(args.probe_elems + 2)
    out["late_first_call_s"] = timed(lambda: dist.all_reduce(late, group=hcc_pg))
    # a size of an octave no call used yet (twice the probe: no bucket or --sizes entry is there)
    octave = torch.ones(2 * args.probe_elems + 1)
    out["octave_first_call_s"] = timed(lambda: dist.all_reduce(octave, group=hcc_pg))
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()
    return 0


# ------------------------------------------------------------------------------ the driver

def launch(args, cache: str, net=None, ranks: tuple[str, ...] = ()) -> dict:
    """One job of ``args.ranks`` processes; in ``net``'s namespaces (rank r on vertex
    ``ranks[r]``, gloo bound to that vertex's link device) when an emulation is given."""
    from hcc.backends.rendezvous import free_port

    port = free_port()
    procs = []
    for r in range(args.ranks):
        # as torchrun starts a worker (a gloo with a shared-memory path keys on LOCAL_WORLD_SIZE);
        # under --netem every rank is a host of its own
        local = 1 if net is not None else args.ranks
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(r % local),
                   LOCAL_WORLD_SIZE=str(local), GROUP_RANK=str(r // local), ROLE_RANK=str(r),
                   ROLE_WORLD_SIZE=str(args.ranks), GROUP_WORLD_SIZE=str(args.ranks // local),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HCC_CACHE_DIR=cache, OMP_NUM_THREADS="1")
        if args.topology:
            env["HCC_TOPOLOGY"] = args.topology
        cmd = [sys.executable, __file__, "--worker"] + [a for a in sys.argv[1:] if a != "--worker"]
        if net is not None:
            v = ranks[r]
            env["MASTER_ADDR"] = net.address(ranks[0])
            env["HCC_RANKS"] = ",".join(ranks)
            env["HCC_HOST"] = net.address(v)
            env["GLOO_SOCKET_IFNAME"] = next(e.dev for e in net.ends if e.vertex == v)
            cmd = net.wrap(v, cmd)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    from hcc.collectives import wait_all

    try:
        done = wait_all(procs, args.deadline)
    except TimeoutError:
        raise SystemExit(f"ddp_bench: a rank did not finish in {args.deadline:g} s") from None
    result = None
    errors = [e[-2000:] for code, _, e in done if code]
    for _, o, _ in done:
        for line in o.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[7:])
    if errors or result is None:
        raise SystemExit("ddp_bench: a rank failed:\n" + "\n".join(errors))
    return result


def netem_up(args, cache: str):
    """Emulate topology (b) or (c) of BENCHMARKS.md (benchmarks/netem_bench.py's cases) on
    ``args.ranks`` ranks; hcc compiles for the emulation as built (``Netem.model_topology``,
    written to an .hcl in ``cache`` and passed as HCC_TOPOLOGY)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from netem_bench import make_case, to_hcl

    from hcc import netem

    case = make_case(args.netem, args.ranks)
    net = netem.up(case.topology, name=f"ddp-{case.name}", scale=case.scale, routing=case.routing)
    path = Path(cache) / f"{case.name}.hcl"
    path.write_text(to_hcl(net.model_topology()))
    args.topology = str(path)
    return net, case.ranks, f"{case.name} ({args.netem})"


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12, help="timed DDP steps per backend")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--sizes", default="1,16,64", help="all_reduce sizes in MiB")
    ap.add_argument("--iters", type=int, default=8, help="timed all_reduces per size and backend")
    ap.add_argument("--probe-elems", type=int, default=1_000_003, help="elements of the first-call probe")
    ap.add_argument("--topology", default=None, help="an .hcl for HCC_TOPOLOGY (default: hcc's star)")
    ap.add_argument("--deadline", type=float, default=1800.0, help="seconds a job may take")
    ap.add_argument("--netem", choices=["b", "c"], default=None,
                    help="run on emulated topology (b) or (c) of BENCHMARKS.md (root)")
    ap.add_argument("--profile", action="store_true",
                    help="print when each hcc bucket all-reduce was issued, started and finished")
    ap.add_argument("--burners", type=int, default=0,
                    help="this many CPU burners (one busy process each) beside the measured job: a loaded machine")
    ap.add_argument("--quick", action="store_true", help="2 ranks, a small model, 1 and 4 MiB")
    ap.add_argument("--csv", default=None, help="default: benchmarks/results/ddp_bench[_netem_b|c].csv")
    args = ap.parse_args(argv)
    if args.quick:
        args.ranks, args.steps, args.warmup, args.width, args.layers = 2, 4, 1, 512, 2
        args.sizes, args.iters = "1,4", 3
    if args.worker:
        return worker(args)
    net, ranks, topo = None, (), "loopback" if not args.topology else Path(args.topology).stem
    with tempfile.TemporaryDirectory(prefix="hcc-ddp-bench-") as cache:
        if args.netem:
            net, ranks, topo = netem_up(args, cache)
        try:
            t0 = time.monotonic()
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from runtime_bench import start_burners, stop_burners

            burners = start_burners(args.burners) if args.burners else []
            try:  # the measured job only: the warm job's first calls are not loaded
                res = launch(args, cache, net, ranks)
            finally:
                stop_burners(burners)
            # a second job on the same cache: the first call now loads its plan from disk
            warm = launch(argparse.Namespace(**{**vars(args), "steps": 0, "sizes": ""}), cache, net, ranks)
            wall = time.monotonic() - t0
        finally:
            if net is not None:
                from hcc import netem

                netem.down(net.name, kill=True)
    n = res["n"]
    rows = []
    print(f"ddp_bench: {n} ranks on {topo}, {res.get('params', 0) / 1e6:.1f} M parameters "
          f"({res.get('params', 0) * 4 / 2**20:.0f} MiB of gradients), {args.steps} steps per backend, "
          f"{wall:.0f} s")
    print(f"hcc: {res['hcc_path']}" + (f"; {args.burners} CPU burners beside the job" if args.burners else ""))
    print(f"hcc first all_reduce of {args.probe_elems} floats right after joining: {res['first_call_s']:.3f} s "
          f"with an empty plan cache, {warm['first_call_s']:.3f} s with the plan on disk; "
          f"{res['second_call_s']:.4f} s the second time; joining the hcc group: {res['join_s']:.2f} s")
    print(f"hcc first all_reduce of a new size ({args.probe_elems + 2} floats) late in the job: "
          f"{res['late_first_call_s']:.3f} s compiling it, {warm['late_first_call_s']:.3f} s from disk")
    print(f"hcc first all_reduce of a size in a new octave ({2 * args.probe_elems + 1} floats) late in the job: "
          f"{res['octave_first_call_s']:.3f} s compiling it, {warm['octave_first_call_s']:.3f} s from disk")
    print(f"{'metric':<24}{'hcc':>12}{'gloo':>12}{'gloo/hcc':>10}")
    for k, prof in enumerate(res.get("profile", [])):
        print(f"  hcc step {k} rank 0, per call (issued, started, finished s; MiB): {prof}")
    if args.steps:
        h, g = res["step_s"]["hcc"], res["step_s"]["gloo"]
        ratios = [b / a for a, b in zip(h, g)]
        print(f"{'DDP step s':<24}{med(h):>12.4f}{med(g):>12.4f}{med(ratios):>10.2f}")
        print(f"  params hcc vs gloo after {args.warmup + args.steps} steps: max |diff| {res['max_param_diff']:.2e}")
        rows.append({"topology": topo, "ranks": n, "metric": "ddp_step_s", "size_mib": round(res["params"] * 4 / 2**20, 1),
                     "hcc": med(h), "gloo": med(g), "ratio": med(ratios), "ratio_min": min(ratios),
                     "ratio_max": max(ratios), "iters": len(h)})
    factor = 2 * (n - 1) / n
    for mib, t in res["allreduce_s"].items():
        h, g = t["hcc"], t["gloo"]
        ratios = [b / a for a, b in zip(h, g)]
        bus = lambda s: (int(mib) << 20) / s * factor / 1e9  # noqa: E731
        print(f"{'allreduce ' + mib + ' MiB busbw GB/s':<24}{bus(med(h)):>12.3f}{bus(med(g)):>12.3f}{med(ratios):>10.2f}")
        rows.append({"topology": topo, "ranks": n, "metric": "allreduce_s", "size_mib": int(mib), "hcc": med(h),
                     "gloo": med(g), "ratio": med(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "iters": len(h)})
    for metric, job, key, elems in (("first_call_cold_s", res, "first_call_s", args.probe_elems),
                                    ("late_first_call_cold_s", res, "late_first_call_s", args.probe_elems + 2),
                                    ("late_first_call_disk_s", warm, "late_first_call_s", args.probe_elems + 2),
                                    ("first_call_disk_s", warm, "first_call_s", args.probe_elems),
                                    ("octave_first_call_cold_s", res, "octave_first_call_s", 2 * args.probe_elems + 1),
                                    ("octave_first_call_disk_s", warm, "octave_first_call_s", 2 * args.probe_elems + 1)):
        rows.append({"topology": topo, "ranks": n, "metric": metric, "size_mib": round(elems * 4 / 2**20, 2),
                     "hcc": job[key], "gloo": "", "ratio": "", "ratio_min": "", "ratio_max": "", "iters": 1})
    path = Path(args.csv or RESULTS / f"ddp_bench{'_netem_' + args.netem if args.netem else ''}.csv")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
