"""A page is acked when everything it yielded is done, however the engine disposed of it.

Scrapy lets a ``request_scheduled`` handler drop a request by raising
IgnoreRequest: the request then never reaches the scheduler. Its parent page
must still be acked (:mod:`bloomcrawl.crawl.pages`), or the worker would
renew that lease forever and never see the frontier empty.
"""

from __future__ import annotations

from typing import Any

import pytest
from scrapy import signals
from scrapy.exceptions import IgnoreRequest

from bloomcrawl.ops.demo_site import page_id

from kit.checks import frontier_left, shared_stats
from kit.workers import WorkerPool, check_exits, run_workers

pytestmark = pytest.mark.slow

#: pages whose number ends in this digit are ignored by IgnoreEveryTenth
IGNORED_DIGIT = 7


class IgnoreEveryTenth:
    """An extension dropping the requests of one page in ten at ``request_scheduled``."""

    @classmethod
    def from_crawler(cls, crawler: Any) -> IgnoreEveryTenth:
        extension = cls()
        crawler.signals.connect(extension.request_scheduled, signal=signals.request_scheduled)
        return extension

    def request_scheduled(self, request: Any, **kwargs: Any) -> None:
        number = page_id(request.url)
        if number is not None and number % 10 == IGNORED_DIGIT:
            raise IgnoreRequest("ignored by the test")


def test_pages_whose_links_a_handler_ignores_are_acked(redis_server, redis_client, demo_site,
                                                       worker_pool: WorkerPool) -> None:
    redis_client.rpush("site:start_urls", demo_site.url)
    settings = {"EXTENSIONS": '{"test_pages_crawl.IgnoreEveryTenth": 0}'}
    workers = worker_pool.start_many(2, redis_server.url, settings)
    # they close by themselves: no page waits for a request the engine ignored
    run_workers(workers, timeout=300)
    check_exits(workers)
    hits = demo_site.hits()
    ignored = [n for n, h in enumerate(hits) if n % 10 == IGNORED_DIGIT and h]
    assert ignored == []  # the handler really dropped them
    crawled = [n for n, h in enumerate(hits) if h]
    assert len(crawled) > len(hits) // 2, len(crawled)
    assert max(hits) == 1  # no page crawled twice: every lease was acked, none expired
    assert shared_stats(redis_client)["pages"] == len(crawled)
    assert frontier_left(redis_client) == 0
