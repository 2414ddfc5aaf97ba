"""The real `inferno serve` beyond loopback: without keys it exits with a message naming --auth.allow-open;
with that flag it serves the API to anyone and keeps the admin API closed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from orchestrator.launch import PROJECT_ROOT
from tests.conftest import DEFAULT_MODEL, start_server

pytestmark = pytest.mark.e2e


def _without_keys() -> dict:
    return {name: value for name, value in os.environ.items() if not name.startswith("INFERNO_AUTH__")}


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            json.load(response)
            return response.status
    except urllib.error.HTTPError as refused:
        json.load(refused)
        return refused.code


def test_serve_on_every_interface_without_keys_exits_naming_the_flag(default_engine):
    command = [sys.executable, "-m", "orchestrator", "serve", "--host", "0.0.0.0", "--port", "0",
               "--engines-dir", str(default_engine.parent), "--models", DEFAULT_MODEL]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT, env=_without_keys())
    assert done.returncode != 0
    assert "--auth.allow-open" in done.stderr and "Inferno ready" not in done.stdout


def test_serve_with_allow_open_serves_the_api_and_refuses_the_admin_api(default_engine, tmp_path):
    server = start_server(default_engine.parent, tmp_path / "server.log", "--models", DEFAULT_MODEL,
                          "--host", "0.0.0.0", "--auth.allow-open")
    try:
        base = server.base_url.replace("0.0.0.0", "127.0.0.1")
        assert _status(f"{base}/v1/models") == 200
        assert _status(f"{base}/admin/models") == 401
        assert _status(f"{base}/admin/usage") == 401
    finally:
        server.stop()
