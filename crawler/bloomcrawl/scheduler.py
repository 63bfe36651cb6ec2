"""SCHEDULER = "bloomcrawl.scheduler.Scheduler": a shared frontier that loses nothing.

* Enqueue-if-new is one atomic Lua call per partition: the Bloom
  check-and-set and the push into the queue happen together. The requests a
  response yields are sent in one round trip, together with the ack of the
  response's own lease.
* ``next_request`` leases: the request moves from the queue into a lease with
  a deadline from Redis's clock. A live worker renews its leases; expired
  leases (a dead worker's) are put back into the queue by any worker.
* Requests are stored as JSON (:mod:`bloomcrawl.serialization`), never pickle.
* Start URLs are read from ``<spider>:start_urls``.
* The spider stays open while the queue or the leases are non-empty, and
  closes after MAX_IDLE_TIME_BEFORE_CLOSE seconds of both being empty.

The outcome of a leased request is reported by
:class:`bloomcrawl.middleware.FrontierSpiderMiddleware` and
:class:`bloomcrawl.middleware.FrontierDownloaderMiddleware` through the
:data:`request_finished` signal.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis
from scrapy import Request, signals
from scrapy.exceptions import DontCloseSpider

from bloomcrawl import keys
from bloomcrawl.bloom import (
    BACKENDS,
    LuaScript,
    _load_lua,
    backend_script,
    describe_redis,
    normalise_fingerprint,
    partition_of,
)
from bloomcrawl.connection import (
    SettingError,
    get_float,
    get_int,
    redis_from_settings,
)
from bloomcrawl.dupefilter import bloom_from_settings, filter_key, filter_options
from bloomcrawl.serialization import (
    LEASE_META_KEY,
    UnserializableRequest,
    priority_score,
    request_from_json,
    request_to_json,
)

try:
    from scrapy.utils.asyncio import call_later, create_looping_call
except ImportError:  # Scrapy < 2.14
    from twisted.internet import reactor as _reactor
    from twisted.internet.task import LoopingCall as create_looping_call  # type: ignore[assignment]

    def call_later(delay: float, func: Any, *args: Any) -> Any:  # type: ignore[misc]
        return _reactor.callLater(delay, func, *args)  # type: ignore[arg-type]


if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

    from bloomcrawl.bloom import BloomFilter

logger = logging.getLogger(__name__)

#: sent by the middlewares when a leased request's outcome is final;
#: arguments: request, outcome ("response", "spider_error", "download_error", "ignored")
request_finished = object()

#: meta key marking a request this scheduler leased and handed back to itself
_LOCAL_META_KEY = "_bloomcrawl_local"

QUEUE_TYPES = {
    "priority": "priority",
    "fifo": "fifo",
    "lifo": "lifo",
    "scrapy_redis.queue.PriorityQueue": "priority",
    "scrapy_redis.queue.FifoQueue": "fifo",
    "scrapy_redis.queue.LifoQueue": "lifo",
    "scrapy_redis_bloomfilter.queue.PriorityQueue": "priority",
    "scrapy_redis_bloomfilter.queue.FifoQueue": "fifo",
    "scrapy_redis_bloomfilter.queue.LifoQueue": "lifo",
}

_ENQUEUE = {b: LuaScript(backend_script(b, "frontier_enqueue.lua")) for b in BACKENDS}
_LEASE = LuaScript(_load_lua("frontier_lease.lua"))
_ACK = LuaScript(_load_lua("frontier_ack.lua"))
_RENEW = LuaScript(_load_lua("frontier_renew.lua"))
_REAP = LuaScript(_load_lua("frontier_reap.lua"))

MAX_BATCH = 500
MAX_POLL_DELAY = 1.0
ACK_DELAY = 0.05
REAP_BATCH = 1000
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError)


def queue_type_from_settings(value: Any) -> str:
    name = value if isinstance(value, str) else getattr(value, "__module__", "") + "." + getattr(
        value, "__qualname__", "")
    try:
        return QUEUE_TYPES[name]
    except KeyError:
        raise SettingError(
            "SCHEDULER_QUEUE_CLASS %r: choose priority, fifo or lifo (or the scrapy-redis"
            " PriorityQueue, FifoQueue, LifoQueue)" % (value,)
        ) from None


def parse_start_entry(raw: bytes | str) -> dict[str, Any]:
    """One start-URL entry: a URL, or JSON ``{"url", "meta", "priority"}``."""
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    text = text.strip()
    if text.startswith("{"):
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        unknown = set(data) - {"url", "meta", "priority", "dont_filter"}
        if unknown:
            raise ValueError("unknown fields %s" % sorted(unknown))
    else:
        data = {"url": text}
    url = data.get("url")
    if not isinstance(url, str):
        raise ValueError("no url")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL: %r" % url)
    if not isinstance(data.get("meta", {}), dict):
        raise ValueError("meta must be an object")
    priority = data.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError("priority must be an integer")
    if not isinstance(data.get("dont_filter", False), bool):
        raise ValueError("dont_filter must be true or false")
    return data


class Scheduler:
    """The distributed, leased scheduler. Settings are read in :meth:`from_crawler` only."""

    def __init__(
        self,
        server: redis.Redis,
        crawler: Crawler,
        *,
        queue_pattern: str = keys.DEFAULT_QUEUE_KEY,
        queue_type: str = "priority",
        persist: bool = True,
        flush_on_start: bool = False,
        lease_timeout: float = 30.0,
        reap_interval: float = 5.0,
        max_idle: float = 0.0,
        prefetch: int = 1,
        seen_cache: int = 200_000,
    ) -> None:
        self.server = server
        self.crawler = crawler
        self.stats = crawler.stats
        self.fingerprinter = crawler.request_fingerprinter
        self.queue_pattern = queue_pattern
        self.queue_type = queue_type
        self.persist = persist
        self.flush_on_start = flush_on_start
        self.lease_ms = int(lease_timeout * 1000)
        self.lease_timeout = lease_timeout
        self.reap_interval = reap_interval
        self.max_idle = max_idle
        self.prefetch = prefetch
        self.seen_cache = seen_cache
        # fingerprints this worker already sent through the filter: the filter only
        # grows, so they are in it for good and need no round trip
        self._seen: set[bytes] = set()
        self.spider: Spider | None = None
        self.bloom: BloomFilter | None = None
        self._enqueue_script = _ENQUEUE["bitmap"]
        self.frontier: keys.FrontierKeys | None = None
        self.node = socket.gethostname()
        self._worker_id = "%s-%d-%s" % (self.node[:24], os.getpid(), uuid.uuid4().hex[:6])
        self._lease_seq = 0
        self._rotation = 0
        # requests leased and not handed to the engine yet: (partition, token, request)
        self._local: deque[tuple[int, str, Request]] = deque()
        # requests waiting to be sent: (fingerprint, dont_filter, score, payload)
        self._pending: list[tuple[bytes, bool, float, str]] = []
        self._pending_acks: dict[int, list[str]] = defaultdict(list)
        self._counts: dict[str, int] = defaultdict(int)
        # leases this worker holds: token -> partition
        self._inflight: dict[str, int] = {}
        self._redis_has_work = True
        # the engine asked for a request and got none: the poller must wake it
        self._starved = False
        self._redis_down_since: float | None = None
        self._idle_since: float | None = None
        self._poll_delay = 0.05
        self._poll_call: Any = None
        self._ack_call: Any = None
        self._loops: list[Any] = []
        self._closing = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Scheduler:
        settings = crawler.settings
        # every setting is checked before anything touches Redis
        queue_pattern = settings.get("SCHEDULER_QUEUE_KEY") or keys.DEFAULT_QUEUE_KEY
        options = dict(
            queue_pattern=queue_pattern,
            queue_type=queue_type_from_settings(
                settings.get("SCHEDULER_QUEUE_CLASS") or "priority"),
            persist=settings.getbool("SCHEDULER_PERSIST", True),
            flush_on_start=settings.getbool("SCHEDULER_FLUSH_ON_START", False),
            lease_timeout=get_float(settings, "SCHEDULER_LEASE_TIMEOUT", 30.0, 0, None),
            reap_interval=get_float(settings, "SCHEDULER_REAP_INTERVAL", 5.0, 0, None),
            max_idle=get_float(settings, "MAX_IDLE_TIME_BEFORE_CLOSE", 0.0, -1e-9, None),
            prefetch=get_int(settings, "SCHEDULER_PREFETCH", 1, minimum=1),
            seen_cache=get_int(settings, "SCHEDULER_SEEN_CACHE", 200_000, minimum=0),
        )
        filter_options(settings)
        if crawler.spider is not None:
            filter_key(settings, crawler.spider.name)
            try:
                keys.spider_key(queue_pattern, crawler.spider.name)
            except (KeyError, ValueError, TypeError) as exc:
                raise SettingError("SCHEDULER_QUEUE_KEY %r: %s" % (queue_pattern, exc)) from exc
        return cls(redis_from_settings(settings), crawler, **options)  # type: ignore[arg-type]

    # -- life cycle -----------------------------------------------------

    def open(self, spider: Spider) -> None:
        self.open_frontier(spider)
        self._start_background()

    def open_frontier(self, spider: Spider) -> None:
        """Open the filter and the queue, record the layout, reap expired leases."""
        self.spider = spider
        settings = self.crawler.settings
        self.bloom = bloom_from_settings(self.server, settings, spider.name)
        try:
            self.frontier = keys.FrontierKeys(
                spider.name,
                filter_pattern=settings.get("BLOOMFILTER_KEY") or keys.DEFAULT_FILTER_KEY,
                queue_pattern=self.queue_pattern,
                partitions=self.bloom.params.partitions,
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise SettingError("SCHEDULER_QUEUE_KEY %r: %s" % (self.queue_pattern, exc)) from exc
        self._enqueue_script = _ENQUEUE[self.bloom.params.backend]
        self._record_layout()
        if self.flush_on_start:
            self.flush()
        self.reap()
        assert self.frontier is not None
        logger.info(
            "bloomcrawl frontier %s (%s, %d partitions, lease %.0f s) at %s",
            self.frontier.queue, self.queue_type, self.frontier.partitions,
            self.lease_timeout, describe_redis(self.server), extra={"spider": spider})

    def _start_background(self) -> None:
        """Signals, lease renewal, reaping and polling (needs a running reactor)."""
        signals_ = self.crawler.signals
        signals_.connect(self._on_idle, signal=signals.spider_idle)
        signals_.connect(self._on_finished, signal=request_finished)
        signals_.connect(self._on_item, signal=signals.item_scraped)
        signals_.connect(self._on_spider_error, signal=signals.spider_error)
        for func, interval in ((self.renew, self.lease_timeout / 3),
                               (self._reap_quietly, self.reap_interval)):
            loop = create_looping_call(func)
            loop.start(interval, now=False)
            self._loops.append(loop)
        self._schedule_poll(0)

    def _record_layout(self) -> None:
        """Tell the exporter and CLI where this spider's keys are; refuse a queue-type change."""
        assert self.frontier is not None
        f = self.frontier
        raw: bytes | None = self.server.hget(f.meta, "queue_type")  # type: ignore[assignment]
        stored = raw.decode() if raw is not None else None
        if stored is not None and stored != self.queue_type and self._queue_size() > 0:
            raise SettingError(
                "SCHEDULER_QUEUE_CLASS: the queue %r holds a %s queue, asked for %s; finish or"
                " flush it first (SCHEDULER_FLUSH_ON_START)" % (f.queue, stored, self.queue_type))
        self.server.hset(f.meta, mapping={
            "spider": f.spider, "queue": f.queue, "queue_type": self.queue_type,
            "stats": f.stats, "start_urls": f.start_urls, "items": f.items,
            "pages_by_node": f.pages_by_node,
        })

    def close(self, reason: str) -> None:
        self._closing = True
        for loop in self._loops:
            if loop.running:
                loop.stop()
        for call in (self._poll_call, self._ack_call):
            if call is not None:
                call.cancel()
        self._poll_call = self._ack_call = None
        try:
            self._send_pending()
            self._release_local()
        except REDIS_ERRORS as exc:
            logger.error("could not save the frontier on close (%s): unacked leases will be"
                         " requeued when they expire", exc, extra={"spider": self.spider})
        if not self.persist:
            self.flush()

    def flush(self) -> None:
        """Delete the queue, the leases and the filter (SCHEDULER_FLUSH_ON_START, not PERSIST)."""
        assert self.frontier is not None and self.bloom is not None
        f = self.frontier
        doomed = []
        for p in range(f.partitions):
            doomed += [f.queue_part(p), f.leases(p), f.deadlines(p)]
        self.server.unlink(*doomed)
        self.bloom.clear()
        self.bloom = bloom_from_settings(self.server, self.crawler.settings, f.spider)
        self._record_layout()

    # -- the engine's interface -----------------------------------------------

    def has_pending_requests(self) -> bool:
        return bool(self._local or self._pending or self._redis_has_work)

    def enqueue_request(self, request: Request) -> bool:
        meta = request.meta
        if meta.get(_LOCAL_META_KEY):
            del meta[_LOCAL_META_KEY]
            partition, token = meta[LEASE_META_KEY]
            self._local.append((partition, token, request))
            return True
        lease = meta.pop(LEASE_META_KEY, None)
        fp = normalise_fingerprint(self.fingerprinter.fingerprint(request))
        if not request.dont_filter and fp in self._seen:
            self._counts["filtered"] += 1
            self.stats.inc_value("dupefilter/filtered")
            self.stats.inc_value("bloomcrawl/filtered_locally")
            if lease is not None:
                self._ack_later(lease)
            return False
        try:
            payload = request_to_json(request, self._spider())
        except UnserializableRequest as exc:
            logger.error("%s", exc, extra={"spider": self.spider})
            self.stats.inc_value("bloomcrawl/unserializable")
            self._counts["unserializable"] += 1
            if lease is not None:
                self._ack_later(lease)
            return False
        self._pending.append((fp, request.dont_filter, priority_score(request), payload))
        if lease is not None:
            # a retry or redirect of a leased request: ack the original once this is queued
            self._ack_later(lease)
        self.stats.inc_value("scheduler/enqueued/redis")
        if len(self._pending) >= MAX_BATCH:
            self._send_quietly()
        return True

    def next_request(self) -> Request | None:
        if not self._local:
            if self._redis_has_work:
                self._lease_into_local()  # sends what is pending in the same round trip
            elif self._pending or self._pending_acks:
                self._send_quietly()
        if self._local:
            partition, token, request = self._local.popleft()
            request.meta[LEASE_META_KEY] = (partition, token)
            self.stats.inc_value("scheduler/dequeued/redis")
            self._starved = False
            return request
        self._starved = True
        return None

    def __len__(self) -> int:
        return self._queue_size()

    # -- leasing ----------------------------------------------------------------

    def _lease_into_local(self) -> None:
        """Send what is pending and lease, in one round trip; probe on if it was empty.

        The lease goes to a partition where this worker has leases to ack, so
        the ack rides along; otherwise to the next in rotation. Probing one
        partition at a time keeps a worker from holding more than it asked for.
        """
        parts = self._frontier().partitions
        first = next((p for p, tokens in self._pending_acks.items() if tokens), None)
        if first is None:
            first = self._rotation % parts
            self._rotation += 1
        try:
            got = self._take_leased(first, self._send_pending(lease_partition=first))
            for _ in range(parts - 1):
                if got:
                    break
                p = self._rotation % parts
                self._rotation += 1
                if p != first:
                    got = self._lease([p], self.prefetch)
        except REDIS_ERRORS as exc:
            self._redis_failed(exc)
            return
        self._redis_ok()
        self._redis_has_work = got > 0

    def _lease_args(self) -> list[Any]:
        self._lease_seq += 1
        prefix = "%s:%d:" % (self._worker_id, self._lease_seq)
        return [self.queue_type, self.lease_ms, self.prefetch, prefix]

    def _lease(self, partitions: list[int], want: int) -> int:
        f = self._frontier()
        calls = []
        for p in partitions:
            args = self._lease_args()
            args[2] = want
            calls.append(([f.queue_part(p), f.leases(p), f.deadlines(p)], args))
        results = _LEASE.run_many(self.server, calls)
        return sum(self._take_leased(p, r) for p, r in zip(partitions, results, strict=True))

    def _take_leased(self, p: int, result: list[bytes]) -> int:
        """Turn a lease reply into requests in the local buffer; returns how many."""
        got = 0
        for i in range(0, len(result), 2):
            token, payload = result[i].decode(), result[i + 1]
            self._inflight[token] = p
            try:
                request = request_from_json(payload, self._spider())
            except Exception as exc:  # a corrupt entry must not stop the crawl
                logger.error("dropping an unreadable queue entry %r: %s", payload[:200], exc,
                             extra={"spider": self.spider})
                self._counts["errors"] += 1
                self._ack_later((p, token))
                continue
            self._local.append((p, token, request))
            got += 1
        return got

    def _ack_later(self, lease: Any) -> None:
        partition, token = lease
        if self._inflight.pop(token, None) is not None:
            self._pending_acks[int(partition)].append(token)

    def renew(self) -> None:
        """Extend the deadlines of every lease this worker still holds."""
        if not self._inflight or self.frontier is None:
            return
        by_partition: dict[int, list[str]] = defaultdict(list)
        for token, p in self._inflight.items():
            by_partition[p].append(token)
        calls = [([self.frontier.deadlines(p)], [self.lease_ms, *tokens])
                 for p, tokens in by_partition.items()]
        try:
            renewed = sum(_RENEW.run_many(self.server, calls))
        except REDIS_ERRORS as exc:
            self._redis_failed(exc)
            return
        self._redis_ok()
        lost = len(self._inflight) - renewed
        if lost > 0:
            self.stats.inc_value("bloomcrawl/leases_lost", lost)
            logger.warning("%d leases expired before renewal; their requests may be crawled"
                           " twice (raise SCHEDULER_LEASE_TIMEOUT?)", lost,
                           extra={"spider": self.spider})

    def reap(self) -> int:
        """Put expired leases back into the queue; returns how many."""
        f = self._frontier()
        calls = [([f.queue_part(p), f.leases(p), f.deadlines(p)], [self.queue_type, REAP_BATCH])
                 for p in range(f.partitions)]
        requeued = int(sum(_REAP.run_many(self.server, calls)))
        if requeued:
            self.stats.inc_value("bloomcrawl/requeued", requeued)
            self.server.hincrby(f.stats, "requeued", requeued)
            self._redis_has_work = True
            logger.info("requeued %d expired leases", requeued, extra={"spider": self.spider})
        return requeued

    def _reap_quietly(self) -> None:
        try:
            self.reap()
        except REDIS_ERRORS as exc:
            self._redis_failed(exc)
        else:
            self._redis_ok()

    def _release_local(self) -> None:
        """Closing: leases this worker still holds go straight back to the queue."""
        f = self._frontier()
        self._local.clear()
        if self._inflight:
            pipe = self.server.pipeline(transaction=False)
            for token, partition in self._inflight.items():
                pipe.zadd(f.deadlines(partition), {token: 0}, xx=True)
            pipe.execute()
            self._inflight.clear()
            self.reap()

    # -- outcomes -----------------------------------------------------------------

    def _on_finished(self, request: Request, outcome: str) -> None:
        lease = request.meta.pop(LEASE_META_KEY, None)
        if outcome == "response":
            self._counts["pages"] += 1
        elif outcome in ("spider_error", "download_error"):
            self._counts["errors"] += 1
        if lease is not None:
            # sent with the next lease (next_request), or within ACK_DELAY anyway:
            # a worker killed now must not leave finished pages to be crawled again
            self._ack_later(lease)
            if self._ack_call is None and self._loops:
                self._ack_call = call_later(ACK_DELAY, self._flush_acks)

    def _flush_acks(self) -> None:
        self._ack_call = None
        if self._pending_acks or self._pending:
            self._send_quietly()

    def _on_item(self, item: Any, response: Any, spider: Spider) -> None:
        self._counts["items"] += 1

    def _on_spider_error(self, failure: Any, response: Any, spider: Spider) -> None:
        self._counts["errors"] += 1

    # -- sending --------------------------------------------------------------------

    def _send_quietly(self) -> None:
        try:
            self._send_pending()
        except REDIS_ERRORS as exc:
            self._redis_failed(exc)
        else:
            self._redis_ok()

    def _send_pending(self, lease_partition: int | None = None) -> Any:
        """Enqueue-if-new the pending requests, then ack, then stats: one round trip.

        With ``lease_partition``, the same round trip acks that partition's
        finished leases and leases from it; the lease reply is returned.
        """
        # the shared stats ride along with every send: a page's count goes with
        # its ack, so the counters stay exact when a worker dies
        send_stats = bool(self._counts)
        if not (self._pending or self._pending_acks or send_stats) and lease_partition is None:
            return None
        f = self._frontier()
        pending, acks = self._pending, self._pending_acks
        counts = self._counts if send_stats else {}
        by_partition: dict[int, list[tuple[bytes, bool, float, str]]] = defaultdict(list)
        parts = f.partitions
        for entry in pending:
            by_partition[partition_of(entry[0], parts)].append(entry)
        order = list(by_partition)
        calls: list[tuple[LuaScript, list[str], list[Any]]] = []
        for p in order:
            entries = by_partition[p]
            args: list[Any] = [b"".join(e[0] for e in entries),
                               "".join("1" if e[1] else "0" for e in entries),
                               self.queue_type]
            for e in entries:
                args += [repr(e[2]), e[3]]
            calls.append((self._enqueue_script, [f.state(p), f.queue_part(p)], args))
        for p, tokens in acks.items():
            if p != lease_partition:
                calls.append((_ACK, [f.leases(p), f.deadlines(p)], tokens))
        if lease_partition is not None:
            p = lease_partition
            calls.append((_LEASE, [f.queue_part(p), f.leases(p), f.deadlines(p)],
                          [*self._lease_args(), *acks.get(p, [])]))
        results = self._run_scripts(calls, counts)
        self._pending, self._pending_acks = [], defaultdict(list)
        if send_stats:
            self._counts = defaultdict(int)
        if self.seen_cache:
            if len(self._seen) + len(pending) > self.seen_cache:
                self._seen.clear()
            self._seen.update(e[0] for e in pending if not e[1])
        queued = sum(r.count(b"1") for r in results[: len(order)])
        filtered = len(pending) - queued
        if queued:
            self._redis_has_work = True
        if filtered:
            self.stats.inc_value("dupefilter/filtered", filtered)
            self.stats.inc_value("bloomfilter/filtered", filtered)
            self._counts["filtered"] += filtered
        return results[len(calls) - 1] if lease_partition is not None else None

    def _run_scripts(self, calls: list[tuple[LuaScript, list[str], list[Any]]],
                     counts: dict[str, int]) -> list[Any]:
        """Run script calls (in order) and stats increments in one pipeline.

        After a Redis restart the script cache is empty: the calls that got
        NOSCRIPT did nothing, so only those are sent again.
        """
        f = self._frontier()
        pipe = self.server.pipeline(transaction=False)
        for script, keys_, args in calls:
            script.queue(pipe, keys_, args)
        for name, value in counts.items():
            pipe.hincrby(f.stats, name, value)
        if counts.get("pages"):
            pipe.hincrby(f.pages_by_node, self.node, counts["pages"])
        results = list(pipe.execute(raise_on_error=False))
        missing = [i for i, r in enumerate(results[: len(calls)])
                   if isinstance(r, redis.exceptions.NoScriptError)]
        cleared = [i for i, r in enumerate(results[: len(calls)])
                   if isinstance(r, redis.ResponseError) and "BLOOMCRAWL_NOFILTER" in str(r)]
        if cleared:
            # the filter was deleted under us (bloomcrawl clear): create it again,
            # forget what this worker had seen, and send those calls again
            logger.warning("the Bloom filter %s was deleted; creating it again", f.filter,
                           extra={"spider": self.spider})
            self.bloom = bloom_from_settings(self.server, self.crawler.settings, f.spider)
            self._record_layout()
            self._seen.clear()
            missing = sorted(set(missing) | set(cleared))
        if missing:
            for script in {calls[i][0] for i in missing}:
                self.server.script_load(script.source)
            pipe = self.server.pipeline(transaction=False)
            for i in missing:
                script, keys_, args = calls[i]
                script.queue(pipe, keys_, args)
            for i, r in zip(missing, pipe.execute(raise_on_error=False), strict=True):
                results[i] = r
        for r in results:
            if isinstance(r, Exception):
                raise r
        return results

    # -- start URLs, polling and idling ---------------------------------------------

    def _schedule_poll(self, delay: float) -> None:
        if not self._closing:
            self._poll_call = call_later(delay, self._poll)

    def _poll(self) -> None:
        """Read start URLs, retry unsent work and wake the engine when Redis has work."""
        self._poll_call = None
        try:
            found = self._read_start_urls()
            self._send_pending()
            if not self._local and (self._starved or not self._redis_has_work):
                self._lease_into_local()
                if self._local:
                    found = True
                    self._wake_engine()
            self._redis_ok()
        except REDIS_ERRORS as exc:
            self._redis_failed(exc)
            found = False
        if found:
            self._poll_delay = 0.05
        else:
            self._poll_delay = min(MAX_POLL_DELAY, self._poll_delay * 2)
        self._schedule_poll(self._poll_delay)

    def _wake_engine(self) -> None:
        """Hand one leased request to the engine through its public crawl()."""
        engine = self.crawler.engine
        if engine is None or self.spider is None or not self._local:
            return
        partition, token, request = self._local.popleft()
        request.meta[LEASE_META_KEY] = (partition, token)
        request.meta[_LOCAL_META_KEY] = True
        engine.crawl(request)

    def _read_start_urls(self, most: int = 100) -> bool:
        f = self._frontier()
        entries: list[bytes] | None = self.server.lpop(  # type: ignore[assignment]
            f.start_urls, most)
        if not entries:
            return False
        for raw in entries:
            try:
                data = parse_start_entry(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                logger.warning("bad start URL entry %r in %s: %s", raw[:200], f.start_urls, exc,
                               extra={"spider": self.spider})
                self.stats.inc_value("bloomcrawl/bad_start_urls")
                self._counts["bad_start_urls"] += 1
                continue
            request = self._make_start_request(data)
            self.enqueue_request(request)
        return True

    def _make_start_request(self, data: dict[str, Any]) -> Request:
        spider = self._spider()
        make = getattr(spider, "make_request_from_start_entry", None)
        if callable(make):
            request: Request = make(data)
            return request
        return Request(data["url"], meta=data.get("meta") or {},
                       priority=data.get("priority", 0),
                       dont_filter=data.get("dont_filter", False))

    def _on_idle(self, spider: Spider) -> None:
        if self._local or self._pending or self._pending_acks:
            self._send_quietly()
            raise DontCloseSpider
        if self._counts:
            self._send_quietly()
        try:
            busy = self._queue_size(with_leases=True) > 0
        except REDIS_ERRORS as exc:
            self._redis_failed(exc)
            raise DontCloseSpider from exc
        now = time.monotonic()
        if busy:
            # others are crawling and may queue more: poll for it soon
            self._idle_since = None
            self._starved = True
            if self._poll_delay > 0.2:
                self._poll_delay = 0.05
                if self._poll_call is not None:
                    self._poll_call.cancel()
                self._schedule_poll(0)
            raise DontCloseSpider
        if self._idle_since is None:
            self._idle_since = now
        if self.max_idle <= 0 or now - self._idle_since < self.max_idle:
            raise DontCloseSpider
        logger.info("frontier empty for %.0f s: closing", now - self._idle_since,
                    extra={"spider": spider})

    def _queue_size(self, with_leases: bool = False) -> int:
        f = self._frontier()
        pipe = self.server.pipeline(transaction=False)
        for p in range(f.partitions):
            if self.queue_type == "priority":
                pipe.zcard(f.queue_part(p))
            else:
                pipe.llen(f.queue_part(p))
            if with_leases:
                pipe.zcard(f.deadlines(p))
        if with_leases:
            pipe.llen(f.start_urls)
        try:
            return int(sum(pipe.execute()))
        except redis.ResponseError as exc:
            if "WRONGTYPE" in str(exc):
                return 1
            raise

    # -- Redis outages ------------------------------------------------------------

    def _redis_failed(self, exc: Exception) -> None:
        if self._redis_down_since is None:
            self._redis_down_since = time.monotonic()
            logger.warning("Redis at %s unreachable (%s): retrying; nothing leased is lost",
                           describe_redis(self.server), exc, extra={"spider": self.spider})
        self.stats.inc_value("bloomcrawl/redis_errors")

    def _redis_ok(self) -> None:
        if self._redis_down_since is not None:
            logger.warning("Redis at %s is back after %.1f s", describe_redis(self.server),
                           time.monotonic() - self._redis_down_since,
                           extra={"spider": self.spider})
            self._redis_down_since = None

    def _spider(self) -> Spider:
        assert self.spider is not None, "scheduler not opened"
        return self.spider

    def _frontier(self) -> keys.FrontierKeys:
        assert self.frontier is not None, "scheduler not opened"
        return self.frontier
