"""benchmarks/plot.py's tables from netem_bench rows (no root, no network): speedups are
computed from the rows themselves, so rows appended by separate runs compare too."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plot():
    spec = importlib.util.spec_from_file_location("netem_plot", ROOT / "benchmarks" / "plot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def row(topo, size_mib, system, t, **kw):
    r = {"topology": topo, "ranks": topo[-1], "size_bytes": str(size_mib << 20), "system": system,
         "time_s": str(t), "kind": "allreduce", "scale": "0.001", "busbw_Bps": "1", "algbw_Bps": "1",
         "measured_over_bound": str(kw.pop("mb", 0.5))}
    r.update({k: str(v) for k, v in kw.items()})
    return r


def test_speedups_targets_and_cpu_share(plot):
    rows = [
        row("slow8", 64, "gloo", 9.0), row("slow8", 64, "hcc", 6.0, predicted_s=5.4, prediction_error=-0.1),
        row("slow8", 64, "mpich", 12.0), row("slow8", 256, "hcc", 20.0, mb=0.81, predicted_s=19.0,
                                               prediction_error=-0.05, cpu_s_per_rank=6.0, iters=2, warmup=1),
        row("slow8", 16, "hcc-ring", 1.0, error="skipped"),
        row("ring8", 64, "hcc", 3.0), row("ring8", 64, "gloo", 4.5),
    ]
    sp = plot.speedups(rows)
    assert sp[("slow8", str(64 << 20))] == {"gloo": pytest.approx(1.5), "mpich": pytest.approx(2.0)}
    assert sp[("ring8", str(64 << 20))] == {"gloo": pytest.approx(1.5)}
    assert plot.cpu_share(rows[3]) == pytest.approx(6.0 / (3 * 20.0))
    table = plot.targets_table(rows)
    lines = table.splitlines()
    # ring before slow (topology order), each once; the failed row is left out of the figures
    assert [l.split(" | ")[0] for l in lines[2:]] == ["| ring8", "| slow8"]
    assert "| slow8 | 8 | 81.0% | — / -10% / -5% | 1.50x | 2.00x |" in lines
    full = plot.markdown_tables(rows, [])
    assert "skipped" in full and full.index("| ring8 |") < full.index("| slow8 |")


def test_reps_table_gives_the_range_over_reps_against_the_live_bound(plot):
    # hcc's speedup is paired per rep (both from the same run), the bound is the live one
    rows = [row("slow4", 64, "hcc", t, rep=k, bound_s=3.0, live_bound_s=3.3) for k, t in ((1, 3.4), (2, 3.5))]
    rows += [row("slow4", 64, "gloo", t, rep=k, bound_s=3.0, live_bound_s=3.3) for k, t in ((1, 5.1), (2, 5.0))]
    rows.append(row("slow4", 64, "mpich", 7.0, rep=1, bound_s=3.0, error="timeout"))
    lines = plot.reps_table(rows).splitlines()
    assert len(lines) == 4  # header, rule, hcc, gloo: the failed run is left out
    assert lines[2] == f"| slow4 | 64 MiB | hcc | 2 | 3.400–3.500 | {3.3 / 3.5:.1%}–{3.3 / 3.4:.1%} |  |"
    lo, hi = sorted((5.1 / 3.4, 5.0 / 3.5))
    assert lines[3] == (f"| slow4 | 64 MiB | gloo | 2 | 5.000–5.100 | {3.3 / 5.1:.1%}–{3.3 / 5.0:.1%} | "
                        f"{lo:.3f}x–{hi:.3f}x |")
