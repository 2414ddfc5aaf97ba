"""The tree says which process runs a file: every module of the HTTP process's packages imports no model runtime.

The HTTP process serves every model from one event loop and never loads torch, transformers, xgrammar or
llama.cpp: those live in the worker process (`orchestrator/worker/`, the backends' packages under
`orchestrator/backends/<name>/`) and the grammar checker's process (`orchestrator/structured/grammar/`). This test
imports every module of every other package, found by walking the folders (not a hand-kept list), in a fresh
interpreter, and names the modules that pulled a runtime in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
# Packages whose code runs outside the HTTP process: the worker, each backend, the grammar checker, and the
# benchmark client (`inferno bench`, its own process).
OTHER_PROCESSES = ("worker", "backends/hf", "backends/llamacpp", "backends/trtllm", "backends/sim",
                   "structured/grammar", "bench")
RUNTIMES = ("torch", "transformers", "xgrammar", "llama_cpp", "tensorrt_llm")

PROBE = """
import importlib, json, sys
runtimes, pulled = {runtimes!r}, {{}}
for name in {modules!r}:
    before = {{r for r in runtimes if r in sys.modules}}
    importlib.import_module(name)
    for runtime in runtimes:
        if runtime in sys.modules and runtime not in before:
            pulled.setdefault(runtime, name)
print(json.dumps(pulled))
"""


def http_process_modules() -> list[str]:
    excluded = tuple(PACKAGE / folder for folder in OTHER_PROCESSES)
    modules = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__main__.py" or any(path.is_relative_to(folder) for folder in excluded):
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def test_the_http_process_packages_import_no_model_runtime():
    modules = http_process_modules()
    assert "orchestrator.server" in modules and "orchestrator.api.app" in modules and len(modules) > 80
    probe = PROBE.format(runtimes=RUNTIMES, modules=modules)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    pulled = json.loads(result.stdout.strip().splitlines()[-1])
    assert pulled == {}, f"HTTP-process modules that import a model runtime (runtime: first module): {pulled}"


def test_the_other_processes_packages_exist():
    """A renamed folder must not silently widen what this test checks."""
    assert all((PACKAGE / folder).is_dir() for folder in OTHER_PROCESSES)
