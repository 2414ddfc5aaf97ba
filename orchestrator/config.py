"""The server's configuration: one frozen tree, loaded once at start.

Every field is settable three ways, all derived from the same declaration:
  * a CLI flag:      --port 9000, --worker.load-timeout-s 60
  * an env variable: INFERNO_PORT=9000, INFERNO_WORKER__LOAD_TIMEOUT_S=60
  * its default here.
CLI flags win over env variables. Nothing else in the code reads os.environ for settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, CliApp, SettingsConfigDict

from orchestrator.backends.options import CapacityPolicy, Device, PromptCacheBytes, Threads


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkerConfig(_Section):
    """How model worker processes are started and stopped."""

    # The backends' own options (backends/options.py: each backend's section takes the ones it declares).
    device: Device = Field("auto", description="device for the hf backend: auto picks cuda when torch sees a GPU")
    threads: Threads = Field(
        None, description="CPU threads per hf or llamacpp worker (default: hf all cores; llamacpp all but one or all, whichever is faster per step size)"
    )
    prompt_cache_bytes: PromptCacheBytes = Field(
        None,
        description="host RAM per model that keeps reusable KV (prompt prefixes) once it leaves the device's cache: "
        "llamacpp's RAM prompt cache, trtllm's pinned host KV tier; a model's own setting (--model-settings) wins "
        "(default: llamacpp half the model's KV cache budget, trtllm and sim none; 0 turns it off)",
    )
    load_timeout_s: float = Field(300.0, gt=0, description="give up on a model load after this long")
    spare: bool = Field(True, description="keep one worker started and its runtime imported, for fast loads")
    spare_refill: Literal["auto", "after-load", "when-idle"] = Field(
        "auto",
        description="start the next spare right after a load, or once the server is quiet (its imports take a "
        "core for seconds); auto: after-load with 8 or more cores, else when-idle",
    )
    capacity_policy: CapacityPolicy = Field(
        "guaranteed_no_evict",
        description="TensorRT-LLM's capacity scheduler: admit only what can finish, or fill the KV cache and pause",
    )
    stop_timeout_s: float = Field(10.0, gt=0, description="wait this long for a worker to exit, then kill it")
    kv_cache_bytes: int | None = Field(
        None, ge=1, description="KV cache budget per model in bytes (default: the engine manifest's)"
    )


class SchedulingConfig(_Section):
    """Admission and placement; per-model settings (--model-settings) override the per-model ones."""

    max_concurrency: int | None = Field(
        None, ge=1, description="requests running at once per model (default, and at most: its engine's batch size)"
    )
    max_queue: int = Field(256, ge=0, description="requests waiting per model before 429 (shared between API keys)")
    key_presence_s: float = Field(
        10.0, ge=0, description="an API key active on a model this recently keeps a permit free for its next request"
    )
    queue_timeout_s: float = Field(60.0, gt=0, description="longest wait for a permit or a load before 503")
    max_running_total: int = Field(
        1024, ge=1, description="requests running at once on the device, shared by weighted fair share"
    )
    keep_alive_s: float = Field(-1, ge=-1, description="idle seconds before a model is unloaded; 0 at once, -1 never")
    max_tokens: int | None = Field(
        None, ge=1, description="most tokens one choice may generate; also the default when a request gives none"
    )
    preload: Literal["fit", "pinned"] = Field(
        "fit", description="at start load pinned models, then (fit) every other model that fits without eviction"
    )


class MemoryConfig(_Section):
    """The memory ledger of the device models are placed on (a GPU through NVML, else the host's RAM)."""

    capacity_bytes: int | None = Field(None, ge=1, description="default: the device's total memory")
    reserve_bytes: int | None = Field(None, ge=0, description="held back from models (default: 10% of capacity)")
    overhead_bytes: int = Field(
        512 * 2**20, ge=0, description="runtime overhead per model, added to weights + KV until measured"
    )
    gpu_index: int = Field(0, ge=0, description="the GPU models are placed on, as CUDA numbers it (after CUDA_VISIBLE_DEVICES)")
    host_capacity_bytes: int | None = Field(
        None, ge=1, description="host RAM for models' host KV tiers (prompt_cache_bytes) when models run on a GPU "
        "(default: the host's total memory)",
    )
    host_reserve_bytes: int | None = Field(
        None, ge=0, description="host RAM held back from host KV tiers, for the system, the server and its workers "
        "(default: a quarter of host_capacity_bytes)",
    )
    kept_weights_bytes: int | None = Field(
        None, ge=0, description="host RAM that keeps unloaded models' weights (pinned where the server may), so "
        "that loading one again reads no disk; dropped, least recently used first, before any loaded model is "
        "evicted (default: half of host_capacity_bytes less host_reserve_bytes; on the CPU, half of the device's "
        "capacity less its reserve; 0 keeps none)",
    )


class StructuredConfig(_Section):
    """Structured outputs and tool calls: every grammar is compiled once before admission, with a time limit."""

    compile_timeout_s: float = Field(10.0, gt=0, description="refuse a grammar that takes longer to compile (400)")
    cache_entries: int = Field(4096, ge=1, description="grammar check outcomes remembered, by content")
    step_budget_ms: float = Field(
        4.0, gt=0, description="refuse a grammar (400) whose token mask costs more than this per decoding step, "
        "measured for one row along a short sample walk and multiplied by the request's rows (n)",
    )
    checker_processes: int = Field(2, ge=1, description="grammar checker processes (each imports xgrammar)")
    checks_per_key: int = Field(1, ge=1, description="grammar checks one API key may have in flight at a time")
    check_wait_s: float = Field(
        15.0, gt=0, description="a request waits at most this for its grammar's verdict (then 503, Retry-After)"
    )


class HttpConfig(_Section):
    """The HTTP front door: body limits, connection deadlines, browser origins."""

    max_body_bytes: int = Field(4 * 2**20, ge=1024, description="largest request body accepted (413 beyond it)")
    inline_body_bytes: int = Field(
        512, ge=0, description="bodies up to this size are parsed and tokenised on the event loop, larger ones "
        "on a thread, so that one big prompt never holds up other requests (except an ASCII body up to 8 KiB "
        "whose prompt the model's tokenizer takes piece by piece, in Python, which a thread would not make "
        "parallel)",
    )
    body_timeout_s: float = Field(60.0, gt=0, description="the whole request body must arrive within this (408)")
    header_timeout_s: float = Field(
        30.0, gt=0, description="close a connection that sends no complete request head this long after it opens "
        "or after its last response (slow senders; also the keep-alive idle time)",
    )
    stall_timeout_s: float = Field(
        30.0, gt=0, description="cancel a stream whose client has read nothing for this long while output waits "
        "(its permit goes to others)",
    )
    allowed_origins: tuple[str, ...] = Field(
        (), description="browser origins allowed to call the API (CORS), e.g. https://app.example.com, or *; "
        "requests from any other origin get 403 (default: none)",
    )


class AuthConfig(_Section):
    """API keys: best from a keys file (see docs/security.md); the two plain settings below remain for
    compatibility and are best given as INFERNO_AUTH__* variables, never on a command line."""

    keys_file: Path | None = Field(
        None, description="TOML or JSON file of named API keys (hashed), with per-key models and limits"
    )
    api_keys: tuple[str, ...] = Field(
        (), description="bearer keys accepted on /v1, plain or sha256:<hex> (prefer --auth.keys-file)"
    )
    admin_key: str | None = Field(
        None, description="bearer key for /admin, plain or sha256:<hex> (default: open unless keys are set)"
    )
    allow_open: bool = Field(
        False, description="serve without API keys on an address other than loopback: anyone who reaches the "
        "port may use every model (the admin API stays closed without an admin key)"
    )


class AuditConfig(_Section):
    """One JSON line per API request: who, which model, tokens, status, latency."""

    file: Path | None = Field(None, description="append the audit log to this file (default: no audit log)")
    include_text: bool = Field(
        False, description="also record prompts and completions (off: the log never holds request text)"
    )


class StoreConfig(_Section):
    """The response store: Responses API responses kept on disk, so that `previous_response_id` continues a
    conversation and a response can be read back, also after a restart."""

    enabled: bool = Field(True, description="keep responses (off: the Responses API keeps nothing between requests)")
    path: Path | None = Field(None, description="the SQLite database file (default: responses.sqlite3 in --data-dir)")
    max_age_days: float = Field(30.0, gt=0, description="responses older than this are deleted")
    max_mb: float = Field(
        1024.0, gt=0, description="most megabytes of responses kept; the oldest are deleted first beyond it"
    )


class ServerConfig(BaseSettings):
    """Inferno's settings (`inferno serve --help` lists them all)."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", env_prefix="INFERNO_",
                                      env_nested_delimiter="__", cli_kebab_case=True, cli_implicit_flags=True,
                                      cli_prog_name="inferno serve")

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on (0 picks a free one)")
    engines_dir: Path = Field(Path("engines"), description="folder holding one engine folder per model")
    models: tuple[str, ...] = Field((), description="serve only these engines (default: every engine found)")
    data_dir: Path = Field(Path("data"), description="folder for what the server keeps (the response store)")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    drain_timeout_s: float = Field(30.0, ge=0, description="on shutdown, let running requests finish this long")
    model_settings: Path | None = Field(None, description="TOML file of per-model settings (pinned, keep_alive_s, ...)")
    worker: WorkerConfig = WorkerConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    memory: MemoryConfig = MemoryConfig()
    http: HttpConfig = HttpConfig()
    auth: AuthConfig = AuthConfig()
    structured: StructuredConfig = StructuredConfig()
    audit: AuditConfig = AuditConfig()
    store: StoreConfig = StoreConfig()

    @property
    def store_file(self) -> Path:
        """Where the response store's database is: --store.path, else responses.sqlite3 in --data-dir."""
        return self.store.path if self.store.path is not None else self.data_dir / "responses.sqlite3"


def load_config(argv: list[str] | None = None) -> ServerConfig:
    """Build the config from CLI arguments (None: no flags) layered over INFERNO_* env variables."""
    return CliApp.run(ServerConfig, cli_args=argv or [])
