"""Report when a leased request's outcome is final, so its lease is acked.

* :class:`FrontierSpiderMiddleware`: the response's callback output has been
  processed (its requests handed to the scheduler), or the callback raised.
* :class:`FrontierDownloaderMiddleware`: the download failed for good (no
  other middleware retried it) or the request was ignored.

Retries and redirects are new requests carrying the original's lease; the
scheduler queues them, then acks the original.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.exceptions import IgnoreRequest

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


def _child(output: Any) -> Any:
    if isinstance(output, Request):
        # a child request must not carry its parent's lease (spiders copy meta around)
        for key in INTERNAL_META_KEYS:
            output.meta.pop(key, None)
    return output


class FrontierSpiderMiddleware(_Reporter):
    """Acks a response's lease once everything its callback yielded was processed."""

    # ``spider=None``: Scrapy < 2.14 passes the spider, later versions do not

    def process_spider_output(self, response: Response, result: Iterable[Any],
                              spider: Spider | None = None) -> Iterator[Any]:
        for output in result:
            yield _child(output)
        self._finished(response.request, "response")

    async def process_spider_output_async(
        self, response: Response, result: AsyncIterator[Any], spider: Spider | None = None
    ) -> AsyncIterator[Any]:
        async for output in result:
            yield _child(output)
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
