"""Turning a backend's token deltas into text deltas, per request, inside the worker process.

Detokenising and stop-string matching run here, once per request per engine step, so the HTTP process
only forwards finished text: its event loop serves every model and must stay light.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from orchestrator.engine.request import EngineRequest, FinishReason, TokenDelta
from orchestrator.errors import EngineError, to_wire
from orchestrator.ipc.messages import TextDelta
from orchestrator.text.byte_level import ByteLevelPieces
from orchestrator.text.detokenizer import IncrementalDetokenizer, StopMatcher
from orchestrator.worker.channels import OutputChannels
from orchestrator.worker.direct import DirectStream


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
    """The text of one sequence so far; `stopped` once a stop string or a repeated tool call ended it. With
    `channels` (requests that parse tool calls or thinking), each step's text is split into content, reasoning and
    tool calls, and special tokens stay in the text the parsers read (a format's call marker may be one)."""

    __slots__ = ("_channels", "_detokenizer", "_json_pieces", "_jsons", "_min_tokens", "_plain", "_stops", "_texts",
                 "direct", "generated", "request_id", "stopped")

    def __init__(self, request: EngineRequest, tokenizer: Tokenizer, texts: TokenTexts,
                 channels: OutputChannels | None = None, pieces: ByteLevelPieces | None = None):
        """`pieces`: the worker's byte-level table where its tokenizer has one (faster detokenising)."""
        self.request_id = request.id
        self._texts = texts
        self._detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=channels is None, pieces=pieces)
        self._stops = StopMatcher(request.stop, include=request.include_stop_str_in_output)
        self._channels = channels
        self._min_tokens = request.min_tokens
        self._plain = not request.stop and channels is None and not request.logprobs  # text is all there is
        self._json_pieces = pieces if self._plain else None  # where a token's text may go out as it is (`json`)
        self._jsons = pieces.jsons if pieces is not None else {}
        self.generated = 0
        self.stopped = False
        self.direct: DirectStream | None = None  # the client's socket, where it came with the submit

    def row(self, delta: TokenDelta) -> list | None:
        """`on_delta`'s answer as its wire row (TextDelta.to_wire), made directly in the common case: a request
        with no stop strings, log probabilities or parsing, in the middle of its answer."""
        if self._plain and delta.finish is None and delta.cached_tokens is None:
            count = len(delta.token_ids)
            self.generated += count
            text = self._detokenizer.push(delta.token_ids)
            return [self.request_id, text, count, None, None] if text or count else None
        out = self.on_delta(delta)
        return None if out is None else out.to_wire()

    def json(self, delta: TokenDelta) -> bytes | None:
        """The delta's text as a JSON string where it is one token of plain text in the middle of the answer, whose
        bytes are whole characters, with nothing held back (ByteLevelPieces.json): an attached stream writes it as
        it is, with no row made. None: `row` is needed."""
        if self._json_pieces is None or delta.finish is not None or delta.cached_tokens is not None or \
                len(ids := delta.token_ids) != 1 or self._detokenizer.held:
            return None
        if body := self._jsons.get(ids[0]) or self._json_pieces.json(ids[0]):  # the table's answer, else its fill
            self.generated += 1
            return body
        return None

    def on_delta(self, delta: TokenDelta) -> TextDelta | None:
        """The text delta to send for this token delta; None when there is nothing new to say."""
        if self.stopped:
            return None  # the backend's late tokens after a stop string: already finished
        count = len(delta.token_ids)
        self.generated += count
        armed = self.generated >= self._min_tokens
        text, hit = self._stops.push(self._detokenizer.push(delta.token_ids), armed)
        if delta.finish is FinishReason.ERROR:
            error = delta.error or EngineError("the engine failed this request")
            return TextDelta(self.request_id, text, count, FinishReason.ERROR, to_wire(error))
        finish = FinishReason.STOP if hit else delta.finish
        if hit:
            self.stopped = True
        elif finish is not None:
            text += self._stops.flush()
        out = TextDelta(self.request_id, text, count, finish, None, self._logprobs(delta), delta.cached_tokens)
        if self._channels is not None:
            self._split(out)
        if not (out.text or count or finish or out.cached_tokens is not None or out.reasoning or out.tool_calls):
            return None
        return out

    def _split(self, out: TextDelta) -> None:
        channels = self._channels
        parts = channels.feed(out.text)
        if channels.ended:  # a call repeated an earlier one: the turn is over, the worker ends the request
            out.finish, self.stopped = FinishReason.TOOL_CALLS, True
        if out.finish is not None:
            rest = channels.finish()
            parts.content += rest.content
            parts.reasoning += rest.reasoning
            parts.tool_calls += rest.tool_calls
            if out.finish is FinishReason.STOP and channels.made_calls:
                out.finish = FinishReason.TOOL_CALLS
        out.text, out.reasoning, out.tool_calls = parts.content, parts.reasoning or None, parts.tool_calls or None

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
