"""Limits users expect, in-process: a model's max_tokens ceiling (models.toml), a body that does not arrive in
time (408), and a text prompt too long to fit whatever it tokenises to (refused before tokenising)."""

from __future__ import annotations

import asyncio

import pytest

from tests.app.harness import running_app

HI = [{"role": "user", "content": "Say hello."}]


def ceiling_flags(tmp_path, model: str, ceiling: int) -> tuple[str, ...]:
    settings = tmp_path / "models.toml"
    settings.write_text(f"[models.{model}]\nmax_tokens = {ceiling}\n")
    return ("--model-settings", str(settings))


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_asking_for_more_than_the_ceiling_is_a_400_naming_it(catalogue, tmp_path, field):
    [model] = catalogue.engines

    async def go():
        async with running_app(catalogue, *ceiling_flags(tmp_path, model, 8)) as app:
            response = await app.client.post("/v1/chat/completions", json={"model": model, "messages": HI, field: 9})
            return response.status, await response.json()

    status, body = asyncio.run(go())
    assert status == 400 and body["error"]["param"] == field
    assert body["error"]["message"] == f"{field} is 9, more than this model allows (8 tokens per choice)"


@pytest.mark.parametrize(
    "path, body, ceiling, expected",
    [
        ("/v1/chat/completions", {"messages": HI}, 8, 8),  # without max_tokens the ceiling is the default
        ("/v1/chat/completions", {"messages": HI, "max_tokens": 5}, 8, 5),
        ("/v1/completions", {"prompt": "Once"}, 8, 8),  # completions' own default of 16, cut to the ceiling
        ("/v1/completions", {"prompt": "Once"}, 100, 16),
    ],
)
def test_the_ceiling_is_the_default_when_a_request_gives_none(catalogue, tmp_path, path, body, ceiling, expected):
    [model] = catalogue.engines

    async def go():
        async with running_app(catalogue, *ceiling_flags(tmp_path, model, ceiling)) as app:
            answering = asyncio.create_task(app.client.post(path, json={"model": model, "n": 2, **body}))
            submitted = [await app.workers.next_submit() for _ in range(2)]
            for worker, request in submitted:
                worker.finish(request.id)
            assert (await answering).status == 200
            return [request.max_new_tokens for _, request in submitted]

    assert asyncio.run(go()) == [expected, expected]


def test_min_tokens_above_the_ceiling_is_a_400(catalogue, tmp_path):
    [model] = catalogue.engines

    async def go():
        async with running_app(catalogue, *ceiling_flags(tmp_path, model, 8)) as app:
            response = await app.client.post("/v1/chat/completions", json={"model": model, "messages": HI,
                                                                           "min_tokens": 9})
            return response.status, await response.json()

    status, body = asyncio.run(go())
    assert status == 400 and body["error"]["param"] == "min_tokens"
    assert body["error"]["message"] == "min_tokens is 9, more than this model allows (8 tokens per choice)"


def test_a_body_that_does_not_arrive_in_time_is_a_408(catalogue):
    async def go():
        async with running_app(catalogue, "--http.body-timeout-s", "0.2") as app:
            server = app.client.server
            reader, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"model\": ")  # and the other 90 bytes never come
            status_line = await asyncio.wait_for(reader.readline(), 30)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
            body = await asyncio.wait_for(reader.readexactly(length), 30)
            writer.close()
            return status_line, body

    status_line, body = asyncio.run(go())
    assert status_line.startswith(b"HTTP/1.1 408")
    assert b'"code":"request_timeout"' in body and b"the request body did not arrive within 0.2 s" in body


@pytest.mark.parametrize("path, param", [("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")])
def test_a_prompt_longer_than_any_fitting_prompt_is_refused_before_tokenising(catalogue, monkeypatch, path, param):
    [engine] = catalogue.engines.values()
    monkeypatch.setattr(engine.prompts, "encode_text", lambda *_: pytest.fail("the prompt was tokenised"))
    limit = engine.manifest.limits.max_input_len
    text = "ab" * (limit * 50)

    async def go():
        async with running_app(catalogue) as app:
            prompt = {"prompt": text} if param == "prompt" else {"messages": [{"role": "user", "content": text}]}
            response = await app.client.post(path, json={"model": engine.name, **prompt})
            return response.status, await response.json()

    status, body = asyncio.run(go())
    assert status == 400 and body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == param
    assert f"maximum prompt length is {limit} tokens" in body["error"]["message"]
    assert "but the prompt has" in body["error"]["message"] and "characters" in body["error"]["message"]
