"""The registry the app owns: everything /metrics shows is registered on it, never on the global one."""

from __future__ import annotations

import functools

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, Info, ProcessCollector

from orchestrator import __version__


def new_registry() -> CollectorRegistry:
    """A registry with the HTTP process's own metrics (CPU, memory, file descriptors) and the build info."""
    # prometheus_client has no per-registry switch for `_created` samples. In the text format Prometheus
    # scrapes they come out as an extra gauge family for every counter and histogram: noise, so off.
    prometheus_client.disable_created_metrics()
    registry = CollectorRegistry()
    ProcessCollector(namespace="inferno", registry=registry)
    Info("inferno_build", "Always 1; Inferno's version as a label.", registry=registry).info({"version": __version__})
    return registry


def counter(registry: CollectorRegistry, name: str, documentation: str, labels=("model",)) -> Counter:
    """A counter on `registry`, labelled by model unless `labels` says otherwise."""
    return _children_kept(Counter(name, documentation, labels, registry=registry))


def histogram(registry: CollectorRegistry, name: str, documentation: str, buckets: tuple, labels=("model",)) -> Histogram:
    """A histogram on `registry`, labelled by model unless `labels` says otherwise."""
    return _children_kept(Histogram(name, documentation, labels, buckets=buckets, registry=registry))


def _children_kept(metric):
    """The metric with its `labels()` remembered by label values: prometheus_client takes a lock and converts every
    value on each call (~2 µs), and a request that ends observes a dozen series. The children live as long as the
    metric either way."""
    metric.labels = functools.cache(metric.labels)
    return metric
