"""The guide that forces tool calls: `tool_choice: required` (one or more calls, exactly one when
`parallel_tool_calls` is false) and a named choice (exactly one call of that function), each call's
arguments valid against its tool's JSON Schema.

It is an xgrammar structural tag, built here as plain JSON (no xgrammar in the HTTP process): each tool is a
tag whose begin is the call's fixed text up to the arguments, whose content is the tool's parameter schema
and whose end closes the call; `tags_with_separator` repeats them with the format's separator. The checker
and the hf worker compile it with xgrammar; TensorRT-LLM takes it as GuidedDecodingParams STRUCTURAL_TAG.
"""

from __future__ import annotations

import json
from typing import Any

from orchestrator.errors import InvalidRequest
from orchestrator.structured.guide import MAX_GUIDE_CHARS, Guide
from orchestrator.structured.tool_formats import ToolFormat
from orchestrator.structured.tools import ToolPlan


def tool_call_guide(plan: ToolPlan, fmt: ToolFormat) -> Guide | None:
    """The guide for a plan that forces calls; None for `none` and `auto` (nothing to enforce)."""
    if not plan.forced:
        return None
    calls = {
        "type": "tags_with_separator",
        "tags": [
            _call_tag(tool.function.name, tool.function.parameters_schema(), fmt) for tool in plan.tools
        ],
        "separator": fmt.separator,
        "at_least_one": True,
        "stop_after_first": not plan.parallel,
    }
    text = json.dumps({"type": "structural_tag", "format": _framed(calls, fmt)}, ensure_ascii=False)
    if len(text) > MAX_GUIDE_CHARS:
        raise InvalidRequest(
            f"the tools' schemas make a grammar of {len(text)} characters; the limit is {MAX_GUIDE_CHARS}",
            param="tools",
        )
    return Guide("structural_tag", text, param="tools")


def _call_tag(name: str, parameters: dict[str, Any], fmt: ToolFormat) -> dict[str, Any]:
    return {"type": "tag", "begin": fmt.call_open + fmt.call_head(name),
            "content": {"type": "json_schema", "json_schema": parameters}, "end": "}" + fmt.call_close}


def _framed(calls: dict[str, Any], fmt: ToolFormat) -> dict[str, Any]:
    """The calls inside the format's list brackets, if it has any (a tag: xgrammar allows an unbounded
    element only last in a sequence, but anywhere as a tag's content)."""
    opening = fmt.marker + fmt.list_open
    if not opening and not fmt.list_close:
        return calls
    return {"type": "tag", "begin": opening, "content": calls, "end": fmt.list_close}
