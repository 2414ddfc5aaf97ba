"""The result file and the table: the machine, versions, every row, the ratios between series."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psutil

import orchestrator
from orchestrator.visible_gpus import list_visible_gpus

PACKAGES = ("aiohttp", "uvloop", "orjson", "tokenizers", "torch", "transformers", "tensorrt_llm")



def now() -> str:
    """The time now, for a result file (UTC, to the second)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def header(schema: str, command: list[str], settings: dict) -> dict:
    """A result file's opening fields: its schema, the command and settings that made it, when, on what."""
    return {"schema": schema, "command": command, "started_at": now(), "settings": settings, "machine": machine(),
            "versions": versions()}


def machine() -> dict:
    """What the numbers were measured on, including how busy the machine already was."""
    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_bytes": psutil.virtual_memory().total,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        # The GPUs this process sees, in CUDA's order (none without NVML, a driver or a GPU).
        "gpus": [gpu.name for gpu in list_visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES")).gpus],
    }


def versions() -> dict:
    found = {"inferno": orchestrator.__version__}
    for package in PACKAGES:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            continue
    return found


def _load_key(row: dict) -> str:
    return json.dumps(row["load"], sort_keys=True)


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b to 4 significant digits (ratios to the bare server can be tiny); None without both."""
    return float(f"{a / b:.4g}") if a is not None and b else None


def ratios(main: list[dict], other: list[dict], name: str) -> list[dict]:
    """main / other per level with the same load: throughput and median latencies."""
    by_load = {_load_key(row): row for row in other}
    out = []
    for row in main:
        base = by_load.get(_load_key(row))
        if base is None:
            continue
        medians = {f"{kind}_p50": _ratio(row[f"{kind}_s"]["p50"], base[f"{kind}_s"]["p50"])
                   for kind in ("ttft", "itl", "e2e")}
        out.append({"load": row["load"], "of": name,
                    "output_tok_s": _ratio(row["output_tok_s"], base["output_tok_s"]), **medians})
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


HEADER = ("series", "load", "ok", "err", "tok/s", "req/s", "ttft p50", "ttft p99", "itl p50", "itl p99",
          "e2e p50", "goodput", "client us/chunk", "server us/tok", "x floor")


def table_row(row: dict) -> tuple[str, ...]:
    (key, value), = row["load"].items()
    load = {"concurrency": f"c={value}", "rate": f"{value:g}/s"}.get(key, "trace")
    goodput = row.get("goodput")
    server = row.get("server_cpu") or {}
    server_cell = _num(server.get("us_per_token"), ".0f")
    if "us_per_token_excluding" in server:
        server_cell += f" ({_num(server['us_per_token_excluding'], '.0f')} excl)"
    return (
        row["series"], load, str(row["ok"]), str(row["errors"]), _num(row["output_tok_s"], ".1f"),
        _num(row["req_s"], ".2f"), _ms(row["ttft_s"]["p50"]), _ms(row["ttft_s"]["p99"]), _ms(row["itl_s"]["p50"]),
        _ms(row["itl_s"]["p99"]), _num(row["e2e_s"]["p50"], ".2f"),
        "-" if not goodput else f"{goodput['fraction']:.0%}", _num(row["client"]["cpu_us_per_chunk"], ".1f"),
        server_cell, _num(server.get("floor_ratio"), ".2f"),
    )


def table(rows: list[dict]) -> str:
    """A plain-text table (latencies in ms, e2e in s)."""
    cells = [HEADER, *(table_row(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(c[i].rjust(widths[i]) for i in range(len(HEADER))) for c in cells)


def write(report: dict, out: Path, prefix: str = "bench") -> Path:
    """<prefix>-<timestamp>.json under `out` (made if missing); never overwrites an earlier result."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = out / f"{prefix}-{stamp}.json"
    suffix = 1
    while path.exists():
        path, suffix = out / f"{prefix}-{stamp}-{suffix}.json", suffix + 1
    path.write_text(json.dumps(report, indent=2))
    return path
