"""The Responses API's response object: its output items and usage, and the request's settings as OpenAI echoes them.

The shapes are those of the `openai` SDK's `Response` and its output items (`ResponseReasoningItem`,
`ResponseOutputMessage`, `ResponseFunctionToolCall`). One `OutputItem` is one output item as it grows; it is
rendered the same way in a whole response, in a stream's events and in its final `response.completed`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.api.completions_format import chat_logprobs
from orchestrator.api.record import new_id
from orchestrator.api.responses_api.wire import FunctionChoice, FunctionTool, ResponsesRequest
from orchestrator.engine.request import FinishReason
from orchestrator.lifecycle import Choice, InferenceRequest

ItemKind = Literal["reasoning", "message", "function_call"]
_ID_PREFIX = {"reasoning": "rs", "message": "msg", "function_call": "fc"}


@dataclass
class OutputItem:
    """One output item: a reasoning item, the answer's message, or one function call."""

    kind: ItemKind
    text: str = ""  # the thinking, the answer's text, or the call's arguments
    name: str = ""  # a function call's
    call_id: str = ""  # a function call's: the tool call's id, which its output names
    logprobs: list | None = None  # the answer's tokens' entries ([text, log probability, alternatives]), when asked
    namespace: str | None = None  # a function call's, when its function is in a namespace tool
    id: str = field(default="")

    def __post_init__(self) -> None:
        self.id = self.id or new_id(_ID_PREFIX[self.kind])

    def part(self) -> dict:
        """The item's content part (a message's output text, a reasoning item's text)."""
        if self.kind == "reasoning":
            return {"type": "reasoning_text", "text": self.text}
        part = {"type": "output_text", "text": self.text, "annotations": []}
        if self.logprobs is not None:
            part["logprobs"] = (chat_logprobs(self.logprobs) or {}).get("content", [])
        return part

    def render(self, status: str) -> dict:
        if self.kind == "function_call":
            call = {"id": self.id, "type": "function_call", "status": status, "call_id": self.call_id,
                    "name": self.name, "arguments": self.text}
            return call if self.namespace is None else {**call, "namespace": self.namespace}
        if self.kind == "reasoning":
            content = [self.part()] if status != "in_progress" else []
            return {"id": self.id, "type": "reasoning", "status": status, "summary": [], "content": content}
        content = [self.part()] if status != "in_progress" else []
        return {"id": self.id, "type": "message", "status": status, "role": "assistant", "content": content}


def items_of(choice: Choice, wants_logprobs: bool, namespaces: dict[str, str]) -> list[OutputItem]:
    """A finished choice's output items: its thinking, its answer (unless it only called tools), its calls."""
    items = [OutputItem("reasoning", choice.reasoning)] if choice.reasoning else []
    text = "".join(choice.parts)
    if text or not choice.tool_calls:
        logprobs = (choice.logprobs or []) if wants_logprobs else None
        items.append(OutputItem("message", text, logprobs=logprobs))
    items += [function_call(call["function"]["name"], call["id"], namespaces, call["function"]["arguments"])
              for call in choice.tool_calls]
    return items


def function_call(name: str, call_id: str, namespaces: dict[str, str], arguments: str = "") -> OutputItem:
    return OutputItem("function_call", arguments, name, call_id, namespace=namespaces.get(name))


def final_status(choice: Choice) -> str:
    return "incomplete" if choice.finish == FinishReason.LENGTH else "completed"


def usage(request: InferenceRequest, reasoning_tokens: int) -> dict:
    output = request.completion_tokens
    return {"input_tokens": request.prompt_tokens,
            "input_tokens_details": {"cached_tokens": request.cached_tokens or 0, "cache_write_tokens": 0},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": request.prompt_tokens + output}


def response_body(wire: ResponsesRequest, request: InferenceRequest, response_id: str, created_at: int,
                  status: str, output: list[dict], usage_: dict | None, error: dict | None = None) -> dict:
    """The response object in `status`, with what the request asked echoed as OpenAI echoes it."""
    sampling = request.choices[0].engine_request.sampling
    body = {
        "id": response_id, "object": "response", "created_at": created_at, "status": status,
        "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
        "background": bool(wire.background), "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": request.model, "output": output, "usage": usage_,
        "instructions": wire.instructions, "metadata": wire.metadata or {},
        "max_output_tokens": wire.max_output_tokens, "max_tool_calls": wire.max_tool_calls,
        "parallel_tool_calls": wire.parallel_tool_calls is not False,
        "previous_response_id": wire.previous_response_id, "prompt_cache_key": wire.prompt_cache_key,
        "prompt_cache_retention": wire.prompt_cache_retention, "safety_identifier": wire.safety_identifier,
        "user": wire.user, "store": wire.store is not False,
        "service_tier": wire.service_tier if wire.service_tier in ("flex", "priority") else "default",
        "temperature": sampling.temperature, "top_p": sampling.top_p, "top_logprobs": wire.top_logprobs or 0,
        "truncation": wire.truncation or "disabled",
        "reasoning": _reasoning(wire), "text": _text(wire), "tool_choice": _tool_choice(wire), "tools": _tools(wire),
    }
    return body


def _reasoning(wire: ResponsesRequest) -> dict:
    given = wire.reasoning
    return {"effort": given and given.effort, "summary": given and (given.summary or given.generate_summary)}


def _text(wire: ResponsesRequest) -> dict:
    given = wire.text
    fmt = given.format.model_dump(by_alias=True, exclude_none=True) if given and given.format else {"type": "text"}
    return {"format": fmt, "verbosity": (given and given.verbosity) or "medium"}


def _tool_choice(wire: ResponsesRequest) -> str | dict:
    choice = wire.tool_choice
    return choice.model_dump() if isinstance(choice, FunctionChoice) else choice or "auto"


def _tools(wire: ResponsesRequest) -> list[dict]:
    tools = []
    for tool in wire.tools or ():
        if isinstance(tool, FunctionTool):
            tools.append({"type": "function", "name": tool.name, "description": tool.description,
                          "parameters": tool.parameters, "strict": tool.strict})
        else:
            tools.append(tool.model_dump(by_alias=True, exclude_none=True))
    return tools
