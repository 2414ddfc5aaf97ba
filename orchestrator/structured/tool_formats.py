"""How model families write tool calls: one layout description per format, named in an engine's manifest.

Every format writes each call as the JSON object `{"name": NAME, KEY: ARGUMENTS}` and differs in what
surrounds the calls:

- `hermes` (Hermes, Qwen2.5, Qwen3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one
  block per call, separated by a newline; text may come before the first block.
- `llama3_json` (Llama 3.1-3.3): `{"name": ..., "parameters": {...}}` as the whole answer, optionally after
  `<|python_tag|>`; several calls separated by `; `.
- `mistral` (Mistral v3 tokenizers): `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.

The generator (`tool_grammar.py`), the parser (`tool_parsers.py`) and the prompt (`tool_prompt.py`) all read
these descriptions, so a format is described once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolFormat:
    """The layout of tool calls in a model's output.

    Written output: `marker + list_open + call (separator call)* + list_close`, where each call is
    `call_open + {"name": NAME, arguments_key: ARGUMENTS} + call_close`. `marker` (a special token in the
    model's vocabulary) also tells the parser that calls begin; `optional_marker` may precede calls and is
    never generated. `calls_at_start_only`: calls can only open the answer (no text before them).
    """

    name: str
    arguments_key: str = "arguments"
    marker: str = ""  # every surrounding piece is nothing unless a format names it
    list_open: str = ""
    list_close: str = ""
    call_open: str = ""
    call_close: str = ""
    separator: str = ""
    optional_marker: str = ""
    calls_at_start_only: bool = False

    def call_text(self, name: str, arguments: dict[str, Any] | str) -> str:
        """One call as this format writes it (arguments as an object, or as JSON text)."""
        args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return f"{self.call_open}{self.call_head(name)}{args}}}{self.call_close}"

    def call_head(self, name: str) -> str:
        """The call object up to its arguments: `{"name": NAME, "arguments": `."""
        return f'{{"name": {json.dumps(name, ensure_ascii=False)}, "{self.arguments_key}": '

    def calls_text(self, calls: list[tuple[str, dict[str, Any] | str]]) -> str:
        """A whole answer of calls, as the model would write it."""
        body = self.separator.join(self.call_text(name, args) for name, args in calls)
        return f"{self.marker}{self.list_open}{body}{self.list_close}"


TOOL_FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat("hermes", call_open="<tool_call>\n", call_close="\n</tool_call>", separator="\n"),
    "llama3_json": ToolFormat("llama3_json", arguments_key="parameters", separator="; ",
                              optional_marker="<|python_tag|>", calls_at_start_only=True),
    "mistral": ToolFormat("mistral", marker="[TOOL_CALLS]", list_open="[", list_close="]", separator=", "),
}
DEFAULT_TOOL_FORMAT = "hermes"  # for models whose manifest names none (the tool prompt teaches it)


def tool_format(name: str | None) -> ToolFormat:
    """The format an engine's manifest names (`hermes` when it names none). An unknown name is a fault of
    the manifest, which should only accept the names in TOOL_FORMATS: ValueError."""
    key = name or DEFAULT_TOOL_FORMAT
    if key not in TOOL_FORMATS:
        raise ValueError(f"tool call format {key!r} is unknown; known formats: {', '.join(TOOL_FORMATS)}")
    return TOOL_FORMATS[key]
