"""The Messages API's response object (`anthropic.types.Message`): its content blocks, stop reason and usage.

Usage counts as Anthropic's do: `input_tokens` are the prompt's tokens not read from the prefix cache,
`cache_read_input_tokens` those that were (their sum is the whole prompt, what count_tokens says), and
`cache_creation_input_tokens` is 0 (the cache fills as a side effect; nothing is written on request).
A thinking block's `signature` is a digest of its text: this server checks no signature sent back.
"""

from __future__ import annotations

import hashlib

import orjson

from orchestrator.engine.request import FinishReason
from orchestrator.lifecycle import Choice, InferenceRequest

_STOP_REASONS = {FinishReason.TOOL_CALLS: "tool_use", FinishReason.LENGTH: "max_tokens"}


def signature(thinking: str) -> str:
    return hashlib.sha256(thinking.encode()).hexdigest()


def matched_stop(text: str, stops: tuple[str, ...]) -> str | None:
    """The stop sequence that ended `text` (the engine keeps it at the end, and stops at the first one found);
    None when the answer ended otherwise."""
    ends = [stop for stop in stops if text.endswith(stop)]
    return max(ends, key=len) if ends else None


def stop_reason(finish: FinishReason | None, stop: str | None) -> str:
    return "stop_sequence" if stop is not None else _STOP_REASONS.get(finish, "end_turn")


def usage(request: InferenceRequest, *, output: bool = True) -> dict:
    cached = request.cached_tokens or 0
    body = {"input_tokens": request.prompt_tokens - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached}
    if output:
        body["output_tokens"] = request.completion_tokens
    return body


def tool_input(arguments: str) -> dict:
    """A call's arguments (JSON text) as the object Anthropic's `input` is; {} if they are not one."""
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def input_json(arguments: str) -> str:
    """A call's input as a stream's `input_json_delta` carries it: the model's own text when it is a JSON object,
    else "{}" (what `tool_input` makes of it)."""
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return "{}"
    return arguments if isinstance(value, dict) else "{}"


def content_blocks(choice: Choice, text: str) -> list[dict]:
    """A finished answer's blocks: its thinking, its text (unless it only called tools), its tool calls."""
    blocks = []
    if choice.reasoning:
        blocks.append({"type": "thinking", "thinking": choice.reasoning, "signature": signature(choice.reasoning)})
    if text or not choice.tool_calls:
        blocks.append({"type": "text", "text": text})
    blocks += [{"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                "input": tool_input(call["function"]["arguments"])} for call in choice.tool_calls]
    return blocks


def message_body(message_id: str, model: str, content: list[dict], reason: str | None, stop: str | None,
                 usage_: dict) -> dict:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": stop, "usage": usage_}
