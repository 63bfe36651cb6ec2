"""ITEM_PIPELINES: items as JSON into ``%(spider)s:items``, where scrapy-redis puts them.

Each item is stored once: under its origin (the request fingerprint of the
response that yielded it and its position, :mod:`bloomcrawl.crawl.origins`),
checked and pushed in one atomic call, so a page crawled twice after a
worker died, or a push sent twice, stores nothing twice. The ids are kept
for REDIS_ITEMS_DEDUP_WINDOW seconds (7 days), by Redis's clock, in the
zset ``{<items key>}:recent_ids``: its memory follows the items of that
window, not every item ever stored. The set ``{<items key>}:ids`` of
earlier versions (every id) is still read, and expires one window after the
first push that finds it.
"""

from __future__ import annotations

import logging
import threading
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
from bloomcrawl.core.connection import (
    REDIS_ERRORS,
    TRANSIENT_REPLIES,
    RedisErrorPolicy,
    error_kind,
    is_cluster,
    on_each_connection,
)
from bloomcrawl.core.scripts import Script, ScriptCall, run_scripts
from bloomcrawl.crawl import origins
from bloomcrawl.crawl.config import get_lease_timeout, redis_from_settings, spider_key
from bloomcrawl.crawl.setting_values import get_float

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

_PUSH = Script("items_push.lua")
#: the most items, and JSON bytes of them, stored in one call
BATCH_ITEMS = 256
BATCH_BYTES = 1 << 20
#: a pipeline's record of its last call outlives REDIS_ITEMS_RETRY_TIMEOUT by this much
RECORD_MARGIN_S = 60.0


class StoredMark:
    """The last item this process's pipeline wrote to each server, for a worker whose
    Redis restarted to ask the new server for (:class:`~bloomcrawl.crawl.recovery.Recovery`).

    One Redis loses only the last writes it was sent (a snapshot, an AOF cut
    short, a replica behind): a server that holds the id of the last item
    stored (in ``{<items>}:recent_ids``) holds every item stored before it.
    The pipeline's connection is not the scheduler's: it may have stored
    items on the new server before the scheduler asked, and the last of
    those says nothing of what the old one lost. So each id is kept under
    the ``run_id`` of the server it went to (asked as a connection opens;
    None on Redis Cluster), set on the writing thread as the reply is read;
    :attr:`in_flight` is true from a call's send until its reply (or error)
    was read.
    """

    def __init__(self, ids_key: str) -> None:
        self.ids_key = ids_key
        #: the run_id of the server the pipeline's newest connection reached
        self.server: str | None = None
        #: run_id -> the id of the last item written to that server
        self.last_ids: dict[str | None, str] = {}
        self.in_flight = False
        #: wrote() runs on the pipeline's thread, kept_on() on the scheduler's I/O thread
        self._lock = threading.Lock()

    @property
    def last_id(self) -> str | None:
        """The id of the last item written to the server the pipeline reaches now."""
        return self.last_ids.get(self.server)

    def connected(self, connection: Any, run_id: str) -> None:
        self.server = run_id

    def wrote(self, item_id: str) -> None:
        with self._lock:
            self.last_ids[self.server] = item_id

    def kept_on(self, server: redis.Redis, run_id: str | None) -> bool:
        """Whether ``server`` (whose run_id is ``run_id``) holds the last item written to
        each server. Once answered, the servers other than it are forgotten (asked once);
        a Redis error leaves them to be asked again."""
        with self._lock:
            marks = list(self.last_ids.items())
        if not marks:
            return True
        pipe = server.pipeline(transaction=False)
        for _, item_id in marks:
            pipe.zscore(self.ids_key, item_id)
        scores = pipe.execute()
        with self._lock:  # a server written to since is asked again
            for other, item_id in marks:
                if other != run_id and self.last_ids.get(other) == item_id:
                    del self.last_ids[other]
        return all(score is not None for score in scores)


def stored_mark(crawler: Crawler) -> StoredMark | None:
    """The :class:`StoredMark` of this crawl's RedisItemsPipeline (None: not enabled, or
    its spider not open yet)."""
    mark: StoredMark | None = getattr(crawler, "_bloomcrawl_stored_mark", None)
    return mark


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
        self.mark: StoredMark | None = None
        #: this pipeline's record of its last call (a call sent again answers what it did
        #: the first time), kept this long after the call
        self.record_key = ""
        self.record_ms = round((retry_timeout + RECORD_MARGIN_S) * 1000)
        self._caller = uuid.uuid4().hex[:16]
        self._calls = 0
        self.errors = RedisErrorPolicy(logger, server, "items wait until they can be stored",
                                       max_delay=5.0)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisItemsPipeline:
        settings = crawler.settings
        pattern = settings.get("REDIS_ITEMS_KEY") or defaults.ITEMS_KEY
        if crawler.spider is not None:
            spider_key(settings, "REDIS_ITEMS_KEY", defaults.ITEMS_KEY, crawler.spider.name)
        retry = get_float(settings, "REDIS_ITEMS_RETRY_TIMEOUT", defaults.ITEMS_RETRY_TIMEOUT,
                          0, None)
        window = get_float(settings, "REDIS_ITEMS_DEDUP_WINDOW", defaults.ITEMS_DEDUP_WINDOW,
                           0.001, None)
        lease_timeout = get_lease_timeout(settings)
        if window < lease_timeout:
            # A warning, not a SettingError: a short window is a trade one may make on
            # purpose (less memory for ids, items deduplicated downstream, a crawl whose
            # scheduler has no leases), and refusing it would stop crawls that ran before.
            logger.warning(
                "REDIS_ITEMS_DEDUP_WINDOW (%gs) is shorter than SCHEDULER_LEASE_TIMEOUT (%gs):"
                " a page whose worker died before its ack is crawled again only after its"
                " lease expired, when its items' ids have left the window, so its items are"
                " stored twice. Set REDIS_ITEMS_DEDUP_WINDOW to a few lease timeouts at least",
                window, lease_timeout)
        origins.want(crawler)  # the spider middleware tags items from now on
        return cls(redis_from_settings(settings), crawler, pattern, retry, window)

    # ``spider=None``: Scrapy < 2.14 passes the spider, later versions do not

    def open_spider(self, spider: Spider | None = None) -> None:
        assert self.crawler.spider is not None
        self.key = keys.spider_key(self.key_pattern, self.crawler.spider.name)
        self.record_key = keys.item_call_key(self.key, self._caller)
        self.mark = StoredMark(keys.recent_item_ids_key(self.key))
        if not is_cluster(self.server):
            on_each_connection(self.server, self.mark.connected)
        self.crawler._bloomcrawl_stored_mark = self.mark  # type: ignore[attr-defined]

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
        token = self.new_token()  # every try is the same call
        while True:
            try:
                stored: list[bool] = await maybe_deferred_to_future(
                    deferToThread(self.push_many, pairs, token))
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

    def new_token(self) -> str:
        """A call's token: the same call sent again carries the same one."""
        self._calls += 1
        return str(self._calls)

    def push_many(self, pairs: Sequence[tuple[str, str]], token: str | None = None
                  ) -> list[bool]:
        """Store items ``(id, JSON)`` in order, each unless its id was stored within the
        window, in one call (blocks on Redis); whether each was stored.

        ``token`` (default: a new one): the call sent again with the token it
        had answers what its first send did, even when that reply was lost.
        """
        args: list[str] = [str(self.dedup_window_ms), token or self.new_token(),
                           str(self.record_ms)]
        for origin, data in pairs:
            args += (origin, data)
        mark = self.mark
        if mark is not None:
            mark.in_flight = True
        try:
            (stored,) = run_scripts(self.server, [ScriptCall(
                _PUSH, [self.key, keys.item_ids_key(self.key),
                        keys.recent_item_ids_key(self.key), self.record_key], args)])
            if mark is not None:
                for (origin, _), one in zip(pairs, stored, strict=True):
                    if one:
                        mark.wrote(origin)
        finally:
            if mark is not None:
                mark.in_flight = False
        return [bool(one) for one in stored]
