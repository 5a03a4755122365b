"""Stored responses of /v1/responses (`store`, `previous_response_id`): in memory, bounded in
number (the least recently used go first) and in age. Nothing survives a restart."""

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_RESPONSES = 1000
MAX_AGE_SECONDS = 3600.0


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: dict[str, Any]  # the response object, as GET /v1/responses/{id} returns it
    items: list[Any]  # the conversation as input items: earlier turns, this input, the output


class ResponseStore:
    """Responses by id; one that is older than max_age_s reads as absent."""

    def __init__(
        self,
        max_entries: int = MAX_RESPONSES,
        max_age_s: float = MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries, self.max_age_s, self.clock = max_entries, max_age_s, clock
        self._entries: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()

    def put(self, stored: StoredResponse) -> None:
        self._drop_expired()
        self._entries[stored.response["id"]] = (self.clock(), stored)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        self._drop_expired()
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        self._entries.move_to_end(response_id)  # used: the last to be dropped for room
        return entry[1]

    def delete(self, response_id: str) -> bool:
        self._drop_expired()
        return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._entries)

    def _drop_expired(self) -> None:
        oldest = self.clock() - self.max_age_s
        expired = [key for key, (stored_at, _) in self._entries.items() if stored_at < oldest]
        for key in expired:
            del self._entries[key]
