"""hcc.cli — the ``hcc`` console script: a thin ``main()`` over the subcommands.

Exit status: 0 success; 2 bad input (a :class:`SourceError` or :class:`PlanError`, printed
as ``file:line:col: error: …`` with the line and a caret, or a flag's value out of its domain);
1 a failed run or an internal fault. No traceback reaches the user unless ``HCC_TRACEBACK=1``.
Every option has a help line (``hcc COMMAND -h``); ``hcc --version`` prints the version.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# subcommand -> "module:function"; each module owns its flags' meaning
COMMANDS = {
    "check": "hcc.commands:cmd_check",
    "compile": "hcc.commands:cmd_compile",
    "viz": "hcc.commands:cmd_viz",
    "simulate": "hcc.commands:cmd_simulate",
    "run": "hcc.runner:cmd_run",
    "netem": "hcc.netemcmd:cmd_netem",
}


def _cost_flags(s: argparse.ArgumentParser, run: bool = False) -> None:
    """The cost model's knobs (compiler/cost.py ``CostModel``); unset flags keep the default
    (``hcc compile``/``simulate``: the compiler's; ``hcc run``: the backend's measured one)."""
    title = "cost model (default: the backend's measured costs, printed with the results)" if run else "cost model"
    g = s.add_argument_group(title)
    g.add_argument("--per-message-us", type=float, metavar="US",
                   help="software cost of one message, microseconds (compiler default 1; the chunk "
                        "search trades it against pipeline fill)")
    g.add_argument("--reduce-GBps", type=float, metavar="GB/s",
                   help="local reduction rate, GB/s of input (default: free)")
    g.add_argument("--copy-GBps", type=float, metavar="GB/s", help="local copy rate, GB/s (default: free)")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="hcc", description="declarative collective schedule compiler",
                                epilog="exit status: 0 done, 2 bad input (file:line:col and a caret), "
                                       "1 a failed run or an internal error; `hcc COMMAND -h` for a command's options")
    p.add_argument("--version", action="version", version=f"hcc {__version__}",
                   help="print hcc's version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("check", help="parse and check a program")
    s.add_argument("file", help="the program (.hcl)")

    s = sub.add_parser("compile", help="compile collectives to plans")
    s.add_argument("file", help="the program (.hcl)")
    s.add_argument("-c", "--collective", metavar="NAME", help="compile only this collective")
    s.add_argument("-o", "--output", metavar="PLAN.json", help="write the plan file (atomically)")
    s.add_argument("--json", action="store_true", help="print a JSON list, one object per collective")
    _cost_flags(s)

    s = sub.add_parser("viz", help="draw the topology and trees, or a timeline")
    s.add_argument("file", help="plan.hcl or plan.json")
    s.add_argument("-c", "--collective", metavar="NAME",
                   help="which collective of an .hcl program to draw (needed when it has several)")
    s.add_argument("--format", choices=["dot", "trace", "png", "svg"], default=None,
                   help="dot: Graphviz source of the topology panel and one panel per tree; "
                        "trace: the predicted timeline as Chrome/Perfetto trace JSON; png, svg: a picture "
                        "(rendered by Graphviz's dot when installed, else matplotlib, the viz extra). "
                        "Default: from OUT's suffix (.png, .svg, .json: trace; dot otherwise)")
    s.add_argument("-o", "--output", metavar="OUT", required=True,
                   help="the file to write (atomically: a failed run leaves no half-written file)")

    s = sub.add_parser("simulate", help="predict per-rank times and link utilisation")
    s.add_argument("file", help="plan.hcl or plan.json")
    s.add_argument("-c", "--collective", metavar="NAME", help="simulate only this collective of an .hcl program")
    s.add_argument("--json", action="store_true", help="print the prediction as JSON instead of a table")
    _cost_flags(s)

    s = sub.add_parser("run", help="run a plan on local ranks and check the results")
    s.add_argument("file", help="plan.hcl or plan.json")
    s.add_argument("-c", "--collective", metavar="NAME", help="run only this collective of an .hcl program")
    s.add_argument("--backend", choices=["sockets", "mpi", "ray"], default="sockets",
                   help="sockets: TCP and shared memory between local processes (default); mpi: mpi4py "
                        "under mpiexec; ray: Ray actors on a local cluster")
    s.add_argument("--iters", type=int, default=5, metavar="N",
                   help="timed runs of each collective; the table reports their times (default 5)")
    s.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="untimed runs before them: connections, plan caches (default 1)")
    s.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="deadline of every wait, seconds (default 60)")
    s.add_argument("--json", action="store_true", help="print one JSON object per collective instead of a table")
    s.add_argument("--netem", action="store_true", help="run each rank in its `hcc netem` namespace")
    s.add_argument("--seed", type=int, default=0,
                   help="seed of the random inputs every rank draws and the checker recomputes (default 0)")
    s.add_argument("--trace", metavar="OUT.json",
                   help="record the last iteration's transfers (send/receive start and end per op, every "
                        "rank) as a Perfetto trace beside the prediction (`hcc viz --format trace`'s tracks); "
                        "sockets and mpi only. Traced runs use the pure-Python executor for every iteration "
                        "(the native core and bound MPI runs keep no per-op times), so their times are the "
                        "Python executor's")
    _cost_flags(s, run=True)

    s = sub.add_parser("netem", help="emulate a topology with network namespaces (root)",
                       description="build a declared topology out of network namespaces, veth pairs and tc "
                                   "shaping (docs/netem.md); `hcc netem ACTION -h` for an action's options")
    s.add_argument("action", choices=["up", "down", "exec", "status"],
                   help="up: build an emulation from a program or topology JSON; status: show it; "
                        "exec: run a command inside a rank's namespace; down: remove it")
    s.add_argument("args", nargs=argparse.REMAINDER, help="the action's own arguments (see `hcc netem ACTION -h`)")
    return p


def main(argv: list[str] | None = None) -> int:
    from .grammar.diagnostics import SourceError
    from .grammar.errors import HccError
    from .ir.errors import ArgumentError, PlanError

    args = build_parser().parse_args(argv)
    module, func = COMMANDS[args.command].split(":")
    try:
        handler = getattr(importlib.import_module(module), func)
        return int(handler(args) or 0)
    except (SourceError, PlanError) as e:
        print(e.render() if isinstance(e, SourceError) else str(e), file=sys.stderr)
        return 2
    except ArgumentError as e:  # a flag's value out of its domain (--per-message-us -1): bad input
        print(f"hcc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except HccError as e:
        print(f"hcc {args.command}: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `hcc compile --json | head`: the reader left, as for any Unix tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"hcc {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # an internal fault: say so plainly, keep the traceback for debugging
        if os.environ.get("HCC_TRACEBACK"):
            raise
        print(
            f"hcc {args.command}: internal error: {type(e).__name__}: {e}\n"
            "(set HCC_TRACEBACK=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
