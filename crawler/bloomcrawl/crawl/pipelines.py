"""ITEM_PIPELINES: items as JSON into ``%(spider)s:items``, where scrapy-redis puts them.

Each item is stored once: under its origin (the request fingerprint of the
response that yielded it and its position, :mod:`bloomcrawl.crawl.origins`),
checked and pushed in one atomic call, so a page crawled twice after a
worker died, or a push sent twice, stores nothing twice. The ids are kept
for REDIS_ITEMS_DEDUP_WINDOW seconds (7 days), by Redis's clock, in the
zset ``{<items key>}:recent_ids``: its memory follows the items of that
window, not every item ever stored.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import redis
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.serialize import ScrapyJSONEncoder
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.connection import REDIS_ERRORS, TRANSIENT_REPLIES, RedisErrorPolicy, error_kind
from bloomcrawl.core.scripts import Script, ScriptCall, run_scripts
from bloomcrawl.crawl import origins
from bloomcrawl.crawl.config import get_float, redis_from_settings

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

_PUSH = Script("items_push.lua")


class RedisItemsPipeline:
    """RPUSH each item, JSON-encoded, to REDIS_ITEMS_KEY (default ``%(spider)s:items``).

    The push runs on a thread: the reactor never waits on Redis. While Redis
    is unreachable or refuses writes for a while (OOM, READONLY, MISCONF,
    BUSY, ...) the item waits and is pushed when it can be, for up to
    REDIS_ITEMS_RETRY_TIMEOUT seconds; then, or at once for any other error,
    the error is raised and Scrapy logs it with the item.
    """

    def __init__(self, server: redis.Redis, crawler: Crawler, key_pattern: str,
                 retry_timeout: float = defaults.ITEMS_RETRY_TIMEOUT,
                 dedup_window: float = defaults.ITEMS_DEDUP_WINDOW) -> None:
        self.server = server
        self.dedup_window_ms = max(1, round(dedup_window * 1000))
        self.crawler = crawler
        self.key_pattern = key_pattern
        self.retry_timeout = retry_timeout
        self.encoder = ScrapyJSONEncoder()
        self._warned_untagged = False
        self.key = ""
        self.errors = RedisErrorPolicy(logger, server, "items wait until they can be stored",
                                       max_delay=5.0)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisItemsPipeline:
        settings = crawler.settings
        pattern = settings.get("REDIS_ITEMS_KEY") or defaults.ITEMS_KEY
        retry = get_float(settings, "REDIS_ITEMS_RETRY_TIMEOUT", defaults.ITEMS_RETRY_TIMEOUT,
                          0, None)
        window = get_float(settings, "REDIS_ITEMS_DEDUP_WINDOW", defaults.ITEMS_DEDUP_WINDOW,
                           0.001, None)
        origins.want(crawler)  # the spider middleware tags items from now on
        return cls(redis_from_settings(settings), crawler, pattern, retry, window)

    # ``spider=None``: Scrapy < 2.14 passes the spider, later versions do not

    def open_spider(self, spider: Spider | None = None) -> None:
        assert self.crawler.spider is not None
        self.key = keys.spider_key(self.key_pattern, self.crawler.spider.name)

    async def process_item(self, item: Any, spider: Spider | None = None) -> Any:
        data = self.encoder.encode(item)
        origin = origins.pop(item)
        if origin is None:
            # an item no tracked callback yielded still gets an id: a resent push stores
            # it once
            origin = "u:" + uuid.uuid4().hex
            if origins.tagged_any:
                self._untagged(item)
        deadline = time.monotonic() + self.retry_timeout
        while True:
            try:
                stored = await maybe_deferred_to_future(deferToThread(self.push, origin, data))
            except REDIS_ERRORS as exc:
                kind = error_kind(exc)
                if (kind != "unreachable" and kind not in TRANSIENT_REPLIES) or (
                        time.monotonic() > deadline):
                    raise
                from twisted.internet import reactor  # the one Scrapy installed

                await maybe_deferred_to_future(deferLater(reactor, self.errors.failed(exc)))
                continue
            self.errors.ok()
            if not stored:
                self.crawler.stats.inc_value("bloomcrawl/items_stored_before")
            return item

    def _untagged(self, item: Any) -> None:
        """An item that is not the object a callback yielded, in a crawl whose items are
        tagged: a pipeline before this one returned a new object."""
        self.crawler.stats.inc_value("bloomcrawl/items_without_origin")
        if not self._warned_untagged:
            self._warned_untagged = True
            logger.warning(
                "RedisItemsPipeline got a %s that is not the object the callback yielded (a"
                " pipeline before it returned a new one): it is stored under an id of its"
                " own, so if its page is crawled twice (a worker died before the page was"
                " done) it is stored twice. Have that pipeline change the item it is given"
                " and return it; further such items are counted in"
                " bloomcrawl/items_without_origin",
                type(item).__name__, extra={"spider": self.crawler.spider})

    def push(self, origin: str, data: str) -> bool:
        """Store one item under its id unless stored within the window (blocks on Redis)."""
        (stored,) = run_scripts(self.server, [ScriptCall(
            _PUSH, [self.key, keys.item_ids_key(self.key), keys.recent_item_ids_key(self.key)],
            [origin, data, str(self.dedup_window_ms)])])
        return bool(stored)
