"""What a run talks to: a server at a URL, or an Inferno server it starts.

A target knows its API base, the models to load, and, when its server runs on this machine, the root
process id and a name for each of the server's processes (for CPU accounting).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from orchestrator.launch import start_server


class TargetError(Exception):
    """The target cannot be reached or started; the message says why."""


def api_base(url: str) -> str:
    """http://host:port[/v1] -> http://host:port/v1"""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def get_json(url: str, api_key: str | None = None, timeout_s: float = 30) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def first_model(api: str, api_key: str | None) -> str:
    """The first model GET /v1/models lists."""
    try:
        models = get_json(f"{api}/models", api_key).get("data") or []
    except OSError as exc:
        raise TargetError(f"GET {api}/models failed: {exc}") from exc
    if not models:
        raise TargetError(f"GET {api}/models lists no models: name one with --model")
    return models[0]["id"]


@dataclass
class Target:
    kind: str  # "url" | "inferno" (the dev comparisons in bench/ add others)
    api: str  # http://host:port/v1
    models: list[str]
    pid: int | None = None  # the server's root process, when it runs on this machine
    tokenizer_dirs: dict[str, Path | None] = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    name_processes: Callable[[int], dict[int, str]] = lambda pid: {pid: "server"}
    stop: Callable[[], None] = lambda: None
    series: str = "http"  # the name of its rows

    def roles(self) -> dict[int, str]:
        return self.name_processes(self.pid) if self.pid else {}

    def describe(self) -> dict:
        """The target as a result file records it."""
        return {"kind": self.kind, "api": self.api, "models": self.models, **self.info}


def connect(url: str, models: list[str], api_key: str | None, server_pid: int | None, tokenizer: Path | None) -> Target:
    """A server someone else runs. Its CPU is measured only with `server_pid`."""
    api = api_base(url)
    names = models or [first_model(api, api_key)]
    if server_pid is not None and not psutil.pid_exists(server_pid):
        raise TargetError(f"--server-pid {server_pid}: no such process on this machine")
    return Target("url", api, names, server_pid, dict.fromkeys(names, tokenizer), {"url": url})


def inferno_roles(api: str, api_key: str | None) -> Callable[[int], dict[int, str]]:
    """Names for an Inferno server's processes: http, worker:<model> (from /admin/models), spare."""

    def name(root: int) -> dict[int, str]:
        roles = {root: "http"}
        try:
            for model in get_json(f"{api.removesuffix('/v1')}/admin/models", api_key, 10)["models"]:
                if model.get("pid"):
                    roles[model["pid"]] = f"worker:{model['name']}"
        except (OSError, KeyError):
            pass  # an admin key is needed, or not Inferno: processes keep generic names
        try:
            for child in psutil.Process(root).children(recursive=True):
                if child.pid not in roles and "orchestrator.worker" in " ".join(child.cmdline()):
                    roles[child.pid] = "spare"
        except psutil.Error:
            pass
        return roles

    return name


def start_inferno(engines_dir: Path, models: list[str], server_args: list[str], log_path: Path) -> Target:
    """`inferno serve` on a free loopback port, serving `models` (default: every engine, the first is used)."""
    args = ["--models", ",".join(models)] if models else []
    try:
        server = start_server(engines_dir, log_path, *args, *server_args)
    except RuntimeError as exc:
        raise TargetError(str(exc)) from exc
    names = models or [first_model(server.api, None)]
    engines = {}
    for name in names:
        manifest = json.loads((engines_dir / name / "engine.json").read_text())
        engines[name] = {"backend": manifest["backend"], "dtype": manifest["dtype"], "quantization": manifest.get("quantization"),
                         "architecture": manifest["model"]["architecture"], "parameters": manifest["model"]["parameters"]}
    tokenizers = {folder.name: folder for folder in engines_dir.iterdir() if (folder / "tokenizer.json").is_file()}
    return Target(
        "inferno", server.api, names, server.pid, tokenizers,
        {"engines_dir": str(engines_dir), "engines": engines, "server_args": server_args, "log": str(log_path)},
        inferno_roles(server.api, None), lambda: server.stop(),
    )
