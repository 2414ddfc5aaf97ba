"""Turning a backend's token deltas into text deltas, per request, inside the worker process.

Detokenising and stop-string matching run here, once per request per engine step, so the HTTP process
only forwards finished text: its event loop serves every model and must stay light.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from orchestrator.engine.request import EngineRequest, FinishReason, TextDelta, TokenDelta
from orchestrator.errors import EngineError, to_wire
from orchestrator.text.detokenizer import IncrementalDetokenizer, StopMatcher


class TokenTexts:
    """Each token's own text, as log probabilities show it (special tokens are empty; a character split across
    tokens shows as U+FFFD in each), cached per token id. One per worker."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self._tokenizer.decode([token], skip_special_tokens=True)
        return text


class SequenceOutput:
    """The text of one sequence so far; `stopped` once a stop string ended it."""

    __slots__ = ("_detokenizer", "_min_tokens", "_stops", "_texts", "generated", "request_id", "stopped")

    def __init__(self, request: EngineRequest, tokenizer: Tokenizer, texts: TokenTexts):
        self.request_id = request.id
        self._texts = texts
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._stops = StopMatcher(request.stop, include=request.include_stop_str_in_output)
        self._min_tokens = request.min_tokens
        self.generated = 0
        self.stopped = False

    def on_delta(self, delta: TokenDelta) -> TextDelta | None:
        """The text delta to send for this token delta; None when there is nothing new to say."""
        if self.stopped:
            return None  # the backend's late tokens after a stop string: already finished
        count = len(delta.token_ids)
        self.generated += count
        armed = self.generated >= self._min_tokens
        text, hit = self._stops.push(self._detokenizer.push(delta.token_ids), armed)
        logprobs = self._logprobs(delta)
        if hit:
            self.stopped = True
            return TextDelta(self.request_id, text, count, FinishReason.STOP, None, logprobs, delta.cached_tokens)
        if delta.finish is FinishReason.ERROR:
            error = delta.error or EngineError("the engine failed this request")
            return TextDelta(self.request_id, text, count, FinishReason.ERROR, to_wire(error))
        if delta.finish is not None:
            text += self._stops.flush()
            return TextDelta(self.request_id, text, count, delta.finish, None, logprobs, delta.cached_tokens)
        if not text and not count and delta.cached_tokens is None:
            return None
        return TextDelta(self.request_id, text, count, None, None, logprobs, delta.cached_tokens)

    def _logprobs(self, delta: TokenDelta) -> list | None:
        """Per token: [its text, its log probability, [[alternative's text, log probability], ...]]."""
        if delta.logprobs is None:
            return None
        texts = self._texts
        tops = delta.top_logprobs or [()] * len(delta.token_ids)
        return [
            [texts(token), logprob, [[texts(t), lp] for t, lp in top]]
            for token, logprob, top in zip(delta.token_ids, delta.logprobs, tops, strict=True)
        ]
