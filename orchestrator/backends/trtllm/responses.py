"""TensorRT-LLM Responses back to token deltas, and the one thread that waits for them.

The thread blocks in `await_responses(timeout=...)`, which releases the GIL while it waits, and hands each
batch it gets (every request's output of one or more engine steps) to the worker's event loop in a single
`call_soon_threadsafe`. The timeout only lets it notice a stop request; nothing else polls.

Finish reasons: END_ID and STOP_WORDS -> stop; LENGTH -> length; CANCELLED -> cancelled. TIMED_OUT (a
request's allotted time ran out) -> length: like max_tokens it is a budget that cut the answer short, and
the client keeps what was streamed. Inferno sets no allotted time, so it is not expected.

Cached prompt tokens: every request asks for perf metrics, so every result carries the request's
`kv_cache_metrics.num_reused_blocks`, counted once, when its first context chunk was scheduled (reference:
the facts table's "perf metrics" and "prefix reuse" facts). `cached_prompt_tokens` turns that into tokens.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType

from orchestrator.backends.protocol import hand_over
from orchestrator.engine.request import FinishReason, TokenDelta
from orchestrator.errors import EngineError, InfernoError, QueueFull

log = logging.getLogger(__name__)

AWAIT_TIMEOUT = timedelta(seconds=1)


@dataclass(slots=True)
class Update:
    """One response, read: for the executor request `request_id`, new tokens, and whether it is the last.
    The delta's own request_id (the engine request's) is filled in by the backend; `logits` are the new tokens'
    generation logits ([tokens, vocab]) where the request asked for them."""

    request_id: int
    delta: TokenDelta
    final: bool
    logits: object | None = None
    reused_blocks: int | None = None  # the request's prompt blocks found in the prefix cache, where reported


class ResponseReader:
    """Reads Responses into Updates. Only the tokens new since the last response are in a streaming result.

    The reused blocks are read from a request's first result only: every result carries the same count, and
    reading the perf metrics makes a Python copy of them. Called from the response thread alone."""

    def __init__(self, trtllm: ModuleType, eos_token_ids: tuple[int, ...]):
        reasons = trtllm.FinishReason
        self._finish = {reasons.END_ID: FinishReason.STOP, reasons.STOP_WORDS: FinishReason.STOP,
                        reasons.LENGTH: FinishReason.LENGTH, reasons.TIMED_OUT: FinishReason.LENGTH,
                        reasons.CANCELLED: FinishReason.CANCELLED}
        self._eos = frozenset(eos_token_ids)
        self._counted: set[int] = set()  # requests whose reused blocks were read, until their final result

    def _reused_blocks(self, request_id: int, result) -> int | None:
        """kv_cache_metrics.num_reused_blocks on the request's first result; None on the others, and when the
        result carries no perf metrics."""
        if result.is_final:
            first = request_id not in self._counted
            self._counted.discard(request_id)
            if not first:
                return None
        elif request_id in self._counted:
            return None
        else:
            self._counted.add(request_id)
        metrics = result.request_perf_metrics
        return None if metrics is None else int(metrics.kv_cache_metrics.num_reused_blocks)

    def read(self, response) -> Update:
        request_id = response.request_id
        if response.has_error():  # `result` would raise; an error ends the request
            self._counted.discard(request_id)
            error = request_error(response.error_msg)
            return Update(request_id, TokenDelta("", finish=FinishReason.ERROR, error=error), True)
        result = response.result
        beams = result.output_token_ids
        tokens = list(beams[0]) if beams else []  # one beam: beam_width is 1
        logprobs = _last_logprobs(result.log_probs, len(tokens))
        logits = _step_logits(result.generation_logits, len(tokens))
        reused = self._reused_blocks(request_id, result)
        if not result.is_final:
            return Update(request_id, TokenDelta("", tokens, logprobs=logprobs), False, logits, reused)
        reasons = result.finish_reasons
        finish = self._finish.get(reasons[0]) if reasons else None
        if finish is None:  # NOT_FINISHED in a final result: judge by the last token
            finish = FinishReason.STOP if tokens and tokens[-1] in self._eos else FinishReason.LENGTH
        if finish is FinishReason.STOP:
            while tokens and tokens[-1] in self._eos:  # an end token ends the text, it is not part of it
                tokens.pop()
            logprobs = logprobs[: len(tokens)] if logprobs is not None else None
        return Update(request_id, TokenDelta("", tokens, finish, logprobs=logprobs), True, logits, reused)


def cached_prompt_tokens(reused_blocks: int, tokens_per_block: int, prompt_len: int) -> int:
    """The prompt tokens a request took from the prefix cache, from the blocks TensorRT-LLM says it reused.

    The engine always computes a prompt's last token again (it reuses at most prompt_len - 1 tokens), so the
    count stops there: a prompt seen before in full reports prompt_len - 1. With partial reuse (on by
    default), the last reused block may have matched on only some of its tokens and still counts as a whole
    block, so where two prompts part in the middle of a block this says up to tokens_per_block - 1 more than
    the engine really reused; where they part at a block boundary it is exact."""
    return max(0, min(reused_blocks * tokens_per_block, prompt_len - 1))


def request_error(message: str) -> InfernoError:
    """The error a failed request's response stands for. A full queue is retryable: in orchestrator mode
    (multi-GPU) the executor reports it in a response, not as an exception of enqueue_request."""
    if "maximum queue size" in message.lower():
        return QueueFull(f"the engine's request queue is full; retry shortly ({message})", retry_after_s=1.0)
    return EngineError(f"the engine failed this request: {message}")


def _step_logits(generation_logits, count: int):
    """The generation logits of the `count` newest tokens as [tokens, vocab]. A streaming response carries its
    step's logits as [tokens, beam, vocab] (reference §8); beam 0 is the only one."""
    if generation_logits is None or not count:
        return None
    logits = generation_logits[:, 0, :] if generation_logits.dim() == 3 else generation_logits
    return logits[-count:]


def top_alternatives(logits, chosen: list[int], count: int) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """For each step's logits ([tokens, vocab]): the chosen token's log probability and the `count` most likely
    tokens with theirs, best first."""
    logprobs = logits.float().log_softmax(dim=-1)
    top = logprobs.topk(count, dim=-1)
    picked = [float(logprobs[i, token]) for i, token in enumerate(chosen[: logprobs.size(0)])]
    alternatives = [list(zip(ids, values, strict=True)) for ids, values in zip(top.indices.tolist(), top.values.tolist(),
                                                                             strict=True)]
    return picked, alternatives


def _last_logprobs(log_probs, count: int) -> list[float] | None:
    """The log probabilities of the `count` newest tokens. A streaming result's log_probs may cover every
    token generated so far (TensorRT-LLM's own LLM API reads them so), so take them from the end."""
    if log_probs is None or not log_probs:
        return None
    values = list(log_probs[0])
    return None if len(values) < count else values[len(values) - count :] if count else []


class ResponsePump:
    """The one thread that waits for the executor's responses and hands them to the event loop."""

    def __init__(self, executor, reader: ResponseReader, loop: asyncio.AbstractEventLoop,
                 deliver: Callable[[list[Update]], None], fail: Callable[[str], None]):
        self._executor = executor
        self._reader = reader
        self._loop = loop
        self._deliver = deliver
        self._fail = fail
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="trtllm-responses", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; it does within one await timeout, at once when shutdown() wakes it."""
        self._stopping = True

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        while not self._stopping:
            try:
                responses = self._executor.await_responses(timeout=AWAIT_TIMEOUT)
                updates = [self._reader.read(response) for response in responses]
            except Exception as exc:
                if self._stopping:  # shutdown() makes a waiting await_responses raise or return
                    return
                log.exception("the TensorRT-LLM executor failed")
                hand_over(self._loop, self._fail, f"the TensorRT-LLM executor failed: {exc}")
                return
            if updates and not hand_over(self._loop, self._deliver, updates):
                return

