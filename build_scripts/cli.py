"""`inferno build` and `inferno models catalog`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from build_scripts.catalog import Recipe, RecipeError, load_catalog
from build_scripts.plan import BuildOptions, Plan
from build_scripts.preflight import PreflightError


def _recipe_dirs(args: argparse.Namespace) -> tuple[Path, ...]:
    folder = args.recipes_dir or os.environ.get("INFERNO_RECIPES_DIR")
    return (Path(folder),) if folder else ()


def make_plan(recipe: Recipe, options: BuildOptions) -> Plan:
    if recipe.target.backend == "hf":
        from build_scripts.hf_engine import plan_hf

        return plan_hf(recipe, options)
    raise PreflightError(f"recipe {recipe.name}: the {recipe.target.backend} build is not available in this version")


def build_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="inferno build", description="Build an engine ahead of time.")
    parser.add_argument("model", help="a catalog name (see: inferno models catalog)")
    parser.add_argument("--checkpoint", type=Path, help="local checkpoint folder (default: the recipe's source)")
    parser.add_argument("--name", help="engine folder name (default: the model name)")
    parser.add_argument("--engines-dir", type=Path, default=Path(os.environ.get("INFERNO_ENGINES_DIR", "engines")))
    parser.add_argument("--recipes-dir", type=Path, help="extra folder of recipe .toml files")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    parser.add_argument("--force", action="store_true", help="rebuild even if the engine is up to date")
    args = parser.parse_args(argv)
    try:
        catalog = load_catalog(_recipe_dirs(args))
        recipe = catalog.get(args.model)
        if recipe is None:
            raise PreflightError(f"no recipe named {args.model!r}; known: {', '.join(sorted(catalog))}")
        options = BuildOptions(
            engines_dir=args.engines_dir, checkpoint=args.checkpoint, name=args.name, force=args.force
        )
        plan = make_plan(recipe, options)
        if args.dry_run:
            print(plan.render())
            return 0
        from build_scripts.runner import is_up_to_date, run_plan

        if not args.force and is_up_to_date(plan):
            print(f"{plan.output} is up to date (fingerprint {plan.fingerprint[:19]}…); --force rebuilds it")
            return 0
        run_plan(plan)
        return 0
    except (RecipeError, PreflightError) as exc:
        print(f"inferno build: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("inferno build: interrupted; nothing was written", file=sys.stderr)
        return 130


def catalog_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="inferno models catalog", description="What can be built.")
    parser.add_argument("--recipes-dir", type=Path, help="extra folder of recipe .toml files")
    args = parser.parse_args(argv)
    try:
        catalog = load_catalog(_recipe_dirs(args))
    except RecipeError as exc:
        print(f"inferno models catalog: {exc}", file=sys.stderr)
        return 2
    print(f"{'name':<28} {'backend':<8} {'dtype':<9} {'params':>8}  description")
    for name, recipe in sorted(catalog.items()):
        params = f"{recipe.parameters / 1e9:.1f}B" if recipe.parameters >= 1e9 else f"{recipe.parameters / 1e6:.0f}M"
        print(f"{name:<28} {recipe.target.backend:<8} {recipe.target.dtype:<9} {params:>8}  {recipe.description}")
    return 0
