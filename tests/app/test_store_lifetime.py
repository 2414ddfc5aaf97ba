"""The response store lives with the app: opened when it starts, in the data folder the config names, and
closed when it is cleaned up (after the scheduler's drain), with what was put kept in the file."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestrator.errors import StoreUnavailable
from orchestrator.store import SqliteResponseStore, StoredResponse
from tests.app.harness import running_app

STORED = StoredResponse("resp_1", "anonymous", "m", time.time(), "completed",
                        {"id": "resp_1", "output": []}, [{"type": "message", "role": "user", "content": "hi"}])


def test_the_app_opens_the_store_and_closes_it_on_cleanup(catalogue, tmp_path):
    async def go():
        async with running_app(catalogue, "--data-dir", str(tmp_path)) as app:
            store = app.state.store
            assert isinstance(store, SqliteResponseStore)
            await store.put(STORED)
        with pytest.raises(StoreUnavailable, match="closed"):
            await store.get("resp_1", "anonymous")
        again = await SqliteResponseStore.open(tmp_path / "responses.sqlite3")
        got = await again.get("resp_1", "anonymous")
        await again.close()
        return got

    assert asyncio.run(go()) == STORED


def test_a_store_turned_off_is_none(catalogue, tmp_path):
    async def go():
        async with running_app(catalogue, "--data-dir", str(tmp_path), "--no-store.enabled") as app:
            return app.state.store

    assert asyncio.run(go()) is None
    assert not (tmp_path / "responses.sqlite3").exists()
