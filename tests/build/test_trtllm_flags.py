"""The table of TensorRT-LLM 1.2 flags the planner may use: the helper that enforces it, and the table
held to the project's TensorRT-LLM 1.2 facts table (tests/trtllm/tensorrt_llm_1_2_facts.toml, [tools])."""

from __future__ import annotations

import re

import pytest

from build_scripts.trtllm_flags import BUILD_TOOL, CONVERT_TOOL, FLAGS, QUANTIZE_TOOL, UnknownFlag, flag
from tests.trtllm.reference import FACTS, BuildTools, read_build_tools


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
def reference() -> BuildTools:
    if not FACTS.is_file():
        pytest.fail(f"the TensorRT-LLM 1.2 facts table is missing ({FACTS})")
    return read_build_tools(FACTS)


def test_the_facts_list_each_tools_flags(reference):
    """Guards the reader: a table it misreads would make the checks below pass or fail for nothing."""
    assert set(reference.tools) == {CONVERT_TOOL, QUANTIZE_TOOL, BUILD_TOOL}
    build = reference.tools[BUILD_TOOL]
    assert {"--checkpoint_dir", "--gemm_plugin", "--kv_cache_type"} <= build.flags
    assert "--paged_kv_cache" in build.deprecated and "--paged_kv_cache" not in build.flags
    assert "--checkpoint_dir" not in reference.tools[CONVERT_TOOL].flags
    assert "fp8" in reference.tools[QUANTIZE_TOOL].values["--qformat"]


@pytest.mark.parametrize("spec", FLAGS, ids=lambda spec: f"{spec.tool}{spec.name}")
def test_every_flag_is_in_the_reference_for_its_tool(reference, spec):
    tool = reference.tools[spec.tool]
    assert spec.name in tool.flags, f"{spec.name} is not in its tool's part"
    assert spec.source in tool.sources, f"{spec.source} is not a source of that part"
    assert spec.source in reference.sources, f"{spec.source} is not a source key"


@pytest.mark.parametrize("spec", [s for s in FLAGS if s.choices], ids=lambda spec: f"{spec.tool}{spec.name}")
def test_every_value_the_table_allows_is_in_the_reference(reference, spec):
    for value in spec.choices:
        assert value in reference.values, f"{spec.name} {value}"
