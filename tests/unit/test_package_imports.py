"""The package's import graph: every module imports, and no two modules import each other, even
through a function-level import (a cycle hidden in a function still couples the two modules)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "eagle3_pipeline"
# imported by vLLM's own processes only, in the interpreter that has vLLM (.venv-vllm)
NEEDS_VLLM = {"eagle3_pipeline.hidden_states.vllm_connector"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted((SRC / PACKAGE).rglob("*.py"))}


def imported(name: str) -> set[str]:
    """The package's modules `name` imports anywhere in its source (top level or in a function)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(PACKAGE):
            for alias in node.names:  # `from pkg import module` names a module, else a name in pkg
                child = f"{node.module}.{alias.name}"
                found.add(child if child in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith(PACKAGE))
    assert not any(
        isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(ast.parse(MODULES[name].read_text()))
    )
    return {module for module in found if module in MODULES and module != name}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, as the modules along it, or None when it is acyclic."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for child in sorted(graph[node]):
            if state.get(child) == "open":
                return [*path[path.index(child) :], child]
            if child not in state and (found := visit(child)):
                return found
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_helper_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_the_package():
    found = cycle({name: imported(name) for name in MODULES})
    assert found is None, "import cycle: " + " -> ".join(found or [])


@pytest.mark.parametrize("name", sorted(set(MODULES) - NEEDS_VLLM))
def test_every_module_imports(name):
    importlib.import_module(name)
