"""The response store's SQLite database, synchronous: one connection, used only from the store's own thread.

WAL journal with `synchronous=NORMAL`: a write is one append to the log, and a power cut loses at most the
last moments of writes, never the file. The file is checked when it is opened; a corrupt or unreadable one is
moved aside (renamed `<name>.corrupt-<UTC time>`, its -wal and -shm files with it) with a warning, and a
fresh one is made, so a bad file never stops the server from starting.

Bounded by age and by size, oldest first. The bytes kept are counted as they change, so a write checks the
size bound without a scan; past it, one prune deletes the oldest down to `LOW_WATER` of the budget, so the next
writes need none. Responses past their age are deleted at open and at most once per `AGE_PRUNE_INTERVAL_S`
(reads never return them meanwhile). Freed pages are reused by later writes: the file stays near the budget.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson

from orchestrator.errors import StorageFull, StoreUnavailable
from orchestrator.store.interface import Status, StoredResponse

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    model TEXT NOT NULL,
    created_at REAL NOT NULL,
    status TEXT NOT NULL,
    previous_response_id TEXT,
    response BLOB NOT NULL,
    input_items BLOB NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created_at, size);
"""
_COLUMNS = "id, owner, model, created_at, status, previous_response_id, response, input_items"
_FULL = 13  # SQLite's primary result codes (the low byte of an extended code); and those of a file that is
_UNUSABLE = {3, 8, 10, 11, 14, 26, None}  # unusable: PERM, READONLY, IOERR, CORRUPT, CANTOPEN, NOTADB, failed check
_ROW_OVERHEAD = 64  # bytes a row takes beyond its fields (record header, index entries), roughly
AGE_PRUNE_INTERVAL_S = 3600.0
LOW_WATER = 0.9  # a prune for size deletes down to this share of the budget


@dataclass(frozen=True)
class Bounds:
    """How much the store keeps: nothing older than `max_age_s`, at most `max_bytes` of responses."""

    max_age_s: float
    max_bytes: int


class ResponseDatabase:
    """The responses table over one connection. Errors leave as the taxonomy's StoreUnavailable or StorageFull."""

    def __init__(self, connection: sqlite3.Connection, path: Path, bounds: Bounds, clock: Callable[[], float]):
        self.connection = connection
        self.path = path
        self.bounds = bounds
        self._clock = clock
        self._total = 0  # bytes kept, as the rows' size column counts them
        self._next_age_prune = 0.0
        self._prune_by_age()

    @classmethod
    def open(cls, path: Path, bounds: Bounds, clock: Callable[[], float] = time.time) -> ResponseDatabase:
        """The database at `path`, made if missing; a corrupt or unreadable file is moved aside for a fresh one."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                return cls(_connect(path), path, bounds, clock)
            except sqlite3.DatabaseError as exc:
                if _code(exc) not in _UNUSABLE or not path.exists():
                    raise
                aside = _move_aside(path, clock())
                log.warning("the response store %s cannot be read (%s): moved aside to %s, starting a fresh one",
                            path, exc, aside.name)
            return cls(_connect(path), path, bounds, clock)
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"the response store {path} cannot be opened: {exc}") from exc

    def close(self) -> None:
        self.connection.close()

    # -- reads ----------------------------------------------------------------------------------------------
    def get(self, id: str, owner: str) -> StoredResponse | None:
        try:
            row = self.connection.execute(
                f"SELECT {_COLUMNS} FROM responses WHERE id = ? AND owner = ? AND created_at >= ?",
                (id, owner, self._cutoff()),
            ).fetchone()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"the response store {self.path} cannot be read: {exc}") from exc
        return None if row is None else _stored(row)

    # -- writes ---------------------------------------------------------------------------------------------
    def put(self, stored: StoredResponse) -> None:
        response, items = orjson.dumps(stored.response), orjson.dumps(stored.input_items)
        size = len(response) + len(items) + len(stored.id) + len(stored.owner) + len(stored.model) + _ROW_OVERHEAD
        values = (stored.id, stored.owner, stored.model, stored.created_at, stored.status,
                  stored.previous_response_id, response, items, size)

        def change() -> int:
            before = self.connection.execute("SELECT size FROM responses WHERE id = ?", (stored.id,)).fetchone()
            self.connection.execute(f"INSERT OR REPLACE INTO responses ({_COLUMNS}, size) VALUES "
                                    "(?, ?, ?, ?, ?, ?, ?, ?, ?)", values)
            return size - (before[0] if before else 0)

        self._write(stored.id, change)

    def update(self, id: str, status: Status, response: dict) -> bool:
        blob = orjson.dumps(response)

        def change() -> int | None:
            row = self.connection.execute("SELECT size, length(response) FROM responses WHERE id = ?",
                                          (id,)).fetchone()
            if row is None:
                return None
            size = row[0] - row[1] + len(blob)
            self.connection.execute("UPDATE responses SET status = ?, response = ?, size = ? WHERE id = ?",
                                    (status, blob, size, id))
            return size - row[0]

        return self._write(id, change)

    def delete(self, id: str, owner: str) -> bool:
        def change() -> int | None:
            row = self.connection.execute("DELETE FROM responses WHERE id = ? AND owner = ? RETURNING size",
                                          (id, owner)).fetchone()
            return None if row is None else -row[0]

        return self._write(id, change)

    def _write(self, id: str, change: Callable[[], int | None]) -> bool:
        """Run `change` (it returns the bytes it added, None when it found nothing to change) and the size
        bound's prune in one transaction; then the age bound's, when one is due."""
        try:
            self.connection.execute("BEGIN IMMEDIATE")
            added = change()
            removed = self._prune_by_size(self._total + (added or 0), keep=id)
            self.connection.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            if _code(exc) == _FULL:
                raise StorageFull(f"the response store's disk is full ({self.path}): response {id} was not "
                                  "kept") from exc
            raise StoreUnavailable(f"the response store {self.path} failed writing response {id}: {exc}") from exc
        except BaseException:
            self._rollback()
            raise
        self._total += (added or 0) - removed
        if self._clock() >= self._next_age_prune:
            self._prune_by_age_logged()
        return added is not None

    def _rollback(self) -> None:
        if self.connection.in_transaction:
            self.connection.execute("ROLLBACK")

    # -- bounds ---------------------------------------------------------------------------------------------
    def _cutoff(self) -> float:
        return self._clock() - self.bounds.max_age_s

    def _prune_by_size(self, total: int, keep: str) -> int:
        """Delete the oldest responses (never `keep`, just written) until `total` is down to the low water
        mark, if it is over the budget; the bytes deleted."""
        if total <= self.bounds.max_bytes:
            return 0
        target, removed, doomed = int(self.bounds.max_bytes * LOW_WATER), 0, []
        oldest = self.connection.execute("SELECT rowid, size FROM responses WHERE id != ? ORDER BY created_at",
                                         (keep,))
        for rowid, size in oldest:
            if total - removed <= target:
                break
            doomed.append((rowid,))
            removed += size
        oldest.close()
        if doomed:
            self.connection.executemany("DELETE FROM responses WHERE rowid = ?", doomed)
            log.info("response store over %.1f MB: deleted the %d oldest responses", self.bounds.max_bytes / 2**20,
                     len(doomed))
        return removed

    def _prune_by_age(self) -> None:
        """Delete what is past its age, and count the bytes kept afresh (another process may share the file)."""
        deleted = self.connection.execute("DELETE FROM responses WHERE created_at < ?", (self._cutoff(),)).rowcount
        self._total = self.connection.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()[0]
        self._next_age_prune = self._clock() + AGE_PRUNE_INTERVAL_S
        if deleted:
            log.info("response store: deleted %d responses older than %g days", deleted,
                     self.bounds.max_age_s / 86400)

    def _prune_by_age_logged(self) -> None:
        """The periodic age prune after a write: the write is kept, so a failure here is only a warning."""
        try:
            self._prune_by_age()
        except sqlite3.Error as exc:
            self._rollback()
            self._next_age_prune = self._clock() + AGE_PRUNE_INTERVAL_S
            log.warning("response store %s: deleting old responses failed: %s", self.path, exc)


def _connect(path: Path) -> sqlite3.Connection:
    """A connection to the file at `path`, checked, in WAL mode, with the schema made."""
    # check_same_thread off: the connection is made on one thread and used on it alone, the store's
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        connection.execute("PRAGMA busy_timeout = 5000")  # another process sharing the file (a second server)
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute("PRAGMA synchronous = NORMAL")
        problems = [row[0] for row in connection.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError("; ".join(problems[:3]))
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreUnavailable(f"the response store {path} was written by a newer server (schema {version})")
        connection.executescript(_SCHEMA)
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        connection.close()
        raise
    return connection


def _move_aside(path: Path, now: float) -> Path:
    """Rename the database file (and its -wal and -shm files) with the time; the new name."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
    aside, n = path.with_name(f"{path.name}.corrupt-{stamp}"), 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    path.rename(aside)
    for suffix in ("-wal", "-shm"):
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            companion.rename(aside.with_name(aside.name + suffix))
    return aside


def _stored(row: tuple) -> StoredResponse:
    id, owner, model, created_at, status, previous, response, items = row
    return StoredResponse(id, owner, model, created_at, status, orjson.loads(response), orjson.loads(items), previous)


def _code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF
