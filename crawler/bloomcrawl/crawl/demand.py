"""How many requests a worker leases, and when it leases before its engine runs dry.

A lease asks for the engine's free slots (``want``: from any host, as each
goes out at once) and, beyond them, ``ahead``: up to LEASE_AHEAD_S of the
worker's recent pace, from hosts without a delay only (a request of a host
with a delay never waits in a worker). The engine asks the scheduler for
work only when a slot frees; when the leased requests run out first its
slots stay empty for a round trip, some tens of ms on a busy reactor, so a
worker whose leased requests run low leases more while it still has some
(:meth:`LeaseDemand.runs_low`, :meth:`ExchangeLoop.refill`).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bloomcrawl.crawl.engine import EngineInterface
    from bloomcrawl.crawl.lease_book import LeaseBook
    from bloomcrawl.crawl.redis_io import RedisIO

#: requests leased in one exchange at the most
MAX_LEASE = 32
#: a lease may hold this many seconds of the worker's recent pace beyond the engine's
#: free slots, from hosts without a delay: a fast crawl's exchanges each carry more
#: pages, and so are fewer (each costs Redis a wake-up and a script call's fixed work)
LEASE_AHEAD_S = 0.2
#: the pace is the requests finished over the last window this long
PACE_WINDOW_S = 0.5
#: leased requests that would last less than this at the worker's pace run low: it
#: leases more before its engine runs dry (bench/crawl.py measured 25-30 ms from a
#: lease's send to its reply on the reactor of a busy worker)
REFILL_S = 0.05


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


class LeaseDemand:
    def __init__(self, engine: EngineInterface, book: LeaseBook, io: RedisIO, *,
                 concurrency: int, prefetch: int) -> None:
        self.engine = engine
        self.book = book
        self.io = io
        self.concurrency = concurrency
        self.prefetch = prefetch
        #: requests finished per second (ExchangeLoop.ack counts them)
        self.pace = Pace()

    def lease(self, least: int | None = None) -> tuple[int, int]:
        """How many to lease: SCHEDULER_PREFETCH (or ``least``) or the engine's free slots
        (leasing one per exchange would leave slots idle a round trip each); and how many
        more from hosts without a delay, up to LEASE_AHEAD_S of the recent pace."""
        least = self.prefetch if least is None else least
        if not self.io.threaded:
            return least, 0
        active = self.engine.active_downloads()
        if active is None:  # no engine (yet)
            return least, 0
        ready = self.book.ready()
        want = max(least, min(self.concurrency - active - ready, MAX_LEASE))
        pace = math.ceil(self.pace.per_second(time.monotonic()) * LEASE_AHEAD_S)
        return want, max(0, min(pace, MAX_LEASE) - want - ready)

    def runs_low(self) -> bool:
        """The leased requests the engine has not taken would last less than REFILL_S at
        the recent pace (never before the engine and a pace exist)."""
        if self.engine.active_downloads() is None:
            return False
        rate = self.pace.per_second(time.monotonic())
        return rate > 0 and self.book.ready() <= rate * REFILL_S
