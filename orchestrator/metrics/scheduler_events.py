"""The scheduler's events as metrics: load times, unloads by reason, worker crashes.

Implements `SchedulerEvents` (`scheduler/observe.py`); the scheduler calls it on its event loop as things
happen. Each call is a label lookup and an increment: cheap, and it cannot raise on the labels given.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry

from orchestrator.metrics.registry import counter, histogram

# Seconds: from reading safetensors on a CPU (under a second) to a big TensorRT-LLM engine's first load.
LOAD_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 300.0, 600.0, 900.0)
UNLOAD_REASONS = ("evicted", "idle", "admin", "shutdown")


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry, models: Iterable[str] = ()):
        self.load_seconds = histogram(
            registry, "inferno_model_load_seconds",
            "Seconds a successful model load took, from starting its worker to the model being ready.", LOAD_BUCKETS,
        )
        self.unloads = counter(
            registry, "inferno_model_unloads",
            "Models unloaded, by reason: evicted (to make room for another model), idle, admin, shutdown.",
            ("model", "reason"),
        )
        self.worker_restarts = counter(
            registry, "inferno_worker_restarts",
            "Model worker processes that exited unexpectedly; the model's next request starts a new one.",
        )
        for model in models:  # every series exists from the start, so rate() and alerts see the first event
            self.load_seconds.labels(model)
            self.worker_restarts.labels(model)
            for reason in UNLOAD_REASONS:
                self.unloads.labels(model, reason)

    def model_loaded(self, model: str, seconds: float) -> None:
        self.load_seconds.labels(model).observe(seconds)

    def model_unloaded(self, model: str, reason: str) -> None:
        self.unloads.labels(model, reason).inc()

    def worker_crashed(self, model: str) -> None:
        self.worker_restarts.labels(model).inc()
