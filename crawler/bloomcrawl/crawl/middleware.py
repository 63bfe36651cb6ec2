"""Report when a leased request's outcome is final, so its lease is acked.

* :class:`FrontierSpiderMiddleware`: the response's page is done: its callback
  output handled, its requests queued and its items through the item
  pipeline (:mod:`bloomcrawl.crawl.pages`), or the callback raised.
* :class:`FrontierDownloaderMiddleware`: the download failed for good (no
  other middleware retried it) or the request was ignored, where Scrapy's
  engine cannot be followed (where it can, :meth:`PageTracker.downloads`
  hears of every failure, those of ``process_response`` too). It also says,
  once, that a response set a cookie: each worker keeps its own jar.

Retries and redirects are new requests carrying the original's lease; the
scheduler queues them, then acks the original.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.threads import deferToThread

from bloomcrawl.core.connection import REDIS_ERRORS
from bloomcrawl.crawl import origins
from bloomcrawl.crawl.lease import Outcome
from bloomcrawl.crawl.pages import Page, PageTracker, adopted, failure_outcome, labels, tracked

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response


class _Reporter:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.pages = PageTracker.of(crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        return cls(crawler)


class FrontierSpiderMiddleware(_Reporter):
    """Acks a response's lease once its page is done (:mod:`bloomcrawl.crawl.pages`).

    With RedisItemsPipeline enabled, each item of a tracked page is tagged
    with its origin (:mod:`bloomcrawl.crawl.origins`): the response's request
    fingerprint and the item's position in the output.
    """

    def _outputs(self, response: Response) -> tuple[Callable[[Any], Any], Page | None]:
        request = response.request
        page = self.pages.open(response) if tracked(request) else None
        label = labels(self.crawler, page) if page is not None else None

        def child(output: Any) -> Any:
            if isinstance(output, Request):
                # a child request must not carry its parent's lease nor be a start
                # request (fetched once in every crawl) when it copied the page's meta
                adopted(output)
                if page is not None:
                    self.pages.child_request(page, output)
            elif output is not None and page is not None:
                self.pages.child_item(page)
            return output if label is None else label(output)

        return child, page

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """The items ``start()`` yields (Scrapy 2.13), once per crawl.

        Every worker of a crawl runs ``start()``, as plain Scrapy runs it once:
        the first worker to yield an item takes them all
        (:func:`~bloomcrawl.crawl.seeds.take_start_items`), and the others drop
        theirs. They are tagged with the crawl and their position, so
        RedisItemsPipeline stores each once.
        """
        joined = origins.crawl_of(self.crawler)
        mine: bool | None = None if joined is not None else True
        position = 0
        async for output in start:
            if output is not None and not isinstance(output, Request):
                if mine is None:
                    assert joined is not None
                    mine = await self._take_start_items(joined[1])
                if not mine:
                    self.crawler.stats.inc_value("bloomcrawl/start_items_elsewhere")
                    continue
                if joined is not None and origins.wanted(self.crawler):
                    origins.tag(output, "start:%s:%d" % (
                        joined[0].decode("ascii", "replace"), position))
                position += 1
            yield output

    async def _take_start_items(self, take: Callable[[], bool]) -> bool:
        extra = {"spider": self.crawler.spider}
        try:
            mine = await maybe_deferred_to_future(deferToThread(take))
        except REDIS_ERRORS as exc:
            logger.warning("could not tell whether another worker took the items start()"
                           " yields in this crawl (%s): this worker keeps its own", exc,
                           extra=extra)
            return True
        if not mine:
            logger.info("another worker of this crawl took the items start() yields: this"
                        " worker drops its own (bloomcrawl/start_items_elsewhere)",
                        extra=extra)
        return bool(mine)

    # ``spider=None``: Scrapy < 2.14 passes the spider, later versions do not

    def process_spider_output(self, response: Response, result: Iterable[Any],
                              spider: Spider | None = None) -> Iterator[Any]:
        child, page = self._outputs(response)
        for output in result:
            yield child(output)
        if page is not None:
            self.pages.ended(page, Outcome.RESPONSE)

    async def process_spider_output_async(
        self, response: Response, result: AsyncIterator[Any], spider: Spider | None = None
    ) -> AsyncIterator[Any]:
        child, page = self._outputs(response)
        async for output in result:
            yield child(output)
        if page is not None:
            self.pages.ended(page, Outcome.RESPONSE)

    def process_spider_exception(self, response: Response, exception: Exception,
                                 spider: Spider | None = None) -> None:
        page = self.pages.find(response)
        if page is not None:
            self.pages.ended(page, Outcome.SPIDER_ERROR)  # what it yielded before still counts
        elif response.request is not None and tracked(response.request):
            self.pages.finish(response.request, Outcome.SPIDER_ERROR)


class FrontierDownloaderMiddleware(_Reporter):
    """Acks the lease of a request whose download failed for good or was ignored (once
    its errback's output is handled, when it has one), where the engine's handler of
    download results cannot be followed."""

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self._cookies_said = not crawler.settings.getbool("COOKIES_ENABLED", True)

    def process_response(self, request: Request, response: Response,
                         spider: Spider | None = None) -> Response:
        if not self._cookies_said and b"Set-Cookie" in response.headers:
            # once: from then on this costs one attribute test a response
            self._cookies_said = True
            logger.warning(
                "%s sets cookies: Scrapy keeps cookies in each worker's own jar, and a"
                " queued request carries only the cookies set on it (cookies=..., a"
                " Cookie header), so other workers fetch it without this one's session"
                " (a login on one worker logs in no other). See \"What each worker keeps"
                " to itself\" in bloomcrawl's README", response,
                extra={"spider": self.crawler.spider})
        return response

    def process_exception(self, request: Request, exception: Exception,
                          spider: Spider | None = None) -> None:
        # the engine's handler of download results hears of every failure of a scheduled
        # request (PageTracker.downloads), this one of engine.download()'s too: those of a
        # request that copied its page's meta must not finish the page
        if self.pages.follows_downloads:
            return
        self.pages.failed(request, failure_outcome(exception))
