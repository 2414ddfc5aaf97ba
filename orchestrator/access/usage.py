"""Per-key usage: generation requests, prompt and completion tokens, and engine seconds, by key name and model.

Counted once per generation request, when it ends, both as Prometheus counters (labelled by the key's name,
never the key) and as plain totals for `GET /admin/usage`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from prometheus_client import CollectorRegistry

from orchestrator.metrics.registry import counter


@dataclass
class UsageTotals:
    requests: int = 0
    errors: int = 0  # requests answered with a 4xx or 5xx status (499, the client went away, included)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    engine_seconds: float = 0.0  # from entering the engine to the end, summed over requests

    def add(self, other: UsageTotals) -> None:  # field by field: once per request, dataclasses.fields is slow
        self.requests += other.requests
        self.errors += other.errors
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.engine_seconds += other.engine_seconds


class UsageMeter:
    def __init__(self, registry: CollectorRegistry):
        labels = ("key", "model")
        self._requests = counter(
            registry, "inferno_key_requests", "Generation requests by API key name, model and HTTP status class.",
            (*labels, "status_class"),
        )
        self._prompt = counter(
            registry, "inferno_key_prompt_tokens",
            "Prompt tokens of requests that reached their engine, by API key name.", labels,
        )
        self._completion = counter(
            registry, "inferno_key_completion_tokens", "Tokens generated, all choices counted, by API key name.", labels
        )
        self._engine = counter(
            registry, "inferno_key_engine_seconds", "Seconds requests spent in their engine, by API key name.", labels
        )
        self._totals: dict[str, dict[str, UsageTotals]] = {}

    def record(self, key: str, model: str, status: int, prompt_tokens: int, completion_tokens: int,
               engine_seconds: float) -> None:
        """One generation request that ended with HTTP `status` (499: the client went away)."""
        self._requests.labels(key, model, f"{status // 100}xx").inc()
        if prompt_tokens or completion_tokens or engine_seconds:
            self._prompt.labels(key, model).inc(prompt_tokens)
            self._completion.labels(key, model).inc(completion_tokens)
            self._engine.labels(key, model).inc(engine_seconds)
        totals = self._totals.setdefault(key, {}).setdefault(model, UsageTotals())
        totals.add(UsageTotals(1, int(status >= 400), prompt_tokens, completion_tokens, engine_seconds))

    def report(self) -> dict[str, dict]:
        """{key name: {"total": totals, "models": {model: totals}}}, totals as plain dicts."""
        report = {}
        for key, by_model in sorted(self._totals.items()):
            total = UsageTotals()
            for totals in by_model.values():
                total.add(totals)
            report[key] = {"total": asdict(total), "models": {m: asdict(t) for m, t in sorted(by_model.items())}}
        return report
