"""hcc.api — the public entry points; thin wrappers over the compiler pipeline and the runtime."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .compiler.program import Program
from .ir.plan import Plan

if TYPE_CHECKING:
    from .compiler.cost import CostModel


def _no_unknown(func: str, unknown: dict, known: tuple[str, ...]) -> None:
    """An unknown keyword is an :class:`ArgumentTypeError` naming it (with a did-you-mean),
    as Python's own TypeError would, but catchable as :class:`hcc.HccError`."""
    if unknown:
        import difflib

        from .ir.errors import ArgumentTypeError

        word = next(iter(unknown))
        close = difflib.get_close_matches(word, known, n=1)
        raise ArgumentTypeError(f"{func}() got an unexpected keyword argument {word!r}"
                                + (f" (did you mean {close[0]!r}?)" if close else "")
                                + f"; it takes {', '.join(known)}")


def _check_compile_args(func: str, program, name, model) -> None:
    from .compiler.cost import CostModel
    from .ir.errors import ArgumentTypeError

    if not isinstance(program, (Program, str, os.PathLike)):
        raise ArgumentTypeError(f"{func}: program must be a Program, a path or source text, "
                                f"got {type(program).__name__}")
    if name is not None and not isinstance(name, str):
        raise ArgumentTypeError(f"{func}: name must be a collective's name (str) or None, "
                                f"got {type(name).__name__} {name!r}")
    if model is not None and not isinstance(model, CostModel):
        raise ArgumentTypeError(f"{func}: model must be a CostModel or None, got {type(model).__name__}")


def load(path_or_source: str | os.PathLike, **unknown) -> Program:
    """Parse and check a program from a path (``*.hcl``) or from source text.

    Raises :class:`hcc.SourceError` (with file, line, column and caret) on bad input, and
    :class:`hcc.ArgumentTypeError` for an argument of another type."""
    from .compiler.frontend import load_program

    _no_unknown("hcc.load", unknown, ("path_or_source",))
    return load_program(path_or_source)


def compile(program: Program | str | os.PathLike, name: str | None = None, *,
            model: "CostModel | None" = None, **unknown) -> Plan:
    """Compile one collective of ``program`` (a Program, a path or source text) to a
    verified :class:`Plan`. ``name`` may be omitted when the program has one collective.
    ``model`` (a :class:`~hcc.compiler.cost.CostModel`, e.g. ``CostModel(per_message_s=1e-4)``
    for the sockets runtime) prices the candidates the chunk search compares; None is the
    compiler's default, the same as ``hcc compile`` without cost flags.

    An argument of the wrong type or an unknown keyword is an :class:`hcc.ArgumentTypeError`."""
    from .compiler.cost import DEFAULT_MODEL
    from .compiler.pipeline import compile_unit

    _no_unknown("hcc.compile", unknown, ("program", "name", "model"))
    _check_compile_args("hcc.compile", program, name, model)
    if not isinstance(program, Program):
        program = load(program)
    return compile_unit(program, name, model=model or DEFAULT_MODEL).plan


def run(plan: Plan, comm, array=None, **options):
    """Run ``plan`` on this rank over ``comm`` (a backend's transport: sockets, MPI, Ray) and
    return its output: ``out = hcc.run(plan, comm, x)``. Keywords: ``out`` (a preallocated
    output, may be ``x`` itself), ``timeout`` (seconds per wait), ``step`` (the training step
    of a neighbor_average), and the adaptive runtime's ``adaptive``, ``quorum``,
    ``chunk_bytes``; see :func:`hcc.backends.runtime.run`, which decides how the plan runs."""
    from .backends.runtime import run as run_plan

    return run_plan(plan, comm, array, **options)


def compile_all(program: Program | str | os.PathLike, *, model: "CostModel | None" = None,
                **unknown) -> dict[str, Plan]:
    """Compile every collective of ``program``, in declaration order, under ``model``."""
    _no_unknown("hcc.compile_all", unknown, ("program", "model"))
    _check_compile_args("hcc.compile_all", program, None, model)
    if not isinstance(program, Program):
        program = load(program)
    return {c.name: compile(program, c.name, model=model) for c in program.collectives}
