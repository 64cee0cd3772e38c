"""Adaptive runtime figures (issue 4): one failure vs none, staggered arrivals adaptive vs static,
and what the default (adaptive on, with its fast path) costs when nobody is late.

    .venv/bin/python benchmarks/fault_bench.py [--ranks 8] [--size-mib 64] [--reps 3] [--stagger 0.5]

8 local ranks over sockets (backends/testing.py's harness: one process per rank, reused
across the cases of a job; the first case of every job is a warm-up that is not counted: it
opens the connections and the agreement session). Times are seconds from a common start
barrier to the moment a rank's run returns; a case's time is the maximum over the ranks that
survive it, then the median over reps. Cases of one rep run back to back in one job, so a
busy machine slows them alike: compare within a row, not across runs of this script.

Engines (``Case``):
- default: the plan as a user compiles it (``on_failure = abort``, ``adaptive`` not said =
  on for sockets): when the log shows every rank present the plan's flattened program runs
  (the fast path), otherwise the adaptive schedule;
- adaptive: the adaptive executor forced (``adaptive=True``) on an ``on_failure = continue``
  plan — what a run that must survive deaths pays;
- static: the flattened program (``adaptive = off``), backends/executor.py.

1. failure: allreduce and broadcast without failure, then with one rank SIGKILLed half-way
   through its chunks (``on_failure = continue``). Target: survivors within 1.5x the
   no-failure time plus the detection delay (an EOF on loopback: well under a millisecond;
   the agreement adds two store round trips).
2. staggered arrivals: start delays uniform in [0, T], the same delays for every engine of a
   rep. Target: within 1.2x of (last arrival + one-hop time) and faster than static. The
   **one-hop time** is measured in the same job, in every rep: rank 0 sends its whole
   64 MiB input to rank 1 as one message over one TCP connection while the other ranks idle
   (harness engine "hop"), timed from the start barrier to rank 1's receive completion.
3. nobody late: default vs ``adaptive = off`` (the fast path's price: one log append, and
   waiting until the log shows every arrival), at the bench size and at 1 MiB.

Writes benchmarks/results/fault_bench.json and fault_bench.csv and prints the table.

``--netem`` (root): the same cases where the *links* are the bottleneck, not the two shared
cores. On loopback, after the last arrival a star allreduce moves ~7x the bytes of "one hop"
through the same two cores, so a network property is measured on a machine bottleneck.
Here ``hcc netem`` (hcc/netem.py) builds a star: every rank ``g<i>`` on one switch ``s``
through its own full-duplex link of ``--link-MBps`` MB/s (no latency), every rank runs in its
namespace (``Netem.launch_kwargs``, the launcher's store in ``g0``'s), and the emulation is
taken down however the run ends (Ctrl-C and SIGTERM included). Plans are compiled for that
star. The one-hop time is the same rank 0 -> rank 1 message, which here crosses *two* star
links (g0 -> s -> g1), both of B: its time is M / B plus one packet. The stagger scale T
defaults to 2 x M / B, the loopback run's ratio (T = 0.5 s against a 0.26 s hop). Every case
records its ranks' CPU time against their wall time (a share far below 1 means the rank
waited on its links), and each job how busy the whole machine was. One more engine for
allreduce, "adaptive-1MiB": the adaptive executor with ``chunk_bytes`` = 1 MiB (its star
chunks were 4 MiB, sized for loopback's per-chunk CPU cost, which left an owner waiting for a
whole 4 MiB chunk of the last rank's piece at B/(n-1) before it could forward anything; they
are now 50 ms of the slowest link, 1 MB at 20 MB/s, so the two rows nearly coincide: the row
stays for comparison with earlier runs). The failure runs kill their victim half-way through its own data chunks, counted
in the same job's no-failure adaptive run. ``--only-stagger`` keeps only the staggered cases and
their one-hop reference (the per-seed comparison: ``--kinds allreduce --only-stagger --seed S``);
``--seeds-table J1 J2 ... --out CSV`` tabulates such runs (per rep: ratio, hops after the last
arrival, and the two-sided model's best for its arrivals, :func:`model_best_hops`). Staggered
cases also record each rank's sub-blocks owned and a trace after the last arrival (``meta``:
``owns``, ``trace``: when its last piece / result left and came in).
``--trace`` makes the staggered adaptive cases record every star data chunk's send post, send
completion and receive (``meta[...]["events"]``, seconds from the last arrival) and
``--trace-report JSON`` prints, per rank, what its link carried after the last arrival L:
bytes in and out, the out side split into pieces, results of its own sub-blocks and results
it relayed, and when its last byte came in and left (receivers' clocks; one machine).
``--engines default`` (with ``static``, which always runs) shortens such a run.
Before bringing the star up the script waits (at
most ``--wait-busy`` s) while another emulation runs processes: two emulations coexist
(distinct namespaces), but would share the two cores. Writes fault_bench_netem.{json,csv}.

    sudo .venv/bin/python benchmarks/fault_bench.py --netem [--link-MBps 20] [--size-mib 64] [--reps 3]
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import signal
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np

import hcc
from hcc.backends.testing import Case, run_local
from hcc.backends.reference import ResultMismatch, _reduce, check, expected, make_inputs
from hcc.ir.files import atomic_write_text

KINDS = ("broadcast", "allreduce")


def _topology_src(n: int, star_MBps: float | None = None) -> str:
    """A clique of 1 GB/s links (loopback), or with ``star_MBps`` a star: every rank on one
    switch ``s`` through its own full-duplex link (the --netem network)."""
    if star_MBps is None:
        return f"topology t {{ node g[0..{n - 1}]\n  g[0..{n - 1}] <-> g[0..{n - 1}] : 1 GB/s, 10 us }}"
    return f"topology t {{ node g[0..{n - 1}]  switch s\n  g[0..{n - 1}] <-> s : {star_MBps:g} MB/s }}"


def _src(n: int, size: str, star_MBps: float | None = None) -> str:
    lines = [_topology_src(n, star_MBps)]
    for k in KINDS:
        lines.append(f"collective {k} = {k} on t {{ size = {size}  on_failure = continue }}")
        lines.append(f"collective {k}_default = {k} on t {{ size = {size} }}")
    return "\n".join(lines) + "\n"


def _compile(n: int, size: str, star_MBps: float | None = None) -> dict:
    prog = hcc.load(_src(n, size, star_MBps))
    plans = {c.name: hcc.compile(prog, c.name) for c in prog.collectives}
    # the *_default plans do not say `adaptive`: the backend's default (Plan.adaptive None;
    # set here in case the compiler still writes False for "not said")
    return {k: replace(p, adaptive=None) if k.endswith("_default") else p for k, p in plans.items()}


def _time(out, survivors=None) -> float:
    ranks = [r for r in out.info if survivors is None or r in survivors]
    return max(out.info[r]["seconds"] for r in ranks)


def _engines(plans: dict, kind: str, small_star_chunks: bool = False) -> dict:
    eng = {"default": dict(plan=plans[f"{kind}_default"]),
           "adaptive": dict(plan=plans[kind], adaptive=True),
           "static": dict(plan=plans[kind], engine="static")}
    if small_star_chunks and kind == "allreduce":
        # an explicit 1 MiB chunk (the run's public chunk_bytes option); the star allreduce's
        # own chunk is 50 ms of the slowest link within [256 KiB, 4 MiB] (adaptive.STAR_CHUNK_S:
        # 1 MB on 20 MB/s links), so this row now checks that the default is as good
        eng["adaptive-1MiB"] = dict(plan=plans[kind], adaptive=True, chunk_bytes=1 << 20)
    return eng


def _machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot (/proc/stat's first line)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    return sum(f) - idle, sum(f)


def _run_job(job: list, results: dict, meta: dict, emu=None, jobs: list | None = None) -> None:
    """Run one job's cases; with ``emu`` (a Netem) every rank in its namespace."""
    cases = [c for _, c in job]
    j0 = _machine_jiffies()
    if emu is None:
        outs = run_local(cases, timeout=60, overall=1800)
    else:
        ranks = cases[0].plan.ranks
        with emu.inside(ranks[0]):  # the launcher's store must live where the ranks can reach it
            outs = run_local(cases, timeout=120, overall=3600, **emu.launch_kwargs(ranks))
    j1 = _machine_jiffies()
    if jobs is not None:
        jobs.append({"cases": len(job), "machine_busy": round((j1[0] - j0[0]) / max(j1[1] - j0[1], 1), 3)})
    for (label, case), out in zip(job, outs):
        died = {r for r, e in out.errors.items() if e == "died"}
        errs = {r: e for r, e in out.errors.items() if e != "died"}
        if errs:
            raise SystemExit(f"{label}: {errs}")
        if label is None:
            continue  # the warm-up
        results.setdefault(label, []).append(_time(out))
        m = meta.setdefault(label, {})
        if case.delays:
            m.setdefault("last_arrival", []).append(max(case.delays))
            m.setdefault("delays", []).append(list(case.delays))
        paths = sorted({str((out.info[r].get("stats") or {}).get("path")) for r in out.info})
        m.setdefault("paths", []).append("/".join(paths))
        # CPU against wall per rank (ranks that did nothing, e.g. 2..n-1 of "hop", left out):
        # the busiest rank's share, and the mean
        shares = [i["cpu_seconds"] / i["seconds"] for i in out.info.values()
                  if i.get("seconds", 0) > 0.05 and "cpu_seconds" in i]
        if shares:
            m.setdefault("cpu_share_max", []).append(round(max(shares), 3))
            m.setdefault("cpu_share_mean", []).append(round(statistics.fmean(shares), 3))
        m.setdefault("data_chunks", []).append(
            {r: (i.get("stats") or {}).get("chunks_sent", 0) + (i.get("stats") or {}).get("chunks_received", 0)
             for r, i in out.info.items()})
        if case.delays:  # who owned how many star sub-blocks, and each rank's own time (s)
            m.setdefault("owns", []).append({r: (i.get("stats") or {}).get("owns") for r, i in out.info.items()})
            m.setdefault("rank_seconds", []).append({r: round(i.get("seconds", 0.0), 3) for r, i in out.info.items()})
            # the trace after the last arrival L (one machine's monotonic clock): per rank,
            # seconds from L to its arrival and to when its last piece / result copy left and
            # its last piece / result came in
            st = {r: (i.get("stats") or {}) for r, i in out.info.items()}
            arr = [v["t_arrived"] for v in st.values() if "t_arrived" in v]
            if arr:
                m.setdefault("trace", []).append(
                    {r: {k[2:]: round(v[k] - max(arr), 3) for k in ("t_arrived", "t_piece_out", "t_piece_in",
                                                                  "t_result_out", "t_result_in") if k in v}
                     for r, v in st.items()})
                if any("events" in v for v in st.values()):
                    # --trace: every star data chunk's events, seconds from L (trace_report)
                    L = max(arr)
                    anyst = next(v for v in st.values() if "events" in v)
                    m.setdefault("events", []).append({
                        "ranks": {r: [[round(e[0] - L, 4)] + e[1:] for e in v.get("events", [])]
                                  for r, v in st.items()},
                        "arrived": {r: round(v["t_arrived"] - L, 4) for r, v in st.items() if "t_arrived" in v},
                        "chunk_bytes": anyst["chunk_bytes"], "owner": anyst["owner"]})
        if died:
            m["died"] = sorted(died)
        if not case.save:
            continue
        plan = case.plan
        ins = make_inputs(plan, case.seed)
        want = expected(plan, ins)
        if died:
            contrib = out.info[min(out.info)]["contributors"]
            if plan.kind == "allreduce":
                want = [_reduce(plan, [ins[r] for r in contrib])] * plan.n
            want = [None if r in died else w for r, w in enumerate(want)]
        try:
            check(plan, out.outputs, want)
            m.setdefault("checked", True)  # a mismatch in an earlier rep stays recorded
        except ResultMismatch as e:  # recorded and reported (exit status 1), the figures kept
            m["checked"] = False
            m["mismatch"] = str(e)
            m["agreed"] = {r: [out.info[r].get("contributors"), out.info[r].get("generation")] for r in out.info}
            print(f"{label}: WRONG RESULT: {e}; per rank (contributors, generation): {m['agreed']}", flush=True)


def _busy_emulations(mine: str) -> dict[str, list[int]]:
    """Other ``hcc netem`` emulations with processes running inside (a benchmark at work):
    they coexist with ours (distinct namespaces), but share the two cores."""
    from hcc import netem

    busy = {}
    for name in netem.names():
        if name == mine:
            continue
        try:
            e = netem.load(name)
        except netem.NetemError:
            busy[name] = []  # being built right now
            continue
        pids = [p for _, ns in e.namespaces for p in netem.namespace_pids(ns)]
        if pids:
            busy[name] = pids
    return busy


@contextlib.contextmanager
def _emulation(n: int, link_MBps: float, name: str, wait_s: float, info: dict):
    """Bring the star up as ``name`` and always take it down again. Waits (at most ``wait_s``)
    while another emulation runs processes, so that the figures are not another benchmark's
    CPU load; never touches another emulation."""
    from hcc import netem

    netem.check_permitted()
    topo = hcc.load(_topology_src(n, link_MBps) + "\n").topologies["t"]
    end = time.monotonic() + wait_s
    while True:
        busy = _busy_emulations(name)
        if not busy or time.monotonic() >= end:
            break
        print(f"waiting for busy emulations {sorted(busy)} ({end - time.monotonic():.0f} s left)", flush=True)
        time.sleep(min(15.0, max(end - time.monotonic(), 0.1)))
    info["other_emulations_busy_at_start"] = sorted(busy)
    if name in netem.names():  # our own leftover (an earlier run killed with -9): ours to remove
        netem.down(name, kill=True)
    emu = netem.up(topo, name, delay_mode="none")
    try:
        yield emu
    finally:
        netem.down(name, kill=True)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _build_jobs(a, n: int, plans: dict, small: dict) -> tuple[list, list]:
    """The main job (warm-up, then per rep: hop, and per kind and engine nobody-late and
    staggered cases) and the 1 MiB nobody-late job."""
    rng = np.random.default_rng(a.seed)
    job: list = [(None, Case(plans["allreduce"], seed=0, adaptive=True, save=False))]
    for rep in range(a.reps):
        job.append(("hop", Case(plans["allreduce"], seed=rep, engine="hop", save=False)))
        for kind in a.kinds:
            delays = tuple(float(d) for d in rng.uniform(0, a.stagger, n))
            for eng, kw in _engines(plans, kind, a.netem).items():
                if a.engines and eng not in a.engines and eng != "static":
                    continue  # --engines (static stays: the rows' last arrival comes from it)
                if not a.only_stagger:
                    job.append((f"{kind}/none/{eng}", Case(seed=rep, save=False, **kw)))
                # outputs are checked for the first rep of the staggered runs only: 64 MiB x 8
                # ranks = 512 MiB of .npy files per saved case
                job.append((f"{kind}/stagger/{eng}", Case(seed=rep, delays=delays, save=rep == 0,
                                                          trace=a.trace and eng != "static", **kw)))
    small_job: list = [(None, Case(small["allreduce_default"], seed=0, save=False))]
    for rep in range(a.small_reps):
        for kind in a.kinds:
            small_job.append((f"{kind}/1MiB/default", Case(small[f"{kind}_default"], seed=rep, save=False)))
            small_job.append((f"{kind}/1MiB/static", Case(small[kind], seed=rep, engine="static", save=False)))
    return job, small_job


def _kill_jobs(n: int, plans: dict, kill_at: dict, reps: int = 1, kinds=KINDS) -> list:
    """Per rep, one job per kind (a killed rank stays dead for its job): warm-up, no failure,
    then the victim SIGKILLs itself after ``kill_at[kind] = (rank, data chunks)``."""
    jobs = []
    for rep in range(reps):
        for kind, seed in ((k, v) for k, v in (("allreduce", 99), ("broadcast", 98)) if k in kinds):
            seed += 1000 * rep
            jobs.append([(None, Case(plans[kind], seed=0, adaptive=True, save=False)),
                         (f"{kind}/none/adaptive-k", Case(plans[kind], seed=seed, adaptive=True)),
                         (f"{kind}/kill/adaptive", Case(plans[kind], seed=seed, adaptive=True,
                                                        kill=kill_at[kind]))])
    return jobs


def _per_rep(times: Sequence[float], refs: Sequence[float], add: float = 0.0) -> list[float]:
    """Each rep's own ratio: its time over its own reference (+ ``add``, e.g. one hop).

    >>> _per_rep([12.0, 10.0], [6.0, 4.0], add=2.0)
    [1.5, 1.6666666666666667]
    """
    return [t / (r + add) for t, r in zip(times, refs)]


def _rows(a, med: dict, meta: dict, results: dict | None = None) -> list[dict]:
    """The printed rows. A staggered row's ``ratio`` is the median over the reps of each rep's
    own ratio (its time over its own last arrival + one hop; against static, over the static
    time of the same arrivals): every rep draws new delays, so the median time and the median
    last arrival may come from different reps. ``ratio_of_medians`` keeps the median time over
    the median reference (the figure this row printed before): in a seed-7 run
    whose first rep stalled 4.6 s on one TCP connection it paired the third rep's time
    (L = 6.68 s) with the first rep's arrival (6.02 s), 1.26 against that rep's own 1.18."""
    def cpu(label: str) -> float | None:
        v = meta.get(label, {}).get("cpu_share_max")
        return statistics.median(v) if v else None

    one_hop = med.get("hop")
    rows = []

    def row(case, label, ref, target, ref_label=None, per_rep=None):
        t = med[label]
        rows.append(dict(case=case, seconds=t, reference_s=ref,
                         ratio=statistics.median(per_rep) if per_rep else t / ref, ratio_of_medians=t / ref,
                         target=target, cpu_share=cpu(label), ref_cpu_share=cpu(ref_label) if ref_label else None))

    for kind in a.kinds:
        if f"{kind}/kill/adaptive" in med:
            row(f"{kind}: one failure vs none (adaptive)", f"{kind}/kill/adaptive",
                med[f"{kind}/none/adaptive-k"], "<= 1.5 + detection", f"{kind}/none/adaptive-k")
        if "hop" not in med:  # --only-failure
            continue
        lasts = meta[f"{kind}/stagger/static"]["last_arrival"]
        ideal = statistics.median(lasts) + one_hop
        static_t = med[f"{kind}/stagger/static"]
        res = results or {}
        for eng in ("default", "adaptive", "adaptive-1MiB", "static"):
            label = f"{kind}/stagger/{eng}"
            if label not in med:
                continue
            ts = res.get(label, [])
            row(f"{kind}: stagger [0,{a.stagger:g}] {eng}", label, ideal,
                "<= 1.2" if eng != "static" else "(baseline)",
                per_rep=_per_rep(ts, lasts, one_hop))
            if eng != "static":
                row(f"{kind}: stagger {eng} vs static", label, static_t, "< 1", f"{kind}/stagger/static",
                    per_rep=_per_rep(ts, res.get(f"{kind}/stagger/static", [])))
        if f"{kind}/none/static" not in med:  # --only-stagger
            continue
        st = med[f"{kind}/none/static"]
        for eng in ("default", "adaptive", "adaptive-1MiB"):
            if f"{kind}/none/{eng}" not in med:
                continue
            row(f"{kind}: nobody late, {eng} vs adaptive=off", f"{kind}/none/{eng}", st,
                "~1" if eng == "default" else "(reported)", f"{kind}/none/static")
        row(f"{kind}: 1 MiB nobody late, default vs adaptive=off", f"{kind}/1MiB/default",
            med[f"{kind}/1MiB/static"], "~1", f"{kind}/1MiB/static")
    return rows


def model_best_hops(arrivals: Sequence[float], hop: float, iters: int = 20000) -> float:
    """The least post-last-arrival load, in hops, that any star ownership reaches in the
    two-sided fluid model of repair.share_by_load (docs/fault-tolerance.md, "Both directions
    of a link"): rank r owns a share x_r of the buffer, pushes its pieces from its arrival at
    link speed, and after the last arrival its link carries max(out_r, in_r) with out_r =
    rem_r + (n-1) x_r and in_r = (1 - x_r) + sum_k rem_k x_r / (1 - x_k). Found by moving
    share from the most to the least loaded rank while the maximum drops (step halved
    otherwise): an upper bound on the optimum, tight to about 0.01 hop on 8 ranks."""
    a = np.asarray(arrivals, dtype=float)
    n, last = len(a), float(np.max(a))

    def loads(x):
        rem = np.maximum(0.0, (1.0 - x) - (last - a) / hop)
        out = rem + (n - 1) * x
        share = rem / np.maximum(1.0 - x, 1e-12)
        into = (1.0 - x) + x * (share.sum() - share)
        return np.maximum(out, into)

    x = np.full(n, 1.0 / n)
    step = 0.05
    for _ in range(iters):
        cur = loads(x)
        hi, lo = int(np.argmax(cur)), int(np.argmin(cur))
        y = x.copy()
        d = min(step, y[hi])
        y[hi] -= d
        y[lo] += d
        if loads(y).max() < cur.max() - 1e-12:
            x = y
        else:
            step /= 2
            if step < 1e-7:
                break
    return float(loads(x).max())


def _stagger_delays(d: dict, kind: str) -> list[tuple[float, ...]]:
    """The staggered delays a run used, per rep: recorded, or drawn again as _build_jobs drew
    them (one generator for the run, per rep one draw per kind in KINDS order)."""
    rec = d["meta"].get(f"{kind}/stagger/static", {}).get("delays")
    if rec:
        return [tuple(x) for x in rec]
    kinds = [k for k in KINDS if f"{k}/stagger/static" in d["times"]]
    rng = np.random.default_rng(d["seed"])
    out = []
    for _ in range(d["reps"]):
        for k in kinds:
            dl = tuple(float(x) for x in rng.uniform(0, d["stagger_s"], d["ranks"]))
            if k == kind:
                out.append(dl)
    return out


def seeds_table(paths: Sequence[str], out: str, label: str = "") -> list[dict]:
    """One row per (run file, staggered engine) of ``--only-stagger`` runs, for comparing
    stagger seeds: the median time, ideal = median last arrival + median one hop, the ratio
    (the row fault_bench prints: the median of the reps' own ratios, each rep's time over its
    own last arrival + one hop; ``ratio_of_medians`` = median time / ideal), against static
    (per rep, then the median), and per rep its own ratio, its hops after the last arrival
    and the model's best for its arrivals (:func:`model_best_hops`). Written as CSV to ``out``."""
    rows = []
    for path in paths:
        d = json.loads(Path(path).read_text())
        hop = statistics.median(d["times"]["hop"])
        for kind in KINDS:
            st = d["times"].get(f"{kind}/stagger/static")
            if not st:
                continue
            last = d["meta"][f"{kind}/stagger/static"]["last_arrival"]
            ideal = statistics.median(last) + hop
            best = [model_best_hops(dl, hop) for dl in _stagger_delays(d, kind)]
            for eng in ("default", "adaptive", "adaptive-1MiB", "static"):
                ts = d["times"].get(f"{kind}/stagger/{eng}")
                if not ts:
                    continue
                t = statistics.median(ts)
                rows.append(dict(seed=d["seed"], code=label, kind=kind, engine=eng, seconds=round(t, 3),
                                 ideal_s=round(ideal, 3),
                                 ratio=round(statistics.median(_per_rep(ts, last, hop)), 3),
                                 ratio_of_medians=round(t / ideal, 3),
                                 vs_static=round(statistics.median(_per_rep(ts, st)), 3),
                                 last_arrivals=" ".join(f"{x:.2f}" for x in last),
                                 rep_ratios=" ".join(f"{x:.2f}" for x in _per_rep(ts, last, hop)),
                                 post_last_hops=" ".join(f"{(x - l) / hop:.2f}" for x, l in zip(ts, last)),
                                 model_best_hops=" ".join(f"{b:.2f}" for b in best)))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["seed"])
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(Path(out), buf.getvalue())
    return rows


def trace_report(path: str, label: str = "allreduce/stagger/default") -> list[str]:
    """Lines describing each traced rep of ``label`` in a ``--trace`` result file: per rank
    (in arrival order) its arrival, sub-blocks owned, and the MB its link carried after the
    last arrival L — in, out, and out split into pieces / own results / relayed results —
    with seconds from L to its last byte in and out (a byte is counted when its chunk's
    receive completes; the link rate is the reader's to apply: 20 MB/s is 0.05 s per MB)."""
    d = json.loads(Path(path).read_text())
    m = d["meta"][label]
    lines = []
    for rep, (E, t, last) in enumerate(zip(m.get("events", []), d["times"][label], m["last_arrival"])):
        cb = {int(k): v for k, v in E["chunk_bytes"].items()}
        owner = {int(k): v for k, v in E["owner"].items()}
        arr = {int(r): a for r, a in E["arrived"].items()}
        ev = {int(r): v for r, v in E["ranks"].items()}
        recv = [(t_, fid, c, p, q, k) for q, v in ev.items() for t_, k, fid, c, p in v if k in ("pi", "ri")]
        lines.append(f"rep {rep}: {t:.3f} s, last arrival {last:.3f} s, {t - last:.3f} s after it")
        for r in sorted(arr, key=arr.get):
            def mb(sel):
                return sum(cb[fid][c] for t_, fid, c, p, q, k in recv if t_ > 0 and sel(fid, p, q, k)) / 1e6
            into = mb(lambda fid, p, q, k: q == r)
            pieces = mb(lambda fid, p, q, k: p == r and k == "pi")
            own = mb(lambda fid, p, q, k: p == r and k == "ri" and owner[fid] == r)
            relayed = mb(lambda fid, p, q, k: p == r and k == "ri" and owner[fid] != r)
            last_in = max((t_ for t_, fid, c, p, q, k in recv if q == r), default=0.0)
            last_out = max((t_ for t_, fid, c, p, q, k in recv if p == r), default=0.0)
            lines.append(f"  r{r} arrived {arr[r]:6.2f} owns {sum(1 for o in owner.values() if o == r):2d}: "
                         f"in {into:6.1f} MB, out {pieces + own + relayed:6.1f} MB (pieces {pieces:5.1f}, "
                         f"own results {own:5.1f}, relayed {relayed:5.1f}); last in {last_in:5.2f} s, "
                         f"last out {last_out:5.2f} s")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--small-reps", type=int, default=None,
                    help="reps of the 1 MiB nobody-late rows (default 15; --netem 5)")
    ap.add_argument("--stagger", type=float, default=None,
                    help="T: delays uniform in [0, T] seconds (default 0.5; --netem 2 x M / B)")
    ap.add_argument("--netem", action="store_true", help="run on an emulated star network (root)")
    ap.add_argument("--link-MBps", type=float, default=20.0, help="--netem: every star link's MB/s")
    ap.add_argument("--netem-name", default=None, help="--netem: the emulation's name (default fault-star<n>)")
    ap.add_argument("--wait-busy", type=float, default=900.0,
                    help="--netem: seconds to wait at most while another emulation runs processes")
    ap.add_argument("--kill-reps", type=int, default=1, help="reps of the failure jobs (one job each)")
    ap.add_argument("--only-failure", action="store_true",
                    help="only the failure jobs (the kill point counted in a no-failure run first)")
    ap.add_argument("--only-stagger", action="store_true",
                    help="only the staggered rows (and the one-hop reference): no nobody-late, "
                         "1 MiB or failure jobs")
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="comma-separated subset of broadcast,allreduce (default both)")
    ap.add_argument("--seed", type=int, default=42,
                    help="seed of the stagger delays (42: the figures in docs/fault-tolerance.md)")
    ap.add_argument("--engines", default="",
                    help="comma-separated engines to run (default all; static always runs)")
    ap.add_argument("--trace", action="store_true",
                    help="staggered adaptive cases record every star chunk's send and receive "
                         "(meta[...]['events'])")
    ap.add_argument("--trace-report", default=None, metavar="JSON",
                    help="no run: print what every link carried after the last arrival in a --trace result file")
    ap.add_argument("--out", default=None)
    ap.add_argument("--seeds-table", nargs="+", default=None, metavar="JSON",
                    help="no run: tabulate the staggered rows of these --only-stagger result files "
                         "into --out (CSV), one row per file and engine")
    ap.add_argument("--label", default="", help="--seeds-table: the code column (which tree ran)")
    a = ap.parse_args(argv)
    if a.trace_report:
        print("\n".join(trace_report(a.trace_report)))
        return 0
    if a.seeds_table:
        for r in seeds_table(a.seeds_table, a.out or "fault_bench_seeds.csv", a.label):
            print(", ".join(f"{k}={v}" for k, v in r.items()))
        return 0
    a.kinds = tuple(k for k in KINDS if k in a.kinds.split(","))
    a.engines = tuple(e for e in a.engines.split(",") if e)
    n = a.ranks
    size = a.size_mib << 20
    if a.small_reps is None:
        a.small_reps = 5 if a.netem else 15
    if a.stagger is None:
        # netem: the loopback run's ratio of T to the one-hop time (0.5 s / 0.26 s), on the links
        a.stagger = round(2 * size / (a.link_MBps * 1e6), 2) if a.netem else 0.5
    out = Path(a.out or Path(__file__).parent / "results" / (
        "fault_bench_netem.json" if a.netem else "fault_bench.json"))
    t0 = time.time()
    star = a.link_MBps if a.netem else None
    plans = _compile(n, f"{a.size_mib} MiB", star)
    small = _compile(n, "1 MiB", star)
    print(f"compiled in {time.time() - t0:.1f} s; allreduce {plans['allreduce'].algorithm}, "
          f"broadcast {plans['broadcast'].algorithm} ({len(plans['broadcast'].trees)} trees)", flush=True)

    results: dict[str, list[float]] = {}
    meta: dict[str, dict] = {}
    jobs: list[dict] = []
    info: dict = {}
    job, small_job = _build_jobs(a, n, plans, small)
    victims = {"allreduce": n - 1, "broadcast": n // 2}

    if a.only_failure:  # a short job that only counts the victims' data chunks
        job = [(None, Case(plans["allreduce"], seed=0, adaptive=True, save=False))] + [
            (f"{k}/none/adaptive", Case(plans[k], seed=1, adaptive=True, save=False)) for k in a.kinds]
        small_job = []
    if a.only_stagger:
        small_job = []

    def run_all(emu) -> None:
        for j in (job, small_job) if small_job else (job,):
            _run_job(j, results, meta, emu, jobs)
            print(f"job of {len(j)} cases done ({time.time() - t0:.0f} s)", flush=True)
        if a.only_stagger:
            return
        if emu is None:
            chunks = a.size_mib  # 1 MiB adaptive chunks
            kill_at = {"allreduce": (n - 1, chunks), "broadcast": (n // 2, chunks // 2)}
        else:
            # half-way through the victim's own data chunks (sent + received), counted in
            # this job's no-failure adaptive runs
            kill_at = {k: (v, max(1, int(statistics.median(
                c[v] for c in meta[f"{k}/none/adaptive"]["data_chunks"]) // 2))) for k, v in victims.items() if k in a.kinds}
        info["kill_at"] = kill_at
        for j in _kill_jobs(n, plans, kill_at, a.kill_reps, a.kinds):
            _run_job(j, results, meta, emu, jobs)
            print(f"job of {len(j)} cases done ({time.time() - t0:.0f} s)", flush=True)

    if a.netem:
        # SIGTERM / SIGHUP (a `timeout`, a closed terminal) unwind like Ctrl-C, so the
        # emulation always comes down
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGHUP, _interrupt)
        with _emulation(n, a.link_MBps, a.netem_name or f"fault-star{n}", a.wait_busy, info) as emu:
            info["netem"] = emu.name
            run_all(emu)
    else:
        run_all(None)

    med = {k: statistics.median(v) for k, v in results.items()}
    rows = _rows(a, med, meta, results)
    one_hop = med.get("hop", float("nan"))
    where = (f"netem star, {a.link_MBps:g} MB/s links (rank 0 -> 1 crosses two of them)" if a.netem
             else "loopback")
    print(f"\n{n} ranks, {a.size_mib} MiB, {where}, median of {a.reps} (1 MiB: {a.small_reps}); "
          f"stagger T = {a.stagger:g} s; one-hop ({a.size_mib} MiB, rank 0 -> 1, same job) = {one_hop:.3f} s"
          + (f" (M/B = {size / (a.link_MBps * 1e6):.3f} s)" if a.netem else ""))
    cpu_cols = f" {'cpu':>5s} {'refcpu':>6s}" if a.netem else ""
    print(f"{'case':52s} {'time s':>8s} {'vs s':>8s} {'ratio':>6s}{cpu_cols}  target")
    for r in rows:
        cpu = ""
        if a.netem:
            cpu = "".join(f" {v:5.2f}" if v is not None else "      " for v in (r["cpu_share"],)) + (
                f" {r['ref_cpu_share']:6.2f}" if r["ref_cpu_share"] is not None else "       ")
        print(f"{r['case']:52s} {r['seconds']:8.3f} {r['reference_s']:8.3f} {r['ratio']:6.2f}{cpu}  {r['target']}")
    if a.netem:
        print("cpu = the busiest rank's CPU time / its wall time (median over reps); refcpu the same for the "
              "reference case; machine busy per job: " + ", ".join(str(j["machine_busy"]) for j in jobs))
    for kind in a.kinds:  # what a death costs in traffic: data chunks a survivor sent + received
        none, kill = meta.get(f"{kind}/none/adaptive-k"), meta.get(f"{kind}/kill/adaptive")
        if none and kill:
            dead = set(kill.get("died", []))

            def per_survivor(runs):
                return statistics.median(c for run in runs for r, c in run.items() if int(r) not in dead)
            print(f"{kind}: data chunks per survivor (median), no failure {per_survivor(none['data_chunks']):g}, "
                  f"one failure {per_survivor(kill['data_chunks']):g}")
    fast = {k: v.get("paths") for k, v in meta.items() if "/default" in k}
    print("default runs' executor per rep (static = fast path taken):")
    for k, v in fast.items():
        print(f"  {k:28s} {', '.join(v)}")
    doc = {"ranks": n, "size_mib": a.size_mib, "reps": a.reps, "small_reps": a.small_reps, "stagger_s": a.stagger,
           "seed": a.seed,
           "kill_reps": a.kill_reps, "only_failure": a.only_failure, "only_stagger": a.only_stagger,
           "one_hop_s": one_hop, "times": results, "median": med, "meta": meta,
           "rows": rows if a.netem else [{k: r[k] for k in ("case", "seconds", "reference_s", "ratio", "target")}
                                         for r in rows]}
    if a.netem:
        doc.update(network=f"star of {n} ranks on one switch, {a.link_MBps:g} MB/s full-duplex links, no latency",
                   link_Bps=a.link_MBps * 1e6, one_hop_model_s=size / (a.link_MBps * 1e6), jobs=jobs, **info)
    atomic_write_text(out, json.dumps(doc, indent=1))
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["case", "seconds", "reference_s", "ratio", "target"] + (["cpu_share", "ref_cpu_share"] if a.netem else []))
    for r in rows:
        extra = [("" if r[k] is None else f"{r[k]:.3f}") for k in ("cpu_share", "ref_cpu_share")] if a.netem else []
        w.writerow([r["case"], f"{r['seconds']:.4f}", f"{r['reference_s']:.4f}", f"{r['ratio']:.3f}", r["target"]] + extra)
    atomic_write_text(out.with_suffix(".csv"), buf.getvalue())
    wrong = sorted(k for k, v in meta.items() if v.get("checked") is False)
    if wrong:
        print(f"WRONG RESULTS in {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
