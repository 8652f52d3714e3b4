"""The package's layers: imports only go down, and no module imports itself round a cycle.

Every import counts, including those inside functions (they are deferred for speed, not to hide
a dependency). See docs/architecture.md for the layers.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# lowest first; a module may import its own layer's modules (without cycles) and lower layers
LAYERS = [
    ("policies", "hermes_cli.defaults", "hermes_cli.settings", "hermes_cli", "hermes_cli.cluster"),
    ("hermes_cli.positions", "hermes_cli.frames", "hermes_cli.sources"),
    ("hermes_cli.models",),
    ("hermes_cli.engine",),
    ("hermes_cli.app",),
    ("hermes_cli.bench", "hermes_cli.evaluation"),
    ("hermes_cli.cli", "hermes_cli.serve",  # serve builds streams from the CLI's settings
     # the cluster's runtime: engine actors host serve's Hub, the gateway is serve's app, the CLI starts it
     "hermes_cli.cluster.store", "hermes_cli.cluster.actors", "hermes_cli.cluster.gateway",
     "hermes_cli.cluster.launch"),
    ("hermes_cli.__main__",),
]


def layer_of(module: str) -> int:
    best, depth = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    assert best is not None, f"{module} is in no layer: add it to LAYERS and to docs/architecture.md"
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_from(node: ast.ImportFrom, path: Path) -> str:
    """The absolute module a ``from … import`` in ``path`` names (relative ones resolved)."""
    if not node.level:
        return node.module or ""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(path: Path) -> set[str]:
    """Project modules imported anywhere in ``path`` (absolute or relative)."""
    name = module_name(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = imported_from(node, path)
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from pkg import module`
    modules = {module_name(p) for p in source_files()}
    return {m for m in found if m in modules and m != name}


def source_files() -> list[Path]:
    return sorted([*(ROOT / "hermes_cli").rglob("*.py"), *(ROOT / "policies").rglob("*.py")])


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in source_files()}


def test_imports_only_go_down():
    upward = [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in graph().items()
        for target in targets
        if layer_of(target) > layer_of(module)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycles():
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph().items()}  # a package's __init__ is no cycle
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" → ".join(c) for c in cycles)


def test_the_checker_sees_an_upward_import_and_a_cycle(tmp_path, monkeypatch):
    """The two checks above can fail: a fake tree with both faults."""
    pkg = tmp_path / "hermes_cli"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "cli").mkdir()
    (tmp_path / "policies").mkdir()
    for init in (pkg, pkg / "engine", pkg / "cli", tmp_path / "policies"):
        (init / "__init__.py").write_text("")
    (pkg / "engine" / "a.py").write_text("from ..cli import b\n")
    (pkg / "cli" / "b.py").write_text("from ..engine import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match=r"hermes_cli.engine.a \(layer 3\) imports hermes_cli.cli.b"):
        test_imports_only_go_down()
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycles()


def project_imports_of(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """Every project ``from X import a, b`` in ``path`` (inside functions too): (X, names)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = imported_from(node, path)
            if target.split(".")[0] in ("hermes_cli", "policies"):
                found.append((target, tuple(alias.name for alias in node.names)))
    return found


def test_every_project_import_names_a_module_that_exists():
    """A deferred import of a moved module fails only when its code runs (a micro-benchmark's
    ``from .runner import`` did): each ``from X import y`` must name a module X, and y must be
    a module of X or a name X defines."""
    modules = {module_name(p): p for p in source_files()}
    broken = []
    for module, path in modules.items():
        for target, names in project_imports_of(path):
            if target not in modules:
                broken.append(f"{module}: from {target} (no such module)")
                continue
            tree = ast.parse(modules[target].read_text())
            defined = {n.id for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
                       for n in ast.walk(t) if isinstance(n, ast.Name)}  # `A, B = …` too
            defined |= {node.target.id for node in ast.walk(tree)
                        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
            defined |= {node.name for node in tree.body
                        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
            defined |= {(a.asname or a.name).split(".")[0] for node in ast.walk(tree)
                        if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
            broken += [f"{module}: from {target} import {n}" for n in names
                       if n != "*" and n not in defined and f"{target}.{n}" not in modules]
    assert not broken, "imports that fail when they run:\n" + "\n".join(broken)


# The engine's insides: only hermes_cli/engine/ imports them; every mode drives streams through
# the engine's client (hermes_cli/engine/client.py) and reads its records.
ENGINE_INTERNALS = ("session", "cache", "decoding", "prefill", "compression", "pseudo_query", "position_tracker",
                    "conversation", "probe")


def test_only_the_engine_imports_its_internals():
    internal = {f"hermes_cli.engine.{name}" for name in ENGINE_INTERNALS}
    offenders = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        if not module.startswith("hermes_cli.engine")
        for target in targets
        if target in internal or any(target.startswith(i + ".") for i in internal)
    ]
    assert not offenders, "outside the engine, use engine.client:\n" + "\n".join(sorted(offenders))
