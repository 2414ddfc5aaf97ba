"""The TensorRT-LLM planner, for every catalogue entry: bf16, FP8, every allowed TP size.

Each plan is held to the project's table of TensorRT-LLM 1.2 flags (build_scripts/trtllm_flags.py),
independently of the `flag()` helper the planner uses.
"""

from __future__ import annotations

import pytest

from build_scripts.catalogue import RecipeError, load_catalogue
from build_scripts.preflight import preflight
from build_scripts.trtllm_flags import BUILD_TOOL, CONVERT_TOOL, FLAGS, QUANTIZE_TOOL
from tests.build.conftest import machine, make_plan

TABLE = {(spec.tool, spec.name): spec for spec in FLAGS}


def variants():
    """(recipe name, quant, tp) for every build the shipped catalogue allows."""
    for name, recipe in sorted(load_catalogue().items()):
        if recipe.target.backend != "trtllm":
            continue
        for quant in (None, *sorted(recipe.quantization)):
            for tp in recipe.parallel.tp_choices:
                yield pytest.param(name, quant, tp, id=f"{name}-{quant or recipe.target.dtype}-tp{tp}")


def emitted_flags(step) -> list[tuple[str, str]]:
    """(flag, value) pairs of a step's command line; every flag here takes exactly one value."""
    tokens = list(step.argv[2:] if step.tool.endswith(".py") else step.argv[1:])
    assert len(tokens) % 2 == 0, tokens
    pairs = list(zip(tokens[::2], tokens[1::2], strict=True))
    assert all(name.startswith("--") and not value.startswith("--") for name, value in pairs), pairs
    return pairs


def as_dict(step) -> dict[str, str]:
    return dict(emitted_flags(step))


@pytest.mark.parametrize(("name", "quant", "tp"), list(variants()))
def test_every_flag_of_every_plan_is_in_the_table(catalogue, examples, hf_folder, name, quant, tp):
    plan = make_plan(catalogue[name], machine(), checkpoint=hf_folder, quant=quant, tp=tp, trtllm_examples=examples)
    external = [step for step in plan.steps if step.argv]
    assert [step.tool for step in external] == [QUANTIZE_TOOL if quant else CONVERT_TOOL, BUILD_TOOL]
    for step in external:
        for flag, value in emitted_flags(step):
            spec = TABLE.get((step.tool, flag))
            assert spec is not None, f"{step.tool} {flag} is not in the flag table"
            assert not spec.choices or value in spec.choices, f"{step.tool} {flag} {value}"
    assert preflight(plan) == ()


@pytest.mark.parametrize(("name", "quant", "tp"), list(variants()))
def test_plans_carry_the_recipe_and_options(catalogue, examples, hf_folder, name, quant, tp):
    recipe = catalogue[name]
    plan = make_plan(recipe, machine(), checkpoint=hf_folder, quant=quant, tp=tp, trtllm_examples=examples)
    first, build = (as_dict(step) for step in plan.steps[:2])
    assert first["--model_dir"] == str(hf_folder)
    assert first["--tp_size"] == str(tp)
    assert build["--checkpoint_dir"] == first["--output_dir"]
    assert build["--output_dir"] == str(plan.staging)
    limits = recipe.limits
    assert (build["--max_batch_size"], build["--max_input_len"], build["--max_seq_len"], build["--max_num_tokens"]) == (
        str(limits.max_batch_size), str(limits.max_input_len), str(limits.max_seq_len), str(limits.max_num_tokens))
    assert build["--tokens_per_block"] == str(recipe.kv_cache.tokens_per_block)
    assert build["--workers"] == str(tp)
    assert build["--use_paged_context_fmha"] == "enable"
    if quant == "fp8":
        assert (first["--qformat"], first["--kv_cache_dtype"]) == ("fp8", "fp8")
        assert build["--use_fp8_context_fmha"] == "enable"
        assert build["--gemm_plugin"] == "disable"
    else:
        assert plan.steps[0].argv[1] == str(examples / recipe.convert.script)
        assert first["--dtype"] == "bfloat16"
        assert build["--use_fp8_context_fmha"] == "disable"
        assert build["--gemm_plugin"] == "auto"
    assert [step.name for step in plan.steps[2:]] == ["tokenizer", "manifest"]
    assert plan.staging.parent == plan.scratch.parent == plan.output.parent
    assert plan.staging.name.startswith(".") and plan.scratch.name.startswith(".")


def test_the_dry_run_text_spells_out_every_flag(catalogue, examples, hf_folder):
    plan = make_plan(catalogue["llama3-8b"], machine(), checkpoint=hf_folder, quant="fp8", tp=2, trtllm_examples=examples)
    text = plan.render(preflight(plan))
    for step in plan.steps[:2]:
        for flag, value in emitted_flags(step):
            assert f"{flag} {value}" in text
    assert "preflight: ok" in text
    assert "TP 2 x PP 1, sm90" in text


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("llama3-8b", {"quant": "int4"}, "cannot be built with --quant int4; allowed: fp8"),
        ("llama3-8b", {"tp": 3}, "cannot be built with --tp 3; allowed: 1, 2, 4, 8"),
        ("qwen2.5-7b-instruct", {"tp": 8}, "allowed: 1, 2, 4"),
        ("llama3-70b-instruct", {"tp": 2}, "allowed: 4, 8"),
        ("llama3-8b", {"quant": "fp8", "arch": "sm80"}, "FP8 needs sm89 or newer"),
        ("llama3-8b", {"arch": "hopper"}, "name a GPU architecture such as sm90"),
        ("smollm2-135m-hf", {"quant": "fp8"}, "builds only in float32"),
        ("smollm2-135m-hf", {"arch": "sm90"}, "portable hf engine"),
    ],
)
def test_options_a_recipe_does_not_allow_are_refused(catalogue, name, options, message):
    with pytest.raises(RecipeError, match=message):
        make_plan(catalogue[name], machine(), **options)


def test_the_fingerprint_covers_options_tools_and_architecture(catalogue, examples, hf_folder, tmp_path):
    recipe = catalogue["llama3-8b"]

    def fp(env=None, **options):
        options = {"checkpoint": hf_folder, "trtllm_examples": examples, **options}
        return make_plan(recipe, env or machine(), **options).fingerprint

    base = fp()
    assert base is not None and base == fp()
    assert base == fp(build_id="4242", name="another-name")  # where and under which name: not inputs
    different = {
        fp(quant="fp8"),
        fp(tp=2),
        fp(arch="sm89"),
        fp(machine(tools={**machine().tools, "tensorrt_llm": "1.2.0"})),
        fp(machine(tools={**machine().tools, "tensorrt": "10.13.2.6"})),
    }
    assert base not in different and len(different) == 5
    assert base == fp(checkpoint=hf_folder.rename(tmp_path / "moved"))  # the content counts, not the path


def test_a_missing_checkpoint_still_plans_with_an_unknown_fingerprint(catalogue, examples, tmp_path):
    plan = make_plan(catalogue["llama3-8b"], machine(), checkpoint=tmp_path / "absent", trtllm_examples=examples)
    assert plan.fingerprint is None
    assert "fingerprint: unknown until the checkpoint is found" in plan.render()
    assert any("does not exist" in problem for problem in preflight(plan))
