"""Per-request metrics: counters and histograms computed from each request's own timestamps when it ends.

One `observe` per request, never per token: the HTTP process serves every model on one event loop, so work
here multiplies by the request rate only. Everything lives on the registry passed in and is labelled by model.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from orchestrator.lifecycle import InferenceRequest
from orchestrator.metrics.registry import counter, histogram

# Seconds. Time to first token: prefill of one prompt, plus queueing; sub-second resolution matters most.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
                30.0, 60.0, 120.0)
# Seconds per token: one decode step, from ~1 ms (small model, big GPU) to a slow CPU.
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
               1.0, 2.5)
# Seconds for a whole request: long generations run for minutes.
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
               180.0, 300.0, 600.0)
# Seconds waiting for a permit: ~0 when there is room, up to a model load or the queue timeout otherwise.
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# Tokens per request: powers of two up to the longest contexts served.
LENGTH_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)



def status_class(status: int) -> str:
    return f"{status // 100}xx"


class RequestMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.requests = counter(
            registry, "inferno_requests",
            "Generation requests that ended, by model, HTTP status class (499: the client went away) and "
            "finish reason (stop, length, cancelled, error).",
            ("model", "status_class", "finish_reason"),
        )
        self.prompt_tokens = counter(
            registry, "inferno_prompt_tokens", "Prompt tokens of the requests that reached their engine."
        )
        self.generation_tokens = counter(registry, "inferno_generation_tokens", "Tokens generated, all choices counted.")
        self.time_to_first_token = histogram(
            registry, "inferno_time_to_first_token_seconds",
            "Seconds from a request's arrival to its first generated token (queueing included).", TTFT_BUCKETS,
        )
        self.inter_token_latency = histogram(
            registry, "inferno_inter_token_latency_seconds",
            "Seconds per generated token after the first: one observation per request, its mean.", ITL_BUCKETS,
        )
        self.e2e_latency = histogram(
            registry, "inferno_e2e_request_latency_seconds",
            "Seconds from a request's arrival to its end (last token, error or cancellation).", E2E_BUCKETS,
        )
        self.queue_time = histogram(
            registry, "inferno_request_queue_time_seconds",
            "Seconds from a request's arrival until it entered its engine (waiting for a permit or a model load).",
            QUEUE_BUCKETS,
        )
        self.prompt_length = histogram(
            registry, "inferno_request_prompt_tokens", "Prompt tokens per request.", LENGTH_BUCKETS
        )
        self.generation_length = histogram(
            registry, "inferno_request_generation_tokens", "Tokens generated per request, all choices counted.",
            LENGTH_BUCKETS,
        )

    def observe(self, request: InferenceRequest, http_status: int) -> None:
        model = request.model
        if request.status.finished:
            reason = request.status.label
        else:  # an unexpected exception left the handler: aiohttp answers it with a 500
            reason, http_status = "error", 500
        self.requests.labels(model, status_class(http_status), reason).inc()
        if request.started is None:
            return  # turned away before it ran: no tokens, no latencies
        self.prompt_tokens.labels(model).inc(request.prompt_tokens)
        self.generation_tokens.labels(model).inc(request.completion_tokens)
        self.prompt_length.labels(model).observe(request.prompt_tokens)
        self.generation_length.labels(model).observe(request.completion_tokens)
        self.queue_time.labels(model).observe(request.started - request.arrived)
        if request.finished is not None:
            self.e2e_latency.labels(model).observe(request.finished - request.arrived)
        if request.first_token is None:
            return
        self.time_to_first_token.labels(model).observe(request.first_token - request.arrived)
        longest = max(choice.completion_tokens for choice in request.choices)  # choices run side by side
        if longest > 1:
            self.inter_token_latency.labels(model).observe((request.last_token - request.first_token) / (longest - 1))
