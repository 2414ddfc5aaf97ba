"""The grammar checker process, with the real xgrammar and the real SmolLM2 vocabulary."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from orchestrator.errors import InvalidRequest, ModelUnavailable, UnsupportedParameter
from orchestrator.structured.checker import GrammarChecker
from orchestrator.structured.guide import Guide, guide_from_response_format
from orchestrator.structured.tool_formats import TOOL_FORMATS
from orchestrator.structured.tool_grammar import tool_call_guide
from orchestrator.structured.tools import ToolDefinition, plan_tools

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def pathological_grammar(rules: int) -> str:
    """Many rules, each a star over a wide character class: xgrammar precomputes a token mask per
    position, which takes tens of seconds for a few thousand of them."""
    body = "\n".join(f'r{i} ::= [^"{chr(97 + i % 26)}]* "{chr(97 + (i * 7) % 26)}"' for i in range(rules))
    return "root ::= " + " ".join(f"r{i}" for i in range(rules)) + "\n" + body


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def checker(loop):
    checker = GrammarChecker(time_limit_s=1.0, processes=1)
    yield checker
    loop.run_until_complete(checker.close())


def test_a_valid_schema_passes_and_is_then_answered_from_the_cache(loop, checker, smollm2_vocab_dir):
    guide = guide_from_response_format(
        {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    )
    loop.run_until_complete(checker.check(smollm2_vocab_dir, guide))
    assert checker.xgrammar_version == "0.1.25"
    trips = checker.round_trips
    loop.run_until_complete(checker.check(smollm2_vocab_dir, Guide("json_schema", guide.text)))
    assert checker.round_trips == trips


def test_a_tool_grammar_passes_in_both_forms(loop, checker, smollm2_vocab_dir):
    """A structural tag is compiled as such and as its EBNF lowering (what TensorRT-LLM may be given)."""
    tools = [
        ToolDefinition.model_validate(
            {"type": "function", "function": {"name": "lookup", "parameters": PERSON}}
        )
    ]
    guide = tool_call_guide(plan_tools(tools, "required", None), TOOL_FORMATS["mistral"])
    loop.run_until_complete(checker.check(smollm2_vocab_dir, guide))


def test_an_invalid_schema_is_refused_with_xgrammars_reason(loop, checker, smollm2_vocab_dir):
    guide = guide_from_response_format(
        {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "objectx"}}}
    )
    with pytest.raises(InvalidRequest) as refused:
        loop.run_until_complete(checker.check(smollm2_vocab_dir, guide))
    assert refused.value.param == "response_format.json_schema.schema"
    assert refused.value.message == (
        'response_format.json_schema.schema cannot be enforced: xgrammar refused it: Unsupported type "objectx"'
    )
    trips = checker.round_trips
    with pytest.raises(InvalidRequest, match="objectx"):  # the refusal is remembered too
        loop.run_until_complete(checker.check(smollm2_vocab_dir, guide))
    assert checker.round_trips == trips


@pytest.mark.parametrize(
    ("guide", "reason"),
    [
        (Guide("regex", "a(", param="structured_outputs.regex"), "The parenthesis is not closed"),
        (Guide("ebnf", 'root ::= "a" |', param="structured_outputs.grammar"), "EBNF parser error"),
        (Guide("ebnf", 'start ::= "a"', param="structured_outputs.grammar"), "root"),
        (Guide("structural_tag", '{"type": "structural_tag"}', param="tools"), "format"),
    ],
)
def test_invalid_grammars_of_every_kind_are_refused(loop, checker, smollm2_vocab_dir, guide, reason):
    with pytest.raises(InvalidRequest) as refused:
        loop.run_until_complete(checker.check(smollm2_vocab_dir, guide))
    assert refused.value.param == guide.param
    assert reason in refused.value.message


def test_concurrent_checks_of_one_guide_share_one_compile(loop, checker, smollm2_vocab_dir):
    guide = Guide("regex", "[0-9]{3}-[0-9]{4}")

    async def three_at_once():
        await asyncio.gather(*(checker.check(smollm2_vocab_dir, guide) for _ in range(3)))

    trips = checker.round_trips
    loop.run_until_complete(three_at_once())
    assert checker.round_trips == trips + 1


def test_a_pathological_grammar_hits_the_time_limit_and_the_next_check_still_works(
    loop, checker, smollm2_vocab_dir
):
    slow = Guide("ebnf", pathological_grammar(400), param="structured_outputs.grammar")
    restarts = checker.restarts
    with pytest.raises(InvalidRequest) as refused:
        loop.run_until_complete(checker.check(smollm2_vocab_dir, slow))
    assert refused.value.message == (
        "structured_outputs.grammar: the grammar took longer than 1 s to compile; simplify it"
    )
    assert checker.restarts == restarts + 1
    loop.run_until_complete(checker.check(smollm2_vocab_dir, Guide("json_object")))  # a fresh process answers
    trips = checker.round_trips
    with pytest.raises(InvalidRequest, match="longer than 1 s"):  # a time-out is not remembered: checked again
        loop.run_until_complete(checker.check(smollm2_vocab_dir, slow))
    assert (checker.round_trips, checker.restarts) == (trips + 1, restarts + 2)


def test_a_folder_without_a_vocabulary_is_a_server_problem(loop, checker, tmp_path):
    with pytest.raises(ModelUnavailable, match=r"no tokenizer\.json"):
        loop.run_until_complete(checker.check(tmp_path, Guide("json_object")))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelUnavailable, match="could not read the vocabulary"):
        loop.run_until_complete(checker.check(tmp_path, Guide("json_object")))


def test_without_xgrammar_the_check_says_structured_outputs_need_it(smollm2_vocab_dir, tmp_path, monkeypatch):
    fake = tmp_path / "xgrammar"  # shadows the real package in the checker's process only
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('xgrammar is absent in this test')\n")
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(root)]))

    async def go():
        checker = GrammarChecker(python=sys.executable)
        try:
            for _ in range(2):  # the second answer comes without starting another process
                with pytest.raises(UnsupportedParameter) as refused:
                    await checker.check(smollm2_vocab_dir, Guide("json_object"))
                assert "xgrammar" in refused.value.message and "pip install" in refused.value.message
            assert checker.round_trips == 0
        finally:
            await checker.close()

    asyncio.run(go())


def test_the_checker_process_speaks_one_json_line_per_request(smollm2_vocab_dir):
    """The protocol, driven by hand: ready line, load, compile, a refusal."""
    import subprocess

    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.structured.grammar.checker_process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    requests = [
        {"op": "load", "vocab": "v", "folder": str(smollm2_vocab_dir), "stop_token_ids": None, "size": None},
        {"op": "compile", "vocab": "v", "kind": "regex", "text": "[a-z]+"},
        {"op": "compile", "vocab": "v", "kind": "json_schema", "text": "{"},
    ]
    out, _ = process.communicate("".join(json.dumps(r) + "\n" for r in requests), timeout=120)
    replies = [json.loads(line) for line in out.splitlines()]
    assert replies[0] == {"ready": True, "xgrammar": "0.1.25"}
    assert replies[1] == {"ok": True, "vocab_size": 49152}
    assert replies[2]["ok"] is True
    assert replies[3]["ok"] is False and replies[3]["error"]


# -- what a guide costs per step, and structural limits before compiling -----------------------------------------
def test_a_grammar_whose_mask_costs_too_much_per_step_is_refused_naming_its_field(loop, checker, smollm2_vocab_dir):
    costly = Guide("regex", "([a-z ]{64}\n){8}", param="structured_outputs.regex")  # ~20 ms per row per step
    with pytest.raises(InvalidRequest) as refused:
        loop.run_until_complete(checker.check(smollm2_vocab_dir, costly))
    assert refused.value.param == "structured_outputs.regex"
    assert "ms per row per decoding step" in refused.value.message
    assert f"the limit is {checker.step_budget_ms:g} ms" in refused.value.message


def test_each_row_of_a_request_is_charged_the_guides_cost(loop, checker, smollm2_vocab_dir):
    cheap = Guide("regex", "[a-z ]+", param="structured_outputs.regex")
    loop.run_until_complete(checker.check(smollm2_vocab_dir, cheap, rows=1))
    trips = checker.round_trips
    with pytest.raises(InvalidRequest, match=r"rows \(n\)") as refused:
        loop.run_until_complete(checker.check(smollm2_vocab_dir, cheap, rows=1_000_000))
    assert refused.value.param == "structured_outputs.regex"
    assert checker.round_trips == trips  # the cost was measured once and remembered


@pytest.mark.parametrize(
    ("guide", "words"),
    [
        (Guide("regex", "(" * 40 + "a" + ")" * 40, param="structured_outputs.regex"), "40 groups deep"),
        (Guide("regex", "a{5000}", param="structured_outputs.regex"), "repeats 5000 times"),
        (Guide("ebnf", pathological_grammar(1100), param="structured_outputs.grammar"), "1101 rules"),
        (Guide("json_schema", json.dumps({"anyOf": [{"type": "object"}] * 1100}), param="response_format"),
         "1101 schema objects"),
    ],
)
def test_a_guide_too_deep_or_too_large_is_refused_before_compiling(loop, checker, smollm2_vocab_dir, guide, words):
    trips = checker.round_trips
    with pytest.raises(InvalidRequest, match=words) as refused:
        loop.run_until_complete(checker.check(smollm2_vocab_dir, guide))
    assert refused.value.param == guide.param
    assert checker.round_trips == trips


# -- several checks at once: a pool of processes, a cap per key, a deadline on waiting ---------------------------
@pytest.fixture(scope="module")
def pool(loop, smollm2_vocab_dir):
    pool = GrammarChecker(time_limit_s=2.0, processes=2, per_key=1, wait_s=60.0)

    async def warm():  # both processes started, each with the vocabulary read
        await asyncio.gather(*(
            pool.check(smollm2_vocab_dir, Guide("regex", f"[0-9]{{{i + 1}}}"), key=f"warm{i}") for i in range(2)
        ))

    loop.run_until_complete(warm())
    yield pool
    loop.run_until_complete(pool.close())


async def compiling(pool: GrammarChecker) -> None:
    """Return once one of the pool's processes is compiling a check (not a fixed pause: a busy machine is slow)."""
    deadline = asyncio.get_running_loop().time() + 30
    while not any(pending.started for pending in pool._inflight.values()):
        assert asyncio.get_running_loop().time() < deadline, "no check started compiling"
        await asyncio.sleep(0.01)


def test_one_keys_slow_grammars_do_not_hold_up_another_keys_fresh_one(loop, pool, smollm2_vocab_dir):
    slow = [Guide("ebnf", pathological_grammar(300 + i)) for i in range(2)]

    async def race():
        attack = [asyncio.ensure_future(pool.check(smollm2_vocab_dir, g, key="a")) for g in slow]
        await compiling(pool)
        await pool.check(smollm2_vocab_dir, Guide("regex", "[a-f]{3}"), key="b")
        done = [task.done() for task in attack]
        await asyncio.gather(*attack, return_exceptions=True)
        return done

    assert loop.run_until_complete(race()) == [False, False]


def test_without_keys_a_fresh_grammar_takes_the_free_process_beside_a_slow_one(loop, pool, smollm2_vocab_dir):
    """A server without keys has one caller, anonymous (key None): its checks use the whole pool."""
    async def race():
        slow = asyncio.ensure_future(pool.check(smollm2_vocab_dir, Guide("ebnf", pathological_grammar(330)), key=None))
        await compiling(pool)
        await pool.check(smollm2_vocab_dir, Guide("regex", "[l-p]{3}"), key=None)
        done = slow.done()
        await asyncio.gather(slow, return_exceptions=True)
        return done

    assert loop.run_until_complete(race()) is False


def test_a_caller_waits_at_most_the_deadline_then_gets_a_retry_time(loop, pool, smollm2_vocab_dir):
    async def behind_own_slow_check():
        slow = asyncio.ensure_future(pool.check(smollm2_vocab_dir, Guide("ebnf", pathological_grammar(320)), key="a"))
        await compiling(pool)
        pool.wait_s = 0.5
        try:
            with pytest.raises(ModelUnavailable, match="busy") as busy:
                await pool.check(smollm2_vocab_dir, Guide("regex", "[g-k]{3}", param="structured_outputs.regex"),
                                 key="a")
        finally:
            pool.wait_s = 60.0
        await asyncio.gather(slow, return_exceptions=True)
        return busy.value

    busy = loop.run_until_complete(behind_own_slow_check())
    assert busy.retry_after_s == pool.time_limit_s
    assert "structured_outputs.regex" in busy.message
