"""SCHEDULER = "bloomcrawl.crawl.scheduler.Scheduler": Scrapy's engine on the shared frontier.

A thin adapter between Scrapy's engine and :class:`bloomcrawl.core.frontier.Frontier`:

* ``enqueue_request`` buffers; ``next_request`` hands out leased requests
  from a local buffer. Neither waits on Redis: one *exchange* at a time
  (:meth:`Frontier.exchange`: the buffered requests, the acks of finished
  leases, the shared stats and the next lease, in one round trip) runs on
  the :class:`~bloomcrawl.crawl.redis_io.RedisIO` thread, and its leases
  reach the engine through ``engine.crawl()``. The reactor never blocks on
  Redis, so a stalled Redis stalls no download.
* A leased request is acked when the middlewares
  (:mod:`bloomcrawl.crawl.middleware`) report its outcome through
  :data:`bloomcrawl.crawl.lease.request_finished`.
* A poller reads ``<spider>:start_urls`` and asks for work when the engine is
  starved; lease renewal and the reaper run on timers.
* Politeness is the cluster's, not the process's: the frontier leases a
  request only when its host may be fetched (one delay and concurrency per
  host across all workers, :mod:`bloomcrawl.core.politeness`), so a leased
  request is fetched at once: the downloader's own per-slot delay is set to
  0 as each request reaches it. The worker remembers when each partition's
  next host is ready and asks then. What it sees of hosts (robots.txt
  Crawl-delay, 429/503 with Retry-After, latencies for AutoThrottle) goes to
  Redis with its next exchange.
* Every Redis failure goes through one
  :class:`~bloomcrawl.core.connection.RedisErrorPolicy`: logged once per
  kind, retried with back-off, what was not sent kept in the worker. No loop
  ever dies of a Redis error.
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
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals

from bloomcrawl.core import defaults, keys, presence
from bloomcrawl.core.connection import (
    REDIS_ERRORS,
    RedisErrorPolicy,
    ServerWatch,
    check_eviction_policy,
    server_infos,
)
from bloomcrawl.core.errors import FilterFullError, SettingError
from bloomcrawl.core.frontier import Frontier, flush, live_leases, open_exchanges
from bloomcrawl.core.scripts import NO_TRANSACTIONS
from bloomcrawl.crawl import origins
from bloomcrawl.crawl.config import (
    FilterConfig,
    FrontierConfig,
    check_middlewares,
    politeness_from_settings,
    redis_from_settings,
    unused_settings,
)
from bloomcrawl.crawl.dupefilter import project_dupefilter
from bloomcrawl.crawl.engine import EngineInterface
from bloomcrawl.crawl.exchanges import ExchangeLoop
from bloomcrawl.crawl.feedback import HostFeedback, retry_after
from bloomcrawl.crawl.held import HeldRequests
from bloomcrawl.crawl.idle import IdleCloser
from bloomcrawl.crawl.intake import Intake
from bloomcrawl.crawl.lease import request_finished
from bloomcrawl.crawl.lease_book import LeaseBook, LeaseUpkeep
from bloomcrawl.crawl.outbox import REPLAY_S, Outbox
from bloomcrawl.crawl.outcomes import Outcomes
from bloomcrawl.crawl.pages import PageTracker
from bloomcrawl.crawl.pipelines import stored_mark
from bloomcrawl.crawl.readiness import PartitionReadiness
from bloomcrawl.crawl.recovery import Recovery
from bloomcrawl.crawl.redis_io import RedisIO
from bloomcrawl.crawl.seeds import (
    StartUrls,
    claim_start_list,
    end_crawl,
    give_back_start_leases,
    join_crawl,
    take_start_items,
)
from bloomcrawl.crawl.seen import SeenCache
from bloomcrawl.crawl.serialization import (
    ClassAllowList,
)
from bloomcrawl.crawl.tools import local_scheduler, tool_command
from bloomcrawl.crawl.windows import RevisitWindows

if TYPE_CHECKING:
    import redis
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from bloomcrawl.core.bloom import BloomFilter
    from bloomcrawl.core.politeness import Politeness

__all__ = ["CLUSTER_STATS_INTERVAL", "Scheduler", "check_middlewares", "retry_after"]

logger = logging.getLogger(__name__)

#: on Redis Cluster, a worker's shared counts go at most once a second: they
#: all live in one slot, which every worker's every exchange would otherwise hit
CLUSTER_STATS_INTERVAL = 1.0


class Scheduler:
    """The distributed, leased scheduler: Scrapy's engine-facing methods over the parts.

    :meth:`open` (or :meth:`open_frontier`, for tools and tests without a
    running reactor) opens the filter and builds the parts that need it: the
    exchange loop and its outbox (``loop``), the lease book and its upkeep,
    host feedback, recovery, the idle closer, the intake of new requests and
    the outcomes of crawled ones (docs/architecture.md draws them).
    """

    spider: Spider
    frontier: Frontier
    loop: ExchangeLoop
    upkeep: LeaseUpkeep
    feedback: HostFeedback
    idle: IdleCloser
    intake: Intake
    outcomes: Outcomes

    def __init__(self, server: redis.Redis, crawler: Crawler, config: FrontierConfig,
                 filter_config: FilterConfig, allowed: ClassAllowList | None = None) -> None:
        self.server = server
        self.allowed = allowed
        self.crawler = crawler
        self.stats: StatsCollector = crawler.stats
        self.fingerprinter = crawler.request_fingerprinter
        self.config = config
        self.filter_config = filter_config
        self.node = os.environ.get(defaults.NODE_ENV) or socket.gethostname()
        self.worker_id = "%s-%d-%s" % (self.node[:24], os.getpid(), uuid.uuid4().hex[:6])
        self.engine = EngineInterface(crawler)
        self.io = RedisIO()
        self.errors = RedisErrorPolicy(logger, server, "retrying; nothing leased is lost")
        # another server behind the client (a restart, a failover) may have rolled
        # state back under this worker's seen cache and leases: see Recovery
        self.watch = ServerWatch(server)
        self.pages = PageTracker.of(crawler)
        self.book = LeaseBook()
        # under a revisit window, a fingerprint is answered here for less than W (see seen)
        self.seen = SeenCache(config.seen_cache,
                              filter_config.shortest_window() / 2 or None)
        self.held = HeldRequests()
        # dont_filter start requests are deduplicated among the workers of one crawl
        self.crawl_id = b""
        # scrapy shell: Scrapy's own scheduler does the work (see open)
        self.tool: Any = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        """The shared frontier; for a tool command (``scrapy parse`` ...), a local scheduler."""
        command = tool_command(crawler)
        if command is not None:
            logger.info("scrapy %s: crawling with a local scheduler; the shared frontier"
                        " is not touched", command)
            return local_scheduler(crawler)
        settings = crawler.settings
        spider = crawler.spider.name if crawler.spider is not None else None
        # every setting is checked before anything touches Redis
        config = FrontierConfig.from_settings(settings, spider)
        filter_config = FilterConfig.from_settings(settings, spider)
        allowed = ClassAllowList.from_settings(settings)
        return cls(redis_from_settings(settings), crawler, config, filter_config, allowed)

    # -- life cycle -------------------------------------------------------------

    def open(self, spider: Spider) -> None:
        """Called by the engine when the spider opens."""
        if self.engine.opened_by_shell():
            logger.info("scrapy shell: crawling with a local scheduler; the shared frontier"
                        " is not touched", extra={"spider": spider})
            self.tool = local_scheduler(self.crawler)
            self.tool.open(spider)
            return
        check_middlewares(self.crawler.settings)
        self.open_frontier(spider)
        self.io.start()
        self.crawler.signals.connect(self._on_idle, signal=signals.spider_idle)
        self.upkeep.start()
        self.loop.start()

    def open_frontier(self, spider: Spider) -> None:
        """Open the filter and the queue, build the parts, reap expired leases.

        Everything :meth:`open` does that needs no running reactor; until
        :meth:`open` starts the I/O thread, Redis work runs inline.
        """
        self.spider = spider
        extra = {"spider": spider}
        if self.allowed is not None:  # the spider's own package (scrapy runspider) too
            self.allowed = self.allowed.extended(type(spider).__module__.partition(".")[0])
        self.errors.extra = extra
        for note in unused_settings(self.crawler.settings):
            logger.warning(note, extra=extra)
        politeness = politeness_from_settings(self.crawler.settings, spider)
        infos = server_infos(self.server)
        for info in infos.values():
            check_eviction_policy(info, self.server, self.config.allow_eviction)
        self.watch.prime(infos)
        self.frontier = frontier = open_frontier(self.server, spider, self.config,
                                                 self.filter_config, politeness,
                                                 worker_id=self.worker_id, node=self.node)
        frontier.watch = self.watch
        reads_start_list, forward_from = claim_start_list(frontier, spider,
                                                          self.crawler.settings)
        cluster = self.watch.cluster
        outbox = Outbox(self.io, frontier, self.watch,
                        stats_interval=CLUSTER_STATS_INTERVAL if cluster else 0.0,
                        replay_s=REPLAY_S if cluster else 0.0)
        readiness = PartitionReadiness(frontier.partitions)
        self.idle = IdleCloser(self.engine, self.config.max_idle, extra)
        self.loop = ExchangeLoop(
            outbox=outbox, frontier=frontier, book=self.book, readiness=readiness,
            seen=self.seen, idle=self.idle, engine=self.engine, spider=spider,
            allowed=self.allowed, stats=self.stats, errors=self.errors,
            requeue=self.enqueue_request, concurrency=self.config.concurrency,
            prefetch=self.config.prefetch,
            debug_duplicates=self.crawler.settings.getbool("DUPEFILTER_DEBUG"),
            recovery=Recovery(self.io, self.server, frontier, outbox, self.book, self.pages,
                              self.seen, readiness, self.watch, self.stats, self.errors,
                              extra, partial(stored_mark, self.crawler)),
            start_urls=(start_urls := StartUrls(self.io, frontier, outbox, spider, self.stats,
                                                self.enqueue_request, enabled=reads_start_list,
                                                forward_from=forward_from)))
        self.upkeep = LeaseUpkeep(self.io, frontier, self.book, readiness, self.watch,
                                  self.stats, self.errors, start_urls.holds,
                                  lease_timeout=self.config.lease_timeout,
                                  reap_interval=self.config.reap_interval, log_extra=extra)
        self.feedback = HostFeedback(frontier, self.book, self.loop, self.engine, self.stats,
                                     self.crawler.settings,
                                     autothrottle=politeness.autothrottle is not None)
        self.outcomes = Outcomes(self.loop)
        self.crawl_id = prepare_frontier(frontier, self.server, self.config, spider)
        origins.joined(self.crawler, self.crawl_id, partial(
            take_start_items, self.server, spider.name, self.crawl_id, self.worker_id))
        self.upkeep.count_requeued(frontier.reap())
        self.intake = Intake(loop=self.loop, book=self.book, seen=self.seen, held=self.held,
                             pages=self.pages, engine=self.engine, stats=self.stats,
                             fingerprinter=self.fingerprinter, spider=spider,
                             allowed=self.allowed, crawl_id=self.crawl_id,
                             partition_by=frontier.bloom.params.partition_by,
                             strict=self.config.strict,
                             windows=RevisitWindows(frontier.bloom.params, spider),
                             project_filter=project_dupefilter(self.crawler))
        s = self.crawler.signals
        s.connect(self.feedback.reached_downloader, signal=signals.request_reached_downloader)
        # response_downloaded, not response_received: a 429 that RetryMiddleware turns
        # into a retry never becomes a received response
        s.connect(self.feedback.response, signal=signals.response_downloaded)
        s.connect(self.outcomes.finished, signal=request_finished)
        self.pages.on_item_scraped = self.outcomes.item_scraped
        # a page's links are let go as the engine queues them, a failed request once its
        # errback's output is handled (no engine: nothing to track)
        self.engine.wrap_crawl(self.pages.scheduling)
        self.engine.wrap_scrape(self.pages.scraping)
        self.engine.wrap_spider_output(self.pages.errback_output)
        if self.engine.available() and not self.engine.wrap_downloader_output(
                self.pages.downloads):
            logger.warning("this Scrapy's engine has no _handle_downloader_output: a request"
                           " a downloader middleware replaces with a new one (not a copy)"
                           " keeps its lease until the worker closes", extra=extra)
        s.connect(self.outcomes.spider_error, signal=signals.spider_error)
        logger.info("bloomcrawl frontier %s, lease %.0f s; politeness: %s",
                    frontier.describe(), self.config.lease_timeout, politeness.describe(),
                    extra=extra)

    def close(self, reason: str) -> None:
        """Called by the engine when the spider closes.

        Waits for the exchange under way, sends what this worker still owes
        Redis and puts the leases it did not finish straight back into the
        queue; without SCHEDULER_PERSIST, deletes the frontier.
        """
        if self.tool is not None:
            self.tool.close(reason)
            return
        if getattr(self, "intake", None) is None:
            # open() failed before the frontier was ready (its error is in the log): nothing
            # was leased, queued or counted
            return
        self.intake.flush_counts()
        self.upkeep.stop()
        self.idle.stop()
        self.loop.stop()
        self.io.stop()  # from here on, Redis work runs inline
        outbox = self.loop.outbox
        for lease in outbox.settle():  # taken by the exchange under way: given back below
            self.book.take(lease, None)
        outbox.owe_later_counts()
        frontier = self.frontier
        try:
            self.loop.send_now()
            acks = outbox.take_start_acks()
            if acks:
                frontier.take_start_entries(0, acks)
            give_back_start_leases(frontier, self.loop.poller.start_urls.holds.clear())
        except FilterFullError:
            outbox.drop_requests()  # said when it happened; the leases still go back
        except REDIS_ERRORS as exc:
            logger.error("could not send this worker's last requests and acks on close"
                         " (%s)", exc, extra={"spider": self.spider})
        self.upkeep.release()
        self.held.clear()
        if self.intake.project_filter is not None:
            self.intake.project_filter.close(reason)
        if reason == "finished" and self.crawl_id and not self.config.crawl_id:
            end_crawl(self.server, frontier, self.spider, self.crawl_id)
        leave(frontier, self.spider, flush=not self.config.persist)

    # -- the engine's interface -----------------------------------------------------

    def has_pending_requests(self) -> bool:
        """True while this worker holds requests or Redis may have some for it."""
        if self.tool is not None:
            return bool(self.tool.has_pending_requests())
        outbox = self.loop.outbox
        return bool(self.book.ready() or self.book.waiting() or len(self.held)
                    or outbox.requests() or self.loop.readiness.ready_now() or outbox.exchanging)

    def enqueue_request(self, request: Request) -> bool:
        """Queue a request in the shared frontier (buffered, sent with the next exchange).

        Returns False when it was not queued (a duplicate this worker already
        sent); the engine then fires ``request_dropped``. See
        :meth:`~bloomcrawl.crawl.intake.Intake.enqueue`.
        """
        if self.tool is not None:
            return bool(self.tool.enqueue_request(request))
        try:
            return self.intake.enqueue(request)
        finally:
            # not ignored (PageTracker.scheduling): its lease is the intake's business
            self.pages.taken(request)

    def next_request(self) -> Request | None:
        """The next leased request, or None when there is none right now.

        None starts an exchange that sends what this worker owes Redis and
        leases the next request in the same round trip; the lease reaches the
        engine through ``engine.crawl()``. (Before :meth:`open` started the
        I/O thread the exchange runs inline and its lease is returned here.)
        Requests this worker keeps (:meth:`Intake._keep`) come after its leases.
        """
        if self.tool is not None:
            request: Request | None = self.tool.next_request()
            return request
        intake = self.intake
        # the engine asks often: the counts buffered since it last asked go to the stats
        intake.flush_counts()
        loop = self.loop
        book = self.book
        if not book.ready():
            if len(self.held):
                self.stats.inc_value("scheduler/dequeued")
                self.stats.inc_value("scheduler/dequeued/memory")
                return self.held.pop()
            loop.starved = True
            loop.exchange(lease=bool(loop.readiness.ready_now()))
        if book.ready():
            counts = intake.counts
            counts.inc("scheduler/dequeued")
            counts.inc("scheduler/dequeued/redis")
            loop.starved = False
            return book.pop_ready()
        return None

    def __len__(self) -> int:
        """Requests queued in Redis for this spider (all workers); asks Redis."""
        if self.tool is not None:
            return len(self.tool)
        return self.frontier.size()

    def send_pending(self) -> None:
        """Send the buffered requests, acks and shared stats now, and wait for Redis.

        Raises the Redis error when the send fails; what was buffered is kept
        for the next try. Tools call this; the scheduler itself never waits.
        """
        self.intake.flush_counts()
        self.loop.send_now()

    @property
    def bloom(self) -> BloomFilter:
        """The spider's Bloom filter (once the spider opened)."""
        return self.frontier.bloom

    def renew(self) -> None:
        """Extend the deadlines of every lease this worker still holds."""
        self.upkeep.renew()

    def reap(self) -> None:
        """Put expired leases (any worker's) back into the queue."""
        self.upkeep.reap()

    # -- signals ------------------------------------------------------------------------

    def _on_idle(self, spider: Spider) -> None:
        """spider_idle: the spider stays open while the cluster's frontier is not empty."""
        self.intake.flush_counts()
        self.idle.spider_idle(self.loop)


def open_frontier(server: redis.Redis, spider: Spider, config: FrontierConfig,
                  filter_config: FilterConfig, politeness: Politeness, *, worker_id: str,
                  node: str) -> Frontier:
    """The spider's frontier: its filter opened (or created) and its queue's keys."""
    bloom = filter_config.open(server, spider.name)
    try:
        frontier_keys = keys.FrontierKeys(
            spider.name, filter_pattern=filter_config.key_pattern,
            queue_pattern=config.queue_pattern, partitions=bloom.params.partitions)
    except (KeyError, ValueError, TypeError) as exc:
        raise SettingError("SCHEDULER_QUEUE_KEY %r: %s" % (config.queue_pattern, exc)) from exc
    return Frontier(server, bloom, frontier_keys, queue_type=config.queue_type,
                    lease_timeout=config.lease_timeout, worker_id=worker_id, node=node,
                    politeness=politeness)


def leave(frontier: Frontier, spider: Spider, flush: bool) -> None:
    """Closing: this worker is no longer alive; with ``flush`` (SCHEDULER_PERSIST False),
    the last worker alive flushes the frontier."""
    try:
        others = presence.gone(frontier)
    except REDIS_ERRORS as exc:
        logger.error("could not tell Redis this worker is closing (%s): other workers count"
                     " it as alive for one lease time%s", exc,
                     "; SCHEDULER_PERSIST is False, but the frontier is kept" if flush else "",
                     extra={"spider": spider})
        return
    if flush:
        flush_unless_shared(frontier, "SCHEDULER_PERSIST is False", spider,
                            "the last worker to close flushes it", others)


def flush_unless_shared(frontier: Frontier, why: str, spider: Spider, then: str,
                        others: int) -> bool:
    """Flush the frontier (queue, leases, filter) unless other workers are alive
    (``others``, :meth:`Frontier.gone`) or hold leases in it: a crawl under way is not
    deleted under them, even while none of them holds a lease (waiting out a host's
    delay, or between two exchanges). Whether it was flushed."""
    leases = live_leases(frontier)
    if others or leases:
        logger.warning("%s, but %d other workers are alive and hold %d leases of this"
                       " frontier: it is kept for the crawl under way (%s)", why, others,
                       leases, then, extra={"spider": spider})
        return False
    flush(frontier)
    return True


def prepare_frontier(frontier: Frontier, server: redis.Redis, config: FrontierConfig,
                     spider: Spider) -> bytes:
    """Record the layout, flush if asked, move old queues; returns the crawl's id."""
    extra = {"spider": spider}
    frontier.record_layout()
    if not open_exchanges(frontier):
        logger.warning(NO_TRANSACTIONS, extra=extra)
    # the workers alive before this one says it is (a worker id is new each run)
    others = presence.gone(frontier)
    if config.flush_on_start and flush_unless_shared(
            frontier, "SCHEDULER_FLUSH_ON_START is set", spider, "this worker joins it",
            others):
        server.delete(keys.crawl_key(spider.name))
    presence.here(frontier)
    crawl_id = join_crawl(server, spider.name, config.crawl_id)
    moved = frontier.migrate()
    if moved:
        logger.info("moved %d queued requests into per-host queues", moved, extra=extra)
    frontier.apply_slots()
    if frontier.bloom.params.partition_by != "host":
        logger.warning(
            "the Bloom filter %s was made before per-host partitions: a host's requests"
            " are spread over its %d partitions, so each host gets its delay and"
            " concurrency once per partition; clear the crawl (or use another"
            " BLOOMFILTER_KEY) for one budget per host", frontier.bloom.key,
            frontier.partitions, extra=extra)
    return crawl_id
