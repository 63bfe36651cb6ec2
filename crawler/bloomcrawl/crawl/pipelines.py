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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.serialize import ScrapyJSONEncoder
from twisted.internet.defer import Deferred
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
#: the most items, and JSON bytes of them, stored in one call
BATCH_ITEMS = 256
BATCH_BYTES = 1 << 20


class PushNumbers:
    """This process's calls storing items, numbered from 1 under a key of their own.

    ``items_push.lua`` sets ``{<items>}:pushes:<id>`` to a call's number only
    when it is the next one (expiring after the dedup window), so a server that
    holds number ``n`` holds every call up to ``n``. After a restart, a worker
    asks the new server for it (:class:`~bloomcrawl.crawl.recovery.Recovery`):
    whether the items it stored are still there.
    """

    def __init__(self, items_key: str) -> None:
        self.items_key = items_key
        self.key = ""
        #: the number of the last call Redis answered (on the I/O thread, as it did)
        self.confirmed = 0
        self._sent = 0
        self.restart()

    def restart(self) -> None:
        """Number from 1 again, under a new key: a server that lost calls would never
        move the old one past them."""
        self.key = "{%s}:pushes:%s" % (self.items_key, uuid.uuid4().hex[:16])
        self.confirmed = self._sent = 0

    def take(self) -> tuple[str, int]:
        """The key and number of the next call (a call sent again keeps its own)."""
        self._sent += 1
        return self.key, self._sent

    def answered(self, key: str, number: int) -> None:
        if key == self.key:
            self.confirmed = max(self.confirmed, number)


def item_pushes(crawler: Crawler) -> PushNumbers | None:
    """The numbered calls of this crawl's RedisItemsPipeline (None: not enabled, or
    its spider not open yet)."""
    numbers: PushNumbers | None = getattr(crawler, "_bloomcrawl_item_pushes", None)
    return numbers


class RedisItemsPipeline:
    """RPUSH each item, JSON-encoded, to REDIS_ITEMS_KEY (default ``%(spider)s:items``).

    One call at a time, on a thread: the reactor never waits on Redis. The
    items that come while a call is under way (the rest of a page's, mostly)
    go in the next one, up to :data:`BATCH_ITEMS` items or :data:`BATCH_BYTES`
    bytes a call. While Redis
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
        #: a call storing items is under way (one at a time)
        self._pushing = False
        #: items waiting for the next call: (id, JSON, fired with whether it was stored,
        #: its page)
        self._waiting: list[tuple[str, str, Deferred[bool], Any]] = []
        self._waiting_since = 0.0
        self._batches: set[Any] = set()
        self.key = ""
        self.numbers: PushNumbers | None = None
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
        self.numbers = PushNumbers(self.key)
        self.crawler._bloomcrawl_item_pushes = self.numbers  # type: ignore[attr-defined]

    async def process_item(self, item: Any, spider: Spider | None = None) -> Any:
        data = self.encoder.encode(item)
        tagged = origins.pop(item)
        if tagged is not None:
            origin, page = tagged
        else:
            # an item no tracked callback yielded still gets an id: a resent push stores
            # it once
            origin, page = "u:" + uuid.uuid4().hex, None
            if origins.tagged_any:
                self._untagged(item)
        if self._pushing:
            # a call is under way: this item goes in the next one, with every other item
            # that comes meanwhile (a page's items, mostly)
            done: Deferred[bool] = Deferred()
            if not self._waiting:
                self._waiting_since = time.monotonic()
            self._waiting.append((origin, data, done, page))
            stored = await maybe_deferred_to_future(done)
        else:
            self._pushing = True
            try:
                (stored,) = await self._push_retrying(
                    [(origin, data)], [page], time.monotonic() + self.retry_timeout)
            finally:
                self._next_call()
        if not stored:
            self.crawler.stats.inc_value("bloomcrawl/items_stored_before")
        return item

    def _next_call(self) -> None:
        """A call ended: the items that came during it go in the next one (or none is
        under way now)."""
        if not self._waiting:
            self._pushing = False
            return
        batch, self._waiting = self._waiting, []
        # held until done: nothing else holds the task of a batch
        pushing = deferred_from_coro(self._push_batch(
            batch, self._waiting_since + self.retry_timeout))
        self._batches.add(pushing)
        pushing.addBoth(lambda _: self._batches.discard(pushing))

    async def _push_batch(self, batch: list[tuple[str, str, Deferred[bool], Any]],
                          deadline: float) -> None:
        """Store ``batch`` in calls of up to :data:`BATCH_ITEMS` items or
        :data:`BATCH_BYTES` bytes, and fire each item's Deferred with what the script
        said, or with the error that ended the retries (at ``deadline``: its first item
        came REDIS_ITEMS_RETRY_TIMEOUT seconds before)."""
        try:
            first = 0
            while first < len(batch):
                end, size = first, 0
                while end < len(batch) and end - first < BATCH_ITEMS and size < BATCH_BYTES:
                    size += len(batch[end][1])
                    end += 1
                chunk = batch[first:end]
                try:
                    stored = await self._push_retrying([(o, d) for o, d, _, _ in chunk],
                                                       [p for _, _, _, p in chunk], deadline)
                except Exception as exc:
                    for _, _, done, _ in batch[first:]:
                        done.errback(exc)
                    return
                for (_, _, done, _), one in zip(chunk, stored, strict=True):
                    done.callback(one)
                first = end
        finally:
            self._next_call()

    async def _push_retrying(self, pairs: list[tuple[str, str]], pages: list[Any],
                             deadline: float) -> list[bool]:
        """Store ``pairs``, retried while Redis is unreachable or refuses for a while,
        until ``deadline``. Their ``pages`` are told first (:func:`origins.sending`):
        a restart may lose what reached the server before it."""
        origins.sending(pages)
        number = self.numbers.take() if self.numbers is not None else None
        while True:
            try:
                stored: list[bool] = await maybe_deferred_to_future(
                    deferToThread(self.push_many, pairs, number))
            except REDIS_ERRORS as exc:
                kind = error_kind(exc)
                if (kind != "unreachable" and kind not in TRANSIENT_REPLIES) or (
                        time.monotonic() > deadline):
                    raise
                from twisted.internet import reactor  # the one Scrapy installed

                await maybe_deferred_to_future(deferLater(reactor, self.errors.failed(exc)))
                continue
            self.errors.ok()
            self.crawler.stats.inc_value("bloomcrawl/item_store_calls")
            return stored

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
        return self.push_many([(origin, data)])[0]

    def push_many(self, pairs: Sequence[tuple[str, str]],
                  number: tuple[str, int] | None = None) -> list[bool]:
        """Store items ``(id, JSON)`` in order, each unless its id was stored within the
        window, in one call (blocks on Redis); whether each was stored. ``number``: the
        call's (:class:`PushNumbers`)."""
        args: list[str] = [str(self.dedup_window_ms)]
        names = [self.key, keys.item_ids_key(self.key), keys.recent_item_ids_key(self.key)]
        if number is not None:
            names.append(number[0])
            args.append(str(number[1]))
        for origin, data in pairs:
            args += (origin, data)
        (stored,) = run_scripts(self.server, [ScriptCall(_PUSH, names, args)])
        if number is not None and self.numbers is not None:
            self.numbers.answered(*number)
        return [bool(one) for one in stored]
