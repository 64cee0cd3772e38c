"""Peak memory of a command's whole process tree, sampled from /proc.

    python benchmarks/run_memory.py [--interval S] -- hcc run samples/dgx1.hcl --iters 1

Every ``--interval`` seconds (default 0.05) it walks /proc for the command's process and all
its descendants and sums, over them, the resident set (``VmRSS``) and the proportional set
size (``Pss`` of ``smaps_rollup``: a page shared by k processes counts 1/k in each, so shared
memory and the interpreter's shared libraries count once). Prints the peaks of both sums and
of the command's own process (the launcher's parent), with the number of processes at the
peak, and exits with the command's status. Linux only.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def _field(path: str, name: str) -> int:
    """A ``name: N kB`` field of a /proc file, in bytes (0 when the process is gone)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree(root: int) -> list[int]:
    kids = _children()
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between samples (default 0.05)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command")
    proc = subprocess.Popen(cmd)
    peak_rss = peak_pss = peak_parent = 0
    at_peak = 0
    per: dict[int, int] = {}  # pid -> its own peak RSS
    t0 = time.monotonic()
    while proc.poll() is None:
        pids = tree(proc.pid)
        each = {p: _field(f"/proc/{p}/status", "VmRSS") for p in pids}
        for p, v in each.items():
            per[p] = max(per.get(p, 0), v)
        rss = sum(each.values())
        pss = sum(_field(f"/proc/{p}/smaps_rollup", "Pss") for p in pids)
        parent = _field(f"/proc/{proc.pid}/status", "VmRSS")
        if rss > peak_rss:
            peak_rss, at_peak = rss, len(pids)
        peak_pss = max(peak_pss, pss)
        peak_parent = max(peak_parent, parent)
        time.sleep(a.interval)
    mib = 1 << 20
    print(f"peak memory of the process tree: RSS sum {peak_rss / mib:.0f} MiB ({at_peak} processes), "
          f"PSS sum {peak_pss / mib:.0f} MiB; the command's own process {peak_parent / mib:.0f} MiB; "
          f"the largest other process {max((v for p, v in per.items() if p != proc.pid), default=0) / mib:.0f} MiB; "
          f"{time.monotonic() - t0:.1f} s", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
