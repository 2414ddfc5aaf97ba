"""Turning a request into prompt token ids, in the HTTP process: chat template, then tokenizer.

The HTTP process tokenises (once per request) so it can refuse an over-long prompt with a 400 before
the request takes a permit; the per-token work (detokenising, stop strings) happens in the worker.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tokenizers import Tokenizer

from orchestrator.errors import InvalidRequest
from orchestrator.text.chat_template import render_chat
from orchestrator.text.literal_specials import LiteralSpecials
from orchestrator.text.pieces import PieceCache
from orchestrator.text.segments import SegmentCache

_SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
# tokenizers' `encode` holds the GIL for all its Rust work, the batch calls release it: texts this long or
# longer go through `encode_batch_fast` (the same ids, without the offsets nobody here reads: a third cheaper
# than `encode_batch`), so that tokenising them on a thread leaves the event loop free (a 25 kB prompt holds
# the GIL for tens of milliseconds otherwise; a 128-token one about 0.3 ms, which a wave of 128 new requests
# turns into a 40 ms pause of every stream). Shorter ones take the cheaper call.
GIL_FREE_CHARS = 512
# Names the server itself gives the chat template; a request's chat_template_kwargs may not set them.
TEMPLATE_OWN_NAMES = frozenset({"messages", "add_generation_prompt", "tools", *_SPECIAL_KEYS})


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value  # older tokenizer_config.json: AddedToken dicts


def _specials_around(tokenizer: Tokenizer) -> tuple[list[int], list[int]] | None:
    """The ids the tokenizer's post-processor puts before and after a text's own (a BOS, an EOS), where they are
    the same for every text, so that a text's ids with them are its own ids between them; None where not."""
    own, added = (tokenizer.encode("x", add_special_tokens=flag).ids for flag in (False, True))
    at = next((i for i in range(len(added) - len(own) + 1) if added[i : i + len(own)] == own), None)
    if at is None:
        return None
    before, after = added[:at], added[at + len(own) :]
    same = all(tokenizer.encode(text, add_special_tokens=True).ids ==
               [*before, *tokenizer.encode(text, add_special_tokens=False).ids, *after]
               for text in ("", " Hello, world!\n", "<|im_end|>12 é"))
    return (before, after) if same else None


class PromptEncoder:
    """Tokenizer and chat template of one engine folder."""

    def __init__(self, folder: Path):
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_truncation()  # a prompt too long is refused with a 400 (engine_requests.py), never cut
        self.tokenizer.no_padding()
        self.segments = SegmentCache(self.tokenizer)
        self._around = _specials_around(self.tokenizer)
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.special_tokens = {k: t for k in _SPECIAL_KEYS if (t := _token_text(config.get(k))) is not None}
        template_path = folder / "chat_template.jinja"
        if template_path.is_file():
            self.chat_template: str | None = template_path.read_text()
        else:
            template = config.get("chat_template")
            self.chat_template = template if isinstance(template, str) else None
        self.literal_specials = LiteralSpecials(self.tokenizer)

    @functools.cached_property
    def pieces(self) -> PieceCache:
        """Made by `warm` or at first use (~0.1 s: it reads the tokenizer's configuration and checks itself
        against it)."""
        return PieceCache(self.tokenizer)

    @functools.cached_property
    def longest_token_chars(self) -> int:
        """No token of this tokenizer stands for more characters than this (its longest vocabulary entry)."""
        return max(len(token) for token in self.tokenizer.get_vocab(with_added_tokens=True))

    @property
    def by_pieces(self) -> bool:
        """ASCII prompts up to pieces.MAX_CHARS go piece by piece, in Python (False until pieces are made)."""
        return "pieces" in self.__dict__ and self.pieces.problem is None

    def warm(self) -> None:
        """Make what a model's first prompt would otherwise make (~0.1 s, holding the GIL): the server does it on
        a thread while the models load, not on the event loop at their first request."""
        self.pieces, self.longest_token_chars  # noqa: B018 (made and kept by cached_property)

    def render_chat(
        self,
        messages: list[dict],
        template_kwargs: dict | None = None,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> str:
        """The prompt text the chat template makes of `messages` (and of `tools`, for templates that read them)."""
        if self.chat_template is None:
            raise InvalidRequest(
                "this model has no chat template: use /v1/completions with a plain prompt", param="messages"
            )
        clash = sorted(set(template_kwargs or ()) & TEMPLATE_OWN_NAMES)
        if clash:
            raise InvalidRequest(
                f"{', '.join(clash)} cannot be set through chat_template_kwargs: the server sets "
                f"{'it' if len(clash) == 1 else 'them'} from the request and the model",
                param="chat_template_kwargs",
            )
        variables = {**(template_kwargs or {}), **self.special_tokens}
        if tools is not None:
            variables["tools"] = tools
        return render_chat(self.chat_template, messages, variables, add_generation_prompt)

    def encode_chat(
        self,
        messages: list[dict],
        template_kwargs: dict | None = None,
        add_generation_prompt: bool = True,
        add_special_tokens: bool = False,
        tools: list[dict] | None = None,
        specials_in_content: bool = False,
    ) -> list[int]:
        """The ids of the rendered conversation. Special-token spellings inside the messages and tools stay text
        (literal_specials.py) unless `specials_in_content` (the model's special_tokens_in_content setting)."""
        marked = None if specials_in_content else self.literal_specials.mark(messages, tools)
        if marked is not None:
            text = self.render_chat(marked.messages, template_kwargs, add_generation_prompt, marked.tools)
            return self.literal_specials.encode(text, marked, self.encode_text, add_special_tokens)
        text = self.render_chat(messages, template_kwargs, add_generation_prompt, tools)
        # The template already wrote every special token the model expects.
        return self.encode_text(text, add_special_tokens)

    def encode_text(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of `prompt`; long texts are encoded with the GIL released (see GIL_FREE_CHARS), and
        their segments found in the segment cache where it applies (segments.py), short ASCII ones piece by piece
        (pieces.py)."""
        if add_special_tokens and self._around is not None:
            before, after = self._around
            return [*before, *self.encode_text(prompt, False), *after]
        if not add_special_tokens and (ids := self.segments.encode(prompt, self._encode_whole)) is not None:
            return ids
        return self._encode_whole(prompt, add_special_tokens)

    def _encode_whole(self, prompt: str, add_special_tokens: bool = False) -> list[int]:
        if not add_special_tokens and (ids := self.pieces.encode(prompt)) is not None:
            return ids
        if len(prompt) < GIL_FREE_CHARS:
            return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens).ids
        return self.tokenizer.encode_batch_fast([prompt], add_special_tokens=add_special_tokens)[0].ids
