"""The few things the scheduler's parts need of Scrapy's engine, in one place.

Scrapy's engine has no public API for them (the downloader's slots, its
active requests, closing the spider from a component); reading them here,
as ``scrapy/pqueues.py`` does with ``DownloaderInterface``, keeps every
other module off the engine's internals and each version difference in one
spot.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import CloseSpider, DontCloseSpider
from scrapy.utils.defer import deferred_from_coro
from twisted.python.failure import Failure

from bloomcrawl.crawl.redis_io import log_unexpected

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


class EngineInterface:
    """The crawler's engine, as the scheduler's parts use it."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    def _engine(self) -> Any:
        try:
            return self.crawler.engine
        except RuntimeError:  # Scrapy >= 2.14 before the crawl started
            return None

    def available(self) -> bool:
        """Whether the engine exists (it does not before the crawl started)."""
        return self._engine() is not None

    def crawl(self, request: Request) -> bool:
        """Hand ``request`` to the engine (its public ``crawl()``); False: no engine."""
        engine = self._engine()
        if engine is None:
            return False
        engine.crawl(request)
        return True

    def wrap_crawl(self, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
        """The engine's ``crawl()`` replaced by ``wrap(crawl)`` for this crawl; False: no engine.

        Every request the engine is given goes through ``crawl()``: the
        scraper's (``crawl(request=...)``), a downloader middleware's retry or
        redirect, the start requests, the scheduler's leases.
        """
        return _wrap(self._engine(), "crawl", wrap)

    def wrap_scrape(self, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
        """The scraper's ``enqueue_scrape()`` replaced by ``wrap(enqueue_scrape)`` for this
        crawl; False: no scraper. The engine hands it each response and each failed
        download; the Deferred it returns fires once the callback's or errback's output
        was handled."""
        return _wrap(getattr(self._engine(), "scraper", None), "enqueue_scrape", wrap)

    def wrap_spider_output(self, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
                           ) -> bool:
        """The scraper's ``handle_spider_output_async()`` (2.13 on), which a callback's
        output (after the spider middlewares) and an errback's (before none) go through,
        ``(result, request, response or failure)``, replaced by ``wrap(handler)`` for this
        crawl; False: not there."""
        return _wrap(getattr(self._engine(), "scraper", None), "handle_spider_output_async",
                     wrap)

    def wrap_downloader_output(self, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
                               ) -> bool:
        """The engine's handler of each download's result, ``(result, request)``: a
        response, a failure, or a request a downloader middleware answered ``request``
        with (Scrapy's ``_handle_downloader_output``, 2.13 to 2.19), replaced by
        ``wrap(handler)`` for this crawl; False: not there."""
        return _wrap(self._engine(), "_handle_downloader_output", wrap)

    def active_downloads(self) -> int | None:
        """Requests in the downloader now (None: no downloader yet)."""
        engine = self._engine()
        downloader = getattr(engine, "downloader", None)
        if downloader is None:
            return None
        return len(getattr(downloader, "active", ()))

    def clear_slot_delay(self, request: Request) -> None:
        """The downloader slot of ``request`` adds no delay of its own."""
        engine = self._engine()
        try:
            slot = engine.downloader.slots.get(request.meta.get("download_slot", ""))
        except AttributeError:
            return
        if slot is not None:
            slot.delay = 0.0

    def opened_by_shell(self) -> bool:
        """``scrapy shell`` (and ``inspect_response``) open the spider never to close when idle.

        Known only once the engine made its slot, right before it opens the
        scheduler.
        """
        slot = getattr(self._engine(), "_slot", None)
        return slot is not None and getattr(slot, "close_if_idle", True) is False

    def spider_is_idle(self) -> bool:
        """Whether the engine has nothing in flight (False: busy or closing)."""
        engine = self._engine()
        if engine is None or engine.spider is None:
            return False
        try:
            return bool(engine.spider_is_idle())
        except RuntimeError:  # the engine's slot is gone: the spider is closing
            return False

    def close_if_idle(self) -> None:
        """What the engine does on its 5 s heartbeat when nothing is in flight, now.

        Sends ``spider_idle`` (every receiver decides, as it would for the
        engine) and closes the spider as the engine would when none raised
        DontCloseSpider.
        """
        engine = self._engine()
        if not self.spider_is_idle():
            return  # busy: the engine calls spider_idle itself when it is idle again
        results = self.crawler.signals.send_catch_log(
            signals.spider_idle, spider=engine.spider, dont_log=(DontCloseSpider, CloseSpider))
        raised = [value for _, value in results if isinstance(value, Failure)]
        if any(isinstance(f.value, DontCloseSpider) for f in raised):
            return
        reasons = [f.value.reason for f in raised if isinstance(f.value, CloseSpider)]
        self.close_spider(reasons[0] if reasons else "finished")

    def close_spider(self, reason: str) -> None:
        """Close the spider with ``reason`` (nothing to close before the crawl started)."""
        engine = self._engine()
        if engine is None or engine.spider is None:
            return
        close_async = getattr(engine, "close_spider_async", None)
        if close_async is not None:  # Scrapy >= 2.14
            d = deferred_from_coro(close_async(reason=reason))
        else:
            d = engine.close_spider(engine.spider, reason)
        d.addErrback(log_unexpected, logger, {"spider": engine.spider})


def _wrap(owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
          ) -> bool:
    """``owner.name`` replaced by ``wrap(owner.name)`` on this instance; False: no such
    method (or no owner)."""
    method = getattr(owner, name, None)
    if not callable(method):
        return False
    setattr(owner, name, wrap(method))
    return True
