"""The shape of the three planes, read statically from their source (nothing is imported).

The import graph counts every ``import`` / ``from ... import`` in a file, at module level, inside
functions and under ``TYPE_CHECKING`` alike: an import moved into a function still ties the two
modules together, it only hides the tie until run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLANES = ("common", "coordinator", "workers")
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 300


def _module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the three planes."""
    files = {}
    for plane in PLANES:
        for path in (root / plane).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def _known(name: str, files: dict[str, Path]) -> str | None:
    """The deepest module of the planes that ``name`` names or lies in (None: outside them)."""
    while name and name not in files:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path, files: dict[str, Path]) -> set[str]:
    """Modules of the planes that ``module`` imports anywhere in its file (relative imports resolved)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(_known(alias.name, files) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:  # ``from pkg import mod`` imports the submodule itself
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in files else _known(source, files))
    return found - {None, module}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Dotted module -> the modules of the planes it imports."""
    files = _module_files(root)
    return {module: _imports(module, path, files) for module, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or None (depth-first search, colouring the path)."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        path.append(module)
        on_path.add(module)
        for dep in sorted(graph[module]):
            if dep in on_path:
                return path[path.index(dep):] + [dep]
            if dep not in done:
                cycle = visit(dep)
                if cycle:
                    return cycle
        path.pop()
        on_path.discard(module)
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def _lengths(root: Path = ROOT) -> tuple[dict[str, int], dict[str, int]]:
    """(functions, classes) of the planes: ``path::Qualname`` -> lines from ``def``/``class`` to its end."""
    functions: dict[str, int] = {}
    classes: dict[str, int] = {}

    def walk(node: ast.AST, where: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                table = classes if isinstance(child, ast.ClassDef) else functions
                table[f"{where}::{name}"] = child.end_lineno - child.lineno + 1
                walk(child, where, name + ".")
            else:
                walk(child, where, prefix)

    for plane in PLANES:
        for path in sorted((root / plane).rglob("*.py")):
            walk(ast.parse(path.read_text(), str(path)), path.relative_to(root).as_posix(), "")
    return functions, classes


def _too_long(lengths: dict[str, int], limit: int) -> list[str]:
    """Each definition longer than ``limit`` lines, with its length."""
    return [f"{name}: {n} lines > {limit}" for name, n in sorted(lengths.items()) if n > limit]


def test_the_planes_have_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_find_cycle_names_the_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_imports_are_read_everywhere_in_a_file_and_resolved(tmp_path):
    (tmp_path / "common" / "policy").mkdir(parents=True)
    for name in ("coordinator", "workers"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / "common" / "__init__.py").write_text("")
    (tmp_path / "common" / "keys.py").write_text("")
    (tmp_path / "common" / "policy" / "__init__.py").write_text("from . import base\n")
    (tmp_path / "common" / "policy" / "base.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..keys import ns\n")
    (tmp_path / "workers" / "task.py").write_text(
        "import numpy\ndef f():\n    from common import keys\n    import coordinator.x\n")
    graph = import_graph(tmp_path)
    assert graph["common.policy"] == {"common.policy.base"}
    assert graph["common.policy.base"] == {"common.keys"}
    assert graph["workers.task"] == {"common.keys", "coordinator"}


def test_coordinator_and_workers_never_import_each_other_and_common_imports_neither():
    crossing = [f"{module} imports {dep}" for module, deps in sorted(import_graph().items()) for dep in sorted(deps)
                if (module.split(".")[0], dep.split(".")[0]) in {
                    ("coordinator", "workers"), ("workers", "coordinator"),
                    ("common", "coordinator"), ("common", "workers")}]
    assert not crossing, "\n".join(crossing)


def test_no_function_is_longer_than_80_lines():
    functions, _ = _lengths()
    wrong = _too_long(functions, MAX_FUNCTION_LINES)
    assert not wrong, "\n".join(wrong)


def test_no_class_is_longer_than_300_lines():
    _, classes = _lengths()
    wrong = _too_long(classes, MAX_CLASS_LINES)
    assert not wrong, "\n".join(wrong)


def test_the_length_check_names_each_offender_with_its_length():
    assert _too_long({"a.py::Big": 301, "a.py::Fits": 300}, 300) == ["a.py::Big: 301 lines > 300"]
