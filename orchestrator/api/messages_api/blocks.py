"""The content blocks of Anthropic's Messages API requests as pydantic types: what a `system` prompt and each
message's `content` may hold.

Block fields this server reads are typed; any other field Anthropic defines on a block (`cache_control`,
`citations`, `caller`, ...) is accepted and ignored, since Anthropic's API grows such fields often and they change
nothing here (docs/api.md, "Anthropic Messages API"). Image and document blocks parse, so that the refusal names
the block (conversation.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Tag


class _Block(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class OtherBlock(_Block):
    """A block of a type this server has no input for (image, document, search_result, server tool blocks...)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str


def _kind(value: Any, known: tuple[str, ...] = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")
          ) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in known else "other"


ResultPart = Annotated[Annotated[TextBlock, Tag("text")] | Annotated[OtherBlock, Tag("other")],
                       Discriminator(lambda value: _kind(value, ("text",)))]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ResultPart] = ""
    is_error: bool = False


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")] | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")] | Annotated[OtherBlock, Tag("other")],
    Discriminator(_kind),
]


class MessageParam(_Block):
    """One turn. `system` turns inside `messages` are Claude Code's (its beta `mid-conversation-system`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]
