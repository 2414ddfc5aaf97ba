"""POST /tokenize and POST /detokenize in vLLM's shapes, with the model's own tokenizer and chat template.

    {model, prompt[, add_special_tokens]}                        -> {count, max_model_len, tokens, token_strs}
    {model, messages[, add_generation_prompt, chat_template_kwargs]} -> the same, for the rendered conversation
    {model, tokens}                                               -> {prompt}

Both count against the caller's key's limits on requests per minute and requests running, as generation does, and
do their heavy steps (tokenising, token strings, decoding, the answer's JSON) off the event loop for big bodies.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from aiohttp import web
from pydantic import Field

from orchestrator.api.access import model_view
from orchestrator.api.body import off_loop, read_json
from orchestrator.api.http import json_response, validate
from orchestrator.api.preparation import admit_caller
from orchestrator.api.wire import ChatMessage, TokenId, _Wire
from orchestrator.errors import InvalidRequest


class TokenizeText(_Wire):
    model: str
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChat(_Wire):
    model: str
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: bool = True
    add_special_tokens: bool = False  # the template writes them
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class Detokenize(_Wire):
    model: str
    tokens: list[TokenId]


def _answer(engine, tokens: list[int], token_strs: bool) -> web.Response:
    strs = [engine.prompts.tokenizer.id_to_token(t) for t in tokens] if token_strs else None
    return json_response(
        {"count": len(tokens), "max_model_len": engine.manifest.limits.max_seq_len, "tokens": tokens, "token_strs": strs}
    )


def _tokens(engine, wire: TokenizeChat | TokenizeText) -> list[int]:
    prompts = engine.prompts
    if isinstance(wire, TokenizeChat):
        messages = [m.as_template_input() for m in wire.messages]
        return prompts.encode_chat(messages, wire.chat_template_kwargs or {}, wire.add_generation_prompt,
                                   wire.add_special_tokens, specials_in_content=engine.special_tokens_in_content)
    return prompts.encode_text(wire.prompt, wire.add_special_tokens)


async def tokenize(http: web.Request) -> web.Response:
    body = await read_json(http)
    try:
        chat = isinstance(parsed := orjson.loads(body), dict) and "messages" in parsed
    except orjson.JSONDecodeError:
        chat = False  # validate() reports it
    wire = validate(body, TokenizeChat if chat else TokenizeText)
    engine = model_view(http, wire.model).engine
    admit_caller(http)
    tokens = await off_loop(http, _tokens, engine, wire)
    return await off_loop(http, _answer, engine, tokens, wire.return_token_strs)


async def detokenize(http: web.Request) -> web.Response:
    wire = validate(await read_json(http), Detokenize)
    prompts = model_view(http, wire.model).engine.prompts
    admit_caller(http)
    return await off_loop(http, _detokenized, prompts, wire.tokens)


def _detokenized(prompts, tokens: list[int]) -> web.Response:
    vocab = prompts.tokenizer.get_vocab_size(with_added_tokens=True)
    if tokens and max(tokens) >= vocab:
        raise InvalidRequest(f"tokens must be in [0, {vocab})", param="tokens")
    return json_response({"prompt": prompts.tokenizer.decode(tokens, skip_special_tokens=False)})
