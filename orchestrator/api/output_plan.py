"""What a request asks of its output beyond sampling: a grammar it must follow, tool calls to parse, thinking to
split from the answer. Made once in the HTTP process from the wire request and the model's chat format; the
guide is checked before admission, the rest travels in each EngineRequest to the worker."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.api.engine_requests import SamplingFields, check_supported
from orchestrator.backends import features_of
from orchestrator.engine.catalogue import Engine
from orchestrator.engine.manifest import ChatFormat
from orchestrator.errors import InvalidRequest, UnsupportedParameter
from orchestrator.structured.guide import Guide, single_guide
from orchestrator.structured.reasoning import after_reasoning
from orchestrator.structured.tool_formats import tool_format
from orchestrator.structured.tool_grammar import tool_call_guide
from orchestrator.structured.tools import ToolPlan


@dataclass(frozen=True)
class OutputPlan:
    guide: Guide | None  # the grammar the output follows (from response_format, structured_outputs or tools)
    tools: ToolPlan | None  # the request's tools, for the prompt
    tool_calls: str  # "" (none), "auto" (the model may call), "forced" (it must: required or named)
    reasoning: bool  # the model thinks aloud first: split the thinking from the answer

    @classmethod
    def for_model(cls, chat_format: ChatFormat, guide: Guide | None, tools: ToolPlan | None, *, chat: bool
                  ) -> OutputPlan:
        reasoning = chat and chat_format.reasoning_format is not None
        if guide is not None and reasoning:  # the constraint begins after the thinking block
            guide = after_reasoning(guide, opened_by_prompt=chat_format.reasoning_format == "deepseek_r1")
        tool_calls = ""
        if tools is not None and tools.parses_calls:
            tool_calls = "forced" if tools.forced else "auto"
        return cls(guide, tools, tool_calls, reasoning)

    def check_compatible(self, fields: SamplingFields) -> None:
        """A constrained output ends where its grammar ends: ignore_eos and min_tokens would fight it."""
        if self.guide is None:
            return
        for name, asked in (("ignore_eos", fields.ignore_eos), ("min_tokens", fields.min_tokens)):
            if asked:
                raise InvalidRequest(
                    f"{name} cannot be combined with an output constraint ({self.guide.param}): the output ends "
                    "where the grammar ends",
                    param=name,
                )


def chat_output_plan(engine: Engine, tools: ToolPlan | None, *guides: Guide | None) -> OutputPlan:
    """The plan of a conversation, whatever API it came through: the grammar of its tools' calls in the model's
    tool call format, or the one other constraint it asked for (two are refused, naming both fields)."""
    calls = tool_call_guide(tools, tool_format(engine.manifest.chat.tool_call_format)) if tools is not None else None
    return OutputPlan.for_model(engine.manifest.chat, single_guide(*guides, calls), tools, chat=True)


def check_output(plan: OutputPlan, fields: SamplingFields, engine: Engine) -> None:
    """Every front door's checks of what a request asks against what the model's backend honours: its sampling
    fields, its constraint with them, and a constraint at all (raises UnsupportedParameter / InvalidRequest)."""
    check_supported(fields, engine)
    plan.check_compatible(fields)
    if plan.guide is not None and not features_of(engine.manifest).guided:
        raise UnsupportedParameter(
            f"output constraints ({plan.guide.param}) are not supported by the '{engine.manifest.backend}' "
            f"backend that serves model '{engine.name}'",
            param=plan.guide.param,
        )
