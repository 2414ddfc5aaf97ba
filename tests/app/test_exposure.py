"""A server safe to expose, in-process: without keys it refuses to listen beyond loopback unless
--auth.allow-open says so, and then the anonymous caller is no admin; with keys, /ready tells its detail (each
model's state, load errors) only to an admin key; error text never carries the server's filesystem paths.
The real `inferno serve --host 0.0.0.0` is in tests/e2e/test_exposure.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from orchestrator.access.keys import KeysError, hash_key
from orchestrator.api.app import build_app
from orchestrator.config import load_config
from orchestrator.engine.catalogue import discover
from orchestrator.errors import EngineError, without_paths
from orchestrator.worker.main import _classify_load_error
from tests.fakes.workers import FakeWorkers


def _config(default_engine, *flags: str):
    return load_config(["--engines-dir", str(default_engine.parent), "--models", default_engine.name, *flags])


def _answers(default_engine, flags: list[str], calls: list[tuple[str, str | None]]) -> list[tuple[int, dict]]:
    config = _config(default_engine, *flags)
    catalogue = discover(config.engines_dir, config.models)

    async def go():
        async with TestClient(TestServer(build_app(config, catalogue, FakeWorkers()))) as client:
            answers = []
            for path, key in calls:
                response = await client.get(path, headers={"Authorization": f"Bearer {key}"} if key else {})
                answers.append((response.status, await response.json()))
            return answers

    return asyncio.run(go())


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "inferno.example", ""])
def test_without_keys_a_server_beyond_loopback_is_refused_naming_the_flag(default_engine, host):
    config = _config(default_engine, "--host", host)
    with pytest.raises(KeysError, match=r"--auth\.allow-open"):
        build_app(config, discover(config.engines_dir, config.models), FakeWorkers())


@pytest.mark.parametrize("flags", [["--host", "127.0.0.1"], ["--host", "::1"], ["--host", "localhost"],
                                   ["--host", "0.0.0.0", "--auth.allow-open"],
                                   ["--host", "0.0.0.0", "--auth.api-keys", '["sk-1"]']])
def test_loopback_keys_or_allow_open_start(default_engine, flags):
    config = _config(default_engine, *flags)
    build_app(config, discover(config.engines_dir, config.models), FakeWorkers())


def test_allow_open_serves_the_api_but_not_the_admin_api(default_engine):
    open_ = _answers(default_engine, ["--auth.allow-open"], [("/v1/models", None), ("/admin/models", None)])
    local = _answers(default_engine, [], [("/admin/models", None)])
    assert [status for status, _ in open_] == [200, 401] and local[0][0] == 200
    assert "--auth.allow-open" in open_[1][1]["error"]["message"]


def test_ready_gives_its_detail_only_to_an_admin_key(default_engine, tmp_path):
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[keys.alice]\nkey = "{hash_key("sk-alice")}"\n[keys.ops]\nkey = "{hash_key("sk-ops")}"\n'
                    "admin = true\n")
    answers = _answers(default_engine, ["--auth.keys-file", str(keys)],
                       [("/ready", None), ("/ready", "sk-wrong"), ("/ready", "sk-alice"), ("/ready", "sk-ops")])
    *others, (_, admin) = answers
    assert all(set(body) == {"ready"} for _, body in others)
    assert len({(status, body["ready"]) for status, body in answers}) == 1  # all told the same readiness
    assert set(admin) == {"ready", "models", "failing"} and default_engine.name in admin["models"]
    [(_, open_)] = _answers(default_engine, [], [("/ready", None)])
    assert set(open_) == {"ready", "models", "failing"}  # no keys: a local server tells everyone


def test_error_text_names_the_engine_folder_by_its_name_and_no_absolute_path():
    folder = Path("/srv/inferno/engines/llama3-8b")
    text = f"No such file or directory: '{folder}/model.gguf' (from /usr/lib/libllama.so); see https://x.org/a/b"
    assert without_paths(text, folder) == (
        "No such file or directory: 'llama3-8b/model.gguf' (from libllama.so); see https://x.org/a/b")
    loaded = _classify_load_error(FileNotFoundError(2, "No such file", f"{folder}/model.gguf"), folder)
    refused = _classify_load_error(EngineError(f"{folder}/engine.json: bad manifest"), folder)
    for error in (loaded, refused):
        assert "/srv" not in error.message and "llama3-8b" in error.message
