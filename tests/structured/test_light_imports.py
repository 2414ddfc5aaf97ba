"""The HTTP process's side of structured outputs must not import xgrammar, torch or transformers."""

from __future__ import annotations

import subprocess
import sys

HTTP_SIDE = [
    "checker",
    "guide",
    "json_scan",
    "markers",
    "reasoning",
    "tool_call_scan",
    "tool_formats",
    "tool_grammar",
    "tool_parsers",
    "tool_prompt",
    "tools",
    "vocabulary",
]


def test_http_side_modules_import_no_heavy_runtime():
    imports = "; ".join(f"import orchestrator.structured.{name}" for name in HTTP_SIDE)
    probe = f"{imports}; import sys; print(sorted(m for m in ('torch', 'transformers', 'xgrammar', 'numpy') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
