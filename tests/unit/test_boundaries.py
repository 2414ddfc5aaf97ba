"""Narrow contracts between packages, read from every module's imports (its AST, imports inside functions too).

The HTTP side (api/, metrics/, access/, server.py) imports nothing of the scheduler but its public view, the
names `orchestrator/scheduler/__init__.py` lists: the model table, queues, the ledger and placement are the scheduler's
own, so a change to them cannot reach the request path unseen."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
HTTP_SIDE = ("api", "metrics", "access", "server.py")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def http_side_files() -> list[Path]:
    files = []
    for part in HTTP_SIDE:
        target = PACKAGE / part
        files.extend([target] if target.is_file() else sorted(target.rglob("*.py")))
    return files


def test_the_http_side_imports_only_the_schedulers_public_view():
    files = http_side_files()
    assert len(files) > 20
    reaching_in = [f"{path.relative_to(PACKAGE.parent)}:{line}: {module}" for path in files
                   for line, module in imported_modules(path) if module.startswith("orchestrator.scheduler.")]
    assert reaching_in == [], "import from orchestrator.scheduler (its public view) instead:\n" + "\n".join(reaching_in)


def test_the_public_view_is_what_the_http_side_uses():
    """Every name the HTTP side takes from the scheduler package is one the view lists."""
    import orchestrator.scheduler as view

    taken = {alias.name for path in http_side_files() for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and node.module == "orchestrator.scheduler" for alias in node.names}
    assert taken and taken <= set(view.__all__), taken - set(view.__all__)
