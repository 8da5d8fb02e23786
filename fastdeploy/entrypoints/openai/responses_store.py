"""The Responses API's stored responses: a bounded, least-recently-used map in the server's memory.

A stored response keeps its response object (for `GET /v1/responses/{id}`) and its whole
conversation as chat messages (the inputs of every turn up to it and its own output), which a
later request's `previous_response_id` continues. The store holds at most `capacity` responses
(`--responses-store-size`); storing one more forgets the one used least recently, whose id then
answers 404 like an id never stored. Capacity 0 stores nothing. Nothing is written to disk, so a
restart forgets every response.

The store is used from the server's event loop only, so it needs no lock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from fastdeploy.engine_args import EngineArgs
from fastdeploy.errors import InvalidArgumentError

#: responses kept by default (`--responses-store-size`)
DEFAULT_RESPONSES_STORE_SIZE: int = EngineArgs.responses_store_size


@dataclass
class StoredResponse:
    """One stored response: its response object and its conversation as chat messages."""

    body: dict[str, Any]
    conversation: list[dict[str, Any]]


class ResponseStore:
    """At most `capacity` responses by id, the least recently stored or read forgotten first."""

    def __init__(self, capacity: int = DEFAULT_RESPONSES_STORE_SIZE) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise InvalidArgumentError(f"responses_store_size must be an int >= 0, got {capacity!r}")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, entry: StoredResponse) -> bool:
        """Store `entry`; False when the store keeps nothing (capacity 0)."""
        if self.capacity == 0:
            return False
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response (now the most recently used), or None if never stored or forgotten."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        """Forget a response; False if it was not stored."""
        return self._entries.pop(response_id, None) is not None
