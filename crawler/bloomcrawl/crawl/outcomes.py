"""Outcomes: what the engine's signals say of the crawl, owed to Redis.

A request's outcome (:data:`~bloomcrawl.crawl.lease.request_finished`, which
the middlewares' PageTracker sends once its page is done) counts a page or
an error in the shared stats and acks the request's lease; ``item_scraped``
counts an item and ``spider_error`` an error. All of it rides with the next
exchange. A request this worker held (the frontier could not share it) acks, once done,
the start entry it was made of (:class:`~bloomcrawl.crawl.seeds.StartHolds`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bloomcrawl.crawl.lease import HOLD_META_KEY, LEASE_META_KEY, Outcome

if TYPE_CHECKING:
    from scrapy import Request, Spider

    from bloomcrawl.crawl.exchanges import ExchangeLoop


class Outcomes:
    """The handlers of request_finished, item_scraped and spider_error (the scheduler
    connects them and keeps this object: signals hold their receivers weakly)."""

    def __init__(self, loop: ExchangeLoop) -> None:
        self.loop = loop
        self.outbox = loop.outbox

    def finished(self, request: Request, outcome: Outcome) -> None:
        lease = request.meta.pop(LEASE_META_KEY, None)
        if outcome == Outcome.RESPONSE:
            self.outbox.count("pages")
        elif outcome == Outcome.DOWNLOAD_ERROR:
            # a raising callback is counted once, by the spider_error signal
            self.outbox.count("errors")
        if lease is not None:
            # sent with the next lease (next_request), or by a timer anyway (ExchangeLoop.ack):
            # a worker killed now must not leave many finished pages to be crawled again
            self.loop.ack(lease)
        else:
            hold = request.meta.get(HOLD_META_KEY)
            if hold is not None:  # held here: a start entry's lease may wait for it
                self.loop.poller.start_urls.hold_done(hold[1])

    def item_scraped(self) -> None:
        """An item was scraped (called by the PageTracker's ``item_scraped`` receiver)."""
        self.outbox.count("items")

    def spider_error(self, failure: Any, response: Any, spider: Spider) -> None:
        self.outbox.count("errors")
