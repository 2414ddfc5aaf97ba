"""POST /tokenize and POST /detokenize in vLLM's shapes, with the model's own tokenizer and chat template.

    {model, prompt[, add_special_tokens]}                        -> {count, max_model_len, tokens, token_strs}
    {model, messages[, add_generation_prompt, chat_template_kwargs]} -> the same, for the rendered conversation
    {model, tokens}                                               -> {prompt}

Both count against the caller's key's limits on requests per minute and requests running, as generation does, and
do their heavy steps (tokenising, token strings, decoding, the answer's JSON) off the event loop for big bodies.
Their work is bounded by what a served model can hold: a text longer than any prompt of the model (in characters,
as for generation) and more token ids than its longest sequence are refused, and a body larger than such a
request could be is refused before it is read (parsing and validating megabytes of JSON holds the interpreter for
tens of milliseconds wherever it runs, and every other request waits).
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from aiohttp import web
from pydantic import Field

from orchestrator.api.access import model_view
from orchestrator.api.body import off_loop, read_json
from orchestrator.api.http import json_response, validate
from orchestrator.api.preparation import admit_caller, most_prompt_chars
from orchestrator.api.state import STATE
from orchestrator.api.wire import ChatMessage, TokenId, Wire
from orchestrator.errors import ContextLengthExceeded, InvalidRequest


class TokenizeText(Wire):
    model: str
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChat(Wire):
    model: str
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: bool = True
    add_special_tokens: bool = False  # the template writes them
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class Detokenize(Wire):
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


ID_BYTES = 8  # one token id in JSON: up to 7 digits and a comma
JSON_CHAR_BYTES = 6  # one character of a JSON string at most (a \uXXXX escape)
BODY_SLACK = 64 * 1024  # the rest of a body: the model, flags, a conversation's structure


def _most_tokenize_bytes(http: web.Request) -> int:
    engines = http.app[STATE].catalogue.engines.values()
    return max((most_prompt_chars(e) for e in engines), default=0) * JSON_CHAR_BYTES + BODY_SLACK


def _most_detokenize_bytes(http: web.Request) -> int:
    engines = http.app[STATE].catalogue.engines.values()
    return max((e.manifest.limits.max_seq_len for e in engines), default=0) * ID_BYTES + BODY_SLACK


async def tokenize(http: web.Request) -> web.Response:
    body = await read_json(http, _most_tokenize_bytes(http))
    try:
        chat = isinstance(parsed := orjson.loads(body), dict) and "messages" in parsed
    except orjson.JSONDecodeError:
        chat = False  # validate() reports it
    wire = validate(body, TokenizeChat if chat else TokenizeText)
    engine = model_view(http, wire.model).engine
    if isinstance(wire, TokenizeText) and len(wire.prompt) > (most := most_prompt_chars(engine)):
        raise ContextLengthExceeded(
            f"this model's maximum prompt length is {engine.manifest.limits.max_input_len} tokens (at most {most} "
            f"characters), but the prompt has {len(wire.prompt)} characters", param="prompt")
    admit_caller(http)
    tokens = await off_loop(http, _tokens, engine, wire, prompts=engine.prompts)
    return await off_loop(http, _answer, engine, tokens, wire.return_token_strs)


async def detokenize(http: web.Request) -> web.Response:
    wire = validate(await read_json(http, _most_detokenize_bytes(http)), Detokenize)
    engine = model_view(http, wire.model).engine
    if len(wire.tokens) > (longest := engine.manifest.limits.max_seq_len):
        raise InvalidRequest(f"tokens has {len(wire.tokens)} ids; no sequence of this model is longer than "
                             f"{longest}", param="tokens")
    admit_caller(http)
    return await off_loop(http, _detokenized, engine.prompts, wire.tokens)


def _detokenized(prompts, tokens: list[int]) -> web.Response:
    vocab = prompts.tokenizer.get_vocab_size(with_added_tokens=True)
    if tokens and max(tokens) >= vocab:
        raise InvalidRequest(f"tokens must be in [0, {vocab})", param="tokens")
    return json_response({"prompt": prompts.tokenizer.decode(tokens, skip_special_tokens=False)})
