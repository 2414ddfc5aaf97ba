"""What the response store keeps and the small async interface every store implements.

A stored response is one Responses API response as last returned to its client, with the conversation it
answered, so that a later request naming it as `previous_response_id` continues from there. The embedded store
is SQLite (`sqlite.py`); a deployment where several replicas serve one API puts the same interface on a shared
database (PostgreSQL) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, get_args

Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
STATUSES: tuple[str, ...] = get_args(Status)
FINISHED: frozenset[str] = frozenset({"completed", "incomplete", "failed", "cancelled"})
ID_PREFIX = "resp_"


@dataclass(frozen=True)
class StoredResponse:
    """One response and what it answered.

    `owner` is the name of the API key that made it ("anonymous" on an open server); only that key reads,
    deletes or continues it. `response` is the Responses API object as JSON, as last returned (its status
    agrees with `status`); `input_items` is the whole conversation the response answered, earlier turns
    resolved, as Responses input items. `created_at` is in seconds since the epoch (the response's own).
    """

    id: str
    owner: str
    model: str
    created_at: float
    status: Status
    response: dict
    input_items: list[dict]
    previous_response_id: str | None = None

    def __post_init__(self) -> None:
        if not self.id.startswith(ID_PREFIX):
            raise ValueError(f"a stored response's id starts with {ID_PREFIX!r}, not {self.id!r:.40}")
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is none of {', '.join(STATUSES)}")

    def conversation(self) -> list[dict]:
        """The input items a request that continues this response starts from: what it answered, then what it
        said (its output items: messages, function calls, reasoning)."""
        return [*self.input_items, *self.response.get("output", [])]


class ResponseStore(Protocol):
    """Durable responses, by id and owner. Every method is a coroutine that never blocks the event loop.

    A write that cannot be kept raises `errors.StorageFull` (the disk is full) or `errors.StoreUnavailable`
    (any other failure of the database); nothing already stored is lost by it, and the caller still holds the
    response it was writing, to return to its client. Another owner's response is absent (None / False),
    never forbidden: ids do not leak across keys.
    """

    async def put(self, stored: StoredResponse) -> None:
        """Keep `stored`, replacing a response of the same id."""

    async def update(self, id: str, *, status: Status, response: dict) -> bool:
        """Set a kept response's status and its Responses object (a background response that runs on, is
        cancelled or ends); False if there is no such response."""

    async def get(self, id: str, owner: str) -> StoredResponse | None:
        """The response `id` if `owner` made it and it is kept, else None."""

    async def delete(self, id: str, owner: str) -> bool:
        """Forget the response `id` of `owner`; False if there was none to forget."""

    async def conversation(self, id: str, owner: str) -> list[dict] | None:
        """The input items that continue response `id` (see StoredResponse.conversation); None if `owner` has
        no such response."""

    async def close(self) -> None:
        """Finish pending writes and release the database; the store takes no calls after this."""
