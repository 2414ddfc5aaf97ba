"""/tokenize and /detokenize under the caller's key's limits, in-process: they take from the same requests-per-minute
allowance as generation and count as running requests while they work (429 with Retry-After past either), and
their heavy steps run off the event loop for bodies over `http.inline_body_bytes`."""

from __future__ import annotations

import asyncio
import threading

import pytest

from orchestrator.access.keys import hash_key
from orchestrator.api import tokenize as tokenize_module
from orchestrator.text.prompt import PromptEncoder
from tests.app.harness import running_app

HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def keys_flags(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text(f"""
        [keys.once]
        key = "{hash_key('sk-once')}"
        requests_per_minute = 1
        [keys.single]
        key = "{hash_key('sk-single')}"
        max_concurrent = 1
    """)
    return "--auth.keys-file", str(path)


def _bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


async def _post(app, path: str, key: str, **body):
    posted = app.client.post(path, json={"model": app.model, **body}, headers=_bearer(key))
    response = await asyncio.wait_for(posted, 30)  # bounded: a request let through would wait for the fake engine
    return response.status, response.headers.get("Retry-After")


def test_tokenize_and_detokenize_take_from_the_keys_requests_per_minute(catalogue, keys_flags):
    async def go():
        async with running_app(catalogue, *keys_flags) as app:
            first = await _post(app, "/tokenize", "sk-once", prompt="hi")
            again = await _post(app, "/tokenize", "sk-once", prompt="hi")
            detokenized = await _post(app, "/detokenize", "sk-once", tokens=[1, 2])
            chat = await _post(app, "/v1/chat/completions", "sk-once", messages=HI)
            return first, again, detokenized, chat

    first, *refused = asyncio.run(go())
    assert first == (200, None)
    assert all(status == 429 and retry_after is not None for status, retry_after in refused)


def test_tokenize_counts_as_a_running_request_of_its_key(catalogue, keys_flags):
    async def go():
        async with running_app(catalogue, *keys_flags) as app:
            chat = asyncio.create_task(_post(app, "/v1/chat/completions", "sk-single", messages=HI))
            worker, request = await app.workers.next_submit()
            while_running = [await _post(app, "/tokenize", "sk-single", prompt="hi"),
                             await _post(app, "/detokenize", "sk-single", tokens=[1])]
            worker.finish(request.id)
            await chat
            after = [await _post(app, "/tokenize", "sk-single", prompt="hi"),  # each gave its place back
                     await _post(app, "/detokenize", "sk-single", tokens=[1]),
                     await _post(app, "/tokenize", "sk-single", prompt="hi")]
            return while_running, after

    while_running, after = asyncio.run(go())
    assert [status for status, _ in while_running] == [429, 429]
    assert [status for status, _ in after] == [200, 200, 200]


def test_big_bodies_are_tokenized_and_detokenized_off_the_event_loop(catalogue, monkeypatch):
    threads: dict[str, set[int]] = {}

    def recorded(name: str):
        work = getattr(tokenize_module, name)

        def run(*args):
            threads.setdefault(name, set()).add(threading.get_ident())
            return work(*args)

        monkeypatch.setattr(tokenize_module, name, run)

    for name in ("_tokens", "_answer", "_detokenized"):
        recorded(name)

    async def go():
        async with running_app(catalogue, "--http.inline-body-bytes", "64") as app:
            # small, or an ASCII body of up to 8 KiB whose prompt goes piece by piece (in Python): on the loop
            small = [await app.client.post("/tokenize", json={"model": app.model, "prompt": prompt})
                     for prompt in ("hi", "word " * 1500)]
            inline = {name: set(seen) for name, seen in threads.items()}
            threads.clear()
            big = [await app.client.post("/tokenize", json={"model": app.model, "prompt": "word " * 2000,
                                                            "return_token_strs": True}),
                   await app.client.post("/tokenize", json={"model": app.model, "prompt": "wörd " * 100}),
                   await app.client.post("/tokenize", data=f'{{"model": "{app.model}", "prompt": "{"wörd " * 100}"}}',
                                         headers={"Content-Type": "application/json"}),
                   await app.client.post("/detokenize", json={"model": app.model, "tokens": [42] * 3000})]
            return threading.get_ident(), [r.status for r in small], inline, [r.status for r in big]

    loop_thread, small, inline, big = asyncio.run(go())
    assert small == [200, 200] and big == [200, 200, 200, 200]
    assert inline["_tokens"] == {loop_thread}
    assert loop_thread in inline["_answer"] and len(inline["_answer"]) == 2  # token strings: not piece by piece
    assert set(threads) == {"_tokens", "_answer", "_detokenized"}
    assert all(loop_thread not in seen for seen in threads.values())

    # a tokenizer that does not go piece by piece releases the GIL on a thread: an ASCII body goes there too
    monkeypatch.setattr(PromptEncoder, "by_pieces", property(lambda self: False))
    threads.clear()
    loop_thread, small, inline, _ = asyncio.run(go())
    assert small == [200, 200]
    assert loop_thread in inline["_tokens"] and len(inline["_tokens"]) == 2


def test_work_past_what_the_model_can_hold_is_refused_before_it_is_done(catalogue):
    """More token ids than the model's longest sequence, a text longer than any prompt of it, and bodies larger
    than such requests could be (413, before the body is parsed) are refused naming what is wrong."""
    async def go():
        async with running_app(catalogue) as app:
            engine = next(iter(catalogue.engines.values()))
            longest = engine.manifest.limits.max_seq_len
            most_chars = tokenize_module.most_prompt_chars(engine)
            answers = [
                await app.client.post("/detokenize", json={"model": app.model, "tokens": [42] * (longest + 1)}),
                await app.client.post("/tokenize", json={"model": app.model, "prompt": "a" * (most_chars + 1)}),
                await app.client.post("/detokenize", json={"model": app.model,
                                                           "tokens": [42] * (longest * tokenize_module.ID_BYTES)}),
                await app.client.post("/tokenize", json={"model": app.model, "prompt": "a" * (8 * most_chars)}),
            ]
            return [(r.status, (await r.json())["error"]) for r in answers]

    (ids, ids_error), (text, text_error), (big_ids, _), (big_text, _) = asyncio.run(go())
    assert ids == 400 and ids_error["param"] == "tokens"
    assert text == 400 and text_error["code"] == "context_length_exceeded" and text_error["param"] == "prompt"
    assert big_ids == 413 and big_text == 413
