"""The response store on real SQLite files in a temporary folder: what is put comes back to its owner only,
outlives the store object, stays within its bounds, survives a corrupt file and a full disk, and its work
never runs on the event loop."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.errors import StorageFull, StoreUnavailable
from orchestrator.store import SqliteResponseStore, StoredResponse, open_store
from orchestrator.store.database import Bounds, ResponseDatabase

DAY_S = 86400.0
NOW = 1_800_000_000.0


class Clock:
    def __init__(self, now: float = NOW):
        self.now = now

    def __call__(self) -> float:
        return self.now


def response(id: str, owner: str = "alice", *, created_at: float = NOW, text: str = "hi", status="completed",
             previous: str | None = None, input_items: list[dict] | None = None) -> StoredResponse:
    output = [{"type": "message", "id": f"msg_{id}", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}]
    body = {"id": id, "object": "response", "created_at": int(created_at), "status": status, "model": "m",
            "output": output, "previous_response_id": previous}
    items = input_items if input_items is not None else [{"type": "message", "role": "user", "content": "hello"}]
    return StoredResponse(id, owner, "m", created_at, status, body, items, previous)


def rows(path: Path) -> list[str]:
    """The ids the file holds, read with a connection of its own (what is really there, not what get shows)."""
    with sqlite3.connect(path) as connection:
        return sorted(row[0] for row in connection.execute("SELECT id FROM responses"))


def run(go):
    return asyncio.run(go())


def test_what_is_put_comes_back(tmp_path):
    first = response("resp_1", input_items=[{"type": "message", "role": "user", "content": "hello"}])
    again = {"type": "message", "role": "user", "content": "and again"}
    second = response("resp_2", previous="resp_1", input_items=[*first.conversation(), again])

    async def go():
        store = await SqliteResponseStore.open(tmp_path / "r.sqlite3", clock=Clock())
        await store.put(first)
        await store.put(second)
        got = await store.get("resp_2", "alice"), await store.conversation("resp_2", "alice")
        await store.close()
        return got

    got, conversation = run(go)
    assert got == second and got is not second
    assert conversation == [*second.input_items, *second.response["output"]]
    assert [item["role"] for item in conversation] == ["user", "assistant", "user", "assistant"]


def test_another_owner_neither_reads_nor_deletes_nor_continues(tmp_path):
    async def go():
        store = await SqliteResponseStore.open(tmp_path / "r.sqlite3", clock=Clock())
        await store.put(response("resp_1", owner="alice"))
        seen = (await store.get("resp_1", "bob"), await store.conversation("resp_1", "bob"),
                await store.delete("resp_1", "bob"), await store.get("resp_1", "alice"))
        await store.close()
        return seen

    get, conversation, deleted, still = run(go)
    assert (get, conversation, deleted) == (None, None, False)
    assert still is not None and still.owner == "alice"


def test_delete_forgets_once(tmp_path):
    async def go():
        store = await SqliteResponseStore.open(tmp_path / "r.sqlite3", clock=Clock())
        await store.put(response("resp_1"))
        await store.put(response("resp_2"))
        outcome = (await store.delete("resp_1", "alice"), await store.delete("resp_1", "alice"),
                   await store.get("resp_1", "alice"), await store.delete("resp_missing", "alice"))
        await store.close()
        return outcome

    assert run(go) == (True, False, None, False)
    assert rows(tmp_path / "r.sqlite3") == ["resp_2"]


def test_update_sets_status_and_response(tmp_path):
    queued = response("resp_1", status="queued")
    done = {**queued.response, "status": "completed", "usage": {"output_tokens": 3}}

    async def go():
        store = await SqliteResponseStore.open(tmp_path / "r.sqlite3", clock=Clock())
        await store.put(queued)
        updated = await store.update("resp_1", status="completed", response=done)
        missing = await store.update("resp_nope", status="failed", response={})
        got = await store.get("resp_1", "alice")
        await store.close()
        return updated, missing, got

    updated, missing, got = run(go)
    assert (updated, missing) == (True, False)
    assert got.status == "completed" and got.response == done and got.input_items == queued.input_items


def test_a_new_store_on_the_same_file_has_everything(tmp_path):
    path = tmp_path / "sub" / "r.sqlite3"  # its folder is made too
    kept = [response(f"resp_{i}", created_at=NOW + i) for i in range(5)]

    async def go():
        store = await SqliteResponseStore.open(path, clock=Clock())
        for stored in kept:
            await store.put(stored)
        await store.delete("resp_0", "alice")
        await store.close()
        with pytest.raises(StoreUnavailable):
            await store.get("resp_1", "alice")
        again = await SqliteResponseStore.open(path, clock=Clock())
        got = [await again.get(s.id, "alice") for s in kept]
        await again.close()
        return got

    assert run(go) == [None, *kept[1:]]


def test_the_file_is_in_wal_mode(tmp_path):
    async def go():
        store = await SqliteResponseStore.open(tmp_path / "r.sqlite3", clock=Clock())
        await store.put(response("resp_1"))
        await store.close()

    run(go)
    with sqlite3.connect(tmp_path / "r.sqlite3") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_responses_past_their_age_are_deleted(tmp_path):
    clock, path = Clock(), tmp_path / "r.sqlite3"

    async def go():
        store = await SqliteResponseStore.open(path, max_age_days=30, clock=clock)
        await store.put(response("resp_old", created_at=NOW))
        await store.put(response("resp_young", created_at=NOW + 20 * DAY_S))
        clock.now = NOW + 30 * DAY_S + 1
        hidden = await store.get("resp_old", "alice")  # not pruned yet, but never read past its age
        before = rows(path)
        clock.now += 3600  # an age prune is due with the next write
        await store.put(response("resp_new", created_at=clock.now))
        after = rows(path)
        await store.close()
        return hidden, before, after

    hidden, before, after = run(go)
    assert hidden is None and "resp_old" in before
    assert after == ["resp_new", "resp_young"]


def test_opening_deletes_what_is_past_its_age(tmp_path):
    path = tmp_path / "r.sqlite3"

    async def go(clock):
        store = await SqliteResponseStore.open(path, max_age_days=1, clock=clock)
        await store.put(response("resp_1", created_at=NOW))
        await store.close()

    run(lambda: go(Clock(NOW)))
    assert rows(path) == ["resp_1"]
    run(lambda: SqliteResponseStore.open(path, max_age_days=1, clock=Clock(NOW + 2 * DAY_S)))
    assert rows(path) == []


def test_beyond_its_size_the_oldest_go_first(tmp_path):
    path, text = tmp_path / "r.sqlite3", "x" * 10_000  # each response ~10 KB (its text is in the output)

    async def go():
        store = await SqliteResponseStore.open(path, max_mb=0.1, clock=Clock())  # ~10 of them
        kept_sizes = []
        for i in range(30):
            await store.put(response(f"resp_{i:02}", created_at=NOW + i, text=text))
            with sqlite3.connect(path) as connection:
                kept_sizes.append(connection.execute("SELECT SUM(size) FROM responses").fetchone()[0])
        await store.close()
        return kept_sizes

    sizes = run(go)
    assert max(sizes) <= 0.1 * 2**20
    kept = rows(path)
    assert kept == [f"resp_{i:02}" for i in range(30 - len(kept), 30)]  # the newest, without gaps
    assert 5 <= len(kept) < 11


def test_a_response_larger_than_the_budget_is_still_kept(tmp_path):
    path = tmp_path / "r.sqlite3"

    async def go():
        store = await SqliteResponseStore.open(path, max_mb=0.01, clock=Clock())
        await store.put(response("resp_small", created_at=NOW))
        await store.put(response("resp_big", created_at=NOW + 1, text="y" * 50_000))
        got = await store.get("resp_big", "alice")
        await store.close()
        return got

    assert run(go) is not None
    assert rows(path) == ["resp_big"]


@pytest.mark.parametrize("damage", ["garbage", "damaged pages"])
def test_a_corrupt_file_is_moved_aside_and_a_fresh_one_serves(tmp_path, caplog, damage):
    path = tmp_path / "r.sqlite3"
    if damage == "garbage":
        path.write_bytes(b"this is not a database" * 100)
    else:
        run(lambda: _fill(path))
        data = bytearray(path.read_bytes())
        data[4096:] = b"\xa5" * (len(data) - 4096)  # every page after the first (the schema's) overwritten
        path.write_bytes(bytes(data))
    broken = path.read_bytes()

    async def go():
        with caplog.at_level(logging.WARNING, logger="orchestrator.store"):
            store = await SqliteResponseStore.open(path, clock=Clock())
        await store.put(response("resp_fresh"))
        got = await store.get("resp_fresh", "alice")
        await store.close()
        return got

    assert run(go) is not None
    [aside] = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name and not p.name.endswith(("-wal", "-shm"))]
    assert aside.name.startswith("r.sqlite3.corrupt-") and aside.read_bytes() == broken
    assert "moved aside" in caplog.text and aside.name in caplog.text
    assert rows(path) == ["resp_fresh"]


async def _fill(path: Path) -> None:
    store = await SqliteResponseStore.open(path, clock=Clock())
    for i in range(40):
        await store.put(response(f"resp_{i}", text="z" * 2000))
    await store.close()
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def test_a_full_disk_is_storage_full_and_loses_nothing_kept(tmp_path):
    path = tmp_path / "r.sqlite3"
    database = ResponseDatabase.open(path, Bounds(max_age_s=30 * DAY_S, max_bytes=2**30), Clock())
    pages = database.connection.execute("PRAGMA page_count").fetchone()[0]
    database.connection.execute(f"PRAGMA max_page_count = {pages + 8}")  # the disk: 8 more pages
    big = response("resp_big", text="b" * 200_000)

    async def go():
        store = SqliteResponseStore(database, ThreadPoolExecutor(max_workers=1))
        await store.put(response("resp_small"))
        with pytest.raises(StorageFull) as full:
            await store.put(big)
        after = await store.get("resp_small", "alice"), await store.get("resp_big", "alice")
        await store.close()
        return full.value, after

    error, (small, missing) = run(go)
    assert "resp_big" in error.message and "full" in error.message
    assert small is not None and missing is None
    assert big.response["output"][0]["content"][0]["text"] == "b" * 200_000  # the caller still has it to return
    assert rows(path) == ["resp_small"]


def test_many_tasks_put_at_once(tmp_path):
    async def go():
        store = await SqliteResponseStore.open(tmp_path / "r.sqlite3", clock=Clock())
        stored = [response(f"resp_{i}", owner=f"key-{i % 3}", created_at=NOW + i, text=str(i)) for i in range(200)]
        await asyncio.gather(*(store.put(s) for s in stored))
        got = await asyncio.gather(*(store.get(s.id, s.owner) for s in stored))
        await store.close()
        return stored, got

    stored, got = run(go)
    assert got == stored


def test_a_large_put_never_blocks_the_event_loop(tmp_path):
    """While a large response is written, the loop runs other tasks: a ticker started right after the put
    ticks before the put is done (a put that ran on the loop would finish before the ticker's first step)."""
    large = response("resp_large", input_items=[{"type": "message", "role": "user", "content": "w" * 2**20}] * 20)
    events: list[str] = []

    async def go():
        store = await SqliteResponseStore.open(tmp_path / "r.sqlite3", clock=Clock())

        async def put() -> None:
            events.append("put")
            await store.put(large)
            events.append("stored")

        async def ticker(putting: asyncio.Task) -> None:
            while not putting.done():
                events.append("tick")
                await asyncio.sleep(0)

        putting = asyncio.create_task(put())
        await asyncio.gather(putting, ticker(putting))
        got = await store.get("resp_large", "alice")
        await store.close()
        return got

    assert run(go) == large
    assert events[0] == "put" and "tick" in events[:events.index("stored")]


def test_the_config_places_the_store_in_the_data_dir(tmp_path):
    config = load_config(["--data-dir", str(tmp_path / "d")])
    assert config.store.enabled and config.store.max_age_days == 30
    assert config.store_file == tmp_path / "d" / "responses.sqlite3"
    assert load_config(["--store.path", str(tmp_path / "x.db")]).store_file == tmp_path / "x.db"

    async def go():
        store = await open_store(config)  # on the real clock
        await store.put(response("resp_1", created_at=time.time()))
        await store.close()
        return await open_store(load_config(["--data-dir", str(tmp_path / "d"), "--no-store.enabled"]))

    assert run(go) is None
    assert rows(tmp_path / "d" / "responses.sqlite3") == ["resp_1"]


def test_without_a_usable_place_the_server_serves_without_a_store(tmp_path, caplog):
    (tmp_path / "file").write_text("a file where the data folder should be")
    config = load_config(["--data-dir", str(tmp_path / "file" / "data")])
    with caplog.at_level(logging.ERROR, logger="orchestrator.store"):
        assert run(lambda: open_store(config)) is None
    assert "serving without a response store" in caplog.text


def test_a_stored_response_says_what_is_wrong_with_it():
    with pytest.raises(ValueError, match="resp_"):
        response("chatcmpl-1")
    with pytest.raises(ValueError, match="status"):
        response("resp_1", status="done")
