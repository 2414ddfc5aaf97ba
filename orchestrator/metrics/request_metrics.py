"""Per-request metrics: counters and histograms computed from each request's own timestamps when it ends.

Everything lives on a registry passed in (never prometheus_client's global one) and is labelled by model.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from orchestrator.lifecycle import InferenceRequest, RequestStatus

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
LENGTH_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 131072)

_FINISH = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_CANCELLED: "cancelled",
    RequestStatus.FINISHED_ERROR: "error",
}


def status_class(status: int) -> str:
    return f"{status // 100}xx"


class RequestMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter(
            "inferno_requests",
            "Generation requests that ended, by model, HTTP status class and finish reason.",
            ["model", "status_class", "finish_reason"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "inferno_prompt_tokens", "Prompt tokens processed.", ["model"], registry=registry
        )
        self.generation_tokens = Counter(
            "inferno_generation_tokens", "Tokens generated.", ["model"], registry=registry
        )
        self.time_to_first_token = Histogram(
            "inferno_time_to_first_token_seconds",
            "From arrival to the first generated token.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.inter_token_latency = Histogram(
            "inferno_inter_token_latency_seconds",
            "Mean time per generated token after the first, per request.",
            ["model"],
            buckets=TOKEN_LATENCY_BUCKETS,
            registry=registry,
        )
        self.e2e_latency = Histogram(
            "inferno_e2e_request_latency_seconds",
            "From arrival to the last token (or the error).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_time = Histogram(
            "inferno_request_queue_time_seconds",
            "From arrival until the request entered its engine (includes waiting for a model load).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.prompt_length = Histogram(
            "inferno_request_prompt_tokens",
            "Prompt length per request.",
            ["model"],
            buckets=LENGTH_BUCKETS,
            registry=registry,
        )
        self.generation_length = Histogram(
            "inferno_request_generation_tokens",
            "Tokens generated per request (all choices).",
            ["model"],
            buckets=LENGTH_BUCKETS,
            registry=registry,
        )

    def observe(self, request: InferenceRequest, http_status: int) -> None:
        model = request.model
        reason = _FINISH.get(request.status, "cancelled")
        self.requests.labels(model, status_class(http_status), reason).inc()
        if request.started is None:
            return  # turned away before it ran: no tokens, no latencies
        self.prompt_tokens.labels(model).inc(request.prompt_tokens)
        self.generation_tokens.labels(model).inc(request.completion_tokens)
        self.prompt_length.labels(model).observe(request.prompt_tokens)
        self.generation_length.labels(model).observe(request.completion_tokens)
        self.queue_time.labels(model).observe(request.started - request.arrived)
        if request.first_token is not None:
            self.time_to_first_token.labels(model).observe(request.first_token - request.arrived)
        if request.finished is not None:
            self.e2e_latency.labels(model).observe(request.finished - request.arrived)
        longest = max(choice.completion_tokens for choice in request.choices)  # choices run side by side
        if request.first_token is not None and longest > 1:
            per_token = (request.last_token - request.first_token) / (longest - 1)
            self.inter_token_latency.labels(model).observe(per_token)
