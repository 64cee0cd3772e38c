"""benchmarks/plot.py — PNG figures from the CSVs of benchmarks/netem_bench.py.

    .venv/bin/python benchmarks/plot.py [--results benchmarks/results]

- ``netem_collectives.png``: one panel per emulated topology (and rank count); busbw against
  size for every system, the compiler's bound as a dashed line, hcc's predicted busbw dotted.
- ``netem_links.png``: measured against configured throughput per measured pair (the 15%
  band the test allows shaded), and measured against configured round trips.
- ``--table``: the markdown tables of BENCHMARKS.md, and the spread over repeated runs
  (``netem_reps_64MiB.csv``, :func:`reps_table`).
Rows that carry an ``error`` (a failed or skipped run) are left out of the plots, not drawn
as zero.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

MiB = 1 << 20
COLOURS = {"hcc": "tab:red", "hcc-ring": "tab:orange", "gloo": "tab:blue", "mpich": "tab:green"}


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _f(x: str) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def plot_collectives(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["topology"], r["ranks"]) for r in rows}, key=lambda p: (int(p[1]), p[0]))
    if not panels:
        return
    cols = min(4, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    for ax, (topo, ranks) in zip(axes.flat, panels):
        mine = [r for r in rows if r["topology"] == topo and r["ranks"] == ranks]
        kind = mine[0]["kind"]
        for system in COLOURS:
            pts = sorted((int(r["size_bytes"]), _f(r.get("busbw_Bps"))) for r in mine
                         if r["system"] == system and not r.get("error"))
            pts = [(s, b) for s, b in pts if b == b]
            if pts:
                ax.plot([s / MiB for s, _ in pts], [b / 1e6 for _, b in pts], "o-", color=COLOURS[system],
                        label=system)
        hcc = sorted((int(r["size_bytes"]), r) for r in mine if r["system"] == "hcc" and not r.get("error"))
        if hcc:
            # busbw at the bound and at the prediction: size x factor / time, the factor
            # recovered from the measured row (busbw / algbw)
            xs, bound, pred = [], [], []
            for s, r in hcc:
                factor = _f(r["busbw_Bps"]) / _f(r["algbw_Bps"])
                xs.append(s / MiB)
                bound.append(s * factor / _f(r["bound_s"]) / 1e6)
                pred.append(s * factor / _f(r["predicted_s"]) / 1e6)
            ax.plot(xs, bound, "k--", lw=1, label="bound")
            ax.plot(xs, pred, ":", color=COLOURS["hcc"], lw=1.5, label="hcc predicted")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{topo} ({ranks} ranks), {kind}", fontsize=9)
        ax.set_xlabel("size (MiB)")
        ax.set_ylabel("busbw (MB/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}")


def plot_links(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    conf = [_f(r["configured_Bps"]) / 1e6 for r in rows]
    meas = [_f(r["measured_Bps"]) / 1e6 for r in rows]
    top = max(conf + meas) * 1.15
    xs = [0, top]
    a1.fill_between(xs, [0, 0.85 * top], [0, 1.15 * top], color="0.9", label="±15%")
    a1.plot(xs, xs, "k--", lw=1)
    a1.scatter(conf, meas, s=18, color="tab:red", zorder=3)
    a1.set_xscale("symlog")
    a1.set_yscale("symlog")
    a1.set_xlabel("configured (bottleneck) MB/s")
    a1.set_ylabel("measured MB/s, one TCP stream")
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    c_rtt = [_f(r["configured_rtt_s"]) * 1e3 for r in rows]
    m_rtt = [_f(r["measured_rtt_s"]) * 1e3 for r in rows]
    top = max(c_rtt + m_rtt) * 1.15 or 1.0
    a2.plot([0, top], [0, top], "k--", lw=1)
    a2.scatter(c_rtt, m_rtt, s=18, color="tab:blue", zorder=3)
    a2.set_xlabel("configured round trip (ms)")
    a2.set_ylabel("measured round trip (ms)")
    a2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}")


SYSTEM_ORDER = {"hcc": 0, "hcc-ring": 1, "gloo": 2, "mpich": 3}
TOPOLOGY_ORDER = ("ring", "slow", "slowhops", "twohost", "dgx1x")


def _topo_rank(name: str) -> int:
    base = name.rstrip("0123456789")
    return TOPOLOGY_ORDER.index(base) if base in TOPOLOGY_ORDER else len(TOPOLOGY_ORDER)


def _sorted(coll: list[dict]) -> list[dict]:
    return sorted(coll, key=lambda r: (int(r["ranks"]), _topo_rank(r["topology"]), int(r["size_bytes"]),
                                       SYSTEM_ORDER.get(r["system"], 9)))


def speedups(coll: list[dict]) -> dict[tuple, dict[str, float]]:
    """hcc's speedup over each other system, per (topology, size): the other's median time
    over hcc's, from the rows themselves (so rows appended by separate runs compare too)."""
    t = {(r["topology"], r["size_bytes"], r["system"]): _f(r.get("time_s")) for r in coll if not r.get("error")}
    out: dict[tuple, dict[str, float]] = {}
    for (topo, size, system), x in t.items():
        if system == "hcc" and x == x:
            out[(topo, size)] = {o: t[(topo, size, o)] / x for (tp, sz, o) in t
                                 if tp == topo and sz == size and o != "hcc" and t[(tp, sz, o)] == t[(tp, sz, o)]}
    return out


def cpu_share(r: dict) -> float:
    """A rank's CPU seconds over the time its collectives ran (warm-up + timed iterations, each
    about the median): an upper bound of the core share a rank needed, since its CPU time
    also counts start-up. 8 ranks on 2 cores have 0.25 core each when nothing else runs."""
    runs = int(_f(r.get("iters") or 0) + _f(r.get("warmup") or 0))
    return _f(r["cpu_s_per_rank"]) / (runs * _f(r["time_s"])) if runs else math.nan


def markdown_tables(coll: list[dict], links: list[dict]) -> str:
    """The tables of BENCHMARKS.md, from the CSVs (so the file can be regenerated): link
    fidelity, every collective row, and hcc against the issue's targets."""
    out = []
    if links:
        out += ["| topology | pair | hops | configured MB/s | measured MB/s | ratio | configured RTT ms | measured RTT ms |",
                "|---|---|---|---|---|---|---|---|"]
        for r in links:
            out.append(f"| {r['topology']} | {r['src']} → {r['dst']} | {r['hops']} | "
                       f"{_f(r['configured_Bps']) / 1e6:.2f} | {_f(r['measured_Bps']) / 1e6:.2f} | "
                       f"{_f(r['ratio']):.1%} | {_f(r['configured_rtt_s']) * 1e3:.3f} | "
                       f"{_f(r['measured_rtt_s']) * 1e3:.3f} |")
        out.append("")
    if not coll:
        return "\n".join(out)
    coll = _sorted(coll)
    sp = speedups(coll)
    peers = [s for s in ("hcc-ring", "gloo", "mpich") if any(r["system"] == s for r in coll)]
    out += ["| topology | ranks | scale | size | system | time s | busbw MB/s | measured/bound | predicted s (error) "
            "| rank CPU / time | " + " | ".join(f"hcc vs {p}" for p in peers) + " |",
            "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(peers)]
    for r in coll:
        size = f"{int(r['size_bytes']) // MiB} MiB"
        head = f"| {r['topology']} | {r['ranks']} | {_f(r.get('scale')):g} | {size} | {r['system']} |"
        if r.get("error"):
            out.append(head + " — | — | — | — | — | " + " | ".join("" for _ in peers)
                       + f" {r['error'][:90]} |")
            continue
        pred = (f"{_f(r['predicted_s']):.3f} ({_f(r['prediction_error']):+.0%})" if r.get("predicted_s") else "")
        cpu = f"{cpu_share(r):.2f}" if r.get("cpu_s_per_rank") else ""
        mine = sp.get((r["topology"], r["size_bytes"]), {}) if r["system"] == "hcc" else {}
        cells = [f"{mine[p]:.2f}x" if p in mine else "" for p in peers]
        out.append(head + f" {_f(r['time_s']):.3f} | {_f(r['busbw_Bps']) / 1e6:.2f} | "
                   f"{_f(r['measured_over_bound']):.1%} | {pred} | {cpu} | " + " | ".join(cells) + " |")
    out += ["", targets_table(coll)]
    return "\n".join(out)


def targets_table(coll: list[dict]) -> str:
    """Per topology and rank count: hcc's measured/bound at 256 MiB (target >= 80%), its
    prediction error at >= 16 MiB (target within 20%), its speedup over gloo and MPICH at
    64 MiB (target >= 1.5x on (b) and (c))."""
    sp = speedups(coll)
    keys = []
    for r in _sorted(coll):
        if (r["topology"], r["ranks"]) not in keys:
            keys.append((r["topology"], r["ranks"]))
    out = ["| topology | ranks | hcc measured/bound at 256 MiB | prediction error at 16 / 64 / 256 MiB "
           "| hcc vs gloo at 64 MiB | hcc vs mpich at 64 MiB |", "|---|---|---|---|---|---|"]
    for topo, ranks in keys:
        hcc = {int(r["size_bytes"]) // MiB: r for r in coll
               if r["topology"] == topo and r["ranks"] == ranks and r["system"] == "hcc" and not r.get("error")}
        at = hcc.get(256)
        mb = f"{_f(at['measured_over_bound']):.1%}" if at else "—"
        errs = " / ".join(f"{_f(hcc[m]['prediction_error']):+.0%}" if hcc.get(m, {}).get("prediction_error") else "—"
                          for m in (16, 64, 256))
        s64 = next((v for (tp, sz), v in sp.items() if tp == topo and int(sz) == 64 * MiB), {})
        out.append(f"| {topo} | {ranks} | {mb} | {errs} | "
                   + " | ".join(f"{s64[p]:.2f}x" if p in s64 else "—" for p in ("gloo", "mpich")) + " |")
    return "\n".join(out)


def reps_table(rows: list[dict]) -> str:
    """The repeated runs (``netem_reps_64MiB.csv``: every system of a topology in each rep, in
    one run): per topology and system, the range over reps of the median time, of the
    fraction of the cut bound over the arcs that carry traffic (``live_bound_s``; on (b)
    routed by cost the slow link carries nothing) and of hcc's speedup over the system."""
    by: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        if not r.get("error") and r.get("time_s"):
            by.setdefault((r["topology"], r["ranks"], r["size_bytes"]), {}).setdefault(r["system"], []).append(r)
    rng = lambda xs, fmt: fmt(min(xs)) if min(xs) == max(xs) else f"{fmt(min(xs))}–{fmt(max(xs))}"
    out = ["| topology | size | system | reps | time s | measured / live bound | hcc speedup |",
           "|---|---|---|---|---|---|---|"]
    for (topo, ranks, size), systems in sorted(by.items(), key=lambda kv: (_topo_rank(kv[0][0]), kv[0])):
        hcc = {r["rep"]: _f(r["time_s"]) for r in systems.get("hcc", [])}
        for system in [s_ for s_ in COLOURS if s_ in systems]:
            rs = systems[system]
            times = [_f(r["time_s"]) for r in rs]
            live = [_f(r.get("live_bound_s") or r["bound_s"]) / _f(r["time_s"]) for r in rs]
            speed = [_f(r["time_s"]) / hcc[r["rep"]] for r in rs if r["rep"] in hcc and system != "hcc"]
            out.append(f"| {topo} | {int(size) // MiB} MiB | {system} | {len(rs)} | {rng(times, '{:.3f}'.format)} | "
                       f"{rng(live, '{:.1%}'.format)} | {rng(speed, '{:.3f}x'.format) if speed else ''} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="PNG plots from benchmarks/results/*.csv")
    ap.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--table", action="store_true", help="print the markdown tables of BENCHMARKS.md")
    a = ap.parse_args(argv)
    res = Path(a.results)
    if a.table:
        coll = _rows(res / "netem_collectives.csv") if (res / "netem_collectives.csv").exists() else []
        links = _rows(res / "netem_links.csv") if (res / "netem_links.csv").exists() else []
        print(markdown_tables(coll, links))
        if (res / "netem_reps_64MiB.csv").exists():
            print("\n" + reps_table(_rows(res / "netem_reps_64MiB.csv")))
        return 0
    done = 0
    if (res / "netem_collectives.csv").exists():
        plot_collectives(_rows(res / "netem_collectives.csv"), res / "netem_collectives.png")
        done += 1
    if (res / "netem_links.csv").exists():
        plot_links(_rows(res / "netem_links.csv"), res / "netem_links.png")
        done += 1
    if not done:
        print(f"plot: no netem_*.csv in {res}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
