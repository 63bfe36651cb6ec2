"""Requests the frontier cannot share, crawled by the worker that made them.

A request with a lambda callback or a lock in meta cannot go through Redis;
it is not dropped for that. It waits here, in priority order, after the
worker's leased requests, and is filtered only against what this worker
kept (the shared filter never sees it).
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING

from bloomcrawl.crawl.serialization import priority_score

if TYPE_CHECKING:
    from scrapy import Request


class HeldRequests:
    def __init__(self) -> None:
        # (score, arrival number, request): the lowest score first, then the oldest
        self._heap: list[tuple[float, int, Request]] = []
        self._numbers = itertools.count()
        self._seen: set[bytes] = set()
        self._kinds: set[str] = set()

    def __len__(self) -> int:
        return len(self._heap)

    def first_of_kind(self, kind: str) -> bool:
        """True the first time a request that cannot be shared for ``kind`` comes."""
        if kind in self._kinds:
            return False
        self._kinds.add(kind)
        return True

    def seen_before(self, fingerprint: bytes) -> bool:
        """Whether this worker already kept a request of ``fingerprint`` (then remembered)."""
        if fingerprint in self._seen:
            return True
        self._seen.add(fingerprint)
        return False

    def push(self, request: Request) -> None:
        heapq.heappush(self._heap, (priority_score(request), next(self._numbers), request))

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[2]

    def clear(self) -> None:
        self._heap.clear()
