"""OpenAI's response bodies and stream chunks, for chat and text completions.

A `Format` knows how one endpoint shapes its objects; the streaming and non-streaming paths share it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from orchestrator.engine.request import FinishReason
from orchestrator.lifecycle import Choice, InferenceRequest


def _alternative(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def chat_logprobs(entries: list | None) -> dict | None:
    """Chat's shape; each entry is [token text, log probability, [[alternative, log probability], ...]]."""
    if entries is None:
        return None
    content = [
        {**_alternative(text, logprob), "top_logprobs": [_alternative(t, lp) for t, lp in top]}
        for text, logprob, top in entries
    ]
    return {"content": content, "refusal": None}


def text_logprobs(entries: list | None, offset: int = 0, alternatives: int = 0) -> dict | None:
    """The legacy completions shape; `offset` is where these tokens start in the choice's text. With
    `alternatives` > 0 each position lists that many most likely tokens (and the chosen one) by text."""
    if entries is None:
        return None
    offsets = []
    for text, _, _ in entries:
        offsets.append(offset)
        offset += len(text)
    top = None
    if alternatives:
        top = [{**{t: lp for t, lp in alts}, text: logprob} for text, logprob, alts in entries]
    return {"tokens": [text for text, _, _ in entries],
            "token_logprobs": [logprob for _, logprob, _ in entries], "top_logprobs": top,
            "text_offset": offsets}


def usage(request: InferenceRequest) -> dict:
    """Token counts so far; the prompt tokens served from the prefix cache where the engine reports them."""
    completion = request.completion_tokens
    counts = {"prompt_tokens": request.prompt_tokens, "completion_tokens": completion,
              "total_tokens": request.prompt_tokens + completion}
    if request.cached_tokens is not None:
        counts["prompt_tokens_details"] = {"cached_tokens": request.cached_tokens}
    return counts


@dataclass(frozen=True)
class Format:
    object_name: str  # "chat.completion" | "text_completion"
    chunk_name: str  # "chat.completion.chunk" | "text_completion"
    chat: bool
    system_fingerprint: str | None = None

    def _envelope(self, request: InferenceRequest, object_name: str, created: int) -> dict:
        body = {"id": request.id, "object": object_name, "created": created, "model": request.model}
        if self.chat:
            body["system_fingerprint"] = self.system_fingerprint
        return body

    # -- whole responses ----------------------------------------------------------------------------------
    def response(self, request: InferenceRequest, texts: list[str], created: int) -> dict:
        body = self._envelope(request, self.object_name, created)
        body["choices"] = [self._final_choice(c, texts[c.index]) for c in request.choices]
        body["usage"] = usage(request)
        return body

    def _final_choice(self, choice: Choice, text: str) -> dict:
        reason = choice.finish.openai if choice.finish else None
        if self.chat:
            message = {"role": "assistant", "content": text if text or not choice.tool_calls else None,
                       "refusal": None}
            if choice.tool_calls:
                message["tool_calls"] = choice.tool_calls
            if choice.reasoning:  # clients read one or the other
                message["reasoning_content"] = message["reasoning"] = choice.reasoning
            return {"index": choice.index, "message": message, "logprobs": chat_logprobs(choice.logprobs),
                    "finish_reason": reason}
        logprobs = text_logprobs(choice.logprobs, 0, choice.engine_request.top_logprobs)
        return {"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    # -- stream chunks ------------------------------------------------------------------------------------
    def chunk(self, request: InferenceRequest, created: int, index: int, text: str | None = None,
              finish: FinishReason | None = None, role: bool = False, include_usage: bool = False,
              continuous_usage: bool = False, logprobs: list | None = None, offset: int = 0,
              alternatives: int = 0, reasoning: str | None = None, tool_calls: list | None = None) -> dict:
        body = self._envelope(request, self.chunk_name, created)
        reason = finish.openai if finish else None
        if self.chat:
            delta: dict = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            if reasoning:
                delta["reasoning_content"] = delta["reasoning"] = reasoning
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {"index": index, "delta": delta, "logprobs": chat_logprobs(logprobs), "finish_reason": reason}
        else:
            choice = {"index": index, "text": text or "", "logprobs": text_logprobs(logprobs, offset, alternatives),
                      "finish_reason": reason}
        body["choices"] = [choice]
        if continuous_usage:
            body["usage"] = usage(request)
        elif include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, request: InferenceRequest, created: int) -> dict:
        body = self._envelope(request, self.chunk_name, created)
        body["choices"] = []
        body["usage"] = usage(request)
        return body


def now() -> int:
    return int(time.time())
