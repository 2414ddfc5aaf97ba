"""Tools and tool-call history in prompts: Hugging Face shapes for templates that read `tools`, and a system
prompt plus plain turns for those that do not (SmolLM2's real template)."""

from __future__ import annotations

import pytest

from orchestrator.errors import InvalidRequest
from orchestrator.structured.tool_formats import TOOL_FORMATS
from orchestrator.structured.tool_prompt import prompt_messages, template_supports_tools, tool_system_prompt
from orchestrator.structured.tools import NamedToolChoice, ToolDefinition, plan_tools
from orchestrator.text.chat_template import compile_template, render_chat
from orchestrator.text.prompt import PromptEncoder

WEATHER = ToolDefinition.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
)
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "24 C"}]},
]

# A small template written the way Hugging Face tool templates read tools, calls and results.
TOOL_TEMPLATE = (
    "{% if tools %}[tools]{% for t in tools %}{{ t.function.name }};{% endfor %}|{% endif %}"
    "{% for m in messages %}<{{ m.role }}>"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.id }}:{{ c.function.name }}{{ c.function.arguments | tojson }}"
    "{% endfor %}{% elif m.role == 'tool' %}{{ m.name }}/{{ m.tool_call_id }}={{ m.content }}"
    "{% else %}{{ m.content }}{% endif %}|{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_template_supports_tools_when_it_reads_the_tools_variable(smollm2_dir):
    assert not template_supports_tools(PromptEncoder(smollm2_dir).chat_template)
    assert template_supports_tools(TOOL_TEMPLATE)
    assert not template_supports_tools(None)


def test_templates_that_read_tools_get_hugging_face_shapes():
    prepared = prompt_messages(
        CONVERSATION, plan_tools([WEATHER], None, None), TOOL_FORMATS["hermes"], template_reads_tools=True
    )
    assert prepared.tools == [WEATHER.template_input()]
    assert prepared.messages[2]["tool_calls"][0] == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    assert prepared.messages[4] == {
        "role": "tool",
        "content": "24 C",
        "tool_call_id": "call_2",
        "name": "get_weather",
    }
    rendered = compile_template(TOOL_TEMPLATE).render(
        messages=prepared.messages, tools=prepared.tools, add_generation_prompt=True
    )
    assert rendered == (
        "[tools]get_weather;|<system>Be brief.|<user>Weather in Paris and Rome?|"
        '<assistant>call_1:get_weather{"city": "Paris"}call_2:get_weather{"city": "Rome"}|'
        "<tool>get_weather/call_1=18 C|<tool>get_weather/call_2=24 C|<assistant>"
    )


def test_templates_without_tools_get_a_system_prompt_and_plain_turns(smollm2_dir):
    encoder = PromptEncoder(smollm2_dir)
    fmt = TOOL_FORMATS["hermes"]
    plan = plan_tools([WEATHER], "required", None)
    prepared = prompt_messages(CONVERSATION, plan, fmt, template_reads_tools=False)
    assert prepared.tools is None
    assert [m["role"] for m in prepared.messages] == ["system", "user", "assistant", "user"]
    assert prepared.messages[0]["content"] == "Be brief.\n\n" + tool_system_prompt(plan, fmt)
    assert prepared.messages[2]["content"] == fmt.calls_text(
        [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    )
    assert prepared.messages[3]["content"] == (
        '<tool_response>\n{"name": "get_weather", "content": "18 C"}\n</tool_response>\n'
        '<tool_response>\n{"name": "get_weather", "content": "24 C"}\n</tool_response>'
    )
    text = render_chat(encoder.chat_template, prepared.messages, encoder.special_tokens)
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools.")
    assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert encoder.encode_chat(prepared.messages)


def test_the_system_prompt_lists_the_tools_and_the_format_for_each_mode():
    fmt = TOOL_FORMATS["llama3_json"]
    auto = tool_system_prompt(plan_tools([WEATHER], "auto", None), fmt)
    assert '"name": "get_weather", "description": "Current weather in a city"' in auto
    assert '{"name": "<function name>", "parameters": <arguments as a JSON object>}' in auto
    assert "otherwise answer normally" in auto and "several calls" in auto
    choice = NamedToolChoice.model_validate({"type": "function", "function": {"name": "get_weather"}})
    named = tool_system_prompt(plan_tools([WEATHER], choice, None), fmt)
    assert "one call of get_weather" in named and "one call at a time" in named


def test_a_first_message_that_is_not_system_gets_one_and_none_shows_no_tools():
    messages = [{"role": "user", "content": "Hi"}]
    fmt = TOOL_FORMATS["mistral"]
    prepared = prompt_messages(messages, plan_tools([WEATHER], "auto", None), fmt, template_reads_tools=False)
    assert [m["role"] for m in prepared.messages] == ["system", "user"]
    assert "[TOOL_CALLS][" in prepared.messages[0]["content"]
    for reads in (False, True):
        none = prompt_messages(messages, plan_tools([WEATHER], "none", None), fmt, template_reads_tools=reads)
        assert none.messages == [{"role": "user", "content": "Hi"}] and none.tools is None


@pytest.mark.parametrize("reads", [False, True])
def test_history_errors_name_the_message(reads):
    fmt = TOOL_FORMATS["hermes"]
    broken = [dict(m) for m in CONVERSATION]
    broken[2] = {
        **broken[2],
        "tool_calls": [{"id": "call_1", "function": {"name": "get_weather", "arguments": "[1, 2]"}}],
    }
    with pytest.raises(InvalidRequest) as refused:
        prompt_messages(broken[:3], None, fmt, template_reads_tools=reads)
    assert refused.value.param == "messages[2].tool_calls[0].function.arguments"
    orphan = [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_9", "content": "y"}]
    with pytest.raises(InvalidRequest) as refused:
        prompt_messages(orphan, None, fmt, template_reads_tools=reads)
    assert refused.value.param == "messages[1].tool_call_id"


@pytest.mark.parametrize("reads", [False, True])
def test_a_call_cut_short_comes_back_as_the_model_wrote_it(reads):
    """A forced call cut by max_tokens (finish_reason length) has arguments that are not JSON; a client sends the
    turn back as it got it. The server never refuses its own output: the model sees the text it wrote."""
    fmt = TOOL_FORMATS["hermes"]
    cut = [dict(m) for m in CONVERSATION[:2]] + [{
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Par'}}],
    }]
    shaped = prompt_messages(cut, None, fmt, template_reads_tools=reads).messages
    last = shaped[-1]
    if reads:
        assert last["tool_calls"][0]["function"]["arguments"] == '{"city": "Par'
    else:
        assert '{"name": "get_weather", "arguments": {"city": "Par}' in last["content"]
