"""OpenAI's response bodies and stream chunks, for chat and text completions.

A `Format` knows how one endpoint shapes its objects; the streaming and non-streaming paths share it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from orchestrator.engine.request import FinishReason
from orchestrator.lifecycle import InferenceRequest

OPENAI_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}


def usage(request: InferenceRequest) -> dict:
    completion = request.completion_tokens
    return {
        "prompt_tokens": request.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": request.prompt_tokens + completion,
    }


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
        body["choices"] = [self._final_choice(c.index, texts[c.index], c.finish) for c in request.choices]
        body["usage"] = usage(request)
        return body

    def _final_choice(self, index: int, text: str, finish: FinishReason | None) -> dict:
        reason = OPENAI_FINISH.get(finish)
        if self.chat:
            message = {"role": "assistant", "content": text, "refusal": None}
            return {"index": index, "message": message, "logprobs": None, "finish_reason": reason}
        return {"index": index, "text": text, "logprobs": None, "finish_reason": reason}

    # -- stream chunks ------------------------------------------------------------------------------------
    def chunk(
        self,
        request: InferenceRequest,
        created: int,
        index: int,
        text: str | None = None,
        finish: FinishReason | None = None,
        role: bool = False,
        include_usage: bool = False,
    ) -> dict:
        body = self._envelope(request, self.chunk_name, created)
        if self.chat:
            delta: dict = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": OPENAI_FINISH.get(finish)}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": OPENAI_FINISH.get(finish)}
        body["choices"] = [choice]
        if include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, request: InferenceRequest, created: int) -> dict:
        body = self._envelope(request, self.chunk_name, created)
        body["choices"] = []
        body["usage"] = usage(request)
        return body


def now() -> int:
    return int(time.time())
