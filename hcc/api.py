"""hcc.api — the public entry points; thin wrappers over the compiler pipeline."""
from __future__ import annotations

import os

from .compiler.program import Program
from .ir.plan import Plan


def load(path_or_source: str | os.PathLike) -> Program:
    """Parse and check a program from a path (``*.hcl``) or from source text.

    Raises :class:`hcc.SourceError` (with file, line, column and caret) on bad input."""
    from .compiler.frontend import load_program

    return load_program(path_or_source)


def compile(program: Program | str | os.PathLike, name: str | None = None) -> Plan:
    """Compile one collective of ``program`` (a Program, a path or source text) to a
    verified :class:`Plan`. ``name`` may be omitted when the program has one collective."""
    from .compiler.pipeline import compile_one

    if not isinstance(program, Program):
        program = load(program)
    return compile_one(program, name)


def compile_all(program: Program | str | os.PathLike) -> dict[str, Plan]:
    """Compile every collective of ``program``, in declaration order."""
    if not isinstance(program, Program):
        program = load(program)
    return {c.name: compile(program, c.name) for c in program.collectives}
