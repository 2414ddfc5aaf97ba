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


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkerConfig(_Section):
    """How model worker processes are started and stopped."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="device for the hf backend: auto picks cuda when torch sees a GPU"
    )
    threads: int | None = Field(None, ge=1, description="CPU threads per hf worker (default: all cores)")
    load_timeout_s: float = Field(300.0, gt=0, description="give up on a model load after this long")
    stop_timeout_s: float = Field(10.0, gt=0, description="wait this long for a worker to exit, then kill it")
    kv_cache_bytes: int | None = Field(
        None, ge=1, description="KV cache budget per model in bytes (default: the engine manifest's)"
    )


class SchedulingConfig(_Section):
    """Admission limits applied to every model."""

    max_concurrency: int = Field(64, ge=1, description="requests running at once per model")
    max_queue: int = Field(256, ge=0, description="requests waiting per model before 429")
    queue_timeout_s: float = Field(60.0, gt=0, description="longest wait for a running slot before 503")


class ServerConfig(BaseSettings):
    """Inferno's settings (`inferno serve --help` lists them all)."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_prefix="INFERNO_",
        env_nested_delimiter="__",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_prog_name="inferno serve",
    )

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on (0 picks a free one)")
    engines_dir: Path = Field(Path("engines"), description="folder holding one engine folder per model")
    models: tuple[str, ...] = Field((), description="serve only these engines (default: every engine found)")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    drain_timeout_s: float = Field(30.0, ge=0, description="on shutdown, let running requests finish this long")
    worker: WorkerConfig = WorkerConfig()
    scheduling: SchedulingConfig = SchedulingConfig()


def load_config(argv: list[str] | None = None) -> ServerConfig:
    """Build the config from CLI arguments (None: no flags) layered over INFERNO_* env variables."""
    return CliApp.run(ServerConfig, cli_args=argv or [])
