"""A Responses API input (instructions and items) as the chat conversation the model's template renders.

The messages are those chat completions makes (`ChatMessage.as_template_input`): developer and system turns are
system messages; function calls join the assistant turn they follow (or make one) as its `tool_calls`; a function
call's output is a tool message; a reasoning item's text is the next assistant turn's `reasoning_content`.
"""

from __future__ import annotations

from pydantic import BaseModel

from orchestrator.api.responses_api.items import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
)


def chat_messages(instructions: str | None, items: list[BaseModel]) -> list[dict]:
    """The conversation, instructions first as a system message."""
    messages: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
    reasoning: str | None = None  # thinking waiting for the assistant turn it belongs to
    for item in items:
        if isinstance(item, ReasoningItem):
            reasoning = "\n\n".join(filter(None, (reasoning, item.text())))
            continue
        if isinstance(item, MessageItem) and item.role == "assistant":
            messages.append(_assistant(item.text(), reasoning))
        elif isinstance(item, MessageItem):
            messages.append({"role": "system" if item.role == "developer" else item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            _add_call(messages, item, reasoning)
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        reasoning = None
    return messages


def _assistant(content: str | None, reasoning: str | None) -> dict:
    message: dict = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def _add_call(messages: list[dict], item: FunctionCallItem, reasoning: str | None) -> None:
    """The call joins the assistant turn just before it, else opens one of its own."""
    call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
    last = messages[-1] if messages else None
    if last is None or last["role"] != "assistant" or reasoning:
        last = _assistant(None, reasoning)
        messages.append(last)
    last.setdefault("tool_calls", []).append(call)
