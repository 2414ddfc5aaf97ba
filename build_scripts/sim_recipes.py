"""Simulated engines in the catalogue: every TensorRT-LLM recipe with a [shape] has a `<name>-sim` variant.

The variant keeps what the simulation is sized by (the model's shape, parameters, limits, KV block size,
parallelism, allowed quantisations, generation defaults) and builds a `sim` engine: no checkpoint, no GPU
and no TensorRT-LLM needed (build_scripts/sim_engine.py). Aliases carry over with the same suffix.
"""

from __future__ import annotations

from build_scripts.recipe import Recipe

SUFFIX = "-sim"


def sim_variant(recipe: Recipe) -> Recipe:
    """The simulated engine of a TensorRT-LLM recipe."""
    data = recipe.model_dump(exclude={"convert", "plugins", "target"})
    model = recipe.description.split(", TensorRT-LLM")[0]
    data.update(
        name=recipe.name + SUFFIX,
        aliases=[alias + SUFFIX for alias in recipe.aliases],
        description=f"{model}, simulated TensorRT-LLM engine (no GPU needed)",
        target={"backend": "sim", "dtype": recipe.target.dtype},
        shape=recipe.shape,
    )
    return Recipe.model_validate(data)


def with_sim_variants(catalogue: dict[str, Recipe]) -> dict[str, Recipe]:
    """The catalogue plus the sim variant of each TensorRT-LLM recipe with a shape (a recipe of that name wins)."""
    variants = {
        recipe.name + SUFFIX: sim_variant(recipe)
        for recipe in catalogue.values()
        if recipe.target.backend == "trtllm" and recipe.shape is not None and recipe.name + SUFFIX not in catalogue
    }
    return {**catalogue, **variants}
