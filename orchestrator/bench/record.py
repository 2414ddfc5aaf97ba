"""What one request measured, the same for every series (HTTP, in-process, bare SSE)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestTiming:
    """Timestamps (time.perf_counter seconds) and counts of one request.

    `token_times` holds one timestamp per output-bearing chunk (an SSE event with new text, or one engine
    step's tokens in-process); chunks that carry no text (the role chunk, the finish-only chunk, the usage
    chunk) are not in it. `output_tokens` comes from the final usage chunk, or the engine in-process.
    """

    model: str
    sent: float
    token_times: list[float] = field(default_factory=list)
    end: float | None = None
    output_tokens: int | None = None  # None when the server sent no usage
    prompt_tokens: int | None = None
    events: int = 0  # every SSE data event received, text or not
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.sent if self.token_times else None

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.sent

    @property
    def gaps(self) -> list[float]:
        """Inter-chunk latencies: the time between successive output-bearing chunks."""
        return [b - a for a, b in itertools.pairwise(self.token_times)]

    @property
    def mean_itl(self) -> float | None:
        """(last chunk - first chunk) / (chunks - 1): this request's own inter-chunk latency."""
        times = self.token_times
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None

    @property
    def tokens(self) -> int:
        """Output tokens: the usage count where there is one, else one per output-bearing chunk."""
        return self.output_tokens if self.output_tokens is not None else len(self.token_times)
