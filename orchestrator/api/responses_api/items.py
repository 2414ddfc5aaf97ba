"""The input items of a Responses API request, as pydantic types: messages, function calls and their outputs, and
reasoning items sent back from an earlier answer. Text only: image, file and audio parts are refused by field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Tag

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def text_or(parts: Any) -> Any:
    """A field that is a string or a list of `parts`; a list that is wrong is reported inside it (not as "should
    be a valid string")."""
    return Annotated[Annotated[str, Tag("<text>")] | Annotated[parts, Tag("<list>")],
                     Discriminator(lambda value: "<text>" if isinstance(value, str) else "<list>")]


# -- input items ------------------------------------------------------------------------------------------------
class InputText(_Wire):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None  # an earlier answer sent back as it came
    logprobs: list[dict[str, Any]] | None = None


class MessageItem(_Wire):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: text_or(list[InputText])
    id: str | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class FunctionCallItem(_Wire):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None  # the namespace tool the function is in
    id: str | None = None
    status: ItemStatus | None = None


class OutputText(_Wire):
    type: Literal["input_text", "output_text"]
    text: str


class FunctionCallOutputItem(_Wire):
    type: Literal["function_call_output"]
    call_id: str
    output: text_or(list[OutputText])
    id: str | None = None
    status: ItemStatus | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(part.text for part in self.output)


class SummaryText(_Wire):
    type: Literal["summary_text"]
    text: str


class ReasoningText(_Wire):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Wire):
    type: Literal["reasoning"]
    summary: list[SummaryText]
    content: list[ReasoningText] | None = None
    id: str | None = None
    encrypted_content: str | None = None  # another server's; nothing here can read it
    status: ItemStatus | None = None

    def text(self) -> str:
        """The thinking in full where it was sent back, else its summary."""
        parts = self.content if self.content else self.summary
        return "\n\n".join(part.text for part in parts)


def item_kind(value: Any) -> str | None:
    """An item's or a tool's `type` (an item without one is a message)."""
    return value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("<message>")]
    | Annotated[FunctionCallItem, Tag("<function_call>")]
    | Annotated[FunctionCallOutputItem, Tag("<function_call_output>")]
    | Annotated[ReasoningItem, Tag("<reasoning>")],
    Discriminator(lambda value: f"<{item_kind(value)}>", custom_error_type="input_item_type",
                  custom_error_message="input items are messages, function_call, function_call_output or "
                                       "reasoning items (this server takes text only)"),
]
