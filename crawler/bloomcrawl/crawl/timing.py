"""The exchange loop's clocks: a timer that only moves earlier, the worker's pace, and
how much a lease asks for."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from bloomcrawl.crawl.redis_io import call_later

#: requests leased in one exchange at the most
MAX_LEASE = 32
#: a lease may hold this many seconds of the worker's recent pace beyond the engine's
#: free slots, from hosts without a delay: a fast crawl's exchanges each carry more
#: pages, and so are fewer (each costs Redis a wake-up and a script call's fixed work)
LEASE_AHEAD_S = 0.2
#: the pace is the requests finished over the last window this long
PACE_WINDOW_S = 0.5


def lease_demand(free: int, ready: int, waiting: int, prefetch: int,
                 pace: float) -> tuple[int, int]:
    """How many to lease: SCHEDULER_PREFETCH or the engine's ``free`` slots (leasing one
    per exchange would leave slots idle a round trip each), less the leased requests
    ``ready`` for it and those ``waiting`` for their time (none more for those); and how
    many more from hosts without a delay, up to LEASE_AHEAD_S of the ``pace`` (requests
    finished a second)."""
    slots = min(free - ready - waiting, MAX_LEASE)
    want = max(0, slots) if waiting else max(prefetch, slots)
    ahead = math.ceil(pace * LEASE_AHEAD_S)
    return want, max(0, min(ahead, MAX_LEASE) - want - ready)


class SoonestCall:
    """A one-shot timer that only moves earlier: asked for a later time than it is set
    for (give or take ``slack`` s), it keeps its own."""

    def __init__(self, fire: Callable[[], None], later: Callable[..., Any] = call_later) -> None:
        self._fire = fire
        self._later = later
        self._call: Any = None
        self._at = 0.0

    def within(self, delay: float, slack: float = 0.0) -> None:
        at = time.monotonic() + delay
        if self._call is not None:
            if self._at <= at + slack:
                return
            self._call.cancel()
        self._at = at
        self._call = self._later(delay, self._run)

    def pending(self) -> bool:
        return self._call is not None

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    def _run(self) -> None:
        self._call = None
        self._fire()


class Pace:
    """Requests a worker finished per second, over its last complete window."""

    def __init__(self, now: float | None = None) -> None:
        self.done = 0
        self._since = time.monotonic() if now is None else now
        self._rate = 0.0

    def per_second(self, now: float) -> float:
        elapsed = now - self._since
        if elapsed >= PACE_WINDOW_S:
            self._rate = self.done / elapsed
            self._since, self.done = now, 0
        return self._rate
