"""Reasoning models: their thinking, between `<think>` and `</think>`, split from the answer as it streams;
and constraints (structured outputs, forced tool calls) that start only after the thinking.

Two styles: DeepSeek-R1's template opens the block in the prompt, so the output starts inside it
(`opened_by_prompt=True`); Qwen3 writes `<think>` itself, and an output that does not open with it has no
thinking. Clients read the thinking as `message.reasoning_content` (and `reasoning`, newer vLLM) and the
answer as `content`. The tags must reach the splitter: the detokeniser has to keep them if the model's
tokenizer marks them special.

Pipeline per choice: detokenised text -> ReasoningSplitter -> content -> tool-call parser (if tools).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.structured.guide import Guide
from orchestrator.structured.markers import partial_suffix

THINK_START = "<think>"
THINK_END = "</think>"
_WHITESPACE = " \t\r\n"


@dataclass(frozen=True)
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class ReasoningSplitter:
    """Fed text deltas, returns the reasoning and content in each; tags split across deltas are held
    back until they can be told apart from text. Whitespace right after either tag is dropped."""

    def __init__(self, *, opened_by_prompt: bool, start: str = THINK_START, end: str = THINK_END):
        self._start, self._end = start, end
        self._state = "thinking_starts" if opened_by_prompt else "may_open"
        self._buffer = ""

    def feed(self, text: str) -> ReasoningDelta:
        self._buffer += text
        reasoning, content = [], []
        while self._buffer and getattr(self, f"_on_{self._state}")(reasoning, content):
            pass
        return ReasoningDelta("".join(reasoning), "".join(content))

    def finish(self) -> ReasoningDelta:
        """The end of the output: a partial tag held back is text of the part it was found in."""
        rest, self._buffer = self._buffer, ""
        if self._state == "thinking":
            return ReasoningDelta(reasoning=rest)
        if self._state in ("may_open", "content"):
            return ReasoningDelta(content=rest)
        return ReasoningDelta()

    @property
    def thinking(self) -> bool:
        """True while the output is (or may still be) inside the thinking block."""
        return self._state in ("thinking_starts", "thinking")

    def _on_may_open(self, reasoning: list[str], content: list[str]) -> bool:
        stripped = self._buffer.lstrip(_WHITESPACE)
        if not stripped or (self._start.startswith(stripped) and stripped != self._start):
            return False
        if stripped.startswith(self._start):
            self._buffer = stripped[len(self._start) :]
            self._state = "thinking_starts"
        else:
            self._state = "content"
        return True

    def _on_thinking_starts(self, reasoning: list[str], content: list[str]) -> bool:
        """Inside the block, before any text: whitespace and a repeated opening tag are dropped."""
        stripped = self._buffer.lstrip(_WHITESPACE)
        if not stripped or (self._start.startswith(stripped) and stripped != self._start):
            self._buffer = stripped
            return False
        if stripped.startswith(self._start):
            self._buffer = stripped[len(self._start) :]  # and the whitespace after it, on the next round
        else:
            self._buffer = stripped
            self._state = "thinking"
        return True

    def _on_thinking(self, reasoning: list[str], content: list[str]) -> bool:
        found = self._buffer.find(self._end)
        if found < 0:  # hold a partial end tag, and the whitespace before it (dropped if the tag comes)
            cut = len(self._buffer) - partial_suffix(self._buffer, self._end)
            while cut > 0 and self._buffer[cut - 1] in _WHITESPACE:
                cut -= 1
            reasoning.append(self._buffer[:cut])
            self._buffer = self._buffer[cut:]
            return False
        reasoning.append(self._buffer[:found].rstrip(_WHITESPACE))
        self._buffer = self._buffer[found + len(self._end) :]
        self._state = "answer_starts"
        return True

    def _on_answer_starts(self, reasoning: list[str], content: list[str]) -> bool:
        self._buffer = self._buffer.lstrip(_WHITESPACE)
        if self._buffer:
            self._state = "content"
        return bool(self._buffer)

    def _on_content(self, reasoning: list[str], content: list[str]) -> bool:
        content.append(self._buffer)
        self._buffer = ""
        return False


def after_reasoning(
    guide: Guide, *, opened_by_prompt: bool, start: str = THINK_START, end: str = THINK_END
) -> Guide:
    """`guide` preceded by a free thinking block: the constraint applies only after `end` (and the
    whitespace that follows it). A structural tag: `sequence(tag(thinking), whitespace, constraint)`."""
    begin = "" if opened_by_prompt else start
    thinking = {"type": "tag", "begin": begin, "content": {"type": "any_text"}, "end": end}
    gap = {"type": "regex", "pattern": "[ \\t\\r\\n]*"}
    sequence = {"type": "sequence", "elements": [thinking, gap, structural_tag_format(guide)]}
    text = json.dumps({"type": "structural_tag", "format": sequence}, ensure_ascii=False)
    return Guide("structural_tag", text, param=guide.param)


def structural_tag_format(guide: Guide) -> dict[str, Any]:
    """Any guide as an element of a structural tag, so it can follow another element."""
    kind, text = guide.compiled_form()
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": json.loads(text)}
    if kind == "regex":
        return {"type": "regex", "pattern": text}
    if kind == "ebnf":
        return {"type": "grammar", "grammar": text}
    return json.loads(text)["format"]
