"""The response store: Responses API responses kept durably, by id and owner, so that `previous_response_id`
continues a conversation (also after a restart) and a response can be read back, deleted or cancelled.

`ResponseStore` is the interface (interface.py); `SqliteResponseStore` the embedded one (sqlite.py, over
database.py); `open_store` opens the one the server's config asks for. This package runs in the HTTP process.
"""

from __future__ import annotations

import logging

from orchestrator.config import ServerConfig
from orchestrator.errors import StoreUnavailable
from orchestrator.store.interface import FINISHED, STATUSES, ResponseStore, Status, StoredResponse
from orchestrator.store.sqlite import SqliteResponseStore

__all__ = ["FINISHED", "STATUSES", "ResponseStore", "SqliteResponseStore", "Status", "StoredResponse", "open_store"]

log = logging.getLogger(__name__)


async def open_store(config: ServerConfig) -> ResponseStore | None:
    """The store the config asks for; None when it is turned off, or when no database can be opened at its path
    (logged: the server still starts, and keeps no responses)."""
    if not config.store.enabled:
        return None
    try:
        return await SqliteResponseStore.open(
            config.store_file, max_age_days=config.store.max_age_days, max_mb=config.store.max_mb
        )
    except StoreUnavailable as exc:
        log.error("%s; serving without a response store (previous_response_id and stored responses are "
                  "unavailable until this is fixed)", exc.message)
        return None
