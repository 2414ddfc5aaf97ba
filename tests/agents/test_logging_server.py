"""The logging server records what a client sends (secrets redacted) and answers each API's smallest valid reply,
or its own 400; and `make test-agents`' verdict on a client's run."""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from tests.agents import run
from tests.agents.logging_server import ANSWER, Recorder, build_app


def events(text: str) -> list[tuple[str, dict]]:
    """(event name, data) pairs of an SSE body; every data line is JSON."""
    pairs = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        pairs.append((lines["event"], json.loads(lines["data"])))
    return pairs


def exchange(folder: Path, path: str, body: dict, fail: int | None = None, times: int = 1) -> list[tuple[int, str]]:
    async def go() -> list[tuple[int, str]]:
        async with TestClient(TestServer(build_app(Recorder(folder, fail), "m"))) as client:
            answers = []
            for _ in range(times):
                response = await client.post(path, json=body, headers={"Authorization": "Bearer sk-secret",
                                                                        "x-api-key": "sk-secret"})
                answers.append((response.status, await response.text()))
            return answers

    return asyncio.run(go())


def test_a_request_is_recorded_with_its_secrets_redacted(tmp_path):
    exchange(tmp_path, "/v1/messages?beta=true", {"model": "m", "stream": False})
    [record] = [json.loads(p.read_text()) for p in tmp_path.iterdir()]
    assert (record["method"], record["path"], record["query"]) == ("POST", "/v1/messages", {"beta": "true"})
    assert record["body"] == {"model": "m", "stream": False}
    assert record["headers"]["Authorization"] == record["headers"]["x-api-key"] == "<redacted>"
    assert "sk-secret" not in json.dumps(record)


def test_the_responses_stream_is_well_formed_and_ends_in_the_whole_response(tmp_path):
    [(status, text)] = exchange(tmp_path, "/v1/responses", {"model": "gpt-x", "stream": True, "input": "hi"})
    stream = events(text)
    assert status == 200 and stream[0][0] == "response.created"
    assert all(name == data["type"] for name, data in stream)
    assert [data["sequence_number"] for _, data in stream] == list(range(len(stream)))
    deltas = "".join(data["delta"] for name, data in stream if name == "response.output_text.delta")
    name, last = stream[-1]
    assert name == "response.completed" and last["response"]["model"] == "gpt-x"
    assert last["response"]["output"][0]["content"][0]["text"] == deltas == ANSWER


def test_the_messages_stream_opens_one_block_and_closes_it(tmp_path):
    [(status, text)] = exchange(tmp_path, "/v1/messages", {"model": "claude-x", "stream": True})
    names = [name for name, _ in events(text)]
    assert status == 200
    assert names == ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]


def test_the_nth_generation_request_gets_each_apis_own_400(tmp_path):
    openai = exchange(tmp_path / "a", "/v1/responses", {"stream": True}, fail=2, times=3)
    anthropic = exchange(tmp_path / "b", "/v1/messages", {"stream": True}, fail=1, times=2)
    assert [status for status, _ in openai] == [200, 400, 200]
    assert json.loads(openai[1][1])["error"]["code"] == "context_length_exceeded"
    assert [status for status, _ in anthropic] == [400, 200]
    body = json.loads(anthropic[0][1])
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("prompt is too long: ")


def test_the_codex_config_points_at_inferno_and_nowhere_else():
    config = tomllib.loads(run.codex_config("http://127.0.0.1:9", "m"))
    provider = config["model_providers"][config["model_provider"]]
    assert (config["model"], provider["base_url"], provider["wire_api"]) == ("m", "http://127.0.0.1:9/v1", "responses")
    assert config["analytics"]["enabled"] is False and config["check_for_update_on_startup"] is False
    assert config["features"] == {"plugins": False, "apps": False}


def outcome(returncode: int | None, output: str, statuses: list[int]) -> run.Outcome:
    client = run.Client("codex", "/v1/responses", ["codex"], {}, Path("."))
    audit = [{"method": "POST", "path": "/v1/responses", "status": s} for s in statuses]
    return run.Outcome(client, returncode, output, 1.0, [{"method": "HEAD", "path": "/", "status": 404}, *audit])


def test_a_client_passes_only_with_exit_0_an_answer_and_every_request_answered_200():
    assert outcome(0, "Hello.", [200, 200]).problems() == []
    assert outcome(1, "Hello.", [200]).problems() == ["it exited 1"]
    assert outcome(None, "", [200]).problems() == ["it did not finish before the timeout", "it printed no answer"]
    assert outcome(0, "Hello.", []).problems() == ["the server's audit log shows no request to /v1/responses"]
    assert outcome(0, "Hello.", [200, 404]).problems() == ["POST /v1/responses was answered 404"]
