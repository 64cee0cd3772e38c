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
