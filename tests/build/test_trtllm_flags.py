"""The table of TensorRT-LLM 1.2 flags the planner may use: the helper that enforces it, and the table
held to the project's TensorRT-LLM 1.2 reference (which lies beside the repository, as in CI)."""

from __future__ import annotations

import re

import pytest

from build_scripts.trtllm_flags import BUILD_TOOL, CONVERT_TOOL, FLAGS, QUANTIZE_TOOL, UnknownFlag, flag
from tests.conftest import ROOT

REFERENCE = ROOT.parent / "shared" / "reference" / "tensorrt-llm-1.2.md"
# Each tool's part of the reference's §3, by the headings that open and close it.
SECTIONS = {
    CONVERT_TOOL: ("**Step 1a", "**Step 1b"),
    QUANTIZE_TOOL: ("**Step 1b", "**Step 2"),
    BUILD_TOOL: ("**Step 2", "**Engine dir**"),
}


def test_flag_spells_booleans_and_checks_values():
    assert flag(BUILD_TOOL, "--context_fmha", True) == ("--context_fmha", "enable")
    assert flag(BUILD_TOOL, "--use_fp8_context_fmha", False) == ("--use_fp8_context_fmha", "disable")
    assert flag(BUILD_TOOL, "--max_batch_size", 64) == ("--max_batch_size", "64")
    with pytest.raises(UnknownFlag, match="not in the table"):
        flag(BUILD_TOOL, "--paged_kv_cache", "enable")  # deprecated in 1.2: --kv_cache_type
    with pytest.raises(UnknownFlag, match="not in the table"):
        flag(CONVERT_TOOL, "--checkpoint_dir", "x")  # a trtllm-build flag, not a convert_checkpoint.py one
    with pytest.raises(UnknownFlag, match="not one of"):
        flag(QUANTIZE_TOOL, "--qformat", "int4_awq")


def test_every_flag_is_listed_once():
    keys = [(spec.tool, spec.name) for spec in FLAGS]
    assert len(keys) == len(set(keys))
    assert all(re.fullmatch(r"--[a-z0-9_]+", spec.name) for spec in FLAGS)


@pytest.fixture(scope="module")
def reference() -> str:
    if not REFERENCE.is_file():
        pytest.skip(f"the TensorRT-LLM 1.2 reference is not beside the repository ({REFERENCE})")
    return REFERENCE.read_text()


def section(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end)]


@pytest.mark.parametrize("spec", FLAGS, ids=lambda spec: f"{spec.tool}{spec.name}")
def test_every_flag_is_in_the_reference_for_its_tool(reference, spec):
    part = section(reference, *SECTIONS[spec.tool])
    assert re.search(rf"(?<![\w-]){re.escape(spec.name)}(?!\w)", part), f"{spec.name} is not in its tool's part"
    heading = part.splitlines()[0]
    assert re.search(rf"\[[^\]]*\b{spec.source}\b[^\]]*\]", heading), f"{spec.source} is not a source of that part"
    sources = section(reference, "## 0.", "## 1.")
    assert re.search(rf"^\| [^|]*\b{spec.source}\b", sources, re.MULTILINE), f"{spec.source} is not a source key"


@pytest.mark.parametrize("spec", [s for s in FLAGS if s.choices], ids=lambda spec: f"{spec.tool}{spec.name}")
def test_every_value_the_table_allows_is_in_the_reference(reference, spec):
    build_section = section(reference, "## 3.", "## 4.")
    for value in spec.choices:
        assert re.search(rf"\b{re.escape(value)}\b", build_section), f"{spec.name} {value}"
