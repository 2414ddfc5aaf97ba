"""No import cycles: between orchestrator's packages, and between build_scripts' modules.

The imports are read from the source (ast), not by importing anything: every `import` and `from ... import`
statement anywhere in a module counts, at its top or inside a function or method, with relative imports
resolved. An import inside a function only hides a cycle: the two sides still cannot be read, tested or
moved apart without each other.

Imports under `if TYPE_CHECKING:` do not count. They never run, so they make no cycle at run time; they name
a type for annotations only. Nor do modules imported by name at run time (`importlib.import_module`), which
this reading cannot see.

An import of `a.b.c` counts as an import of the module `a.b.c` only (its packages' `__init__` modules run
too, but an `__init__` that imports nothing back adds no cycle). Imports of anything outside orchestrator
and build_scripts are left out: the standard library and third-party packages cannot import ours back.

A failure prints each cycle found: the shortest loop through it, and for each step of the loop the import
statements (file, line) that make it, then every unit caught in the same tangle.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("orchestrator", "build_scripts")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module
    where: str  # "path:line: statement", for the failure message


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    return {_module_name(path, root): path for package in packages for path in sorted((root / package).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _run_time_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in the module, at any depth, except those under `if TYPE_CHECKING:`."""
    found, pending = [], [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            pending += node.orelse
        else:
            pending += ast.iter_child_nodes(node)
    return sorted(found, key=lambda node: node.lineno)


def _known(dotted: str, modules: dict[str, Path]) -> str | None:
    """The module `dotted` names, or the innermost one holding it (`a.b.NAME` -> `a.b`); None outside ours."""
    while dotted not in modules and "." in dotted:
        dotted = dotted.rpartition(".")[0]
    return dotted if dotted in modules else None


def _targets(node: ast.Import | ast.ImportFrom, module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        names = [f"{base}.{alias.name}" for alias in node.names]  # a submodule, else a name in `base`
    return {target for name in names if (target := _known(name, modules)) is not None}


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[Import]:
    """Every run-time import of one of the packages' modules by another, with where it is written."""
    modules, edges = _modules(root, packages), []
    for module, path in modules.items():
        source = path.read_text()
        for node in _run_time_imports(ast.parse(source, str(path))):
            statement = " ".join((ast.get_source_segment(source, node) or "").split())
            where = f"{path.relative_to(root)}:{node.lineno}: {statement}"
            edges += [Import(module, target, where) for target in sorted(_targets(node, module, path, modules))
                      if target != module]
    return edges


def _tangles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _shortest_loop(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    """The shortest path from `start` back to itself inside one tangle (breadth first)."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for other in sorted(graph[node] & members):
            if other == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if other not in came_from:
                came_from[other] = node
                queue.append(other)
    raise AssertionError(f"{start} is in a tangle but on no loop")


def tangles(edges: list[Import], unit: Callable[[str], str]) -> dict[tuple[str, ...], str]:
    """Every import cycle between the units `unit` maps modules to: the units caught in it, and what to show."""
    graph: dict[str, set[str]] = {}
    lines: dict[tuple[str, str], list[str]] = {}
    for edge in edges:
        source, target = unit(edge.source), unit(edge.target)
        if source == target:
            continue
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
        lines.setdefault((source, target), []).append(edge.where)
    found = {}
    for members in _tangles(graph):
        loop = _shortest_loop(graph, members[0], set(members))
        report = [f"cycle: {' -> '.join(loop)}"]
        for source, target in pairwise(loop):
            report.append(f"  {source} imports {target}:")
            report += [f"    {where}" for where in lines[source, target]]
        if len(members) > len(loop) - 1:
            report.append(f"  the same tangle holds: {', '.join(members)}")
        found[tuple(members)] = "\n".join(report)
    return found


def orchestrator_unit(module: str) -> str:
    """orchestrator.api.wire -> orchestrator.api; a top-level module (orchestrator.config) is a unit of its own;
    build_scripts, which imports orchestrator's packages and is imported by orchestrator.cli, is one unit."""
    parts = module.split(".")
    return "build_scripts" if parts[0] == "build_scripts" else ".".join(parts[:2])


def build_scripts_unit(module: str) -> str:
    """Each module of build_scripts on its own; orchestrator's modules too, so that a loop through them counts."""
    return module


@pytest.fixture(scope="module")
def edges() -> list[Import]:
    return import_graph()


def test_orchestrator_packages_import_each_other_in_no_cycle(edges):
    found = tangles(edges, orchestrator_unit)
    assert not found, "orchestrator's packages import each other in a cycle:\n" + "\n".join(found.values())


def test_build_scripts_modules_import_each_other_in_no_cycle(edges):
    found = [report for members, report in tangles(edges, build_scripts_unit).items()
             if any(member.startswith("build_scripts.") for member in members)]
    assert not found, "build_scripts' modules import each other in a cycle:\n" + "\n".join(found)


def test_the_reading_counts_lazy_and_relative_imports_and_not_type_checking_ones(tmp_path):
    """The reading itself, on a package written for it: each kind of import, and the report of the cycles."""
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import c\n"
                    "def f():\n    from . import b\n",
        "pkg/b.py": "from .sub.d import thing\n",
        "pkg/c.py": "from pkg.a import f\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/d.py": "from ..a import f as g, f\nimport pkg.c\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    edges = import_graph(tmp_path, ("pkg",))
    pairs = sorted((edge.source, edge.target) for edge in edges)
    assert pairs == [("pkg.a", "pkg.b"), ("pkg.b", "pkg.sub.d"), ("pkg.c", "pkg.a"), ("pkg.sub.d", "pkg.a"),
                     ("pkg.sub.d", "pkg.c")]
    report = tangles(edges, build_scripts_unit)
    assert list(report) == [("pkg.a", "pkg.b", "pkg.c", "pkg.sub.d")]
    assert report["pkg.a", "pkg.b", "pkg.c", "pkg.sub.d"].splitlines() == [
        "cycle: pkg.a -> pkg.b -> pkg.sub.d -> pkg.a",
        "  pkg.a imports pkg.b:",
        "    pkg/a.py:6: from . import b",
        "  pkg.b imports pkg.sub.d:",
        "    pkg/b.py:1: from .sub.d import thing",
        "  pkg.sub.d imports pkg.a:",
        "    pkg/sub/d.py:1: from ..a import f as g, f",
        "  the same tangle holds: pkg.a, pkg.b, pkg.c, pkg.sub.d",
    ]
    assert tangles(edges, lambda module: module.split(".")[0]) == {}  # one package: no cycle between packages
