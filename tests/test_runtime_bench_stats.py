"""The work columns of benchmarks/runtime_bench.py: how idle the host's cores were during the
timed regions (from the launcher's and gloo's readings of the idle counter), next to the CPU
seconds of the ranks' processes, which miss the kernel's softirq threads."""
from __future__ import annotations

import doctest
import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

from hcc.backends.launch import host_idle_seconds

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "runtime_bench.py"


@pytest.fixture(scope="module")
def rb():
    spec = importlib.util.spec_from_file_location("runtime_bench_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


def test_the_idle_share_pools_the_timed_regions(rb):
    # 40 regions of 30 ms on 2 cores, 3 ms of idle core time in each, one region unread
    windows = rb._idle_windows([0.003] * 39 + [None], [0.030] * 40)
    assert len(windows) == 39
    idle, seconds = 39 * 0.003, 39 * 0.030
    assert rb.idle_share(windows, ncpu=2) == pytest.approx(idle / (2 * seconds))
    assert rb.idle_share(windows, ncpu=2) == pytest.approx(0.05)
    # below a second of timed regions the 10 ms ticks of the counter decide: nothing reported
    assert rb.idle_share(windows[:30], ncpu=2) is None
    assert rb.idle_share([], ncpu=2) is None


def test_a_table_line_says_cpu_and_idle_of_both_sides(rb):
    row = {"hcc_cpu_s": 0.047, "peer_cpu_s": 0.052, "hcc_host_idle": 0.04, "peer_host_idle": 0.062}
    assert rb._work_note(row) == "  cpu 47/52 ms, idle 4%/6%"
    assert rb._work_note({"hcc_cpu_s": 0.2}) == "  cpu 200 ms"
    assert rb._work_note({}) == ""


def test_the_doctests_of_the_benchmark(rb):
    assert doctest.testmod(rb).failed == 0


def _possible_cpus() -> int:
    try:
        with open("/sys/devices/system/cpu/possible") as f:
            text = f.read().strip()
    except OSError:
        return 1
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def test_the_host_idle_counter_is_bounded_by_uptime_and_never_runs_backwards():
    a = host_idle_seconds()
    if a is None:
        pytest.skip("no /proc/uptime on this system")
    time.sleep(0.3)
    b = host_idle_seconds()
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    # idle core-seconds since boot: at most every core idle all the time (counting the cores
    # the kernel could bring up, not only those online now)
    ncpu = max(os.cpu_count() or 1, _possible_cpus())
    assert 0 <= a <= b + 0.05 and b <= ncpu * uptime + 0.05
