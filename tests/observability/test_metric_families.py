"""The metrics code on plain data: scheduler snapshots, engine stats, scheduler events, finished requests and
HTTP requests, each rendered through a registry the way /metrics renders it."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.api.outcome import outcome_middleware
from orchestrator.backends.protocol import BackendStats
from orchestrator.engine.request import EngineRequest
from orchestrator.lifecycle import Choice, InferenceRequest, RequestStatus
from orchestrator.metrics.engine_collector import engine_families
from orchestrator.metrics.event_loop import EventLoopCollector
from orchestrator.metrics.http_metrics import HttpDurations
from orchestrator.metrics.registry import new_registry
from orchestrator.metrics.request_metrics import RequestMetrics
from orchestrator.metrics.scheduler_events import SchedulerMetrics
from orchestrator.metrics.scheduler_gauges import device_families, model_families
from orchestrator.scheduler.observe import DeviceMemory, KeptSnapshot, ModelSnapshot, SchedulerEvents


class Families:
    """A collector serving fixed families, so they render through a real registry."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return self.families


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def rendered(families) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    registry.register(Families(families))
    return samples(registry)


def snapshot(name="m", state="ready", **overrides) -> ModelSnapshot:
    fields = dict(backend="trtllm", pinned=False, running=2, queued=3, loads=1, load_failures=1, evictions=0,
                  crashes=0, memory_bytes=7 * 2**30, idle_seconds=1.5, last_error=None)
    return ModelSnapshot(name=name, state=state, **{**fields, **overrides})


def test_model_families_carry_each_snapshot():
    values = rendered(model_families([snapshot("a", "ready"), snapshot("b", "loading", running=0)]))
    assert values[("inferno_requests_running", (("model", "a"),))] == 2
    assert values[("inferno_requests_waiting", (("model", "b"),))] == 3
    assert values[("inferno_model_memory_bytes", (("model", "a"),))] == 7 * 2**30
    assert values[("inferno_model_load_failures_total", (("model", "a"),))] == 1
    assert values[("inferno_kept_weights_bytes", (("model", "a"),))] == 0  # loaded: nothing kept
    assert values[("inferno_model_info", (("backend", "trtllm"), ("model", "b")))] == 1
    states_of_b = {labels[1][1]: v for (name, labels), v in values.items()
                   if name == "inferno_model_state" and labels[0] == ("model", "b")}
    assert states_of_b == {"unloaded": 0, "loading": 1, "ready": 0, "unloading": 0, "failed": 0}


def test_kept_weights_show_per_model():
    kept = KeptSnapshot(bytes=270 * 2**20, pinned=True, since=1.0)
    values = rendered(model_families([snapshot("a", "unloaded", kept_weights=kept), snapshot("b", "ready")]))
    assert values[("inferno_kept_weights_bytes", (("model", "a"),))] == 270 * 2**20
    assert values[("inferno_kept_weights_bytes", (("model", "b"),))] == 0


def test_a_state_the_metrics_do_not_know_yet_still_shows():
    values = rendered(model_families([snapshot("a", "evicting")]))
    assert values[("inferno_model_state", (("model", "a"), ("state", "evicting")))] == 1
    assert values[("inferno_model_state", (("model", "a"), ("state", "ready")))] == 0


def test_device_memory_is_exported_as_the_scheduler_reports_it():
    devices = [DeviceMemory("cuda:0", 80 * 2**30, 60 * 2**30, 2**30), DeviceMemory("cpu", 2**36, 2**35, 0)]
    values = rendered(device_families(devices))
    assert values[("inferno_device_memory_total_bytes", (("device", "cuda:0"),))] == 80 * 2**30
    assert values[("inferno_device_memory_used_bytes", (("device", "cuda:0"),))] == 60 * 2**30
    assert values[("inferno_device_memory_reserved_bytes", (("device", "cuda:0"),))] == 2**30
    assert values[("inferno_device_memory_used_bytes", (("device", "cpu"),))] == 2**35


def engine_stats(**overrides) -> BackendStats:
    stats = dict(running=3, waiting=1, kv_blocks_total=200, kv_blocks_free=150, kv_blocks_used=50,
                 tokens_per_block=32, iterations=1234, kv_blocks_reused=None, iteration_latency_ms=None)
    return BackendStats(**{**stats, **overrides})


def test_engine_families_from_a_workers_stats():
    values = rendered(engine_families({"m": engine_stats()}))
    model = (("model", "m"),)
    assert values[("inferno_engine_requests_running", model)] == 3
    assert values[("inferno_kv_cache_blocks", (("kind", "used"), ("model", "m")))] == 50
    assert values[("inferno_kv_cache_usage_ratio", model)] == 0.25
    assert values[("inferno_kv_cache_tokens_per_block", model)] == 32
    assert values[("inferno_engine_iterations", model)] == 1234
    assert ("inferno_kv_cache_reused_blocks_total", model) not in values  # not reported by this engine
    assert ("inferno_engine_iteration_latency_seconds", model) not in values


def test_prefix_cache_reuse_and_step_latency_where_the_engine_reports_them():
    values = rendered(engine_families({"m": engine_stats(kv_blocks_reused=77, iteration_latency_ms=12.5)}))
    assert values[("inferno_kv_cache_reused_blocks_total", (("model", "m"),))] == 77
    assert values[("inferno_engine_iteration_latency_seconds", (("model", "m"),))] == 0.0125


def test_an_empty_kv_cache_is_zero_usage_not_a_division_error():
    values = rendered(engine_families({"m": engine_stats(kv_blocks_total=0, kv_blocks_free=0, kv_blocks_used=0)}))
    assert values[("inferno_kv_cache_usage_ratio", (("model", "m"),))] == 0


def test_scheduler_events_become_load_times_unloads_and_restarts():
    registry = CollectorRegistry()
    events: SchedulerEvents = SchedulerMetrics(registry, ["a", "b"])
    events.model_loaded("a", 3.0)
    events.model_unloaded("a", "evicted")
    events.model_unloaded("a", "evicted")
    events.worker_crashed("b")
    values = samples(registry)
    assert values[("inferno_model_load_seconds_count", (("model", "a"),))] == 1
    assert values[("inferno_model_load_seconds_bucket", (("le", "5.0"), ("model", "a")))] == 1
    assert values[("inferno_model_load_seconds_bucket", (("le", "2.5"), ("model", "a")))] == 0
    assert values[("inferno_model_unloads_total", (("model", "a"), ("reason", "evicted")))] == 2
    assert values[("inferno_worker_restarts_total", (("model", "b"),))] == 1
    # Series exist before their first event, for every model and unload reason.
    assert values[("inferno_model_load_seconds_count", (("model", "b"),))] == 0
    assert values[("inferno_model_unloads_total", (("model", "b"), ("reason", "idle")))] == 0
    assert values[("inferno_worker_restarts_total", (("model", "a"),))] == 0


def finished_request(status: RequestStatus, tokens: int, arrived=100.0, started=100.5, first=101.0, last=None):
    engine_request = EngineRequest(id="e1", prompt_ids=(1, 2, 3), max_new_tokens=16)
    request = InferenceRequest("r1", "m", prompt_tokens=3, choices=[Choice(0, engine_request, tokens)], stream=False)
    request.arrived, request.started, request.first_token = arrived, started, first if tokens else None
    request.last_token = last if last is not None else request.first_token
    request.status, request.finished = status, 104.0
    return request


def test_a_request_is_observed_once_from_its_timestamps():
    registry = CollectorRegistry()
    RequestMetrics(registry).observe(finished_request(RequestStatus.FINISHED_LENGTH, 5, last=103.0), 200)
    values = samples(registry)
    model = (("model", "m"),)
    assert values[("inferno_requests_total", (("finish_reason", "length"), ("model", "m"), ("status_class", "2xx")))] == 1
    assert values[("inferno_request_queue_time_seconds_sum", model)] == 0.5
    assert values[("inferno_time_to_first_token_seconds_sum", model)] == 1.0
    assert values[("inferno_inter_token_latency_seconds_sum", model)] == 0.5  # 2 s over 4 tokens after the first
    assert values[("inferno_e2e_request_latency_seconds_sum", model)] == 4.0
    assert values[("inferno_generation_tokens_total", model)] == 5
    assert values[("inferno_prompt_tokens_total", model)] == 3


def test_a_request_turned_away_before_it_ran_counts_but_has_no_latencies():
    registry = CollectorRegistry()
    request = finished_request(RequestStatus.FINISHED_ERROR, 0, started=None)
    RequestMetrics(registry).observe(request, 429)
    values = samples(registry)
    assert values[("inferno_requests_total", (("finish_reason", "error"), ("model", "m"), ("status_class", "4xx")))] == 1
    assert not any(name.startswith("inferno_request_queue_time") for name, _ in values)


def test_a_request_left_unfinished_by_an_unexpected_exception_is_a_5xx_error():
    registry = CollectorRegistry()
    request = finished_request(RequestStatus.RUNNING, 2)
    request.finished = None
    RequestMetrics(registry).observe(request, 200)  # the handler never set a status: aiohttp answers 500
    values = samples(registry)
    assert values[("inferno_requests_total", (("finish_reason", "error"), ("model", "m"), ("status_class", "5xx")))] == 1


def test_the_registry_carries_process_metrics_and_build_info_without_created_series():
    registry = new_registry()
    RequestMetrics(registry).observe(finished_request(RequestStatus.FINISHED_STOPPED, 2), 200)
    names = {name for name, _ in samples(registry)}
    assert "inferno_process_resident_memory_bytes" in names
    assert "inferno_build_info" in names
    assert not [name for name in names if name.endswith("_created")]


def test_event_loop_tasks_counts_the_live_tasks_of_the_loop_it_is_scraped_on():
    registry = CollectorRegistry()
    registry.register(EventLoopCollector())  # registering collects once, outside any loop: no sample then
    assert ("inferno_event_loop_tasks", ()) not in samples(registry)

    async def scrape_around_parked_tasks() -> tuple[float, float, float, int]:
        release = asyncio.Event()
        before = samples(registry)[("inferno_event_loop_tasks", ())]
        parked = [asyncio.create_task(release.wait()) for _ in range(5)]
        await asyncio.sleep(0)
        during = samples(registry)[("inferno_event_loop_tasks", ())]
        release.set()
        await asyncio.gather(*parked)
        after = samples(registry)[("inferno_event_loop_tasks", ())]
        return before, during, after, len(asyncio.all_tasks())

    before, during, after, alive = asyncio.run(scrape_around_parked_tasks())
    assert before == alive == 1  # the coroutine asyncio.run wraps in a task, which scrapes
    assert during == before + 5
    assert after == before


def http_app(registry: CollectorRegistry) -> web.Application:
    async def ok(http):
        return web.json_response({})

    async def refused(http):
        raise web.HTTPRequestEntityTooLarge(max_size=1, actual_size=2)

    async def broken(http):
        raise RuntimeError("a bug")

    async def slow(http):
        await asyncio.sleep(30)
        return web.json_response({})

    app = web.Application(middlewares=[outcome_middleware(HttpDurations(registry))])
    app.router.add_get("/items/{item}", ok)
    app.router.add_post("/refused", refused)
    app.router.add_get("/broken", broken)
    app.router.add_get("/slow", slow)
    return app


def http_counts(registry: CollectorRegistry) -> dict[tuple, float]:
    return {labels: value for (name, labels), value in samples(registry).items()
            if name == "inferno_http_request_duration_seconds_count"}


def test_http_durations_by_route_pattern_method_and_real_status():
    registry = CollectorRegistry()

    async def requests():
        server = TestServer(http_app(registry), handler_cancellation=True)  # as `inferno serve` runs it
        async with TestClient(server) as client:
            for path in ("/items/1", "/items/2", "/broken", "/nowhere"):
                await client.get(path)
            await client.post("/refused", data=b"xx")
            await client.request("PROPFIND", "/items/1")
            with pytest.raises(asyncio.TimeoutError):
                await client.get("/slow", timeout=aiohttp.ClientTimeout(total=0.2))  # the client gives up
            gone = (("method", "GET"), ("route", "/slow"), ("status", "499"))
            for _ in range(200):  # the server sees the connection close and cancels the handler
                if gone in http_counts(registry):
                    break
                await asyncio.sleep(0.05)

    asyncio.run(requests())
    counts = http_counts(registry)
    assert counts[(("method", "GET"), ("route", "/items/{item}"), ("status", "200"))] == 2
    assert counts[(("method", "POST"), ("route", "/refused"), ("status", "413"))] == 1
    assert counts[(("method", "GET"), ("route", "/broken"), ("status", "500"))] == 1
    assert counts[(("method", "GET"), ("route", "unmatched"), ("status", "404"))] == 1
    assert counts[(("method", "other"), ("route", "unmatched"), ("status", "405"))] == 1
    assert counts[(("method", "GET"), ("route", "/slow"), ("status", "499"))] == 1


def test_prompt_segment_tokens_found_and_kept_per_model(default_engine):
    from tokenizers import Tokenizer

    from orchestrator.metrics.engine_collector import segment_family
    from orchestrator.text.segments import SegmentCache

    cache = SegmentCache(Tokenizer.from_file(str(default_engine / "tokenizer.json")))
    cache.hit_tokens, cache.miss_tokens = 120, 45
    values = rendered([segment_family({"m": cache})])
    assert values[("inferno_prompt_segment_tokens_total", (("model", "m"), ("result", "hit")))] == 120
    assert values[("inferno_prompt_segment_tokens_total", (("model", "m"), ("result", "miss")))] == 45
