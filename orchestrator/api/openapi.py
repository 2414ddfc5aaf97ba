"""GET /openapi.json: an OpenAPI 3.1 description of the request bodies this server accepts, derived from the same
pydantic wire types that validate them (so it cannot drift from what is enforced). Clients and fuzzers read it."""

from __future__ import annotations

from functools import cache

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from orchestrator import __version__
from orchestrator.api.http import ANTHROPIC_PATHS, json_response
from orchestrator.api.messages_api.wire import CountTokensRequest, MessagesRequest
from orchestrator.api.responses_api.wire import ResponsesRequest
from orchestrator.api.tokenize import Detokenize, TokenizeChat, TokenizeText
from orchestrator.api.wire import ChatCompletionRequest, CompletionRequest

# (path, summary, request body types: one, or several a body may match)
_OPERATIONS: tuple[tuple[str, str, tuple[type[BaseModel], ...]], ...] = (
    ("/v1/chat/completions", "Create a chat completion", (ChatCompletionRequest,)),
    ("/v1/completions", "Create a text completion", (CompletionRequest,)),
    ("/v1/responses", "Create a response (OpenAI's Responses API)", (ResponsesRequest,)),
    ("/v1/messages", "Create a message (Anthropic's Messages API)", (MessagesRequest,)),
    ("/v1/messages/count_tokens", "Count a message's prompt tokens (Anthropic's Messages API)", (CountTokensRequest,)),
    ("/tokenize", "Token ids of a prompt or a conversation", (TokenizeText, TokenizeChat)),
    ("/detokenize", "Text of token ids", (Detokenize,)),
)
_COUNT = {"type": "integer", "minimum": 0}
_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
          "properties": {"prompt_tokens": _COUNT, "completion_tokens": _COUNT, "total_tokens": _COUNT}}
_REASON = {"type": ["string", "null"]}


def _completion(object_name: str, choice: dict) -> dict:
    """A chat or text completion: OpenAI's envelope around its choices."""
    return {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"], "properties": {
        "id": {"type": "string"}, "object": {"const": object_name}, "created": _COUNT, "model": {"type": "string"},
        "choices": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["index", "finish_reason", *choice], "properties": {
                "index": _COUNT, "finish_reason": _REASON, **choice}}},
        "usage": _USAGE}}


_MESSAGE = {"type": "object", "required": ["role", "content"],
            "properties": {"role": {"const": "assistant"}, "content": {"type": ["string", "null"]}}}
# What a 200 answer's JSON holds, per path: the fields clients read, typed (an answer may carry more).
_ANSWERS = {
    "/v1/chat/completions": _completion("chat.completion", {"message": _MESSAGE}),
    "/v1/completions": _completion("text_completion", {"text": {"type": "string"}}),
    "/v1/responses": {
        "type": "object", "required": ["id", "object", "created_at", "status", "model", "output", "usage"],
        "properties": {"id": {"type": "string"}, "object": {"const": "response"}, "created_at": _COUNT,
                       "status": {"enum": ["completed", "incomplete", "failed", "in_progress", "queued",
                                           "cancelled"]},
                       "model": {"type": "string"}, "output": {"type": "array"},
                       "usage": {"type": ["object", "null"]}}},
    "/v1/messages": {
        "type": "object", "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
        "properties": {"id": {"type": "string"}, "type": {"const": "message"}, "role": {"const": "assistant"},
                       "model": {"type": "string"}, "content": {"type": "array"}, "stop_reason": _REASON,
                       "usage": {"type": "object", "required": ["input_tokens", "output_tokens"],
                                 "properties": {"input_tokens": _COUNT, "output_tokens": _COUNT}}}},
    "/v1/messages/count_tokens": {"type": "object", "required": ["input_tokens"],
                                  "properties": {"input_tokens": _COUNT}},
    "/tokenize": {"type": "object", "required": ["count", "max_model_len", "tokens", "token_strs"], "properties": {
        "count": _COUNT, "max_model_len": _COUNT, "tokens": {"type": "array", "items": _COUNT},
        "token_strs": {"type": ["array", "null"], "items": {"type": "string"}}}},
    "/detokenize": {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
}
# The event of each streaming path's server-sent events (a text/event-stream schema describes one event): OpenAI's
# chunks are unnamed data lines ended by `[DONE]`, the Responses and Messages APIs name every event.
_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
_NAMED_EVENT = {**_EVENT, "required": ["event", "data"],
                "properties": {**_EVENT["properties"], "event": {"type": "string", "minLength": 1}}}
_STREAMS = {"/v1/chat/completions": _EVENT, "/v1/completions": _EVENT, "/v1/responses": _NAMED_EVENT,
            "/v1/messages": _NAMED_EVENT}
_ERROR = {"type": "object", "required": ["error"],
          "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"]}}}
_ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"]}}}


def _error(path: str) -> dict:
    """The error response of an operation: Anthropic's shape under its API's paths, OpenAI's elsewhere."""
    shape, name = ("Anthropic's", "AnthropicError") if path.startswith(ANTHROPIC_PATHS) else ("OpenAI's", "Error")
    return {"description": f"An error in {shape} shape",
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}


def _answer(path: str) -> dict:
    """A 200 answer: JSON, or server-sent events where the request may stream."""
    content = {"application/json": {"schema": _ANSWERS[path]}}
    if path in _STREAMS:
        content["text/event-stream"] = {"schema": _STREAMS[path]}
    return {"description": "JSON, or server-sent events when the request streams" if path in _STREAMS else "JSON",
            "content": content}


def _by_role(message: dict) -> dict:
    """A chat message as the roles its validator allows (ChatMessage._fits_role), which pydantic's schema cannot
    say: content everywhere but on an assistant message that carries tool calls, tool_calls only on assistant
    messages, and tool_call_id on tool messages and only there."""
    properties, null = message["properties"], {"type": "null"}
    content = {"anyOf": [branch for branch in properties["content"]["anyOf"] if branch != null]}

    def variant(roles: list[str], required: list[str], **fields: dict) -> dict:
        return {**message, "properties": {**properties, "role": {"enum": roles}, **fields},
                "required": ["role", *required]}

    no_calls = {"tool_calls": null}
    return {"title": message["title"], "anyOf": [
        variant(["system", "developer", "user"], ["content"], content=content, tool_call_id=null, **no_calls),
        variant(["tool"], ["content", "tool_call_id"], content=content, tool_call_id={"type": "string"}, **no_calls),
        variant(["assistant"], ["content"], content=content, tool_call_id=null),
        variant(["assistant"], ["tool_calls"], tool_call_id=null, tool_calls={
            **properties["tool_calls"]["anyOf"][0], "minItems": 1}),
    ]}


@cache
def document() -> dict:
    models = [(model, "validation") for _, _, types in _OPERATIONS for model in types]
    refs, schemas = models_json_schema(models, ref_template="#/components/schemas/{model}")
    paths = {}
    for path, summary, types in _OPERATIONS:
        body = [refs[(model, "validation")] for model in types]
        schema = body[0] if len(body) == 1 else {"oneOf": body}
        paths[path] = {"post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {"200": _answer(path), "default": _error(path)},
        }}
    components = {**schemas.get("$defs", {}), "Error": _ERROR, "AnthropicError": _ANTHROPIC_ERROR}
    components["ChatMessage"] = _by_role(components["ChatMessage"])
    return {"openapi": "3.1.0", "info": {"title": "Inferno", "version": __version__}, "paths": paths,
            "components": {"schemas": components}}


async def openapi(http: web.Request) -> web.Response:
    return json_response(document())
