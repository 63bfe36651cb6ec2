"""SCHEDULER = "bloomcrawl.crawl.scheduler.Scheduler": Scrapy's engine on the shared frontier.

A thin adapter between Scrapy's engine and :class:`bloomcrawl.core.frontier.Frontier`:

* ``enqueue_request`` buffers; the buffer goes to Redis with the next lease
  (one round trip per page), within ``ACK_DELAY`` when a page finished, or
  at ``MAX_BATCH`` requests.
* ``next_request`` hands out a leased request; the lease is acked when the
  middlewares (:mod:`bloomcrawl.crawl.middleware`) report its outcome
  through :data:`bloomcrawl.crawl.lease.request_finished`.
* A poller reads ``<spider>:start_urls``, retries what could not be sent and
  wakes the engine when other workers queued work; lease renewal and the
  reaper run on timers.
* The spider stays open while the queue, the leases or the start URLs are
  non-empty anywhere, and closes after MAX_IDLE_TIME_BEFORE_CLOSE seconds of
  all being empty (0: never).

Settings (read in :meth:`Scheduler.from_crawler` only; defaults in
:mod:`bloomcrawl.core.defaults`): REDIS_URL, REDIS_PARAMS,
SCHEDULER_QUEUE_KEY, SCHEDULER_QUEUE_CLASS, SCHEDULER_PERSIST,
SCHEDULER_FLUSH_ON_START, SCHEDULER_LEASE_TIMEOUT, SCHEDULER_REAP_INTERVAL,
SCHEDULER_PREFETCH, SCHEDULER_SEEN_CACHE, MAX_IDLE_TIME_BEFORE_CLOSE and the
BLOOMFILTER_* settings.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis
from scrapy import Request, signals
from scrapy.exceptions import DontCloseSpider

from bloomcrawl.core import keys
from bloomcrawl.core.bloom import normalise_fingerprint
from bloomcrawl.core.connection import OutageLog
from bloomcrawl.core.errors import RedisUnavailableError, SettingError
from bloomcrawl.core.frontier import Frontier, Lease, Outgoing, parse_start_entry
from bloomcrawl.crawl.config import FilterConfig, FrontierConfig, redis_from_settings
from bloomcrawl.crawl.lease import LEASE_META_KEY, LOCAL_META_KEY, request_finished
from bloomcrawl.crawl.serialization import (
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
    from scrapy.statscollectors import StatsCollector

    from bloomcrawl.core.bloom import BloomFilter

logger = logging.getLogger(__name__)

MAX_BATCH = 500
MAX_POLL_DELAY = 1.0
ACK_DELAY = 0.05
START_URLS_BATCH = 100
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, RedisUnavailableError)


class Scheduler:
    """The distributed, leased scheduler."""

    def __init__(self, server: redis.Redis, crawler: Crawler, config: FrontierConfig,
                 filter_config: FilterConfig) -> None:
        self.server = server
        self.crawler = crawler
        self.stats: StatsCollector = crawler.stats
        self.fingerprinter = crawler.request_fingerprinter
        self.config = config
        self.filter_config = filter_config
        self.node = socket.gethostname()
        self.worker_id = "%s-%d-%s" % (self.node[:24], os.getpid(), uuid.uuid4().hex[:6])
        self.spider: Spider | None = None
        self.frontier: Frontier | None = None
        # fingerprints this worker already sent through the filter: the filter only
        # grows, so they are in it for good and need no round trip
        self._seen: set[bytes] = set()
        self._seen_generation = 0
        # requests leased and not handed to the engine yet
        self._local: deque[tuple[Lease, Request]] = deque()
        # what this worker owes Redis: new requests, acks (partition -> tokens), stats
        self._outgoing: list[Outgoing] = []
        self._acks: dict[int, list[str]] = defaultdict(list)
        self._counts: dict[str, int] = defaultdict(int)
        # leases this worker holds: token -> partition
        self._inflight: dict[str, int] = {}
        self._rotation = 0
        self._redis_may_have_work = True
        # the engine asked for a request and got none: the poller must wake it
        self._starved = False
        self._outage = OutageLog(logger, server, "retrying; nothing leased is lost")
        self._idle_since: float | None = None
        self._poll_delay = 0.05
        self._poll_call: Any = None
        self._ack_call: Any = None
        self._loops: list[Any] = []
        self._closing = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Scheduler:
        settings = crawler.settings
        spider = crawler.spider.name if crawler.spider is not None else None
        # every setting is checked before anything touches Redis
        config = FrontierConfig.from_settings(settings, spider)
        filter_config = FilterConfig.from_settings(settings, spider)
        return cls(redis_from_settings(settings), crawler, config, filter_config)

    # -- life cycle -------------------------------------------------------------

    def open(self, spider: Spider) -> None:
        """Called by the engine when the spider opens."""
        self.open_frontier(spider)
        self._start_background()

    def open_frontier(self, spider: Spider) -> None:
        """Open the filter and the queue, record the layout, reap expired leases.

        Everything :meth:`open` does that needs no running reactor.
        """
        self.spider = spider
        self._outage.extra = {"spider": spider}
        bloom = self.filter_config.open(self.server, spider.name)
        try:
            frontier_keys = keys.FrontierKeys(
                spider.name, filter_pattern=self.filter_config.key_pattern,
                queue_pattern=self.config.queue_pattern, partitions=bloom.params.partitions)
        except (KeyError, ValueError, TypeError) as exc:
            raise SettingError("SCHEDULER_QUEUE_KEY %r: %s"
                               % (self.config.queue_pattern, exc)) from exc
        self.frontier = Frontier(self.server, bloom, frontier_keys,
                                 queue_type=self.config.queue_type,
                                 lease_timeout=self.config.lease_timeout,
                                 worker_id=self.worker_id, node=self.node)
        self.frontier.record_layout()
        if self.config.flush_on_start:
            self.frontier.flush()
        self.reap()
        s = self.crawler.signals
        s.connect(self._on_finished, signal=request_finished)
        s.connect(self._on_item, signal=signals.item_scraped)
        s.connect(self._on_spider_error, signal=signals.spider_error)
        logger.info("bloomcrawl frontier %s, lease %.0f s", self.frontier.describe(),
                    self.config.lease_timeout, extra={"spider": spider})

    def _start_background(self) -> None:
        """The idle handler, lease renewal, reaping and polling (need a running reactor)."""
        self.crawler.signals.connect(self._on_idle, signal=signals.spider_idle)
        for func, interval in ((self.renew, self.config.lease_timeout / 3),
                               (lambda: self._guarded(self.reap), self.config.reap_interval)):
            loop = create_looping_call(func)
            loop.start(interval, now=False)
            self._loops.append(loop)
        self._schedule_poll(0)

    def close(self, reason: str) -> None:
        """Called by the engine when the spider closes.

        Sends what this worker still owes Redis and puts the leases it did not
        finish straight back into the queue; without SCHEDULER_PERSIST, deletes
        the frontier.
        """
        self._closing = True
        for loop in self._loops:
            if loop.running:
                loop.stop()
        for call in (self._poll_call, self._ack_call):
            if call is not None:
                call.cancel()
        self._poll_call = self._ack_call = None
        frontier = self._frontier()
        try:
            self.send_pending()
            self._local.clear()
            released = frontier.release(self._inflight)
            self._inflight.clear()
            self._count_requeued(released)
        except REDIS_ERRORS as exc:
            logger.error("could not save the frontier on close (%s): unacked leases will be"
                         " requeued when they expire", exc, extra={"spider": self.spider})
        if not self.config.persist:
            frontier.flush()

    # -- the engine's interface -----------------------------------------------------

    def has_pending_requests(self) -> bool:
        """True while this worker holds requests or Redis may have some for it."""
        return bool(self._local or self._outgoing or self._redis_may_have_work)

    def enqueue_request(self, request: Request) -> bool:
        """Queue a request in the shared frontier (buffered, sent in the next round trip).

        Returns False when it was not queued (a duplicate this worker already
        sent, or a request that cannot be stored as JSON); the engine then
        fires ``request_dropped``. Duplicates found by the filter in Redis are
        counted in ``dupefilter/filtered`` when the buffer is sent.
        """
        meta = request.meta
        if meta.pop(LOCAL_META_KEY, False):
            partition, token = meta[LEASE_META_KEY]
            self._local.append((Lease(partition, token, b""), request))
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
        self._outgoing.append(Outgoing(fp, request.dont_filter, priority_score(request), payload))
        if lease is not None:
            # a retry or redirect of a leased request: ack the original once this is queued
            self._ack_later(lease)
        self.stats.inc_value("scheduler/enqueued")
        self.stats.inc_value("scheduler/enqueued/redis")
        if len(self._outgoing) >= MAX_BATCH:
            self._send_quietly()
        return True

    def next_request(self) -> Request | None:
        """The next leased request, or None when there is none right now.

        What this worker owes Redis (new requests, acks, stats) goes in the
        same round trip as the lease. None is not the end of the crawl: the
        engine asks again, and the poller wakes it when work appears.
        """
        if not self._local and (self._redis_may_have_work or self._outgoing or self._acks):
            self._lease_into_local()
        if self._local:
            lease, request = self._local.popleft()
            request.meta[LEASE_META_KEY] = (lease.partition, lease.token)
            self.stats.inc_value("scheduler/dequeued")
            self.stats.inc_value("scheduler/dequeued/redis")
            self._starved = False
            return request
        self._starved = True
        return None

    def __len__(self) -> int:
        """Requests queued in Redis for this spider (all workers)."""
        return self._frontier().size()

    # -- leasing ----------------------------------------------------------------------

    def _lease_into_local(self) -> None:
        """Send what is owed and lease, in one round trip; probe on if it was empty.

        The lease goes to a partition where this worker has leases to ack, so
        the ack rides along; otherwise to the next in rotation. Probing one
        partition at a time keeps a worker from holding more than it asked for.
        """
        frontier = self._frontier()
        parts = frontier.partitions
        first = next((p for p, tokens in self._acks.items() if tokens), None)
        if first is None:
            first = self._rotation % parts
            self._rotation += 1
        try:
            got = self._take(self._send(lease_from=first))
            for _ in range(parts - 1):
                if got:
                    break
                p = self._rotation % parts
                self._rotation += 1
                if p != first:
                    got = self._take(frontier.lease(p, self.config.prefetch))
        except REDIS_ERRORS as exc:
            self._redis_failed(exc)
            return
        self._outage.ok()
        self._redis_may_have_work = got > 0

    def _take(self, leases: list[Lease]) -> int:
        """Turn leases into requests in the local buffer; returns how many."""
        got = 0
        for lease in leases:
            self._inflight[lease.token] = lease.partition
            try:
                request = request_from_json(lease.payload, self._spider())
            except Exception as exc:  # a corrupt entry must not stop the crawl
                logger.error("dropping an unreadable queue entry %r: %s", lease.payload[:200],
                             exc, extra={"spider": self.spider})
                self._counts["errors"] += 1
                self._ack_later((lease.partition, lease.token))
                continue
            self._local.append((lease, request))
            got += 1
        return got

    def _ack_later(self, lease: Any) -> None:
        partition, token = lease
        if self._inflight.pop(token, None) is not None:
            self._acks[int(partition)].append(token)

    def renew(self) -> None:
        """Extend the deadlines of every lease this worker still holds."""
        if self._inflight and self.frontier is not None:
            self._guarded(self._renew)

    def _renew(self) -> None:
        renewed = self._frontier().renew(self._inflight)
        lost = len(self._inflight) - renewed
        if lost > 0:
            self.stats.inc_value("bloomcrawl/leases_lost", lost)
            logger.warning("%d leases expired before renewal; their requests may be crawled"
                           " twice (raise SCHEDULER_LEASE_TIMEOUT?)", lost,
                           extra={"spider": self.spider})

    def reap(self) -> int:
        """Put expired leases (any worker's) back into the queue; returns how many."""
        requeued = self._frontier().reap()
        self._count_requeued(requeued)
        return requeued

    def _count_requeued(self, requeued: int) -> None:
        if requeued:
            self.stats.inc_value("bloomcrawl/requeued", requeued)
            self._redis_may_have_work = True
            logger.info("requeued %d expired leases", requeued, extra={"spider": self.spider})

    # -- outcomes ---------------------------------------------------------------------

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
        if self._acks or self._outgoing:
            self._send_quietly()

    def _on_item(self, item: Any, response: Any, spider: Spider) -> None:
        self._counts["items"] += 1

    def _on_spider_error(self, failure: Any, response: Any, spider: Spider) -> None:
        self._counts["errors"] += 1

    # -- sending ----------------------------------------------------------------------

    def send_pending(self) -> None:
        """Send the buffered requests, acks and shared stats now, in one round trip.

        Raises the Redis error if Redis is unreachable; what was buffered is
        kept for the next try. The scheduler calls this itself (timers, idle,
        close); it is public for callers that must know the frontier is written.
        """
        self._send()

    def _send_quietly(self) -> None:
        self._guarded(self._send)

    def _send(self, lease_from: int | None = None) -> list[Lease]:
        frontier = self._frontier()
        outgoing, acks, counts = self._outgoing, self._acks, self._counts
        if not (outgoing or acks or counts) and lease_from is None:
            return []
        done = frontier.exchange(outgoing, acks, counts, lease_from=lease_from,
                                 want=self.config.prefetch)
        # sent: from here on nothing of it is owed
        self._outgoing, self._acks, self._counts = [], defaultdict(list), defaultdict(int)
        if frontier.filter_generation != self._seen_generation:
            logger.warning("the Bloom filter %s was deleted; it was created again",
                           frontier.keys.filter, extra={"spider": self.spider})
            self._seen.clear()
            self._seen_generation = frontier.filter_generation
        if self.config.seen_cache:
            if len(self._seen) + len(outgoing) > self.config.seen_cache:
                self._seen.clear()
            self._seen.update(e.fingerprint for e in outgoing if not e.dont_filter)
        if done.queued:
            self._redis_may_have_work = True
        if done.filtered:
            self.stats.inc_value("dupefilter/filtered", done.filtered)
            self.stats.inc_value("bloomfilter/filtered", done.filtered)
            self._counts["filtered"] += done.filtered
        return done.leases

    # -- start URLs, polling and idling -------------------------------------------------

    def _schedule_poll(self, delay: float) -> None:
        if not self._closing:
            self._poll_call = call_later(delay, self._poll)

    def _poll(self) -> None:
        """Read start URLs, retry unsent work and wake the engine when Redis has work."""
        self._poll_call = None
        try:
            found = self._read_start_urls()
            self._send()
            if not self._local and (self._starved or not self._redis_may_have_work):
                self._lease_into_local()
                if self._local:
                    found = True
                    self._wake_engine()
            self._outage.ok()
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
        lease, request = self._local.popleft()
        request.meta[LEASE_META_KEY] = (lease.partition, lease.token)
        request.meta[LOCAL_META_KEY] = True
        engine.crawl(request)

    def _read_start_urls(self) -> bool:
        frontier = self._frontier()
        entries = frontier.pop_start_entries(START_URLS_BATCH)
        for raw in entries:
            try:
                data = parse_start_entry(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                logger.warning("bad start URL entry %r in %s: %s", raw[:200],
                               frontier.keys.start_urls, exc, extra={"spider": self.spider})
                self.stats.inc_value("bloomcrawl/bad_start_urls")
                self._counts["bad_start_urls"] += 1
                continue
            self.enqueue_request(self._make_start_request(data))
        return bool(entries)

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
        if self._local or self._outgoing or self._acks:
            self._send_quietly()
            raise DontCloseSpider
        if self._counts:
            self._send_quietly()
        try:
            busy = self._frontier().size(with_leases=True) > 0
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
        if self.config.max_idle <= 0 or now - self._idle_since < self.config.max_idle:
            raise DontCloseSpider
        logger.info("frontier empty for %.0f s: closing", now - self._idle_since,
                    extra={"spider": spider})

    # -- Redis outages (logged once per outage) --------------------------------------

    def _guarded(self, action: Callable[[], object]) -> bool:
        """Run a Redis action; an outage is logged (once) and counted, never raised."""
        try:
            action()
        except REDIS_ERRORS as exc:
            self._redis_failed(exc)
            return False
        self._outage.ok()
        return True

    def _redis_failed(self, exc: Exception) -> None:
        self._outage.failed(exc)
        self.stats.inc_value("bloomcrawl/redis_errors")

    @property
    def bloom(self) -> BloomFilter | None:
        """The spider's Bloom filter (None before the spider opened)."""
        return self.frontier.bloom if self.frontier is not None else None

    def _spider(self) -> Spider:
        assert self.spider is not None, "scheduler not opened"
        return self.spider

    def _frontier(self) -> Frontier:
        assert self.frontier is not None, "scheduler not opened"
        return self.frontier
