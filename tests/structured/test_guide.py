"""Guides from response_format and structured_outputs: every conversion, and every refusal naming its field."""

from __future__ import annotations

import json

import pytest

from orchestrator.errors import InvalidRequest
from orchestrator.structured.guide import (
    MAX_GUIDE_CHARS,
    Guide,
    ebnf_literal,
    guide_from_response_format,
    guide_from_structured_outputs,
    single_guide,
)

SCHEMA = {
    "type": "object",
    "properties": {"b": {"type": "string"}, "a": {"type": "integer"}},
    "required": ["b"],
}


def test_text_is_no_constraint():
    assert guide_from_response_format({"type": "text"}) is None
    assert guide_from_response_format(None) is None


def test_json_object():
    guide = guide_from_response_format({"type": "json_object"})
    assert guide == Guide("json_object")
    assert guide.param == "response_format"
    assert guide.compiled_form() == ("json_schema", '{"type":"object"}')
    assert guide.trtllm_guide() == ("JSON_SCHEMA", '{"type":"object"}')


def test_json_schema_takes_the_inner_schema_never_the_wrapper():
    guide = guide_from_response_format(
        {
            "type": "json_schema",
            "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True, "description": "d"},
        }
    )
    assert guide.kind == "json_schema"
    assert json.loads(guide.text) == SCHEMA
    assert list(json.loads(guide.text)["properties"]) == ["b", "a"]  # order kept: it orders the output
    assert guide.param == "response_format.json_schema.schema"
    assert guide.trtllm_guide() == ("JSON_SCHEMA", guide.text)


@pytest.mark.parametrize(
    ("value", "param", "words"),
    [
        ("json", "response_format", "must be an object"),
        ({"type": "yaml"}, "response_format.type", "text, json_object, json_schema"),
        ({"type": "text", "extra": 1}, "response_format.extra", "unknown field"),
        ({"type": "json_schema"}, "response_format.json_schema", "name and schema"),
        (
            {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
            "response_format.json_schema.name",
            "1 to 64",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "a b", "schema": SCHEMA}},
            "response_format.json_schema.name",
            "1 to 64",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": "yes"}},
            "response_format.json_schema.strict",
            "boolean",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x"}},
            "response_format.json_schema.schema",
            "required",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}},
            "response_format.json_schema.schema",
            "JSON Schema object",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "format": 1}},
            "response_format.json_schema.format",
            "unknown field",
        ),
    ],
)
def test_malformed_response_formats_are_refused_naming_the_field(value, param, words):
    with pytest.raises(InvalidRequest) as refused:
        guide_from_response_format(value)
    assert refused.value.param == param
    assert words in refused.value.message


def test_structured_outputs_json_as_object_or_text():
    as_object = guide_from_structured_outputs({"json": SCHEMA})
    as_text = guide_from_structured_outputs({"json": json.dumps(SCHEMA)})
    assert as_object == as_text
    assert (as_object.kind, as_object.param) == ("json_schema", "structured_outputs.json")


def test_structured_outputs_regex_grammar_and_json_object():
    assert guide_from_structured_outputs({"regex": "[0-9]+"}) == Guide("regex", "[0-9]+")
    assert guide_from_structured_outputs({"grammar": 'root ::= "a"'}) == Guide("ebnf", 'root ::= "a"')
    assert guide_from_structured_outputs({"json_object": True}) == Guide("json_object")
    assert Guide("regex", "x").trtllm_guide() == ("REGEX", "x")
    assert Guide("ebnf", "g").trtllm_guide() == ("EBNF_GRAMMAR", "g")
    assert Guide("structural_tag", "{}").trtllm_guide() == ("STRUCTURAL_TAG", "{}")


def test_choice_is_a_grammar_of_exactly_those_strings():
    guide = guide_from_structured_outputs({"choice": ["yes", 'say "no"', "a\\b\n", "yes"]})
    assert guide.kind == "ebnf"
    assert guide.text == 'root ::= "yes" | "say \\"no\\"" | "a\\\\b\\n"'


def test_ebnf_literals_escape_control_characters_as_xgrammar_reads_them():
    assert ebnf_literal("a\x01\t\x7f") == '"a\\u0001\\t\\u007f"'


@pytest.mark.parametrize(
    ("value", "param", "words"),
    [
        ([1], "structured_outputs", "must be an object"),
        ({}, "structured_outputs", "exactly one of"),
        ({"regex": "a", "choice": ["a"]}, "structured_outputs", "exactly one of"),
        ({"json": "{not json"}, "structured_outputs.json", "not valid JSON"),
        ({"json": "[1, 2]"}, "structured_outputs.json", "JSON Schema object"),
        ({"regex": ""}, "structured_outputs.regex", "non-empty string"),
        ({"grammar": 3}, "structured_outputs.grammar", "non-empty string"),
        ({"choice": []}, "structured_outputs.choice", "non-empty list of strings"),
        ({"choice": ["a", 1]}, "structured_outputs.choice", "non-empty list of strings"),
        ({"json_object": False}, "structured_outputs.json_object", "must be true"),
        ({"regex": "a", "whitespace_pattern": " "}, "structured_outputs.whitespace_pattern", "not supported"),
        ({"regex": "a", "guided": 1}, "structured_outputs.guided", "unknown field"),
        (
            {"regex": "a" * (MAX_GUIDE_CHARS + 1)},
            "structured_outputs.regex",
            f"the limit is {MAX_GUIDE_CHARS}",
        ),
    ],
)
def test_malformed_structured_outputs_are_refused_naming_the_field(value, param, words):
    with pytest.raises(InvalidRequest) as refused:
        guide_from_structured_outputs(value)
    assert refused.value.param == param
    assert words in refused.value.message


def test_at_most_one_constraint_per_request():
    response = guide_from_response_format({"type": "json_object"})
    extension = guide_from_structured_outputs({"regex": "a+"})
    assert single_guide(None, extension) is extension
    assert single_guide(None, None) is None
    with pytest.raises(InvalidRequest) as refused:
        single_guide(response, extension)
    assert refused.value.message == (
        "a request can carry at most one output constraint; this one has response_format and structured_outputs.regex"
    )
    assert refused.value.param == "structured_outputs.regex"


def test_a_guide_crosses_the_process_boundary_as_plain_json():
    guide = guide_from_structured_outputs({"choice": ["a", "b"]})
    wire = json.loads(json.dumps(guide.to_wire()))
    assert wire == {"kind": "ebnf", "text": guide.text}
    assert Guide.from_wire(wire) == guide
    assert Guide.from_wire({"kind": "json_object"}) == Guide("json_object")


def test_a_guide_is_checked_when_made():
    with pytest.raises(ValueError, match="unknown guide kind"):
        Guide("yaml", "x")
    with pytest.raises(ValueError, match="needs a text"):
        Guide("regex")
    with pytest.raises(ValueError, match="has no text"):
        Guide("json_object", "{}")
