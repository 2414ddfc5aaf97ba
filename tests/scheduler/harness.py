"""A scheduler (or its admission alone) over made-up models on a made-up device, with in-loop workers, on virtual time.

    scheduler, workers = make_scheduler(tmp_path, {"alpha": 1, "beta": 1}, device_gib=2)

Each model takes the given number of GiB on the device (weights + KV cache; no runtime overhead).
`serve` is what the API does with a lease, without HTTP: submit every choice, collect until all finish.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

from orchestrator.config import MemoryConfig, SchedulingConfig, ServerConfig, WorkerConfig
from orchestrator.engine.catalogue import Catalogue, Engine
from orchestrator.engine.manifest import (
    BuildInfo,
    EngineManifest,
    KvCacheFacts,
    Limits,
    ModelFacts,
    TokenizerFacts,
)
from orchestrator.engine.request import EngineRequest
from orchestrator.lifecycle import Choice, InferenceRequest, RequestStatus
from orchestrator.scheduler import ModelSnapshot, Scheduler
from orchestrator.scheduler.admission import AdmissionControl
from orchestrator.scheduler.entries import ModelEntry, build_entries
from tests.fakes.workers import FakeDevice, FakeWorkers

GIB = 2**30
KV_BYTES = 2**20
_ids = itertools.count()


def manifest(name: str, gib: float, backend: str = "hf") -> EngineManifest:
    return EngineManifest(
        name=name,
        backend=backend,
        model=ModelFacts(recipe=name, architecture="LlamaForCausalLM", source="made up", parameters=1),
        dtype="float32",
        limits=Limits(max_batch_size=8, max_input_len=100, max_seq_len=200, max_num_tokens=200),
        tokenizer=TokenizerFacts(eos_token_ids=(2,), pad_token_id=0, has_chat_template=False),
        kv_cache=KvCacheFacts(tokens_per_block=16, bytes_per_token=1, default_budget_bytes=KV_BYTES),
        weights_bytes=int(gib * GIB) - KV_BYTES,
        build=BuildInfo(fingerprint="sha256:0", built_at="2026-01-01T00:00:00+00:00", duration_s=0, tools={},
                        target_arch="any"),
    )


def catalogue(models: dict[str, float], backend: str = "hf", engines_dir: Path | None = None,
              vocab_size: int | None = None) -> Catalogue:
    """Made-up engines; with `vocab_size`, each folder (under `engines_dir`) has a config.json saying it, as a
    TensorRT-LLM engine's does."""
    folders = {name: (engines_dir or Path("/made-up/engines")) / name for name in models}
    for folder in folders.values() if vocab_size is not None else ():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"pretrained_config": {"vocab_size": vocab_size}}))
    engines = {name: Engine(name, folders[name], manifest(name, gib, backend), None) for name, gib in models.items()}
    return Catalogue(engines, {})


class RecordedEvents:
    """SchedulerEvents, kept as a list: ("loaded", model), ("unloaded", model, reason), ("crashed", model)."""

    def __init__(self):
        self.log: list[tuple] = []

    def model_loaded(self, model: str, seconds: float) -> None:
        self.log.append(("loaded", model))

    def model_unloaded(self, model: str, reason: str) -> None:
        self.log.append(("unloaded", model, reason))

    def worker_crashed(self, model: str) -> None:
        self.log.append(("crashed", model))


def server_config(tmp_path: Path, device_gib: float, model_settings: str | None, host_gib: float = 1024,
                  **scheduling) -> ServerConfig:
    settings_file = None
    if model_settings is not None:
        settings_file = tmp_path / "models.toml"
        settings_file.write_text(model_settings)
    return ServerConfig(
        model_settings=settings_file,
        worker=WorkerConfig(spare=False),
        scheduling=SchedulingConfig(**{"queue_timeout_s": 10.0, "preload": "pinned", **scheduling}),
        memory=MemoryConfig(capacity_bytes=int(device_gib * GIB), reserve_bytes=0, overhead_bytes=0,
                            host_capacity_bytes=int(host_gib * GIB), host_reserve_bytes=0),
    )


def make_admission(tmp_path: Path, model_settings: str, **scheduling) -> tuple[AdmissionControl, ModelEntry]:
    """Admission alone, over one model "alpha" (no workers, no memory): its permits and its queue."""
    config = server_config(tmp_path, 2, model_settings, **scheduling)
    entries = build_entries(config, catalogue({"alpha": 1}), asyncio.get_running_loop().time())
    admission = AdmissionControl(entries, config.scheduling, on_model_idle=lambda _: None, on_busy=lambda: None,
                                 on_quiet=lambda: None, clock=asyncio.get_running_loop().time)
    return admission, entries["alpha"]


def make_scheduler(
    tmp_path: Path,
    models: dict[str, float],
    device_gib: float,
    model_settings: str | None = None,
    backend: str = "hf",
    host_gib: float = 1024,
    vocab_size: int | None = None,
    **scheduling,
) -> tuple[Scheduler, FakeWorkers, RecordedEvents]:
    """Call inside the running (virtual time) loop. `model_settings`: the TOML of --model-settings; `host_gib`: the
    host RAM for host KV tiers and logits pools (its reading is the machine's own: the ledger takes the smaller);
    `vocab_size`: the engines' vocabulary, in a config.json of each (for generation logits pools)."""
    config = server_config(tmp_path, device_gib, model_settings, host_gib, **scheduling)
    workers, events = FakeWorkers(), RecordedEvents()
    scheduler = Scheduler(
        config, catalogue(models, backend, tmp_path / "engines", vocab_size), workers, events=events, probe=FakeDevice(int(device_gib * GIB)),
        clock=asyncio.get_running_loop().time,
    )
    return scheduler, workers, events


def inference_request(model: str, n: int = 1, max_new_tokens: int = 8, top_logprobs: int = 0) -> InferenceRequest:
    request_id = f"req-{next(_ids)}"
    choices = [Choice(i, EngineRequest(f"{request_id}.{i}", (1, 2, 3), max_new_tokens, top_logprobs=top_logprobs))
               for i in range(n)]
    return InferenceRequest(request_id, model, 3, choices, stream=False)


async def serve(scheduler: Scheduler, request: InferenceRequest) -> InferenceRequest:
    """What api/generation.py does for a whole (non-streamed) response."""
    try:
        async with scheduler.lease(request) as worker:
            for choice in request.choices:
                worker.submit(choice.engine_request, request.deliver)
            while not request.all_finished:
                choice = request.record(await request.events.get())
                if choice.error is not None:
                    raise choice.error
            request.finish(request.final_status())
    except BaseException:
        request.finish(RequestStatus.FINISHED_ERROR)
        raise
    return request


async def served(scheduler: Scheduler, workers, model: str = "alpha") -> InferenceRequest:
    """One request for `model`, answered at once by its (fake) worker."""
    task = asyncio.create_task(serve(scheduler, inference_request(model)))
    worker, engine_request = await workers.next_submit()
    worker.finish(engine_request.id)
    return await task


def model(scheduler: Scheduler, name: str) -> ModelSnapshot:
    """The model's snapshot now: what the scheduler shows of it (its state, counters, retry time)."""
    [snapshot] = (s for s in scheduler.snapshot() if s.name == name)
    return snapshot


async def advance(seconds: float) -> None:
    """Let `seconds` of virtual time pass."""
    await asyncio.sleep(seconds)
