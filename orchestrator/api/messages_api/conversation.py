"""A Messages API conversation (`system` and `messages`) as the chat-template messages chat completions makes
(`ChatMessage.as_template_input`), so that the model's template renders it the same way.

`system` is the first system message; a `system` turn inside `messages` stays a system message where it stands.
A user turn's text blocks are one user message; its `tool_result` blocks are `tool` messages (`tool_call_id`), in
the order given. An assistant turn's `thinking` is its `reasoning_content`, its text its content, its `tool_use`
blocks its `tool_calls` (arguments as JSON text). `redacted_thinking` holds nothing this server can read and is
left out. A block of another type (image, document...) is refused with a 400 that names it: no model here reads
one.
"""

from __future__ import annotations

import orjson
from pydantic import BaseModel

from orchestrator.api.messages_api.blocks import (
    MessageParam,
    OtherBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from orchestrator.errors import UnsupportedParameter

BLOCK_SEPARATOR = "\n\n"  # between the text blocks of one turn
ERROR_RESULT_PREFIX = "Error: "  # a tool_result with is_error, as the model reads it


def system_text(system: str | list[TextBlock] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    return BLOCK_SEPARATOR.join(block.text for block in system) or None


def chat_messages(system: str | list[TextBlock] | None, messages: list[MessageParam]) -> list[dict]:
    """The conversation as chat-template messages, the system prompt first."""
    text = system_text(system)
    out: list[dict] = [{"role": "system", "content": text}] if text else []
    for i, message in enumerate(messages):
        blocks = [TextBlock(type="text", text=message.content)] if isinstance(message.content, str) else message.content
        where = f"messages[{i}].content"
        if message.role == "assistant":
            out.append(_assistant(blocks, where))
        else:
            out += _user_or_system(message.role, blocks, where)
    return out


def _refuse(block: BaseModel, where: str) -> None:
    raise UnsupportedParameter(
        f"{where}: a {block.type!r} block is not supported by this server: its models read text only",
        param=f"{where}.type")


def _user_or_system(role: str, blocks: list[BaseModel], where: str) -> list[dict]:
    out: list[dict] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolResultBlock) and role == "user":
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "content": _result_text(block, f"{where}[{j}].content")})
        else:
            _refuse(block, f"{where}[{j}]")
    if texts or not out:
        out.append({"role": role, "content": BLOCK_SEPARATOR.join(texts)})
    return out


def _result_text(block: ToolResultBlock, where: str) -> str:
    if isinstance(block.content, str):
        text = block.content
    else:
        for k, part in enumerate(block.content):
            if isinstance(part, OtherBlock):
                _refuse(part, f"{where}[{k}]")
        text = BLOCK_SEPARATOR.join(part.text for part in block.content)
    return ERROR_RESULT_PREFIX + text if block.is_error else text


def _assistant(blocks: list[BaseModel], where: str) -> dict:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thinking.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            arguments = orjson.dumps(block.input).decode()
            calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}})
        elif not isinstance(block, RedactedThinkingBlock):
            _refuse(block, f"{where}[{j}]")
    message: dict = {"role": "assistant", "content": BLOCK_SEPARATOR.join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = BLOCK_SEPARATOR.join(thinking)
    return message
