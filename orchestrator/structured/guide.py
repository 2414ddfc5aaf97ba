"""One request's output constraint (a Guide), and its conversions from the request fields that ask for one.

A Guide is a plain value that crosses the process boundary as JSON: the HTTP process makes it from
OpenAI's `response_format` or vLLM's `structured_outputs`, or from the tools (`tool_grammar.py`); the
grammar checker compiles it before admission; the worker's backend enforces it (xgrammar's matcher on
hf, TensorRT-LLM's GuidedDecodingParams on trtllm; `trtllm_guide()` names the guide type there).

Kinds: `json_schema` (text: the schema as JSON), `json_object` (any JSON object; no text), `regex`,
`ebnf` (xgrammar's EBNF, root rule `root`), `structural_tag` (xgrammar's structural-tag JSON).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from orchestrator.errors import InvalidRequest
from orchestrator.structured.json_depth import check_depth

GuideKind = Literal["json_schema", "json_object", "regex", "ebnf", "structural_tag"]
GUIDE_KINDS: tuple[str, ...] = get_args(GuideKind)
MAX_GUIDE_CHARS = 262_144  # a schema, regex or grammar longer than this is refused before compiling
ANY_OBJECT_SCHEMA = '{"type":"object"}'  # what json_object compiles to, on every backend
_SCHEMA_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_TRTLLM_GUIDE_TYPE = {"json_schema": "JSON_SCHEMA", "json_object": "JSON_SCHEMA", "regex": "REGEX",
                      "ebnf": "EBNF_GRAMMAR", "structural_tag": "STRUCTURAL_TAG"}


@dataclass(frozen=True)
class Guide:
    """A constraint on one request's output. `param` names the request field it came from (for error
    messages); it is not part of the value's identity and does not cross the process boundary."""

    kind: GuideKind
    text: str = ""
    param: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in GUIDE_KINDS:
            raise ValueError(f"unknown guide kind {self.kind!r}; expected one of {', '.join(GUIDE_KINDS)}")
        if (self.kind == "json_object") != (self.text == ""):
            verb = "has no" if self.kind == "json_object" else "needs a"
            raise ValueError(f"a {self.kind} guide {verb} text")

    def compiled_form(self) -> tuple[str, str]:
        """(kind, text) as compiled: json_object is the JSON schema of any object, everywhere."""
        return ("json_schema", ANY_OBJECT_SCHEMA) if self.kind == "json_object" else (self.kind, self.text)

    def trtllm_guide(self) -> tuple[str, str]:
        """(GuidedDecodingParams.GuideType member name, guide string) for TensorRT-LLM 1.2's Executor."""
        return _TRTLLM_GUIDE_TYPE[self.kind], self.compiled_form()[1]

    def to_wire(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Guide:
        return cls(kind=data["kind"], text=data.get("text", ""))


def single_guide(*guides: Guide | None) -> Guide | None:
    """The one constraint among those a request asked for; two or more are refused, naming both fields."""
    present = [g for g in guides if g is not None]
    if len(present) > 1:
        names = " and ".join(g.param or g.kind for g in present)
        raise InvalidRequest(f"a request can carry at most one output constraint; this one has {names}",
                             param=present[1].param)
    return present[0] if present else None


def guide_from_response_format(value: Any) -> Guide | None:
    """OpenAI's `response_format`: `text` (no constraint), `json_object`, or `json_schema` whose INNER
    `schema` is the constraint (never the `{name, schema, strict}` wrapper)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest(f"response_format must be an object (got {_show(value)})",
                             param="response_format")
    kind = value.get("type")
    allowed_keys = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
    if kind not in allowed_keys:
        raise InvalidRequest("response_format.type must be one of text, json_object, json_schema "
                             f"(got {_show(kind)})", param="response_format.type")
    _refuse_unknown_keys(value, allowed_keys[kind], "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return Guide("json_object", param="response_format")
    return _json_schema_wrapper(value.get("json_schema"))


def _json_schema_wrapper(wrapper: Any) -> Guide:
    param = "response_format.json_schema"
    if not isinstance(wrapper, dict):
        raise InvalidRequest(f"{param} must be an object with name and schema (got {_show(wrapper)})",
                             param=param)
    _refuse_unknown_keys(wrapper, {"name", "schema", "strict", "description"}, param)
    name = wrapper.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise InvalidRequest(f"{param}.name must be 1 to 64 letters, digits, '_' or '-' (got {_show(name)})",
                             param=f"{param}.name")
    strict = wrapper.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest(f"{param}.strict must be a boolean (got {_show(strict)})",
                             param=f"{param}.strict")
    if "schema" not in wrapper:
        raise InvalidRequest(f"{param}.schema is required: the JSON Schema the output must follow",
                             param=f"{param}.schema")
    return json_schema_guide(wrapper["schema"], param=f"{param}.schema")


def json_schema_guide(schema: Any, *, param: str) -> Guide:
    """A json_schema guide from a schema given as an object or as JSON text."""
    check_depth(schema, param)
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"{param} is not valid JSON: {exc}", param=param) from exc
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param} must be a JSON Schema object (got {_show(schema)})", param=param)
    # Key order is kept: it is the order of the output's fields.
    text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    return Guide("json_schema", _bounded(text, param), param=param)


_STRUCTURED_OUTPUT_FIELDS = ("json", "regex", "choice", "grammar", "json_object")
_UNSUPPORTED_STRUCTURED_OUTPUT_FIELDS = ("structural_tag", "disable_fallback", "disable_any_whitespace",
                                         "disable_additional_properties", "whitespace_pattern", "backend")


def guide_from_structured_outputs(value: Any) -> Guide | None:
    """vLLM's `structured_outputs` extension: exactly one of `json` (a schema, as an object or JSON text),
    `regex`, `choice` (the output is exactly one of these strings), `grammar` (EBNF), `json_object: true`."""
    if value is None:
        return None
    param = "structured_outputs"
    if not isinstance(value, dict):
        raise InvalidRequest(f"{param} must be an object (got {_show(value)})", param=param)
    for key in value:
        if key in _UNSUPPORTED_STRUCTURED_OUTPUT_FIELDS:
            raise InvalidRequest(f"{param}.{key} is not supported by this server", param=f"{param}.{key}")
    _refuse_unknown_keys(value, set(_STRUCTURED_OUTPUT_FIELDS), param)
    given = [key for key in _STRUCTURED_OUTPUT_FIELDS if value.get(key) is not None]
    if len(given) != 1:
        raise InvalidRequest(f"{param} needs exactly one of {', '.join(_STRUCTURED_OUTPUT_FIELDS)} "
                             f"(got {len(given)}: {given})", param=param)
    key = given[0]
    return _STRUCTURED_OUTPUT_CONVERTERS[key](value[key], f"{param}.{key}")


def _text_guide(kind: GuideKind):
    def convert(value: Any, param: str) -> Guide:
        if not isinstance(value, str) or not value:
            raise InvalidRequest(f"{param} must be a non-empty string (got {_show(value)})", param=param)
        return Guide(kind, _bounded(value, param), param=param)

    return convert


def _json_object_flag(value: Any, param: str) -> Guide:
    if value is not True:
        raise InvalidRequest(f"{param} must be true when given (got {_show(value)})", param=param)
    return Guide("json_object", param=param)


def choice_guide(choices: Any, param: str) -> Guide:
    """An EBNF grammar whose only sentences are the given strings."""
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise InvalidRequest(f"{param} must be a non-empty list of strings (got {_show(choices)})",
                             param=param)
    alternatives = " | ".join(ebnf_literal(choice) for choice in dict.fromkeys(choices))
    return Guide("ebnf", _bounded(f"root ::= {alternatives}", param), param=param)


_EBNF_ESCAPES = {chr(code): f"\\u{code:04x}" for code in (*range(0x20), 0x7F)}
_EBNF_ESCAPES |= {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def ebnf_literal(text: str) -> str:
    """`text` as an xgrammar EBNF string literal (control characters as \\uXXXX, which its parser reads)."""
    return '"' + "".join(_EBNF_ESCAPES.get(char, char) for char in text) + '"'


_STRUCTURED_OUTPUT_CONVERTERS = {"json": lambda value, param: json_schema_guide(value, param=param),
                                 "regex": _text_guide("regex"), "grammar": _text_guide("ebnf"),
                                 "choice": choice_guide, "json_object": _json_object_flag}


def _bounded(text: str, param: str) -> str:
    if len(text) > MAX_GUIDE_CHARS:
        raise InvalidRequest(f"{param} is {len(text)} characters long; the limit is {MAX_GUIDE_CHARS}",
                             param=param)
    return text


def _refuse_unknown_keys(value: dict, allowed: set[str], param: str) -> None:
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise InvalidRequest(f"{param} has unknown field(s) {', '.join(unknown)}; "
                             f"allowed: {', '.join(sorted(allowed))}", param=f"{param}.{unknown[0]}")


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 else text[:77] + "..."
