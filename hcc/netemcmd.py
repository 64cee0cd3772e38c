"""hcc.netemcmd — ``hcc netem up|down|exec|status``: the emulated network from the shell.

    sudo hcc netem up samples/hetero.hcl [-t TOPOLOGY] [-n NAME] [--scale F] [--delay MODE]
    sudo hcc netem exec [-n NAME] RANK -- CMD ARGS...     # RANK: index into the nodes, or a name
    sudo hcc netem status [NAME] [--json]
    sudo hcc netem down [NAME] [--kill]

``up`` reads the topology from an ``.hcl`` program (``hcc.load``; ``-t`` picks one when the file
declares several) or from a topology JSON (``Topology.to_dict``). Exit status: 0 done; 2 bad
input, not root, or an emulation already up; 1 a system command failed; ``exec`` returns the
command's own status. The work is in :mod:`hcc.netem`.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from .ir.topology import Topology


def _parser(action: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"hcc netem {action}")
    if action == "up":
        p.add_argument("file", help="program (.hcl) or topology JSON")
        p.add_argument("-t", "--topology", metavar="TOPOLOGY", help="which topology of the file")
        p.add_argument("-n", "--name", help="emulation name (default: the topology's name)")
        p.add_argument("--scale", type=float, default=1.0,
                       help="multiply every capacity by this (e.g. 0.001: 25 GB/s -> 25 MB/s)")
        p.add_argument("--delay", choices=["auto", "netem", "delay-line", "none"], default="auto",
                       help="how latencies are applied (auto: the netem qdisc if the kernel has it)")
        p.add_argument("--routing", choices=["cost", "hops", "bandwidth"], default="cost",
                       help="cost: the compiler's route metric (latency + 1 MiB / capacity); "
                            "hops: fewest hops (a link is a cable); bandwidth: OSPF-style 1/capacity")
    elif action == "down":
        p.add_argument("name", nargs="?")
        p.add_argument("--kill", action="store_true", help="SIGKILL processes still inside")
    elif action == "status":
        p.add_argument("name", nargs="?")
        p.add_argument("--json", action="store_true")
    elif action == "exec":
        p.add_argument("-n", "--name")
        p.add_argument("rank", help="rank index (into the topology's nodes) or vertex name")
    return p


def read_topology(path: str, which: str | None = None) -> Topology:
    """The topology named ``which`` (or the only one) of an .hcl program or a topology JSON."""
    from .grammar.errors import HccError

    if path.endswith(".json"):
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise HccError(f"cannot read topology {path}: {e}") from None
        d = d.get("topology", d)  # a netem state file or a plan JSON carries one under "topology"
        return Topology.from_dict(d)
    from .api import load

    program = load(path)
    tops = program.topologies
    if which is None:
        if len(tops) != 1:
            raise HccError(f"{path} declares topologies {', '.join(tops)}: pick one with -t")
        return next(iter(tops.values()))
    if which not in tops:
        raise HccError(f"{path} has no topology {which!r} (it has {', '.join(tops)})")
    return tops[which]


def _one_name(name: str | None) -> str:
    from . import netem

    if name:
        return name
    up = netem.names()
    if len(up) != 1:
        raise netem.NetemError(
            "name the emulation: " + (f"up are {', '.join(up)}" if up else "none is up")
        )
    return up[0]


def cmd_netem(args) -> int:
    from . import netem
    from .grammar.diagnostics import SourceError
    from .grammar.errors import HccError

    rest = list(args.args)
    try:
        if args.action == "exec":
            if "--" not in rest:
                print("hcc netem exec: usage: hcc netem exec [-n NAME] RANK -- CMD ARGS...", file=sys.stderr)
                return 2
            cut = rest.index("--")
            opts, cmd = _parser("exec").parse_args(rest[:cut]), rest[cut + 1:]
            if not cmd:
                print("hcc netem exec: no command after --", file=sys.stderr)
                return 2
            netem.check_permitted()
            n = netem.load(_one_name(opts.name))
            rank: str | int = int(opts.rank) if opts.rank.isdigit() else opts.rank
            return subprocess.call(n.wrap(rank, cmd))
        opts = _parser(args.action).parse_args(rest)
        if args.action == "up":
            netem.check_permitted()
            try:
                topo = read_topology(opts.file, opts.topology)
            except HccError as e:
                if isinstance(e, SourceError):
                    raise
                print(f"hcc netem up: error: {e}", file=sys.stderr)
                return 2
            n = netem.up(topo, opts.name, scale=opts.scale, delay_mode=opts.delay, routing=opts.routing)
            print(n.describe())
            print(f"state: {netem.state_path(n.name)}; remove with `hcc netem down {n.name}`")
            return 0
        if args.action == "down":
            name = _one_name(opts.name)
            removed = netem.down(name, kill=opts.kill)
            print(f"netem {name}: removed {len(removed)} namespaces" + (f" ({', '.join(removed)})" if removed else ""))
            return 0
        # status
        netem.check_permitted()
        shown = [opts.name] if opts.name else netem.names()
        items = []
        for nm in shown:
            try:
                items.append(netem.load(nm))
            except netem.NetemError as e:
                if opts.name:
                    raise
                print(f"netem {nm}: {e}", file=sys.stderr)  # one broken state hides no other
        if opts.json:
            print(json.dumps([{**n.to_dict(), "relay_alive": netem.relay_alive(n.relay_pid)} for n in items], indent=1))
            return 0
        if not items:
            print("no emulation is up")
        for n in items:
            print(n.describe())
            missing = [ns for _, ns in n.namespaces if ns not in netem.existing_namespaces()]
            if missing:
                print(f"  WARNING: namespaces gone: {', '.join(missing)}")
            if n.relay_pid and not netem.relay_alive(n.relay_pid):
                print(f"  WARNING: delay-line relay (pid {n.relay_pid}) is not running: delayed links are down")
        return 0
    except (netem.NetemPermissionError, netem.NetemExists) as e:
        print(f"hcc netem {args.action}: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # argparse's own usage errors
        return int(e.code or 0)
