"""`sim.json`: a sim engine folder's step-time and memory parameters, written by the build, read at load.

The manifest (engine.json) holds what every engine states (limits, KV geometry, weights bytes, tokenizer) and,
under `simulation`, the simulated GPU, precision and speed-up; sim.json holds only what the simulator alone
needs. Every value can be set at build time (`inferno build <model>-sim --sim-param NAME=VALUE`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.backends.sim.step_time import StepCoefficients

SIM_FILE = "sim.json"
INIT_S = 2.0  # starting the runtime before any weights move: CUDA context, allocations [I]


class SimSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    step: StepCoefficients
    calibrated: bool  # the step parameters are the measured fit itself, not carried over to another model or GPU
    runtime_overhead_bytes: int = Field(ge=0)  # CUDA context and activations, on top of weights and KV cache
    kv_tokens: int | None = Field(None, ge=1)  # KV capacity override, in tokens; default: from the byte budget
    load_s: float = Field(ge=0)  # simulated load time (at speed-up 1) of a cold load: weights read from disk
    # A load whose weights the server kept in host RAM: the runtime's start plus the weights over the host-to-device
    # link, at most `load_s` (`load_seconds`). Engines built before these existed take the defaults.
    init_s: float = Field(INIT_S, ge=0)
    host_link_bytes_s: float | None = Field(None, gt=0)  # per GPU (None: the simulated GPU's, engine/gpus.py)
    natural_length: int = Field(ge=1)  # mean answer length of requests that may end on an end token

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def load_seconds(self, weights_bytes: int, gpu_link_bytes_s: float, gpus: int, weights_kept: bool) -> float:
        """Simulated seconds (at speed-up 1) a load takes: `load_s` cold; with its weights kept in host RAM, the
        runtime's start plus the weights copied over the engine's GPUs' host links (TP spreads them), never more
        than a cold load."""
        if not weights_kept:
            return self.load_s
        link = (self.host_link_bytes_s or gpu_link_bytes_s) * gpus
        return min(self.load_s, self.init_s + weights_bytes / link)


def load_sim_spec(folder: Path) -> SimSpec:
    """Read a folder's sim.json; ValueError saying what is wrong."""
    path = folder / SIM_FILE
    try:
        return SimSpec.model_validate_json(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path} is unreadable: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "sim.json"
        raise ValueError(f"{path} is invalid at {where}: {first['msg']}") from exc
