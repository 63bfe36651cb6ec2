"""Start URLs from ``<spider>:start_urls``, leased like requests, acked once queued.

Each entry (a URL, or JSON ``{"url", "meta", "priority", "dont_filter"}``,
checked by :func:`bloomcrawl.core.frontier.parse_start_entry`) is leased; the
request the spider makes of it (``make_request_from_start_entry`` when the
spider has one) is enqueued, and the lease acked once the exchange carrying
that request went through. A worker that dies in between leaves the lease to
expire: the entry goes back to the list. A bad entry is logged, counted and
acked; the others of its batch are queued.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import Request

from bloomcrawl.core.frontier import parse_start_entry
from bloomcrawl.crawl.redis_io import log_unexpected

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.statscollectors import StatsCollector
    from twisted.python.failure import Failure

    from bloomcrawl.core.frontier import Frontier
    from bloomcrawl.crawl.outbox import Outbox
    from bloomcrawl.crawl.redis_io import RedisIO

logger = logging.getLogger(__name__)

BATCH = 100


class StartUrls:
    def __init__(self, io: RedisIO, outbox: Outbox, stats: StatsCollector,
                 enqueue: Callable[[Request], bool], on_found: Callable[[], None],
                 on_error: Callable[[Failure], None]) -> None:
        self.io = io
        self.outbox = outbox
        self.stats = stats
        self.enqueue = enqueue
        self.on_found = on_found
        self.on_error = on_error
        self.frontier: Frontier | None = None
        self.spider: Spider | None = None

    def read(self) -> None:
        """Lease the next batch of entries (and ack those whose requests were sent)."""
        if self.frontier is None:
            return
        acks, self.outbox.start_acks = self.outbox.start_acks, []
        d = self.io.run(self.frontier.take_start_entries, BATCH, acks)
        d.addCallbacks(self._got, self._failed, errbackArgs=(acks,))
        d.addErrback(log_unexpected, logger, {"spider": self.spider})

    def _got(self, entries: list[tuple[str, bytes]]) -> None:
        if entries:
            for token, raw in entries:
                self._queue(token, raw)
            self.on_found()

    def _failed(self, failure: Failure, acks: list[str]) -> None:
        self.outbox.start_acks[:0] = acks
        self.on_error(failure)

    def _queue(self, token: str, raw: bytes) -> None:
        """Queue the request an entry makes; its lease is acked once that is sent."""
        try:
            request = self.make_request(parse_start_entry(raw))
        except Exception as exc:  # one poisoned seed must not stop the others
            where = self.frontier.keys.start_urls if self.frontier is not None else "start_urls"
            logger.warning("bad start URL entry %r in %s: %s", raw[:200], where, exc,
                           extra={"spider": self.spider})
            self.stats.inc_value("bloomcrawl/bad_start_urls")
            self.outbox.counts["bad_start_urls"] += 1
            self.outbox.start_acks.append(token)
            return
        self.outbox.start_waiting.append(token)
        if not self.enqueue(request):
            self.outbox.start_waiting.remove(token)
            self.outbox.start_acks.append(token)

    def make_request(self, data: dict[str, Any]) -> Request:
        make = getattr(self.spider, "make_request_from_start_entry", None)
        if callable(make):
            request: Request = make(data)
            return request
        return Request(data["url"], meta=data.get("meta") or {},
                       priority=data.get("priority", 0),
                       dont_filter=data.get("dont_filter", False))
