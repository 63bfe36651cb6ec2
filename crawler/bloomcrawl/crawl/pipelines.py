"""ITEM_PIPELINES: items as JSON into ``%(spider)s:items``, where scrapy-redis puts them."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import redis
from scrapy.utils.serialize import ScrapyJSONEncoder

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.connection import OutageLog
from bloomcrawl.crawl.config import get_float, redis_from_settings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


class RedisItemsPipeline:
    """RPUSH each item, JSON-encoded, to REDIS_ITEMS_KEY (default ``%(spider)s:items``).

    While Redis is unreachable the item waits and is pushed when it is back
    (for up to REDIS_ITEMS_RETRY_TIMEOUT seconds, then the error is logged).
    """

    def __init__(self, server: redis.Redis, crawler: Crawler, key_pattern: str,
                 retry_timeout: float = defaults.ITEMS_RETRY_TIMEOUT) -> None:
        self.server = server
        self.crawler = crawler
        self.key_pattern = key_pattern
        self.retry_timeout = retry_timeout
        self.encoder = ScrapyJSONEncoder()
        self.key = ""
        self._outage = OutageLog(logger, server, "items wait until it is back")

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisItemsPipeline:
        settings = crawler.settings
        pattern = settings.get("REDIS_ITEMS_KEY") or defaults.ITEMS_KEY
        retry = get_float(settings, "REDIS_ITEMS_RETRY_TIMEOUT", defaults.ITEMS_RETRY_TIMEOUT,
                          0, None)
        return cls(redis_from_settings(settings), crawler, pattern, retry)

    def open_spider(self) -> None:
        assert self.crawler.spider is not None
        self.key = keys.spider_key(self.key_pattern, self.crawler.spider.name)

    async def process_item(self, item: Any) -> Any:
        data = self.encoder.encode(item)
        deadline = time.monotonic() + self.retry_timeout
        delay = 0.1
        while True:
            try:
                self.server.rpush(self.key, data)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise
                self._outage.failed(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self._outage.ok()
            return item
