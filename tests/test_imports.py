"""The stages import one way: grammar → compiler → ir ← backends, the ``hcc`` package on top.

Checked on the sources themselves (``ast``, every import statement, also those inside
functions), so no import can hide behind a lazy one: a stage that reaches back at run time is
as much a cycle as one that does so at load time.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# folder -> installed package (pyproject.toml's package-dir)
STAGES = {"grammar": "hcc.grammar", "compiler": "hcc.compiler", "ir": "hcc.ir", "backends": "hcc.backends",
          "hcc": "hcc"}
# stage -> the stages it must never import
FORBIDDEN = {
    "grammar": {"compiler", "ir", "backends", "hcc"},
    "compiler": {"backends", "hcc"},
    "ir": {"compiler", "backends", "hcc"},
    "backends": {"compiler", "hcc"},
}
# (module, import) pairs tolerated while their own change is under way; nothing may join them
PENDING: set[tuple[str, str]] = set()


def stage_of(module: str) -> str | None:
    """The stage an absolute module name belongs to (None: not hcc's)."""
    parts = module.split(".")
    if parts[0] != "hcc":
        return None
    if len(parts) > 1 and parts[1] in ("grammar", "compiler", "ir", "backends"):
        return parts[1]
    return "hcc"


def imports(path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import in ``path``, relative ones resolved."""
    rel = path.relative_to(ROOT)
    package = [*STAGES[rel.parts[0]].split("."), *rel.parts[1:-1]]  # the module's package: its folder
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            if node.module is None:  # `from . import x`: x may be a module
                out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return out


def sources(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_resolution_of_relative_imports():
    """The checker itself: relative imports resolve to the installed names."""
    engine = ROOT / "backends" / "adaptive" / "engine.py"
    got = {m for _, m in imports(engine)}
    assert "hcc.ir.plan" in got and "hcc.backends.base" in got and "hcc.backends.adaptive.flows" in got
    assert stage_of("hcc.ir.plan") == "ir" and stage_of("hcc.api") == "hcc" and stage_of("numpy") is None


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_stages_import_one_way(folder):
    bad = []
    for path in sources(folder):
        rel = path.relative_to(ROOT).as_posix()
        for line, mod in imports(path):
            if stage_of(mod) in FORBIDDEN[folder] and (rel, mod) not in PENDING:
                bad.append(f"{rel}:{line}: imports {mod}")
    assert not bad, "stages must import one way (grammar -> compiler -> ir <- backends):\n" + "\n".join(bad)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [*STAGES[rel.parts[0]].split("."), *rel.parts[1:]]
    parts[-1] = parts[-1][:-3]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# backends/shm.py subclasses the sockets transport, and sockets.connect() hands every new
# transport to shm.enable() (a lazy import): one known loop between those two modules.
PENDING_CYCLES = {frozenset({"hcc.backends.sockets", "hcc.backends.shm"})}


def test_backend_modules_import_one_way():
    """No loop among the backends' modules (lazy imports included): the runtime imports the
    executors, the executors the transports' interface, never the other way round."""
    bad = sorted(tuple(sorted(c)) for c in cycles(module_graph("backends")) - PENDING_CYCLES)
    assert not bad, f"backends modules that import each other: {bad}"


def module_graph(folder: str) -> dict[str, set[str]]:
    """Module -> the modules of the same folder it imports (lazy imports included)."""
    paths = sources(folder)
    known = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        me = module_name(path)
        deps = set()
        for _, mod in imports(path):
            while mod and mod not in known:  # `from .x import name`: the module is x
                mod = mod.rpartition(".")[0]
            if mod and mod != me and not me.startswith(mod + "."):  # a package's own __init__
                deps.add(mod)
        graph[me] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The pairs of modules that reach each other."""
    reach = {a: _reach(graph, a) for a in graph}
    return {frozenset({a, b}) for a in graph for b in reach[a] if a < b and a in reach.get(b, ())}


def _reach(graph: dict[str, set[str]], a: str) -> set[str]:
    seen, todo = set(), list(graph.get(a, ()))
    while todo:
        b = todo.pop()
        if b not in seen:
            seen.add(b)
            todo.extend(graph.get(b, ()))
    return seen


def test_compiler_modules_import_one_way():
    """No loop among the compiler's modules: the pipeline imports the registry, the registry
    the algorithms, the algorithms the lowering and the tree value, never back."""
    graph = module_graph("compiler")
    bad = sorted(tuple(sorted(c)) for c in cycles(graph))
    assert not bad, f"compiler modules that import each other: {bad}"
    assert not graph["hcc.compiler.registry"] & {"hcc.compiler.pipeline", "hcc.compiler.frontend"}


def test_every_registered_algorithm_is_reachable_from_the_language():
    """The ``algorithm =`` names docs/language.md lists are the front end's (the words and the
    named forms, ``_`` for ``-``), each is a registered algorithm or one of the two choosers
    (auto, treepack), and every algorithm of
    compiler/registry.py is offered for some collective: by auto, by treepack, by its own name,
    or as the sole form of a kind."""
    import re

    from hcc.compiler import registry
    from hcc.compiler.frontend import ALGORITHMS, NAMED_FORMS
    from hcc.compiler.program import CollectiveSpec
    from hcc.ir.plan import KINDS, REDUCING_KINDS, ROOTED_KINDS

    text = (ROOT / "docs" / "language.md").read_text()
    listed = re.search(r"^\s*algorithm = ([a-z_]+(?: \| [a-z_]+)+)$", text, re.M)
    assert listed, "docs/language.md lists the algorithm names"
    words = tuple(w.strip() for w in listed.group(1).split("|"))
    assert words == ALGORITHMS + NAMED_FORMS
    assert f"`{' '.join(ALGORITHMS)}`" in text  # the settings table says the same
    for form in NAMED_FORMS:  # and the Algorithms section names every form
        assert f"`{form}`" in text, form
    names = tuple(w.replace("_", "-") for w in words)
    registered = {a.name for a in registry.REGISTRY}
    assert set(names) - {"auto", "treepack"} <= registered
    assert len(registered) == len(registry.REGISTRY)  # one object per name

    offered: dict[str, set[str]] = {}
    for kind in KINDS:
        for n in (2, 3, 8, 16, 32):
            for alg in names:
                for compress in ("none", "fp16"):
                    s = CollectiveSpec("c", kind, "t", tuple(f"r{i}" for i in range(n)),
                                       0 if kind in ROOTED_KINDS else -1, 1 << 20,
                                       op="sum" if kind in REDUCING_KINDS else None, algorithm=alg,
                                       compress=compress)
                    eligible, lowered = registry.candidates_for(s)
                    assert set(eligible) <= set(lowered) <= registered, (kind, n, alg)
                    for a in eligible:
                        offered.setdefault(a, set()).add(alg)
    assert set(offered) == registered, f"never offered: {sorted(registered - set(offered))}"
    # every treepack-family algorithm is among `algorithm = treepack`'s choices
    assert {a.name for a in registry.REGISTRY if a.treepack} <= {a for a, by in offered.items() if "treepack" in by}
