"""Which models are simulated (backend "sim", orchestrator/backends/sim/): an info series per simulated model, so a
dashboard or an alert can tell GPU rates that were simulated from measured ones."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge

from orchestrator.engine.catalogue import Engine


def register_simulation_info(registry: CollectorRegistry, engines: Mapping[str, Engine]) -> None:
    """`inferno_model_simulated_info`: always declared; one series, always 1, per simulated model."""
    info = Gauge(
        "inferno_model_simulated_info",
        "Always 1 for a simulated model (backend sim): the simulated GPU, precision, speed-up and tokenizer as labels.",
        ["model", "gpu", "gpu_count", "precision", "speedup", "tokenizer"],
        registry=registry,
    )
    for name, engine in sorted(engines.items()):
        facts = engine.manifest.simulation
        if facts is not None:
            labels = (name, facts.gpu, str(facts.gpu_count), facts.precision, f"{facts.speedup:g}", facts.tokenizer)
            info.labels(*labels).set(1)
