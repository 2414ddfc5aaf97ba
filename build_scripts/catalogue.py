"""The model catalogue: every recipe (build_scripts/recipe.py) by name.

Recipes ship in build_scripts/recipes/; users add their own by dropping a .toml file in a folder named
by INFERNO_RECIPES_DIR (or --recipes-dir), no code change needed. A user recipe with the name of a
shipped one replaces it. Every TensorRT-LLM recipe with a [shape] also gives a simulated engine,
`<name>-sim` (sim_recipes.py).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import ValidationError

from build_scripts.recipe import Recipe
from build_scripts.sim_recipes import with_sim_variants

SHIPPED_RECIPES = Path(__file__).parent / "recipes"


class RecipeError(Exception):
    """A recipe file is invalid, or the options asked of a recipe are ones it does not allow."""


def load_recipe(path: Path) -> Recipe:
    try:
        return Recipe.model_validate(tomllib.loads(path.read_text()))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RecipeError(f"{path}: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "recipe"
        raise RecipeError(f"{path}: {where}: {first['msg']}") from exc


def load_catalogue(extra_dirs: tuple[Path, ...] = ()) -> dict[str, Recipe]:
    """Every recipe by name: shipped ones first, then user folders (later ones win)."""
    catalogue: dict[str, Recipe] = {}
    paths: dict[str, Path] = {}
    for folder in (SHIPPED_RECIPES, *extra_dirs):
        if folder != SHIPPED_RECIPES and not folder.is_dir():
            raise RecipeError(f"the recipes folder {folder} does not exist")
        for path in sorted(folder.glob("*.toml")):
            recipe = load_recipe(path)
            if recipe.name != path.stem:
                raise RecipeError(f"{path}: the recipe is named {recipe.name!r}; name the file {recipe.name}.toml")
            catalogue[recipe.name], paths[recipe.name] = recipe, path
    catalogue = with_sim_variants(catalogue)
    for name in catalogue:
        if name not in paths:
            paths[name] = paths[name.removesuffix("-sim")]  # where a derived sim variant came from
    _check_aliases(catalogue, paths)
    return catalogue


def _check_aliases(catalogue: dict[str, Recipe], paths: dict[str, Path]) -> None:
    seen: dict[str, str] = {}
    for recipe in catalogue.values():
        for alias in recipe.aliases:
            other = alias if alias in catalogue else seen.get(alias)
            if other is not None:
                raise RecipeError(f"{paths[recipe.name]}: aliases: {alias!r} is also the name of {other}")
            seen[alias] = recipe.name


def find_recipe(catalogue: dict[str, Recipe], name: str) -> Recipe:
    """A recipe by its name or one of its aliases."""
    if name in catalogue:
        return catalogue[name]
    for recipe in catalogue.values():
        if name in recipe.aliases:
            return recipe
    raise RecipeError(f"no recipe named {name!r}; known: {', '.join(sorted(catalogue))} (see: inferno models catalogue)")
