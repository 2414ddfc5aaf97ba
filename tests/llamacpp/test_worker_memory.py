"""The embedded default's worker holds its weights in its own memory, in 2 MiB pages where the kernel offers
transparent huge pages (backends/llamacpp/api.py, `Model`), not mapped from the GGUF file, whose 4 KiB page-cache
pages cost each decode a TLB miss per 4 KiB of weights."""

from __future__ import annotations

import re
from pathlib import Path

import openai
import pytest

from tests.conftest import DEFAULT_MODEL, admin_models

pytestmark = pytest.mark.e2e

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def test_the_loaded_workers_weights_are_its_own_memory_in_huge_pages(llamacpp_server, gguf_engine):
    client = openai.OpenAI(base_url=llamacpp_server.api, api_key="unused", max_retries=0, timeout=120)
    client.completions.create(model=DEFAULT_MODEL, prompt="Hello", max_tokens=1)
    pid = admin_models(llamacpp_server.base_url)[DEFAULT_MODEL]["pid"]
    assert "model.gguf" not in Path(f"/proc/{pid}/maps").read_text()
    if not THP.exists() or "[never]" in THP.read_text():
        pytest.skip("this kernel offers no transparent huge pages")
    huge_kib = int(re.search(r"AnonHugePages:\s+(\d+) kB", Path(f"/proc/{pid}/smaps_rollup").read_text()).group(1))
    assert huge_kib * 1024 >= (gguf_engine / "model.gguf").stat().st_size // 2
