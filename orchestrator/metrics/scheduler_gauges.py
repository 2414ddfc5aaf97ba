"""Metric families made at scrape time from the scheduler's snapshots (`scheduler/observe.py`).

Pure functions over plain data: no scheduler, no clock, no I/O.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from orchestrator.scheduler import DeviceMemory, ModelSnapshot

# The states a model moves through (ModelSnapshot.state). Each gets a series, so a state shows as 0 before
# a model ever enters it; a state added later to the scheduler still shows, as its own series, when entered.
MODEL_STATES = ("unloaded", "loading", "ready", "unloading", "failed")


def gauge(name: str, labels: str, text: str) -> GaugeMetricFamily:
    """A gauge family; `labels` space-separated."""
    return GaugeMetricFamily(name, text, labels=labels.split())


def counter(name: str, labels: str, text: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, text, labels=labels.split())


def model_families(models: list[ModelSnapshot]) -> list[Metric]:
    running = gauge("inferno_requests_running", "model",
                    "Requests holding a permit on the model (in its engine).")
    waiting = gauge("inferno_requests_waiting", "model",
                    "Requests queued in the server for a permit or for the model's load: the queue depth.")
    state = gauge("inferno_model_state", "model state", "1 for the model's current state, 0 for the others.")
    info = gauge("inferno_model_info", "model backend", "Always 1; the model's backend as a label.")
    memory = gauge("inferno_model_memory_bytes", "model",
        "The model's footprint on its device in bytes: measured while loaded, the scheduler's estimate otherwise.")
    idle = gauge("inferno_model_idle_seconds", "model", "Seconds since the model last finished a request.")
    pool = gauge("inferno_generation_logits_pool_bytes", "model kind",
                 "Pinned host RAM of the model's generation logits pool (trtllm, generation_logits on): its size, "
                 "and what its admitted top_logprobs requests hold of it.")
    kept = gauge("inferno_kept_weights_bytes", "model",
        "Host RAM holding the model's weights while it is unloaded, for its next load (0: not kept).")
    failures = counter("inferno_model_load_failures", "model",
                       "Model loads that failed since the server started.")
    for model in models:
        running.add_metric([model.name], model.running)
        waiting.add_metric([model.name], model.queued)
        states = MODEL_STATES if model.state in MODEL_STATES else (*MODEL_STATES, model.state)
        for candidate in states:
            state.add_metric([model.name, candidate], 1.0 if model.state == candidate else 0.0)
        info.add_metric([model.name, model.backend], 1.0)
        memory.add_metric([model.name], model.memory_bytes)
        idle.add_metric([model.name], model.idle_seconds)
        failures.add_metric([model.name], model.load_failures)
        kept.add_metric([model.name], model.kept_weights.bytes if model.kept_weights is not None else 0)
        if model.generation_logits_pool is not None:
            pool.add_metric([model.name, "size"], model.generation_logits_pool.size_bytes)
            pool.add_metric([model.name, "used"], model.generation_logits_pool.used_bytes)
    return [running, waiting, state, info, memory, idle, pool, kept, failures]


def device_families(devices: list[DeviceMemory]) -> list[Metric]:
    total = gauge("inferno_device_memory_total_bytes", "device", "Memory capacity of the device in bytes.")
    used = gauge("inferno_device_memory_used_bytes", "device",
                 "Memory in use on the device in bytes, by every process (NVML for GPUs, RAM for the CPU).")
    reserved = gauge("inferno_device_memory_reserved_bytes", "device",
                     "Device memory in bytes the scheduler holds back from models.")
    for device in devices:
        total.add_metric([device.device], device.total_bytes)
        used.add_metric([device.device], device.used_bytes)
        reserved.add_metric([device.device], device.reserved_bytes)
    return [total, used, reserved]
