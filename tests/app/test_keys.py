"""API keys from a keys file, in-process: models a key may not use answer exactly as models that do not exist;
admin rights; requests per minute, concurrent requests and tokens per minute (429 with Retry-After); a key's
priority class; usage per key in /metrics and /admin/usage; the audit log, with and without text."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.access.keys import hash_key
from orchestrator.engine.request import FinishReason
from orchestrator.scheduler.settings import Priority
from tests.app.harness import running_app

HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def keys_flags(tmp_path, catalogue):
    [model] = catalogue.engines
    path = tmp_path / "keys.toml"
    path.write_text(f"""
        [keys.insider]
        key = "{hash_key('sk-insider')}"
        [keys.outsider]
        key = "{hash_key('sk-outsider')}"
        models = ["some-other-model"]
        [keys.once]
        key = "{hash_key('sk-once')}"
        requests_per_minute = 1
        [keys.single]
        key = "{hash_key('sk-single')}"
        max_concurrent = 1
        [keys.thrifty]
        key = "{hash_key('sk-thrifty')}"
        tokens_per_minute = 600
        [keys.nightly]
        key = "{hash_key('sk-nightly')}"
        priority = "batch"
        models = ["{model}"]
        [keys.ops]
        key = "{hash_key('sk-ops')}"
        admin = true
        [keys.quad]
        key = "{hash_key('sk-quad')}"
        max_concurrent = 4
        tokens_per_minute = 2000
        weight = 2
    """)
    return "--auth.keys-file", str(path)


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


async def chat(app, key: str, **extra):
    return await app.client.post("/v1/chat/completions", json={"model": app.model, "messages": HI, **extra},
                                 headers=bearer(key))


async def answered(app, key: str, text: str = "Hello there", tokens: int = 2, **extra):
    """A whole chat completion whose engine says `text` in `tokens` tokens."""
    asking = asyncio.create_task(chat(app, key, **extra))
    worker, request = await app.workers.next_submit()
    worker.emit(request.id, text, tokens=tokens, finish=FinishReason.STOP)
    response = await asking
    return response, request


def test_a_model_the_key_may_not_use_answers_as_one_that_does_not_exist(catalogue, keys_flags):
    async def go():
        async with running_app(catalogue, *keys_flags) as app:
            hidden = await chat(app, "sk-outsider")
            missing = await app.client.post("/v1/chat/completions", json={"model": "no-such-model", "messages": HI},
                                            headers=bearer("sk-outsider"))
            card = await app.client.get(f"/v1/models/{app.model}", headers=bearer("sk-outsider"))
            tokenize = await app.client.post("/tokenize", json={"model": app.model, "prompt": "hi"},
                                             headers=bearer("sk-outsider"))
            listed_out = await (await app.client.get("/v1/models", headers=bearer("sk-outsider"))).json()
            listed_in = await (await app.client.get("/v1/models", headers=bearer("sk-insider"))).json()
            return (hidden.status, await hidden.json(), missing.status, await missing.json(), card.status,
                    tokenize.status, listed_out, listed_in, app.workers.submits.qsize())

    hidden, hidden_body, missing, missing_body, card, tokenize, out, inside, submits = asyncio.run(go())
    assert hidden == missing == card == tokenize == 404
    assert hidden_body["error"]["code"] == missing_body["error"]["code"] == "model_not_found"
    assert hidden_body["error"]["message"].endswith("does not exist; models served here: none")
    assert missing_body["error"]["message"].endswith("does not exist; models served here: none")
    assert out["data"] == [] and [m["id"] for m in inside["data"]] == ["smollm2-135m"]
    assert submits == 0


def test_admin_needs_a_key_with_admin_rights(catalogue, keys_flags):
    async def go():
        async with running_app(catalogue, *keys_flags) as app:
            return [(await app.client.get(path, headers=bearer(key))).status
                    for path, key in [("/admin/models", "sk-insider"), ("/admin/models", "sk-ops"),
                                      ("/admin/usage", "sk-ops"), ("/v1/models", "sk-ops"), ("/v1/models", "sk-bad")]]

    assert asyncio.run(go()) == [401, 200, 200, 200, 401]


def test_requests_per_minute_and_concurrent_requests_answer_429_with_retry_after(catalogue, keys_flags):
    async def go():
        async with running_app(catalogue, *keys_flags) as app:
            first, _ = await answered(app, "sk-once")
            second = await chat(app, "sk-once")
            running = asyncio.create_task(chat(app, "sk-single"))
            worker, request = await app.workers.next_submit()
            crowded = await chat(app, "sk-single")
            worker.finish(request.id)
            assert (await running).status == 200
            after, _ = await answered(app, "sk-single")  # its one concurrent request ended, so it may send again
            return (first.status, second.status, second.headers["Retry-After"], await second.json(),
                    crowded.status, crowded.headers["Retry-After"], await crowded.json(), after.status)

    first, second, second_retry, second_body, crowded, crowded_retry, crowded_body, after = asyncio.run(go())
    assert (first, second, crowded, after) == (200, 429, 429, 200)
    assert second_retry == "60" and crowded_retry == "1"
    assert second_body["error"]["code"] == crowded_body["error"]["code"] == "rate_limit_exceeded"
    assert "key 'once' is over its limit of 1 requests per minute" in second_body["error"]["message"]
    assert "key 'single' already has 1 requests running (its limit is 1)" in crowded_body["error"]["message"]


def test_tokens_per_minute_count_the_completion_at_the_end(catalogue, keys_flags):
    async def go():
        async with running_app(catalogue, *keys_flags) as app:
            big, _ = await answered(app, "sk-thrifty", text="word " * 590, tokens=590)  # prompt + 590 > 600
            refused = await chat(app, "sk-thrifty")
            return big.status, refused.status, refused.headers.get("Retry-After"), await refused.json()

    big, refused, retry_after, body = asyncio.run(go())
    assert big == 200 and refused == 429 and int(retry_after) > 0
    assert "key 'thrifty' is over its limit of 600 tokens per minute" in body["error"]["message"]


def test_choices_count_as_concurrent_requests_and_tokens_per_minute_reserve_them_then_refund(catalogue, keys_flags):
    async def go():
        async with running_app(catalogue, *keys_flags) as app:
            async def live() -> dict:
                report = await (await app.client.get("/admin/usage", headers=bearer("sk-ops"))).json()
                return report["keys"]["quad"]

            asking = asyncio.create_task(chat(app, "sk-quad", n=4, max_tokens=300))
            submitted = [await app.workers.next_submit() for _ in range(4)]
            during = await live()
            crowded = await chat(app, "sk-quad")  # n = 4 holds all four of its concurrent requests
            too_many = await chat(app, "sk-quad", n=5)
            for worker, request in submitted:
                worker.emit(request.id, "Hi", tokens=5, finish=FinishReason.STOP)
            body = await (await asking).json()
            return during, crowded.status, await crowded.json(), too_many, await too_many.json(), body, await live()

    during, crowded, crowded_body, too_many, too_many_body, body, after = asyncio.run(go())
    prompt = body["usage"]["prompt_tokens"]
    assert during["limits"]["weight"] == 2
    assert during["now"]["running"] == 4
    assert during["now"]["tokens_left"] == pytest.approx(2000 - prompt - 4 * 300, abs=1)  # reserved on admission
    assert crowded == 429 and "already has 4 requests running" in crowded_body["error"]["message"]
    assert too_many.status == 429 and "Retry-After" not in too_many.headers  # it never could run
    assert "asks for 5 choices (n)" in too_many_body["error"]["message"]
    assert body["usage"]["completion_tokens"] == 20
    assert after["now"]["running"] == 0
    assert after["now"]["tokens_left"] == pytest.approx(2000 - prompt - 20, abs=1)  # the unused reservation came back


def test_a_batch_key_runs_as_batch_whatever_it_asks(catalogue, keys_flags):
    async def go():
        async with running_app(catalogue, *keys_flags) as app:
            _, plain = await answered(app, "sk-nightly")
            _, asking = await answered(app, "sk-nightly", service_tier="priority")
            _, other = await answered(app, "sk-insider")
            return plain.priority, asking.priority, other.priority

    assert asyncio.run(go()) == (Priority.BATCH.in_engine, Priority.BATCH.in_engine, Priority.INTERACTIVE.in_engine)


def samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_usage_per_key_in_metrics_and_admin_usage_and_the_audit_log(catalogue, keys_flags, tmp_path):
    audit_file = tmp_path / "audit.jsonl"

    async def go():
        async with running_app(catalogue, *keys_flags, "--audit.file", str(audit_file)) as app:
            one, request = await answered(app, "sk-insider", tokens=3)
            await answered(app, "sk-insider", tokens=4)
            await chat(app, "sk-outsider")  # 404: no model, no usage
            usage = await (await app.client.get("/admin/usage", headers=bearer("sk-ops"))).json()
            metrics = await (await app.client.get("/metrics", headers=bearer("sk-ops"))).text()
            return one.headers["X-Request-Id"], request, usage, metrics, app.model
        # leaving the app closes the audit log: every line is written

    first_id, request, usage, metrics, model = asyncio.run(go())
    prompt = len(request.prompt_ids)
    insider = usage["keys"]["insider"]
    assert insider["total"]["requests"] == 2 and insider["total"]["errors"] == 0
    assert insider["total"]["prompt_tokens"] == 2 * prompt and insider["total"]["completion_tokens"] == 7
    assert insider["total"]["engine_seconds"] > 0 and list(insider["models"]) == [model]
    assert insider["now"] is None and insider["limits"]["admin"] is False  # no limits: no limiter
    assert usage["keys"]["outsider"]["total"] is None  # named no model it may use
    assert usage["keys"]["once"]["limits"]["requests_per_minute"] == 1
    values = samples(metrics)
    labels = (("key", "insider"), ("model", model))
    assert values[("inferno_key_requests_total", (*labels, ("status_class", "2xx")))] == 2
    assert values[("inferno_key_prompt_tokens_total", labels)] == 2 * prompt
    assert values[("inferno_key_completion_tokens_total", labels)] == 7
    assert "sk-insider" not in metrics

    lines = [orjson.loads(line) for line in audit_file.read_text().splitlines()]
    assert [(line["key"], line["path"], line["status"]) for line in lines] == [
        ("insider", "/v1/chat/completions", 200), ("insider", "/v1/chat/completions", 200),
        ("outsider", "/v1/chat/completions", 404), ("ops", "/admin/usage", 200),
    ]  # /metrics is not audited
    assert lines[0]["request_id"] == first_id and lines[0]["model"] == model
    assert (lines[0]["prompt_tokens"], lines[0]["completion_tokens"], lines[0]["finish_reason"]) == (prompt, 3, "stop")
    assert lines[0]["response_id"] == request.id.rsplit(".", 1)[0]
    assert all("prompt" not in line and "completions" not in line for line in lines)
    assert "Say hello" not in audit_file.read_text() and "sk-" not in audit_file.read_text()


def test_the_audit_log_holds_text_only_when_told(catalogue, keys_flags, tmp_path):
    audit_file = tmp_path / "audit.jsonl"

    async def go():
        async with running_app(catalogue, *keys_flags, "--audit.file", str(audit_file), "--audit.include-text") as app:
            await answered(app, "sk-insider", text="Hello there")
            # A stream its worker would write itself (its socket with the submit): that text would not be seen here.
            app.workers.take_sockets = True
            streaming = asyncio.create_task(chat(app, "sk-insider", stream=True))
            worker, request = await app.workers.next_submit()
            for text in ("Hello", " there", ", again"):
                worker.emit(request.id, text, tokens=1)
            worker.emit(request.id, "", tokens=0, finish=FinishReason.STOP)
            await (await streaming).read()
            return worker.sockets

    handed = asyncio.run(go())
    lines = [orjson.loads(line) for line in audit_file.read_text().splitlines()]
    assert [line["prompt"] for line in lines] == [[{"role": "user", "content": "Say hello."}]] * 2
    assert [line["completions"] for line in lines] == [["Hello there"], ["Hello there, again"]]
    assert handed == {}  # never handed over: the worker would write its text unseen
