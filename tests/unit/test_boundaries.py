"""Narrow contracts between packages, read from every module's imports (its AST, imports inside functions too).

The HTTP side (api/, metrics/, access/, server.py) imports nothing of the scheduler but its public view, the
names `orchestrator/scheduler/__init__.py` lists: the model table, queues, the ledger and placement are the scheduler's
own, so a change to them cannot reach the request path unseen."""

from __future__ import annotations

import ast
import io
import tokenize
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


LINE_BUDGET = 15_000  # lines of code in orchestrator/ (the shipped server), counted as cloc counts them


def code_lines(path: Path) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring (cloc's "code" count)."""
    source = path.read_text()
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def test_the_server_package_stays_within_its_line_budget():
    """The budget keeps the orchestrator thin; dev-only tools (soak, swap, comparisons) live in bench/."""
    counts = {path: code_lines(path) for path in PACKAGE.rglob("*.py")}
    assert len(counts) > 100
    assert code_lines(Path(__file__)) < len(Path(__file__).read_text().splitlines())  # docstrings and blanks left out
    total = sum(counts.values())
    largest = sorted(counts.items(), key=lambda item: -item[1])[:5]
    assert total <= LINE_BUDGET, f"{total} lines of code in orchestrator/; the largest: " + ", ".join(
        f"{path.relative_to(PACKAGE)} {count}" for path, count in largest)
