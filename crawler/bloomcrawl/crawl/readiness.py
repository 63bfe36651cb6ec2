"""Which partitions may have a request to lease now, as far as this worker knows.

A lease call on a partition whose hosts are all waiting out their delay (or
have every slot in flight) costs a round trip for nothing. The lease script
replies when the partition's soonest host is ready; this worker remembers
it and asks that partition again then, or when something may have freed a
host (an ack, a requeue, new links).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

INF = float("inf")


class PartitionReadiness:
    """Per partition: when (``time.monotonic()``) a host of it may be leased.

    0: maybe now; ``inf``: none waits for a time (nothing queued, or all its
    slots in flight).
    """

    def __init__(self, partitions: int) -> None:
        self._ready_at = [0.0] * partitions
        self._rotation = 0

    def __len__(self) -> int:
        return len(self._ready_at)

    def ready_now(self) -> list[int]:
        now = time.monotonic()
        return [p for p, at in enumerate(self._ready_at) if at <= now]

    def may_have_work(self, partitions: Iterable[int] | None = None) -> None:
        """Something may be ready in ``partitions`` (all: None): ask them at the next lease."""
        for p in range(len(self._ready_at)) if partitions is None else partitions:
            self._ready_at[p] = 0.0

    def waiting_for_others(self) -> list[int]:
        """Partitions with nothing this worker can see: other workers may have queued since."""
        return [p for p, at in enumerate(self._ready_at) if at == INF]

    def waiting_for_time(self) -> bool:
        """A partition's soonest host is ready at a known time to come: it has requests
        queued, and this worker asks it then."""
        now = time.monotonic()
        return any(now < at < INF for at in self._ready_at)

    def ready_in(self, partition: int, wait: float | None) -> None:
        """The partition's soonest host is ready in ``wait`` s (None: none waits for a time)."""
        self._ready_at[partition] = INF if wait is None else time.monotonic() + wait

    def soonest(self) -> float:
        """When the first partition is ready (``inf``: none waits for a time)."""
        return min(self._ready_at, default=INF)

    def lease_order(self, ready: list[int], first: int | None) -> list[int]:
        """``ready`` in the order to lease from: ``first`` (it has acks to carry), then
        round robin, so priority holds within a partition and roughly across."""
        start = self._rotation % len(self._ready_at)
        self._rotation += 1
        return sorted(ready, key=lambda p: (p != first, (p - start) % len(self._ready_at)))
