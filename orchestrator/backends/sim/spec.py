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


class SimSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    step: StepCoefficients
    calibrated: bool  # the step parameters are the measured fit itself, not carried over to another model or GPU
    runtime_overhead_bytes: int = Field(ge=0)  # CUDA context and activations, on top of weights and KV cache
    kv_tokens: int | None = Field(None, ge=1)  # KV capacity override, in tokens; default: from the byte budget
    load_s: float = Field(ge=0)  # simulated load time (at speed-up 1)
    natural_length: int = Field(ge=1)  # mean answer length of requests that may end on an end token

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


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
