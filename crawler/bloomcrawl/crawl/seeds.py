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
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import Request

from bloomcrawl.core import keys
from bloomcrawl.core.connection import REDIS_ERRORS
from bloomcrawl.core.frontier import parse_start_entry
from bloomcrawl.core.scripts import Script, ScriptCall, run_scripts

if TYPE_CHECKING:
    import redis
    from scrapy import Spider
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.defer import Deferred
    from twisted.python.failure import Failure

    from bloomcrawl.core.frontier import Frontier
    from bloomcrawl.crawl.outbox import Outbox
    from bloomcrawl.crawl.redis_io import RedisIO

logger = logging.getLogger(__name__)

BATCH = 100

_CRAWL_ID = Script("crawl_id.lua")


class StartUrls:
    def __init__(self, io: RedisIO, frontier: Frontier, outbox: Outbox, spider: Spider,
                 stats: StatsCollector, enqueue: Callable[[Request], bool]) -> None:
        self.io = io
        self.frontier = frontier
        self.outbox = outbox
        self.spider = spider
        self.stats = stats
        self.enqueue = enqueue

    def read(self) -> Deferred[int]:
        """Lease the next batch of entries (and ack those whose requests were sent).

        Fires with how many entries were read; on a Redis failure the acks go
        back to the outbox and the failure is passed on.
        """
        acks = self.outbox.take_start_acks()
        d = self.io.run(self.frontier.take_start_entries, BATCH, acks)
        d.addCallbacks(self._got, self._failed, errbackArgs=(acks,))
        return d

    def _got(self, entries: list[tuple[str, bytes]]) -> int:
        for token, raw in entries:
            self._queue(token, raw)
        return len(entries)

    def _failed(self, failure: Failure, acks: list[str]) -> Failure:
        self.outbox.give_back_start_acks(acks)
        return failure

    def _queue(self, token: str, raw: bytes) -> None:
        """Queue the request an entry makes; its lease is acked once that is sent."""
        try:
            request = self.make_request(parse_start_entry(raw))
        except Exception as exc:  # one poisoned seed must not stop the others
            logger.warning("bad start URL entry %r in %s: %s", raw[:200],
                           self.frontier.keys.start_urls, exc, extra={"spider": self.spider})
            self.stats.inc_value("bloomcrawl/bad_start_urls")
            self.outbox.count("bad_start_urls")
            self.outbox.start_done(token)
            return
        # waiting before the request is enqueued: the exchange that carries it acks it
        self.outbox.start_waiting(token)
        if not self.enqueue(request):
            self.outbox.start_done(token)

    def make_request(self, data: dict[str, Any]) -> Request:
        make = getattr(self.spider, "make_request_from_start_entry", None)
        if callable(make):
            request: Request = make(data)
            return request
        return Request(data["url"], meta=data.get("meta") or {},
                       priority=data.get("priority", 0),
                       dont_filter=data.get("dont_filter", False))


def join_crawl(server: redis.Redis, spider: str, configured: str) -> bytes:
    """The id of the crawl this worker joins: FRONTIER_CRAWL_ID, or the one in Redis.

    dont_filter start requests go through the filter under this id, so each
    start URL is fetched once per crawl whichever workers start it. The
    first worker of a crawl sets ``<spider>:crawl``; the others read it; it
    is deleted when a worker closes with the frontier finished
    (:func:`end_crawl`), so the next crawl starts its start URLs again.
    """
    if configured:
        return configured.encode()
    (value,) = run_scripts(server, [ScriptCall(
        _CRAWL_ID, [keys.crawl_key(spider)], ["join", uuid.uuid4().hex])])
    return value.encode() if isinstance(value, str) else bytes(value or b"")


def end_crawl(server: redis.Redis, frontier: Frontier, spider: Spider, crawl_id: bytes) -> None:
    """The crawl is over when nothing is queued, leased or seeded anywhere."""
    key = keys.crawl_key(spider.name)
    try:
        if frontier.size(with_leases=True) == 0:
            run_scripts(server, [ScriptCall(_CRAWL_ID, [key], ["end", crawl_id])])
    except REDIS_ERRORS as exc:
        logger.warning("could not end the crawl %s (%s): the next crawl's start URLs"
                       " count as seen", crawl_id.decode(), exc, extra={"spider": spider})
