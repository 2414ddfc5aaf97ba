"""How deep a client's JSON nests, measured without recursion, so a deep value is refused with a 400 naming its
field before anything recursive sees it (json.loads raises RecursionError near 1,000 levels; a schema compiler
or a chat template's `tojson` walks a value recursively).

The request body itself is parsed by pydantic-core, which refuses nesting past about 200 levels; JSON inside a
string field (a past tool call's `arguments`, a schema given as text) and the schema objects that reach the
grammar compiler are checked here against `JSON_DEPTH`.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

from orchestrator.errors import InvalidRequest

JSON_DEPTH = 64  # levels of objects and arrays; a JSON Schema spends two per level of the data it describes
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def text_depth(text: str) -> int:
    """The deepest nesting of objects and arrays in JSON text (brackets inside strings do not count). Text that is
    not JSON gets a number too; parsing it says what is wrong."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0)


def value_depth(value: Any) -> int:
    """The deepest nesting of dicts and lists in a parsed JSON value."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in item)
    return deepest


def check_depth(value: Any, param: str) -> None:
    """InvalidRequest naming `param` when `value` (JSON text, or a parsed value) nests deeper than JSON_DEPTH."""
    depth = text_depth(value) if isinstance(value, str) else value_depth(value)
    if depth > JSON_DEPTH:
        raise InvalidRequest(
            f"{param} nests {depth} levels deep; this server accepts JSON nested at most {JSON_DEPTH} levels",
            param=param,
        )
