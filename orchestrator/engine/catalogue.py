"""Which models this server can serve: every engine folder under the engines directory."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from orchestrator.engine.logits import LogitsPool
from orchestrator.engine.manifest import MANIFEST_FILE, EngineManifest, EngineRefused, load_manifest
from orchestrator.text.prompt import PromptEncoder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Engine:
    """A servable engine folder: its manifest, and its tokenizer for the HTTP side."""

    name: str
    folder: Path
    manifest: EngineManifest
    prompts: PromptEncoder
    # The model's retain_system_prompt setting, as served (scheduler/entries.py): the HTTP side counts each
    # conversation's system prefix only for models that keep it.
    retain_system_prompt: bool = False
    # The model's special_tokens_in_content setting, as served: special-token text inside a conversation is read
    # as the special token (else it stays plain text: text/literal_specials.py).
    special_tokens_in_content: bool = False
    # Its generation logits pool, as served (engine/logits.py): a TensorRT-LLM model with generation_logits on.
    logits_pool: LogitsPool | None = None


@dataclass(frozen=True)
class Catalogue:
    engines: dict[str, Engine]
    refused: dict[str, EngineRefused]  # folders that look like engines but cannot be served, and why


def _looks_like_engine(folder: Path) -> bool:
    return folder.is_dir() and not folder.name.startswith(".") and any(folder.iterdir())


def discover(engines_dir: Path, only: tuple[str, ...] = ()) -> Catalogue:
    """Read every engine folder; a bad one is refused with its reason, never fatal to the others."""
    engines: dict[str, Engine] = {}
    refused: dict[str, EngineRefused] = {}
    folders = sorted(p for p in engines_dir.iterdir() if _looks_like_engine(p)) if engines_dir.is_dir() else []
    if only:
        found = {p.name for p in folders}
        folders = [p for p in folders if p.name in only]
        for name in only:
            if name not in found:
                refused[name] = EngineRefused(engines_dir / name, f"no engine folder (no {MANIFEST_FILE})")
    for folder in folders:
        try:
            manifest = load_manifest(folder)
            engines[folder.name] = Engine(folder.name, folder, manifest, PromptEncoder(folder))
        except EngineRefused as exc:
            refused[folder.name] = exc
        except Exception as exc:  # an unreadable tokenizer, say
            refused[folder.name] = EngineRefused(folder, f"cannot be read: {exc}")
    for exc in refused.values():
        log.error("refusing engine %s", exc)
    return Catalogue(engines, refused)
