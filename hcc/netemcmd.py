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
    p = argparse.ArgumentParser(prog=f"hcc netem {action}", description={
        "up": "build the emulation of a topology (needs root)",
        "down": "remove an emulation: its namespaces, links, relay and state file",
        "status": "show the emulations that are up, and what of them is gone",
        "exec": "run a command inside a rank's namespace: hcc netem exec [-n NAME] RANK -- CMD ARGS...",
    }[action])
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
        p.add_argument("name", nargs="?", help="the emulation (default: the only one up)")
        p.add_argument("--kill", action="store_true", help="SIGKILL processes still inside")
    elif action == "status":
        p.add_argument("name", nargs="?", help="one emulation (default: every one up)")
        p.add_argument("--json", action="store_true", help="print the state as JSON")
    elif action == "exec":
        p.add_argument("-n", "--name", help="the emulation (default: the only one up)")
        p.add_argument("rank", help="rank index (into the topology's nodes) or vertex name")
    return p


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:g} µs"


def latency_notes(declared: Topology, n, requested: str | None = None) -> list[str]:
    """Why a latency the topology declares is not the delay the emulation ``n`` applies, in
    words for the user: ``hcc netem up`` printed ``latency by none`` and ``0.000 ms`` for links
    declared at 2 µs and 20 µs and never said why. ``requested``: the ``--delay`` asked for
    (None when unknown, as for ``status``)."""
    from .netem import MIN_DELAY_LINE_S

    want: dict[tuple[str, str], float] = {}
    for l in declared.links:
        want[l.src, l.dst] = max(want.get((l.src, l.dst), 0.0), l.latency)
    applied = {(e.vertex, e.peer): e.delay_s for e in n.ends}
    lost = sorted({lat for arc, lat in want.items() if lat > 0 and not applied.get(arc)})
    notes = []
    if lost:
        count = sum(1 for arc, lat in want.items() if lat > 0 and not applied.get(arc))
        shown = ", ".join(_us(x) for x in lost[:4]) + (", …" if len(lost) > 4 else "")
        if requested == "none":
            why = "--delay none asks for no emulated latency"
        else:
            how = {"auto": "this kernel has no sch_netem qdisc, so delays go through the delay line, "
                           "a user-space relay",
                   "delay-line": "--delay delay-line puts delays in a user-space relay"}.get(
                requested, "the delay line is a user-space relay")
            why = (f"they are under {_us(MIN_DELAY_LINE_S)}, the shortest latency the delay line emulates "
                   f"({how} whose timing is good to about 0.1 ms; the namespaces' own stack adds tens "
                   "of µs per hop, more than these latencies)")
        notes.append(f"note: {count} link direction{'s' if count != 1 else ''} declared with a latency "
                     f"({shown}) run with none added: {why}")
    if n.delay_mode == "netem":  # tc netem takes whole microseconds (at least 1)
        rounded = sorted({lat for lat in want.values() if lat > 0 and abs(lat * 1e6 - max(round(lat * 1e6), 1)) > 1e-9})
        if rounded:
            notes.append("note: tc netem applies delays in whole microseconds: "
                         + ", ".join(f"{_us(x)} as {max(round(x * 1e6), 1)} µs" for x in rounded[:4]))
    return notes


def read_topology(path: str, which: str | None = None) -> Topology:
    """The topology named ``which`` (or the only one) of an .hcl program or a topology JSON."""
    from .grammar.errors import HccError

    if path.endswith(".json"):
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise HccError(f"cannot read topology {path}: {e}") from None
        if not isinstance(d, dict):
            raise HccError(f"cannot read topology {path}: not a JSON object")
        d = d.get("topology", d)  # a netem state file or a plan JSON carries one under "topology"
        from .ir.serialize import topology_from_dict

        return topology_from_dict(d, path)  # numbers checked as a plan file's are
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
            for note in latency_notes(topo, n, opts.delay):
                print(note)
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
            for note in latency_notes(n.topology, n):
                print(note)
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
