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
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"]}},
}

_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {"type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"]}},
}


def _error(path: str) -> dict:
    """The error response of an operation: Anthropic's shape under its API's paths, OpenAI's elsewhere."""
    shape, name = ("Anthropic's", "AnthropicError") if path.startswith(ANTHROPIC_PATHS) else ("OpenAI's", "Error")
    return {"description": f"An error in {shape} shape",
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}


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
            "responses": {
                "200": {"description": "JSON, or server-sent events when the request streams"},
                "default": _error(path),
            },
        }}
    components = {**schemas.get("$defs", {}), "Error": _ERROR, "AnthropicError": _ANTHROPIC_ERROR}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Inferno", "version": __version__},
        "paths": paths,
        "components": {"schemas": components},
    }


async def openapi(http: web.Request) -> web.Response:
    return json_response(document())
