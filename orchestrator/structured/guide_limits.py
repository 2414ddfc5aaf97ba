"""Cheap structural limits on a guide, checked before xgrammar sees it: how deep a schema, regex or grammar
nests and how many rules it has. A compiler's time grows with both, and xgrammar walks some of them
recursively; a guide past these limits is refused with a 400 naming its field, without a round trip to the
grammar checker.
"""

from __future__ import annotations

import re

from orchestrator.errors import InvalidRequest
from orchestrator.structured.guide import Guide
from orchestrator.structured.json_depth import JSON_DEPTH, text_depth

MAX_GROUP_DEPTH = 32  # nested parentheses in a regex or an EBNF rule
MAX_RULES = 1024  # EBNF rules; JSON Schema objects (each becomes at least one rule)
MAX_REPEAT = 1024  # the largest bound of a regex or EBNF repetition {m,n}
STRUCTURAL_TAG_LEVELS = 8  # a structural tag's own levels around the schemas in it (tools, reasoning)
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_EBNF_LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]', re.DOTALL)
_REGEX_ESCAPE_OR_CLASS = re.compile(r"\\.|\[(?:[^\]\\]|\\.)*\]", re.DOTALL)
_EBNF_RULE = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_.-]*\s*::=", re.MULTILINE)
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def check_structure(guide: Guide) -> None:
    """InvalidRequest naming the guide's field when it nests too deep, has too many rules or repeats too
    much; otherwise return (xgrammar may still refuse it)."""
    kind, text = guide.compiled_form()
    field = guide.param or f"the {guide.kind} constraint"
    if kind in ("json_schema", "structural_tag"):
        wrapping = STRUCTURAL_TAG_LEVELS if kind == "structural_tag" else 0  # around the schemas it holds
        _at_most(field, guide.param, "nests", text_depth(text), JSON_DEPTH + wrapping, "levels deep")
        objects = _JSON_STRING.sub('""', text).count("{")
        _at_most(field, guide.param, "has", objects, MAX_RULES, "schema objects")
        return
    plain = (_REGEX_ESCAPE_OR_CLASS if kind == "regex" else _EBNF_LITERAL).sub("x", text)
    _at_most(field, guide.param, "nests", _group_depth(plain), MAX_GROUP_DEPTH, "groups deep")
    if kind == "ebnf":
        _at_most(field, guide.param, "has", len(_EBNF_RULE.findall(plain)), MAX_RULES, "rules")
    bounds = [int(n) for match in _REPEAT.finditer(plain) for n in match.groups() if n]
    _at_most(field, guide.param, "repeats", max(bounds, default=0), MAX_REPEAT, "times")


def _group_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth = max(depth - 1, 0)
    return deepest


def _at_most(field: str, param: str | None, verb: str, value: int, limit: int, unit: str) -> None:
    if value > limit:
        raise InvalidRequest(
            f"{field} {verb} {value} {unit}; this server accepts at most {limit} before compiling", param=param
        )
