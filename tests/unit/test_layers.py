"""The package's layers, read from its imports: every import runs down the layers, none runs in a
cycle, and no kernel loader is imported outside ``backends/``.

    cli, cli_serve, cli_batch, bench, top (and the package facade)  >  server, batch, cluster, llm, plain (front ends)
    >  frontend  >  engine  >  runner  >  backends, model  >  cache, text, core (and config, sampling, platform, threads)

Every import counts: at module level, inside functions, and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import swiftlm

ROOT = Path(swiftlm.__file__).parent
LAYERS: list[set[str]] = [
    {"__init__", "__main__", "cli", "cli_batch", "cli_serve", "bench", "top"},
    {"server", "batch", "cluster", "llm", "plain"},
    {"frontend"},
    {"engine"},
    {"runner"},
    {"backends", "model"},
    {"cache", "text", "core", "config", "sampling", "platform", "threads"},
]
# within one layer, these may not import those: the model stays plain, the shared nouns import no
# cache or text logic
FORBIDDEN_SIDEWAYS = {("model", "backends"), ("core", "cache"), ("core", "text"), ("cache", "text"),
                      ("text", "cache")}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The swiftlm modules that ``path`` imports (a name imported from a package counts as its
    submodule when there is one)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "swiftlm"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # a relative import, resolved against the file's own package
                package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "swiftlm":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules}


def place(module: str) -> tuple[int, str]:
    """(layer index, top-level part) of a swiftlm module; the facade is ``swiftlm`` itself."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i, top
    raise AssertionError(f"{module} is in no layer: place swiftlm/{top} in LAYERS")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {m: imports_of(p, modules) for m, p in modules.items()}


def test_every_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    for module in graph:
        place(module)


def test_imports_run_down_the_layers(graph: dict[str, set[str]]) -> None:
    upward = []
    for module, deps in graph.items():
        layer, top = place(module)
        for dep in deps:
            dep_layer, dep_top = place(dep)
            if dep_layer < layer or (top, dep_top) in FORBIDDEN_SIDEWAYS:
                upward.append(f"{module} -> {dep}")
    assert not upward, "imports that run up (or across) the layers:\n" + "\n".join(sorted(upward))


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if dep == module or module.startswith(dep + "."):
                continue  # a module importing its own package's __init__ (a parent, not a cycle)
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_kernel_loaders_are_imported_only_inside_backends(graph: dict[str, set[str]]) -> None:
    outside = [f"{m} -> {d}" for m, deps in graph.items() for d in deps
               if d.startswith("swiftlm.backends.cpu.kernels") and not m.startswith("swiftlm.backends")]
    assert not outside, "kernel loaders imported outside backends/:\n" + "\n".join(outside)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The parser finds imports in functions and under TYPE_CHECKING (the checks above rely on it)."""
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from swiftlm.engine import engine\n"
                      "def f():\n    import swiftlm.server.app\n    from swiftlm.backends.cpu import ops\n")
    found = imports_of(source, all_modules())
    assert found == {"swiftlm.engine.engine", "swiftlm.server.app", "swiftlm.backends.cpu.ops"}
