"""A choice's text split into the channels OpenAI's chat answers have: the answer's content, the model's thinking
(reasoning models), and tool calls. Runs in the worker, per request, on each step's new text (after stop
strings), for requests that ask for it; others skip it entirely. `ended` says when the tool calls ended the
turn before the engine did (a repeated call): the worker then finishes the request as it does for a stop string."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.engine.request import EngineRequest
from orchestrator.structured.reasoning import ReasoningSplitter
from orchestrator.structured.tool_formats import ToolFormat
from orchestrator.structured.tool_parsers import (
    ContentDelta,
    ToolCallArguments,
    ToolCallParser,
    ToolEvent,
    delta_of,
)


@dataclass
class ChannelText:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # delta.tool_calls entries


class OutputChannels:
    def __init__(self, request: EngineRequest, fmt: ToolFormat, reasoning_format: str | None):
        self._splitter = None
        if request.reasoning and reasoning_format is not None:
            self._splitter = ReasoningSplitter(opened_by_prompt=reasoning_format == "deepseek_r1")
        self._parser = ToolCallParser(fmt, forced=request.tool_calls == "forced") if request.tool_calls else None

    @property
    def made_calls(self) -> bool:
        return self._parser is not None and bool(self._parser.calls)

    @property
    def ended(self) -> bool:
        """A call repeated an earlier one of the turn: the sequence should end here (finish reason tool_calls)."""
        return self._parser is not None and self._parser.ended

    def feed(self, text: str) -> ChannelText:
        out = ChannelText()
        if self._splitter is not None:
            split = self._splitter.feed(text)
            out.reasoning, text = split.reasoning, split.content
        self._route(out, text, self._parser.feed(text) if self._parser and text else None)
        return out

    def finish(self) -> ChannelText:
        out = ChannelText()
        text = ""
        if self._splitter is not None:
            split = self._splitter.finish()
            out.reasoning, text = split.reasoning, split.content
        if self._parser is not None:
            events = self._parser.feed(text) if text else []
            self._route(out, "", events + self._parser.finish())
        else:
            out.content = text
        return out

    @staticmethod
    def _route(out: ChannelText, text: str, events: list[ToolEvent] | None) -> None:
        if events is None:  # no tool parsing: the text is the answer's
            out.content += text
            return
        calls = out.tool_calls
        for event in events:
            if isinstance(event, ContentDelta):
                out.content += event.text
            elif isinstance(event, ToolCallArguments) and calls and calls[-1]["index"] == event.index:
                calls[-1]["function"]["arguments"] += event.fragment  # one entry per call in a chunk, as OpenAI
            else:
                calls.append(delta_of(event))
