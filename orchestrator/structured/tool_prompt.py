"""Putting tools and tool-call history into a prompt, for templates that render tools and for those that do not.

A chat template supports tools when it reads the `tools` variable (Hugging Face renders templates with
`tools=[{"type": "function", "function": {...}}, ...]`). Then `prompt_messages` hands the template the tools
and the history in the shapes Hugging Face templates expect:

- an assistant turn with calls: `{"role": "assistant", "content": "", "tool_calls": [{"id": ID, "type":
  "function", "function": {"name": NAME, "arguments": {...}}}]}`, arguments as an object (templates apply
  `tojson` to them), not OpenAI's JSON string;
- a tool result: `{"role": "tool", "tool_call_id": ID, "name": NAME, "content": TEXT}`, the name looked up from
  the call it answers (Qwen and Llama templates read `name`; Mistral's reads `tool_call_id`).

A template that never mentions `tools` gets what the model can read without it: a system message (added, or
appended to the first one) that lists the tools as JSON and shows the call format, calls in history written
as the model should write them, and tool results as user turns wrapped in `<tool_response>` tags.

Input messages are OpenAI's, as dicts: roles system/user/assistant/tool (developer already mapped to system),
`content` a string or None, assistant `tool_calls` as in the API (arguments a JSON string), tool
`tool_call_id`.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import InvalidRequest
from orchestrator.structured.json_depth import check_depth
from orchestrator.structured.tool_formats import ToolFormat
from orchestrator.structured.tools import ToolPlan

_READS_TOOLS = re.compile(r"\btools\b")


@dataclass(frozen=True)
class PromptMessages:
    """What to render with the model's chat template: the messages, and `tools` (None: pass no tools)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


@functools.cache  # per engine: its template is one string, read once at start
def template_supports_tools(template: str | None) -> bool:
    return template is not None and _READS_TOOLS.search(template) is not None


def prompt_messages(messages: list[dict[str, Any]], plan: ToolPlan | None, fmt: ToolFormat, *,
                    template_reads_tools: bool) -> PromptMessages:
    """The messages (and tools) for the template. With `tool_choice: none` the tools are not shown."""
    calls = _calls_by_id(messages)
    if template_reads_tools:
        shaped = [_template_shape(message, index, calls) for index, message in enumerate(messages)]
        shown = [tool.template_input() for tool in plan.tools] if plan and plan.parses_calls else None
        return PromptMessages(shaped, shown)
    shaped = _merge_tool_results([_plain_shape(m, index, calls, fmt) for index, m in enumerate(messages)])
    if plan and plan.parses_calls:
        shaped = _with_system_text(shaped, tool_system_prompt(plan, fmt))
    return PromptMessages(shaped, None)


def tool_system_prompt(plan: ToolPlan, fmt: ToolFormat) -> str:
    """Instructions for a model whose template does not render tools: the tools, then the call format."""
    listing = "\n".join(json.dumps({"name": f.name, "description": f.description or "",
                                    "parameters": f.parameters_schema()}, ensure_ascii=False)
                        for f in (tool.function for tool in plan.tools))
    example = fmt.calls_text([("<function name>", "<arguments as a JSON object>")])
    rules = {"auto": "If a tool helps, answer with only the call(s); otherwise answer normally.",
             "required": "You must answer with one or more tool calls.",
             "named": f"You must answer with one call of {plan.tools[0].function.name}."}[plan.mode]
    count = "You may make several calls at once." if plan.parallel else "Make one call at a time."
    return (
        "You can call these tools. Each line is one tool, with a JSON Schema of its arguments:\n"
        f"{listing}\n\nTo call a tool, write exactly:\n{example}\n{rules} {count}\n"
        "Results come back wrapped in <tool_response></tool_response>."
    )


def _calls_by_id(messages: list[dict[str, Any]]) -> dict[str, str]:
    return {call.get("id"): call.get("function", {}).get("name")
            for message in messages for call in message.get("tool_calls") or ()}


def _arguments(call: dict[str, Any], where: str) -> dict[str, Any] | str:
    """A past call's arguments: the object, or, when they are not JSON at all, the text as it stands (a call cut
    short by another server's max_tokens comes back from clients that way; this one never returns a cut call):
    the model sees what was written. JSON that is not an object is no call's arguments: refused."""
    text = call.get("function", {}).get("arguments", "")
    check_depth(text, where)
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return text
    if not isinstance(value, dict):
        raise InvalidRequest(f"{where} must be a JSON object", param=where)
    return value


def _past_calls(message: dict[str, Any], index: int) -> list[tuple[str, dict[str, Any] | str]]:
    """An assistant message's calls as (name, arguments)."""
    return [(call["function"]["name"],
             _arguments(call, f"messages[{index}].tool_calls[{j}].function.arguments"))
            for j, call in enumerate(message["tool_calls"])]


def _template_shape(message: dict[str, Any], index: int, calls: dict[str, str]) -> dict[str, Any]:
    shaped = {"role": message["role"], "content": _text(message.get("content"))}
    if message.get("tool_calls"):
        made = zip(message["tool_calls"], _past_calls(message, index), strict=True)
        shaped["tool_calls"] = [{"id": call.get("id"), "type": "function",
                                 "function": {"name": name, "arguments": arguments}}
                                for call, (name, arguments) in made]
    if message["role"] == "tool":
        shaped["tool_call_id"] = message.get("tool_call_id")
        shaped["name"] = _answered_call(message, index, calls)
    return shaped


def _plain_shape(message: dict[str, Any], index: int, calls: dict[str, str],
                 fmt: ToolFormat) -> tuple[dict[str, Any], bool]:
    """The message as plain text turns, and whether it is a tool result."""
    role, content = message["role"], _text(message.get("content"))
    if message.get("tool_calls"):
        written = fmt.calls_text(_past_calls(message, index))
        return {"role": role, "content": f"{content}\n{written}" if content else written}, False
    if role == "tool":
        name = _answered_call(message, index, calls)
        result = json.dumps({"name": name, "content": content}, ensure_ascii=False)
        return {"role": "user", "content": f"<tool_response>\n{result}\n</tool_response>"}, True
    return {"role": role, "content": content}, False


def _answered_call(message: dict[str, Any], index: int, calls: dict[str, str]) -> str:
    call_id = message.get("tool_call_id")
    if call_id not in calls:
        raise InvalidRequest(
            f"messages[{index}].tool_call_id {call_id!r} answers no tool call of an earlier assistant message",
            param=f"messages[{index}].tool_call_id",
        )
    return calls[call_id]


def _merge_tool_results(shaped: list[tuple[dict[str, Any], bool]]) -> list[dict[str, Any]]:
    """Consecutive tool results become one user turn (templates expect roles to alternate)."""
    merged: list[dict[str, Any]] = []
    after_result = False
    for message, is_result in shaped:
        if is_result and after_result:
            merged[-1] = {"role": "user", "content": merged[-1]["content"] + "\n" + message["content"]}
        else:
            merged.append(message)
        after_result = is_result
    return merged


def _with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        content = f"{first['content']}\n\n{text}" if first["content"] else text
        return [{**first, "content": content}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)
