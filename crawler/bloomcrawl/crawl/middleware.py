"""Report when a leased request's outcome is final, so its lease is acked.

* :class:`FrontierSpiderMiddleware`: the response's callback output has been
  processed (its requests handed to the scheduler), or the callback raised.
* :class:`FrontierDownloaderMiddleware`: the download failed for good (no
  other middleware retried it) or the request was ignored.

Retries and redirects are new requests carrying the original's lease; the
scheduler queues them, then acks the original.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest

from bloomcrawl.crawl import origins
from bloomcrawl.crawl.lease import INTERNAL_META_KEYS, LEASE_META_KEY, request_finished

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response


class _Reporter:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        return cls(crawler)

    def _finished(self, request: Request | None, outcome: str) -> None:
        if request is not None and LEASE_META_KEY in request.meta:
            self.crawler.signals.send_catch_log(request_finished, request=request,
                                                outcome=outcome)


class FrontierSpiderMiddleware(_Reporter):
    """Acks a response's lease once everything its callback yielded was processed.

    Each item is tagged with its origin (:mod:`bloomcrawl.crawl.origins`): the
    response's request fingerprint and the item's position in the output.
    """

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        crawler.signals.connect(origins.forget, signal=signals.item_dropped)
        crawler.signals.connect(origins.forget, signal=signals.item_error)
        return cls(crawler)

    def _outputs(self, response: Response) -> Callable[[Any], Any]:
        request = response.request
        fingerprint = (uuid.uuid4().hex if request is None
                       else self.crawler.request_fingerprinter.fingerprint(request).hex())
        position = 0

        def child(output: Any) -> Any:
            nonlocal position
            if isinstance(output, Request):
                # a child request must not carry its parent's lease (spiders copy meta)
                for key in INTERNAL_META_KEYS:
                    output.meta.pop(key, None)
            else:
                origins.tag(output, "%s:%d" % (fingerprint, position))
                position += 1
            return output

        return child

    # ``spider=None``: Scrapy < 2.14 passes the spider, later versions do not

    def process_spider_output(self, response: Response, result: Iterable[Any],
                              spider: Spider | None = None) -> Iterator[Any]:
        child = self._outputs(response)
        for output in result:
            yield child(output)
        self._finished(response.request, "response")

    async def process_spider_output_async(
        self, response: Response, result: AsyncIterator[Any], spider: Spider | None = None
    ) -> AsyncIterator[Any]:
        child = self._outputs(response)
        async for output in result:
            yield child(output)
        self._finished(response.request, "response")

    def process_spider_exception(self, response: Response, exception: Exception,
                                 spider: Spider | None = None) -> None:
        self._finished(response.request, "spider_error")


class FrontierDownloaderMiddleware(_Reporter):
    """Acks the lease of a request whose download failed for good or was ignored."""

    def process_exception(self, request: Request, exception: Exception,
                          spider: Spider | None = None) -> None:
        outcome = "ignored" if isinstance(exception, IgnoreRequest) else "download_error"
        self._finished(request, outcome)
