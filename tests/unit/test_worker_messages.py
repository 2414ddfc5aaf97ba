"""Every message between the HTTP process and a worker (ipc/messages.py): each survives the real framing
(orjson over ipc.py's frames) unchanged, and a frame that is not exactly its message is refused, naming why.
Requests and rows are made from the real SmolLM2 engine folder: its chat template, tokenizer and manifest."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from orchestrator.api.wire import ChatCompletionRequest
from orchestrator.backends.options import HfOptions, LlamaCppOptions, SimOptions, TrtllmOptions, options_for
from orchestrator.config import load_config
from orchestrator.engine.catalogue import discover
from orchestrator.engine.request import FinishReason, TokenDelta
from orchestrator.errors import ModelUnavailable, OutOfMemory, to_wire
from orchestrator.ipc.channel import encode_frame, read_frame
from orchestrator.ipc.messages import (
    FROM_WORKER,
    TO_WORKER,
    BackendStats,
    Cancel,
    FrameKind,
    Idle,
    LoadFailed,
    LoadReport,
    LoadSpec,
    MalformedFrame,
    Release,
    Shutdown,
    StatsQuery,
    StatsReport,
    Step,
    Submit,
    TextDelta,
    WorkerReady,
    decode_from_worker,
    decode_to_worker,
)
from orchestrator.worker.outputs import SequenceOutput, TokenTexts


@pytest.fixture(scope="module")
def engine(default_engine):
    return discover(default_engine.parent, (default_engine.name,)).engines[default_engine.name]


@pytest.fixture(scope="module")
def tokenizer(default_engine) -> Tokenizer:
    return Tokenizer.from_file(str(default_engine / "tokenizer.json"))


def engine_request(engine, **fields):
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Name a colour."}], **fields}
    return ChatCompletionRequest.model_validate(body).to_inference_request(engine, "chatcmpl").choices[0].engine_request


def crossed(message: dict) -> dict:
    """`message` as the other process reads it: encoded into a frame and read back off a stream."""
    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(encode_frame(message))
        reader.feed_eof()
        return await read_frame(reader)

    return asyncio.run(go())


# -- the table --------------------------------------------------------------------------------------------------
def test_every_kind_names_one_message_each_way_and_every_message_says_its_kind():
    assert set(TO_WORKER) | set(FROM_WORKER) == set(FrameKind)
    assert set(TO_WORKER) & set(FROM_WORKER) == {FrameKind.STATS}  # a query one way, the answer the other
    assert all(message.KIND is kind for table in (TO_WORKER, FROM_WORKER) for kind, message in table.items())


# -- round trips -------------------------------------------------------------------------------------------------
def test_the_load_crosses_with_its_backends_option_section(default_engine):
    worker = load_config(["--worker.threads", "3", "--worker.device", "cpu", "--worker.prompt-cache-bytes", "0",
                          "--worker.capacity-policy", "max_utilization"]).worker.model_dump()
    sections = {backend: options_for(backend, worker) for backend in ("hf", "llamacpp", "trtllm", "sim")}
    assert sections == {"hf": HfOptions(device="cpu", threads=3),
                        "llamacpp": LlamaCppOptions(threads=3, prompt_cache_bytes=0),
                        "trtllm": TrtllmOptions(capacity_policy="max_utilization", prompt_cache_bytes=0),
                        "sim": SimOptions(capacity_policy="max_utilization", prompt_cache_bytes=0)}
    for options in sections.values():
        spec = LoadSpec(str(default_engine), 64 * 2**20, options)
        back = decode_to_worker(crossed(spec.to_wire()))
        assert back == spec and type(back.options) is type(options)


def test_the_load_says_whether_the_weights_were_kept(default_engine):
    for kept in (True, False):
        spec = LoadSpec(str(default_engine), 64 * 2**20, SimOptions(), weights_kept=kept)
        assert decode_to_worker(crossed(spec.to_wire())).weights_kept is kept
    frame = {key: value for key, value in LoadSpec(str(default_engine), 1, SimOptions(), True).to_wire().items()
             if key != "weights_kept"}
    assert decode_to_worker(crossed(frame)).weights_kept is False  # a frame without it: not kept


def test_requests_cancels_stats_queries_and_shutdown_cross_unchanged(engine):
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    request = engine_request(
        engine, seed=7, temperature=0.7, top_p=0.9, stop=["\n\n"], logit_bias={"42": -5.5}, logprobs=True,
        top_logprobs=3, response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    assert request.guide is not None and request.sampling.logit_bias == ((42, -5.5),)
    attached = Submit(request, ("HTTP/1.1 200 OK\r\n\r\n\xe9", 'data: {"text":', "}\n\n"))
    ended = Cancel(request.id, to_wire(OutOfMemory("the KV cache is full")))
    for message in (Submit(request), attached, Cancel(request.id), ended, StatsQuery(17), Shutdown(), Release()):
        assert decode_to_worker(crossed(message.to_wire())) == message
    for attach in (["data: "], "data: ", ["h", "data: ", 1], ["h", "data: "]):
        with pytest.raises(MalformedFrame, match="attach") as refused:
            decode_to_worker(crossed(Submit(request).to_wire() | {"attach": attach}))
        assert refused.value.request_id == (request.id if isinstance(attach, list) else None)


def test_the_workers_greeting_ready_report_and_stats_cross_unchanged():
    report = LoadReport("cuda:0")
    simulated = LoadReport("sim:H100-SXM", device_bytes=20 * 2**30)
    stats = BackendStats(running=31, waiting=4, kv_blocks_total=12_288, kv_blocks_free=9000, kv_blocks_used=3288,
                         tokens_per_block=64, iterations=150_211, kv_blocks_reused=77, iteration_latency_ms=12.5)
    for message in (Idle(4242), WorkerReady(4242, 1_500_000_000, report), WorkerReady(7, 10**9, simulated),
                    StatsReport(17, stats), StatsReport(18, BackendStats(0, 0, 0, 0, 0, 1, 0))):
        assert decode_from_worker(crossed(message.to_wire())) == message


def test_a_failed_load_crosses_as_the_same_error_class_with_its_details():
    error = OutOfMemory("not enough device memory to load this model: CUDA out of memory", param="model",
                        retry_after_s=4.0)
    back = decode_from_worker(crossed(LoadFailed(error).to_wire()))
    assert type(back.error) is OutOfMemory
    assert (back.error.message, back.error.param, back.error.retry_after_s) == (error.message, "model", 4.0)


def test_step_rows_cross_as_the_worker_made_them(engine, tokenizer):
    plain = engine_request(engine, max_tokens=8)
    with_logprobs = engine_request(engine, max_tokens=8, logprobs=True, top_logprobs=1)
    texts = TokenTexts(tokenizer)
    tokens = tokenizer.encode("Blue, like the sky.", add_special_tokens=False).ids
    rows = [
        SequenceOutput(plain, tokenizer, texts).row(TokenDelta(plain.id, tokens[:3])),
        SequenceOutput(with_logprobs, tokenizer, texts).row(
            TokenDelta(with_logprobs.id, tokens[:2], FinishReason.LENGTH, logprobs=[-0.1, -0.7],
                       top_logprobs=[[(tokens[0], -0.1)], [(tokens[1], -0.7)]], cached_tokens=16)),
        TextDelta.failure("chatcmpl-x.2", OutOfMemory("the KV cache is full")).to_wire(),
        TextDelta("chatcmpl-y.0", "", 7, tail="3\r\n\xe9\x00}\r\n", first_token=12.5).to_wire(),  # bytes as latin-1
    ]
    step = decode_from_worker(crossed(Step(rows).to_wire()))
    assert step == Step(rows)
    first, second, failed, handed_back = (TextDelta.from_wire(row) for row in step.rows)
    assert handed_back.tail.encode("latin-1") == b"3\r\n\xe9\x00}\r\n" and handed_back.num_tokens == 7
    assert handed_back.first_token == 12.5
    assert (first.text, first.num_tokens, first.finish) == (tokenizer.decode(tokens[:3]), 3, None)
    assert len(rows[0]) == 5  # plain text: no extras element, the HTTP process's fast path
    assert (second.finish, second.cached_tokens, [lp[1] for lp in second.logprobs]) == (
        FinishReason.LENGTH, 16, [-0.1, -0.7])
    assert TextDelta.from_wire(second.to_wire()) == second
    assert failed.finish is FinishReason.ERROR and failed.error["kind"] == "OutOfMemory"


# -- refusals ------------------------------------------------------------------------------------------------------
GOOD_STATS = asdict(BackendStats(1, 0, 64, 60, 4, 16, 9))


@pytest.mark.parametrize(("frame", "why"), [
    ({"kind": "step", "outputs": []}, "no 'step' frame goes to a worker"),
    ({"kind": "reload"}, "no 'reload' frame goes to a worker"),
    ({"outputs": []}, "no 'None' frame"),
    (["submit"], "no 'None' frame"),
    ({"kind": "cancel", "id": 7}, "'id' must be str (got 7)"),
    ({"kind": "cancel"}, "needs 'id'"),
    ({"kind": "stats", "seq": "7"}, "'seq' must be int (got '7')"),
    ({"kind": "stats", "seq": True}, "'seq' must be int (got True)"),
    ({"kind": "shutdown", "now": True}, "unknown field(s) now"),
    ({"kind": "attach", "request_id": "r", "seen": 1}, "no 'attach' frame goes to a worker"),
    ({"kind": "submit", "request": {"prompt_ids": [1, 2]}}, "needs a string 'id'"),
    ({"kind": "load", "engine_dir": "/e", "kv_cache_bytes": 2**26, "backend": "hf", "options": {"threads": 0}},
     "hf option threads: Input should be greater than or equal to 1"),
    ({"kind": "load", "engine_dir": "/e", "kv_cache_bytes": 2**26, "backend": "hf",
      "options": {"capacity_policy": "max_utilization"}}, "hf option capacity_policy: Extra inputs"),
    ({"kind": "load", "engine_dir": "/e", "kv_cache_bytes": 2**26, "backend": "vllm", "options": {}},
     "backend must be one of hf, llamacpp, sim, trtllm (got 'vllm')"),
    ({"kind": "load", "engine_dir": "/e", "kv_cache_bytes": 1.5, "backend": "hf", "options": {}},
     "'kv_cache_bytes' must be int (got 1.5)"),
])
def test_a_frame_to_the_worker_that_is_not_its_message_is_refused(frame, why):
    with pytest.raises(MalformedFrame) as refused:
        decode_to_worker(frame)
    assert why in str(refused.value)


def test_a_submit_whose_request_cannot_be_read_is_refused_naming_the_request(engine):
    wire = engine_request(engine).to_wire()
    del wire["sampling"]
    with pytest.raises(MalformedFrame, match="request is malformed: KeyError") as refused:
        decode_to_worker({"kind": "submit", "request": wire})
    assert refused.value.request_id == wire["id"]


@pytest.mark.parametrize(("frame", "why"), [
    ({"kind": "submit", "request": {}}, "no 'submit' frame goes from a worker"),
    ({"kind": "idle"}, "needs 'pid'"),
    ({"kind": "ready", "pid": 1, "rss_bytes": 2, "load": {"device_bytes": 1}}, "frame's load needs 'device'"),
    ({"kind": "ready", "pid": 1, "rss_bytes": 2,
      "load": {**asdict(LoadReport("cpu")), "kind": "x"}}, "frame's load has unknown field(s) kind"),
    ({"kind": "failed", "error": {"message": "m"}}, "frame's error needs 'kind'"),
    ({"kind": "stats", "seq": 1, "stats": {**GOOD_STATS, "running": None}}, "'running' must be int (got None)"),
    ({"kind": "stats", "seq": 1, "stats": {**GOOD_STATS, "speed": 3}}, "unknown field(s) speed"),
    ({"kind": "stats", "seq": 1, "stats": {**GOOD_STATS, "iteration_latency_ms": "fast"}},
     "'iteration_latency_ms' must be float or null (got 'fast')"),
    ({"kind": "step", "outputs": {"r": 1}}, "a 'step' frame is {kind, outputs: [row, ...]}"),
    ({"kind": "step", "outputs": [], "seq": 1}, "a 'step' frame is {kind, outputs: [row, ...]}"),
    ({"kind": "step", "outputs": [[7, "text", 1, None, None]]}, "a 'step' row must be a list led by a request id"),
    ({"kind": "step", "outputs": [["r.0", "text"]]}, "a 'step' row must be a list led by a request id"),
])
def test_a_frame_from_the_worker_that_is_not_its_message_is_refused(frame, why):
    with pytest.raises(MalformedFrame) as refused:
        decode_from_worker(frame)
    assert why in str(refused.value)


@pytest.mark.parametrize(("row", "why"), [
    (["r.0", "x", 1, "done", None], "finish must be a finish reason (got 'done')"),
    (["r.0", "x", "1", None, None], "must be [id, text, tokens, finish, error(, extras)]"),
    (["r.0", "x", 1, None, None, {"colour": "red"}], "row's extras has unknown field(s) colour"),
    (["r.0", "x", 1, None, None, {"cached_tokens": "16"}], "'cached_tokens' must be int or null (got '16')"),
    (["r.0", "", 1, None, None, {"tail": 7}], "'tail' must be str or null (got 7)"),
    (["r.0", "", 1, None, None, {"first_token": "now"}], "'first_token' must be float or null (got 'now')"),
    (["r.0", "x", 1, None, None, {}, {}], "a list of 5 or 6 items"),
])
def test_a_step_row_that_is_not_a_text_delta_is_refused_where_it_is_read(row, why):
    assert Step.from_wire({"kind": "step", "outputs": [row]}).rows == [row]  # the frame's check is cheap
    with pytest.raises(MalformedFrame) as refused:
        TextDelta.from_wire(row)
    assert why in str(refused.value)


def test_options_of_another_backend_are_refused_for_an_engine(default_engine):
    from orchestrator.backends.protocol import BackendSettings
    from orchestrator.engine.manifest import load_manifest

    manifest = load_manifest(Path(default_engine))
    assert BackendSettings(default_engine, manifest, 2**26).options == HfOptions()
    with pytest.raises(ModelUnavailable, match="the trtllm backend's options were given for an engine of backend hf"):
        BackendSettings(default_engine, manifest, 2**26, TrtllmOptions())
