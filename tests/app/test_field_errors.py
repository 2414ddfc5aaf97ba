"""A request the server cannot take as given is a 400 whose `param` names the field, on every endpoint that
reads the field: /tokenize and /detokenize name their own fields, the chat template's reserved names are refused
wherever a template is rendered, and fields that contradict each other are refused instead of one winning
silently. The model list carries the fields vLLM's benchmark client reads. These need no model: the real app in-process
over fake workers (the conformance suite checks what does, on every backend)."""

from __future__ import annotations

import asyncio
import json

from tests.app.harness import running_app

HI = [{"role": "user", "content": "Say hello."}]


def _refusals(catalogue, *calls) -> list[tuple[str | None, str]]:
    async def go():
        async with running_app(catalogue) as app:
            answers = []
            for path, body in calls:
                response = await app.client.post(path, json={"model": app.model, **body})
                assert response.status == 400, (path, body, await response.text())
                error = (await response.json())["error"]
                answers.append((error["param"], error["message"]))
            return answers

    return asyncio.run(go())


def test_tokenize_and_detokenize_errors_name_their_own_fields(catalogue):
    answers = _refusals(
        catalogue,
        ("/tokenize", {"prompt": "hi", "return_token_strs": 1}),
        ("/tokenize", {"messages": HI, "add_generation_prompt": "yes"}),
        ("/tokenize", {"messages": [{"role": "user", "content": 3}]}),
        ("/detokenize", {"tokens": [5, -1]}),
    )
    assert [param for param, _ in answers] == [
        "return_token_strs", "add_generation_prompt", "messages[0].content", "tokens[1]"]


def test_names_the_server_gives_the_chat_template_are_refused_in_chat_template_kwargs_everywhere(catalogue):
    answers = _refusals(
        catalogue,
        ("/v1/chat/completions", {"messages": HI, "chat_template_kwargs": {"add_generation_prompt": False}}),
        ("/tokenize", {"messages": HI, "chat_template_kwargs": {"add_generation_prompt": False}}),
        ("/tokenize", {"messages": HI, "chat_template_kwargs": {"tools": []}}),
        ("/v1/chat/completions", {"messages": HI, "chat_template_kwargs": {"eos_token": "<|x|>", "bos_token": "y"}}),
    )
    assert [param for param, _ in answers] == ["chat_template_kwargs"] * 4
    assert answers[3][1].startswith("bos_token, eos_token cannot be set through chat_template_kwargs")


def test_fields_that_contradict_each_other_are_refused(catalogue):
    answers = _refusals(
        catalogue,
        ("/v1/chat/completions", {"messages": HI, "max_tokens": 5, "max_completion_tokens": 7}),
        ("/v1/chat/completions", {"messages": HI, "stream_options": {"include_usage": True}}),
        ("/v1/completions", {"prompt": "hi", "stream": False, "stream_options": {"include_usage": True}}),
    )
    assert [param for param, _ in answers] == ["max_completion_tokens", "stream_options", "stream_options"]
    assert "disagree" in answers[0][1] and "only allowed when stream is true" in answers[1][1]


def test_the_same_max_tokens_under_both_names_is_accepted(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            body = {"model": app.model, "messages": HI, "max_tokens": 3, "max_completion_tokens": 3}
            posted = asyncio.create_task(app.client.post("/v1/chat/completions", json=body))
            worker, request = await asyncio.wait_for(app.workers.submits.get(), 30)
            worker.finish(request.id)
            response = await posted
            return response.status, request.max_new_tokens

    status, max_tokens = asyncio.run(go())
    assert (status, max_tokens) == (200, 3)


def test_model_cards_carry_vllms_root_and_parent(catalogue):
    async def go():
        async with running_app(catalogue) as app:
            response = await app.client.get("/v1/models")
            return app.model, (await response.json())["data"]

    model, [card] = asyncio.run(go())
    assert card["id"] == card["root"] == model and card["parent"] is None


def _answer(catalogue, path: str, body: bytes) -> tuple[int, dict]:
    async def go():
        async with running_app(catalogue) as app:
            response = await app.client.post(path, data=body, headers={"Content-Type": "application/json"})
            return response.status, await response.json()

    return asyncio.run(go())


def test_malformed_json_is_a_400_in_openais_shape(catalogue):
    status, body = _answer(catalogue, "/v1/chat/completions", b'{"model": ')
    assert status == 400 and body["error"]["type"] == "invalid_request_error" and "JSON" in body["error"]["message"]


def test_a_wrong_type_a_bad_message_and_an_unknown_argument_are_named(catalogue):
    answers = _refusals(
        catalogue,
        ("/v1/chat/completions", {"messages": HI, "max_tokens": "ten"}),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}),
        ("/v1/chat/completions", {"messages": HI, "max_tokenz": 3}),
    )
    assert [param for param, _ in answers[:2]] == ["max_tokens", "messages[0].role"]
    assert "max_tokens" in answers[0][1] and "max_tokenz" in answers[2][1]


def test_an_unknown_model_is_a_404_naming_it(catalogue):
    status, body = _answer(catalogue, "/v1/chat/completions",
                           json.dumps({"model": "no-such-model", "messages": HI}).encode())
    assert status == 404 and body["error"]["code"] == "model_not_found" and "no-such-model" in body["error"]["message"]
