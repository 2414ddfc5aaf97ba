"""Render a model's chat template the way Hugging Face tokenizers do (sandboxed Jinja2, same helpers),
without importing transformers into the HTTP process."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from orchestrator.errors import InvalidRequest


class TemplateError(InvalidRequest):
    """The chat template refused the conversation (e.g. roles that do not alternate)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(f"the model's chat template refused the messages: {message}", param="messages")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat(source: str, messages: list[dict], variables: dict, add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages`, ending with the assistant's generation prompt unless told not to.
    `variables` are the other names the template sees: the tokenizer's special tokens and the request's
    chat_template_kwargs."""
    try:
        return compile_template(source).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables
        )
    except TemplateError:
        raise
    except Exception as exc:  # the template is the model's code: whatever it raises is a refusal of this input
        raise TemplateError(f"the model's chat template failed on these messages: {exc}", param="messages") from exc
