"""Data-parallel logistic regression on 4 local ranks over hcc's sockets backend, with BAGUA's
relaxations side by side (numpy only).

    python examples/train_logreg.py            # the full run
    python examples/train_logreg.py --quick    # a few seconds (what tests/runtime/test_train.py runs)
    python examples/train_logreg.py --json     # one JSON object per mode on stdout

Modes (each rank trains on its own shard of a synthetic dataset, from the same start):
- ``full``  gradients averaged by an uncompressed allreduce (``op = avg``) every step;
- ``int8``  the same allreduce with ``compress = int8`` (per-chunk min-max, quantized twice);
- ``fp16``  the same with ``compress = fp16``;
- ``ring``  decentralized: a local SGD step, then ``neighbor_average`` of the weights with the
  two ring neighbours (no global synchronisation);
- ``async`` a local SGD step, then :class:`hcc.relax.AsyncAverager` averages a snapshot of the
  weights in the background (launched every ``async_period`` steps) and folds
  ``avg(snapshot) − snapshot`` in when it is done.

The dataset: ``n`` points in ``d`` dimensions from a standard normal, labels from a random
hyperplane with 5% of them flipped (so about 95% is the best any classifier can do). Every rank
draws its minibatches with its own seed, identical across modes, so the modes differ only in
how they communicate. Printed per mode: the test accuracy of rank 0's model, the largest
difference between ranks' accuracies (decentralized modes do not end in exact consensus), the
wall time of the training loop, and the bytes each rank put on the wire per step.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import secrets
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from hcc.backends.rendezvous import free_port

WORLD = 4
MODES = ("full", "int8", "fp16", "ring", "async")


@dataclass(frozen=True)
class Config:
    features: int = 63  # + 1 bias = 64 parameters: 256 bytes of float32
    train: int = 16000
    test: int = 4000
    steps: int = 400
    batch: int = 64
    lr: float = 1.0  # at step 0; decays as 50 / (50 + step)
    seed: int = 0
    async_period: int = 2  # async: launch an average every 2 steps (it overlaps them)

    @staticmethod
    def quick() -> "Config":
        return Config(train=8000, test=4000, steps=150)


@dataclass(frozen=True)
class Result:
    mode: str
    accuracy: float  # rank 0's model on the test set
    spread: float  # max − min accuracy over the ranks
    seconds: float  # the training loop on rank 0
    wire_bytes_per_step: int  # what one rank sends per communication
    algorithm: str


def make_data(cfg: Config):
    rng = np.random.default_rng(cfg.seed)
    n = cfg.train + cfg.test
    X = rng.standard_normal((n, cfg.features)).astype(np.float32)
    X = np.hstack([X, np.ones((n, 1), np.float32)])  # bias column
    w_true = rng.standard_normal(cfg.features + 1).astype(np.float32)
    y = (X @ w_true > 0).astype(np.float32)
    flip = rng.random(n) < 0.05
    y[flip] = 1 - y[flip]
    return X[: cfg.train], y[: cfg.train], X[cfg.train:], y[cfg.train:]


def gradient(w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    p = 1.0 / (1.0 + np.exp(-np.clip(X @ w, -30, 30)))  # clip: exp overflows past 88
    return (X.T @ (p - y) / len(y)).astype(np.float32)


def accuracy(w: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(((X @ w) > 0) == (y > 0.5)))


def program_source(params: int) -> str:
    size = params * 4
    return f"""
topology local {{
    node r[0..{WORLD - 1}]
    r[0..{WORLD - 1}] <-> r[0..{WORLD - 1}] : 1 GB/s, 20 us
}}
collective full = allreduce on local {{ size = {size} B  op = avg }}
collective int8 = allreduce on local {{ size = {size} B  op = avg  compress = int8 }}
collective fp16 = allreduce on local {{ size = {size} B  op = avg  compress = fp16 }}
collective ring = neighbor_average on local {{ size = {size} B  peers = ring }}
"""


def compile_plans(params: int) -> dict[str, str]:
    """Plan JSON per collective, compiled once by the launcher."""
    import hcc

    plans = hcc.compile_all(hcc.load(program_source(params)))
    return {name: plan.to_json() for name, plan in plans.items()}


def train(mode: str, plan, comm, cfg: Config, shard, rank: int) -> tuple[np.ndarray, float]:
    import hcc
    from hcc.relax import AsyncAverager

    Xs, ys = shard
    w = np.zeros(cfg.features + 1, np.float32)
    rng = np.random.default_rng(1000 + rank)
    averager = AsyncAverager(plan, comm, period=cfg.async_period, timeout=30) if mode == "async" else None
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        idx = rng.integers(0, len(ys), cfg.batch)
        g = gradient(w, Xs[idx], ys[idx])
        lr = cfg.lr * 50 / (50 + step)  # decaying, so every mode settles near the optimum
        if mode in ("full", "int8", "fp16"):
            g = hcc.run(plan, comm, g, timeout=30)
            w -= lr * g
        elif mode == "ring":
            w -= lr * g
            w = hcc.run(plan, comm, w, step=step, timeout=30)
        else:
            w -= lr * g
            averager.step(w)
    if averager is not None:
        averager.finish(w)
    return w, time.perf_counter() - t0


def worker(rank: int, port: int, token: str, cfg: Config, plans: dict[str, str], modes, queue) -> None:
    try:
        from hcc.backends.sockets import connect
        from hcc.compiler.lower_relax import message_nbytes
        from hcc.ir.plan import Plan, Send

        Xtr, ytr, Xte, yte = make_data(cfg)
        lo, hi = rank * len(ytr) // WORLD, (rank + 1) * len(ytr) // WORLD
        shard = (Xtr[lo:hi], ytr[lo:hi])
        with connect(rank, WORLD, rendezvous=f"127.0.0.1:{port}", token=token, timeout=60) as comm:
            for mode in modes:
                plan = Plan.from_json(plans["full" if mode == "async" else mode])
                comm.barrier(f"start-{mode}")
                w, secs = train(mode, plan, comm, cfg, shard, rank)
                per_step = sum(message_nbytes(plan, op.src.count)
                               for op in plan.programs[rank] if isinstance(op, Send))
                queue.put(("ok", rank, mode, accuracy(w, Xte, yte), secs, int(per_step), plan.algorithm))
                comm.barrier(f"end-{mode}")
    except BaseException as e:  # reported by the launcher
        queue.put(("error", rank, f"{type(e).__name__}: {e}"))


def run(cfg: Config, modes=MODES, timeout: float = 300.0) -> list[Result]:
    """Train every mode on WORLD local processes; returns one :class:`Result` per mode."""
    plans = compile_plans(cfg.features + 1)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port, token = free_port(), secrets.token_hex(16)
    procs = [ctx.Process(target=worker, args=(r, port, token, cfg, plans, tuple(modes), queue))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    rows: dict[str, dict[int, tuple]] = {m: {} for m in modes}
    deadline = time.monotonic() + timeout
    try:
        while sum(len(v) for v in rows.values()) < WORLD * len(modes):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"training did not finish within {timeout:g} s")
            try:
                msg = queue.get(timeout=min(left, 5.0))
            except Exception:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a rank exited with status {dead[0]}") from None
                continue
            if msg[0] == "error":
                raise RuntimeError(f"rank {msg[1]}: {msg[2]}")
            _, rank, mode, acc, secs, per_step, alg = msg
            rows[mode][rank] = (acc, secs, per_step, alg)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    out = []
    for m in modes:
        accs = [rows[m][r][0] for r in range(WORLD)]
        acc0, secs, per_step, alg = rows[m][0]
        out.append(Result(m, acc0, max(accs) - min(accs), secs, per_step, alg))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short run (seconds), as the tests use")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--steps", type=int, help="training steps (overrides the preset)")
    ap.add_argument("--json", action="store_true", help="print one JSON object per mode")
    a = ap.parse_args(argv)
    cfg = Config.quick() if a.quick else Config()
    if a.steps:
        cfg = Config(**{**asdict(cfg), "steps": a.steps})
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    results = run(cfg, modes)
    if a.json:
        for r in results:
            print(json.dumps(asdict(r)))
        return 0
    print(f"logistic regression, {WORLD} ranks over sockets, {cfg.features + 1} parameters, "
          f"{cfg.steps} steps of batch {cfg.batch} per rank")
    print(f"{'mode':<6} {'algorithm':<14} {'accuracy':>9} {'rank spread':>12} {'time':>9} {'wire B/step':>12}")
    for r in results:
        print(f"{r.mode:<6} {r.algorithm:<14} {r.accuracy * 100:8.2f}% {r.spread * 100:11.2f}% "
              f"{r.seconds:8.3f}s {r.wire_bytes_per_step:12d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
