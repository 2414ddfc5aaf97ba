"""Turning a backend's token deltas into text deltas, per request, inside the worker process.

Detokenising and stop-string matching run here, once per request per engine step, so the HTTP process
only forwards finished text: its event loop serves every model and must stay light.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from orchestrator.engine.request import EngineRequest, FinishReason, TextDelta, TokenDelta
from orchestrator.errors import EngineError, to_wire
from orchestrator.text.detokenizer import IncrementalDetokenizer, StopMatcher


class SequenceOutput:
    """The text of one sequence so far; `stopped` once a stop string ended it."""

    def __init__(self, request: EngineRequest, tokenizer: Tokenizer):
        self.request_id = request.id
        self._tokenizer = tokenizer
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._stops = StopMatcher(request.stop)
        self.stopped = False

    def on_delta(self, delta: TokenDelta) -> TextDelta | None:
        """The text delta to send for this token delta; None when there is nothing new to say."""
        if self.stopped:
            return None  # the backend's late tokens after a stop string: already finished
        text, hit = self._stops.push(self._detokenizer.push(delta.token_ids))
        count = len(delta.token_ids)
        logprobs = self._token_logprobs(delta)
        if hit:
            self.stopped = True
            return TextDelta(self.request_id, text, count, FinishReason.STOP, logprobs=logprobs)
        if delta.finish is FinishReason.ERROR:
            error = to_wire(EngineError(delta.error or "the engine failed this request"))
            return TextDelta(self.request_id, text, count, FinishReason.ERROR, error)
        if delta.finish is not None:
            text += self._stops.flush()
            return TextDelta(self.request_id, text, count, delta.finish, logprobs=logprobs)
        if not text and not count:
            return None
        return TextDelta(self.request_id, text, count, logprobs=logprobs)

    def _token_logprobs(self, delta: TokenDelta) -> list[tuple[str, float]] | None:
        """Each token's own text, as in the output (special tokens are empty; a character split across tokens
        shows as U+FFFD in each), and its log probability."""
        if delta.logprobs is None:
            return None
        decode = self._tokenizer.decode
        return [(decode([t], skip_special_tokens=True), lp) for t, lp in zip(delta.token_ids, delta.logprobs, strict=True)]
