"""ITEM_PIPELINES: items as JSON into ``%(spider)s:items``, where scrapy-redis puts them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy.utils.serialize import ScrapyJSONEncoder

from bloomcrawl import keys
from bloomcrawl.connection import redis_from_settings

if TYPE_CHECKING:
    import redis
    from scrapy.crawler import Crawler


class RedisItemsPipeline:
    """RPUSH each item, JSON-encoded, to REDIS_ITEMS_KEY (default ``%(spider)s:items``)."""

    def __init__(self, server: redis.Redis, crawler: Crawler, key_pattern: str) -> None:
        self.server = server
        self.crawler = crawler
        self.key_pattern = key_pattern
        self.encoder = ScrapyJSONEncoder()
        self.key = ""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisItemsPipeline:
        settings = crawler.settings
        pattern = settings.get("REDIS_ITEMS_KEY") or keys.DEFAULT_ITEMS_KEY
        return cls(redis_from_settings(settings), crawler, pattern)

    def open_spider(self) -> None:
        assert self.crawler.spider is not None
        self.key = keys.spider_key(self.key_pattern, self.crawler.spider.name)

    def process_item(self, item: Any) -> Any:
        self.server.rpush(self.key, self.encoder.encode(item))
        return item
