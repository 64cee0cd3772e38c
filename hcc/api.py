"""hcc.api — the public entry points; thin wrappers over the compiler pipeline."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .compiler.program import Program
from .ir.plan import Plan

if TYPE_CHECKING:
    from .compiler.cost import CostModel


def load(path_or_source: str | os.PathLike) -> Program:
    """Parse and check a program from a path (``*.hcl``) or from source text.

    Raises :class:`hcc.SourceError` (with file, line, column and caret) on bad input."""
    from .compiler.frontend import load_program

    return load_program(path_or_source)


def compile(program: Program | str | os.PathLike, name: str | None = None, *,
            model: "CostModel | None" = None) -> Plan:
    """Compile one collective of ``program`` (a Program, a path or source text) to a
    verified :class:`Plan`. ``name`` may be omitted when the program has one collective.
    ``model`` (a :class:`~hcc.compiler.cost.CostModel`, e.g. ``CostModel(per_message_s=1e-4)``
    for the sockets runtime) prices the candidates the chunk search compares; None is the
    compiler's default, the same as ``hcc compile`` without cost flags."""
    from .compiler.cost import DEFAULT_MODEL
    from .compiler.pipeline import compile_unit

    if not isinstance(program, Program):
        program = load(program)
    return compile_unit(program, name, model=model or DEFAULT_MODEL).plan


def compile_all(program: Program | str | os.PathLike, *, model: "CostModel | None" = None) -> dict[str, Plan]:
    """Compile every collective of ``program``, in declaration order, under ``model``."""
    if not isinstance(program, Program):
        program = load(program)
    return {c.name: compile(program, c.name, model=model) for c in program.collectives}
