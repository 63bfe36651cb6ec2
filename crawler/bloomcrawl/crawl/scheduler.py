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

import email.utils
import hashlib
import heapq
import itertools
import logging
import os
import socket
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.exceptions import CloseSpider, DontCloseSpider
from scrapy.utils.defer import deferred_from_coro
from twisted.python.failure import Failure

from bloomcrawl.core import keys
from bloomcrawl.core.bloom import normalise_fingerprint, partition_of
from bloomcrawl.core.connection import (
    REDIS_ERRORS,
    RedisErrorPolicy,
    ServerWatch,
    check_eviction_policy,
    describe_redis,
    server_infos,
)
from bloomcrawl.core.errors import FilterFullError, SettingError
from bloomcrawl.core.frontier import Frontier, Lease, Outgoing
from bloomcrawl.core.politeness import (
    DEFAULT_BACKOFF_S,
    LAG_REPORTED_S,
    MAX_BACKOFF_S,
    Feedback,
    Politeness,
    filter_fingerprint,
    host_of,
)
from bloomcrawl.core.scripts import Script, ScriptCall, run_scripts
from bloomcrawl.crawl.config import (
    FilterConfig,
    FrontierConfig,
    politeness_from_settings,
    redis_from_settings,
)
from bloomcrawl.crawl.lease import HOLD_META_KEY, LEASE_META_KEY, LOCAL_META_KEY, request_finished
from bloomcrawl.crawl.outbox import REPLAY_S, Batch, Outbox, Reply
from bloomcrawl.crawl.pages import PageTracker
from bloomcrawl.crawl.redis_io import RedisIO, call_later, create_looping_call, log_unexpected
from bloomcrawl.crawl.seeds import StartUrls
from bloomcrawl.crawl.serialization import (
    ClassAllowList,
    UnserializableRequest,
    priority_score,
    request_from_json,
    request_to_json,
)

if TYPE_CHECKING:
    import redis
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from bloomcrawl.core.bloom import BloomFilter

logger = logging.getLogger(__name__)

_CRAWL_ID = Script("crawl_id.lua")

MAX_BATCH = 500
#: requests leased in one exchange at the most
MAX_LEASE = 32
MAX_POLL_DELAY = 1.0
ACK_DELAY = 0.05
#: on Redis Cluster, a worker's shared counts go at most once a second: they
#: all live in one slot, which every worker's every exchange would otherwise hit
CLUSTER_STATS_INTERVAL = 1.0
#: with MAX_IDLE_TIME_BEFORE_CLOSE set, how soon the worker asks whether it is idle
#: again after owing Redis something or seeing the frontier empty: Scrapy's engine
#: asks only every 5 s by itself, which made a 2 s idle close take 5-10 s
IDLE_RECHECK_S = 0.25


def retry_after(response: Any, now: float | None = None) -> float:
    """Seconds a 429/503 asks to wait: Retry-After in seconds or as an HTTP date."""
    raw = response.headers.get(b"Retry-After")
    if raw:
        text = raw.decode("latin-1").strip()
        try:
            return min(MAX_BACKOFF_S, max(0.0, float(text)))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(text).timestamp()
        except (TypeError, ValueError, IndexError):
            return DEFAULT_BACKOFF_S
        return min(MAX_BACKOFF_S, max(0.0, when - (time.time() if now is None else now)))
    return DEFAULT_BACKOFF_S


#: Scrapy commands that try a spider out rather than crawl: they must not take the
#: cluster's work or mark its URLs seen (scrapy.commands.<name> replaces the spider's start)
TOOL_COMMANDS = frozenset({"parse", "fetch", "check", "view", "shell", "bench"})


def tool_command(crawler: Crawler) -> str | None:
    """The Scrapy command trying this crawler's spider out, if any (None: a crawl).

    ``scrapy parse``, ``fetch`` and ``check`` replace the spider class's
    ``start`` with one of their own; ``scrapy shell`` is found later, by
    :func:`opened_by_shell`.
    """
    spidercls = getattr(crawler, "spidercls", None)
    module = getattr(getattr(spidercls, "start", None), "__module__", "") or ""
    if module.startswith("scrapy.commands."):
        name = module.rpartition(".")[2]
        return name if name in TOOL_COMMANDS else None
    return None


def opened_by_shell(crawler: Crawler) -> bool:
    """``scrapy shell`` (and ``inspect_response``) open the spider never to close when idle.

    Known only once the engine made its slot, right before it opens the
    scheduler: :meth:`Scheduler.open` asks.
    """
    try:
        slot = getattr(crawler.engine, "_slot", None)
    except RuntimeError:  # no engine yet
        return False
    return slot is not None and getattr(slot, "close_if_idle", True) is False


def local_scheduler(crawler: Crawler) -> Any:
    """Scrapy's own in-memory scheduler, with no duplicate filter: for a tool command."""
    from scrapy.core.scheduler import Scheduler as ScrapyScheduler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.utils.misc import load_object

    settings = crawler.settings
    return ScrapyScheduler(
        BaseDupeFilter(), jobdir=None,
        mqclass=load_object(settings["SCHEDULER_MEMORY_QUEUE"]),
        dqclass=load_object(settings["SCHEDULER_DISK_QUEUE"]),
        pqclass=load_object(settings["SCHEDULER_PRIORITY_QUEUE"]),
        stats=crawler.stats, crawler=crawler)


#: the middlewares that tell the scheduler a request's outcome: without them no lease
#: is ever acked (setting, class path)
REQUIRED_MIDDLEWARES = (
    ("SPIDER_MIDDLEWARES", "bloomcrawl.crawl.middleware.FrontierSpiderMiddleware"),
    ("DOWNLOADER_MIDDLEWARES", "bloomcrawl.crawl.middleware.FrontierDownloaderMiddleware"),
)


def check_middlewares(settings: Any) -> None:
    """Refuse to crawl without the frontier's middlewares: every lease would be renewed forever."""
    from scrapy.utils.misc import load_object

    for setting, path in REQUIRED_MIDDLEWARES:
        wanted = load_object(path)
        enabled = settings.getwithbase(setting)
        found = False
        for name, order in enabled.items():
            if order is None:
                continue
            try:
                cls = load_object(name) if isinstance(name, str) else name
            except (ImportError, NameError, ValueError):
                continue  # Scrapy says so itself when it builds the middlewares
            if isinstance(cls, type) and issubclass(cls, wanted):
                found = True
        if not found:
            raise SettingError("SCHEDULER is bloomcrawl's, but %s lacks %s: add %s ="
                               " {%r: 10} to the project's settings" % (setting, path, setting,
                                                                         path))


class Scheduler:
    """The distributed, leased scheduler."""

    def __init__(self, server: redis.Redis, crawler: Crawler, config: FrontierConfig,
                 filter_config: FilterConfig, allowed: ClassAllowList | None = None) -> None:
        self.server = server
        self.allowed = allowed
        self.crawler = crawler
        self.stats: StatsCollector = crawler.stats
        self.fingerprinter = crawler.request_fingerprinter
        self.config = config
        self.filter_config = filter_config
        self.node = socket.gethostname()
        self.worker_id = "%s-%d-%s" % (self.node[:24], os.getpid(), uuid.uuid4().hex[:6])
        self.spider: Spider | None = None
        self.frontier: Frontier | None = None
        self.io = RedisIO()
        self.errors = RedisErrorPolicy(logger, server, "retrying; nothing leased is lost")
        # another server behind the client (a restart, a failover) may have rolled
        # state back under this worker's seen cache and leases: see _server_changed
        self.watch = ServerWatch(server)
        # fingerprints this worker already sent through the filter: the filter only
        # grows, so they are in it for good and need no round trip
        self._seen: set[bytes] = set()
        self._seen_generation = 0
        # requests leased and not handed to the engine yet
        self._local: deque[tuple[Lease, Request]] = deque()
        # what this worker owes Redis, and the one exchange at a time that sends it
        self.outbox = Outbox(self.io, self.errors, self.stats, self.watch, on_reply=self._exchanged,
                             on_retry=lambda: self._exchange(lease=self._starved),
                             on_full=self._filter_full)
        self.start_urls = StartUrls(self.io, self.outbox, self.stats, self.enqueue_request,
                                    on_found=self._found_start_urls, on_error=self._failed)
        # leases this worker holds: token -> partition
        self._inflight: dict[str, int] = {}
        # leases not yet sent out by the downloader: token -> when the lease was asked for
        self._leased_at: dict[str, float] = {}
        # leases whose response came: token -> when (sent with the ack)
        self._responded_at: dict[str, float] = {}
        self._rotation = 0
        # per partition: when (time.monotonic()) a host of it may be leased; 0: maybe
        # now, inf: none waits for a time (nothing queued, or all its slots in flight)
        self._ready_at: list[float] = []
        self._wake_call: Any = None
        self._wake_at = 0.0
        self.politeness = Politeness()
        # the engine asked for a request and got none: the next lease must wake it
        self._starved = False
        self._ack_call: Any = None
        self._poll_call: Any = None
        self._poll_delay = 0.05
        # requests, leases and start URLs anywhere in the cluster, as last seen (None: unknown)
        self._frontier_size: int | None = None
        self._idle_since: float | None = None
        self._idle_call: Any = None
        self._loops: list[Any] = []
        self._closing = False
        self._epoch_seen = 0
        self._restate_needed = self._restating = False
        self.pages = PageTracker.of(crawler)
        # requests the frontier cannot share, crawled by this worker: (score, n, request)
        self._held: list[tuple[float, int, Request]] = []
        self._held_numbers = itertools.count()
        self._held_seen: set[bytes] = set()
        self._held_kinds: set[str] = set()
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
        if opened_by_shell(self.crawler):
            logger.info("scrapy shell: crawling with a local scheduler; the shared frontier"
                        " is not touched", extra={"spider": spider})
            self.tool = local_scheduler(self.crawler)
            self.tool.open(spider)
            return
        check_middlewares(self.crawler.settings)
        self.open_frontier(spider)
        self._start_background()

    def open_frontier(self, spider: Spider) -> None:
        """Open the filter and the queue, record the layout, reap expired leases.

        Everything :meth:`open` does that needs no running reactor; until
        :meth:`open` starts the I/O thread, Redis work runs inline.
        """
        self.spider = spider
        if self.allowed is not None:  # the spider's own package (scrapy runspider) too
            self.allowed = self.allowed.extended(type(spider).__module__.partition(".")[0])
        self.errors.extra = self.outbox.log_extra = {"spider": spider}
        self.politeness = politeness_from_settings(self.crawler.settings, spider)
        infos = server_infos(self.server)
        for info in infos.values():
            check_eviction_policy(info, self.server, self.config.allow_eviction)
        self.watch.prime(infos)
        if self.watch.cluster:
            self.outbox.stats_interval = CLUSTER_STATS_INTERVAL
            self.outbox.replay_s = REPLAY_S
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
                                 worker_id=self.worker_id, node=self.node,
                                 politeness=self.politeness)
        self._ready_at = [0.0] * self.frontier.partitions
        self.outbox.frontier = self.start_urls.frontier = self.frontier
        self.start_urls.spider = spider
        self.frontier.record_layout()
        if self.config.flush_on_start:
            self.frontier.flush()
            self.server.delete(keys.crawl_key(spider.name))
        self.crawl_id = self._join_crawl(spider.name)
        moved = self.frontier.migrate()
        if moved:
            logger.info("moved %d queued requests into per-host queues", moved,
                        extra={"spider": spider})
        self.frontier.apply_slots()
        self._count_requeued(self.frontier.reap())
        if bloom.params.partition_by != "host":
            logger.warning(
                "the Bloom filter %s was made before per-host partitions: a host's requests"
                " are spread over its %d partitions, so each host gets its delay and"
                " concurrency once per partition; clear the crawl (or use another"
                " BLOOMFILTER_KEY) for one budget per host", bloom.key, bloom.params.partitions,
                extra={"spider": spider})
        s = self.crawler.signals
        s.connect(self._on_reached_downloader, signal=signals.request_reached_downloader)
        # response_downloaded, not response_received: a 429 that RetryMiddleware turns
        # into a retry never becomes a received response
        s.connect(self._on_response, signal=signals.response_downloaded)
        s.connect(self._on_finished, signal=request_finished)
        s.connect(self._on_item, signal=signals.item_scraped)
        s.connect(self._on_spider_error, signal=signals.spider_error)
        logger.info("bloomcrawl frontier %s, lease %.0f s; politeness: %s",
                    self.frontier.describe(), self.config.lease_timeout,
                    self.politeness.describe(), extra={"spider": spider})

    def _start_background(self) -> None:
        """The I/O thread, the idle handler, renewal, reaping and polling."""
        self.io.start()
        self.crawler.signals.connect(self._on_idle, signal=signals.spider_idle)
        for func, interval in ((self.renew, self.config.lease_timeout / 3),
                               (self.reap, self.config.reap_interval)):
            loop = create_looping_call(func)
            loop.start(interval, now=False)
            self._loops.append(loop)
        self._schedule_poll(0)

    def close(self, reason: str) -> None:
        """Called by the engine when the spider closes.

        Waits for the exchange under way, sends what this worker still owes
        Redis and puts the leases it did not finish straight back into the
        queue; without SCHEDULER_PERSIST, deletes the frontier.
        """
        if self.tool is not None:
            self.tool.close(reason)
            return
        self._closing = True
        for loop in self._loops:
            if loop.running:
                loop.stop()
        for call in (self._poll_call, self._ack_call, self._wake_call, self._idle_call):
            if call is not None:
                call.cancel()
        self._poll_call = self._ack_call = self._wake_call = self._idle_call = None
        self.outbox.cancel()
        self.io.stop()  # from here on, Redis work runs inline
        self.outbox.settle()
        frontier = self._frontier()
        outbox = self.outbox
        try:
            outbox.send_now()
            if outbox.start_acks:
                frontier.take_start_entries(0, outbox.start_acks)
                outbox.start_acks = []
        except FilterFullError:
            outbox.outgoing.clear()  # said when it happened; the leases still go back
        except REDIS_ERRORS as exc:
            logger.error("could not send this worker's last requests and acks on close"
                         " (%s)", exc, extra={"spider": self.spider})
        self._local.clear()
        try:
            self._count_requeued(frontier.release(self._inflight))
            self._inflight.clear()
        except REDIS_ERRORS as exc:
            logger.error("could not put this worker's leases back on close (%s): they will be"
                         " requeued when they expire", exc, extra={"spider": self.spider})
        self._held.clear()
        if reason == "finished":
            self._end_crawl()
        if not self.config.persist:
            frontier.flush()

    # -- the engine's interface -----------------------------------------------------

    def has_pending_requests(self) -> bool:
        """True while this worker holds requests or Redis may have some for it."""
        if self.tool is not None:
            return bool(self.tool.has_pending_requests())
        return bool(self._local or self._held or self.outbox.outgoing or self._ready_now()
                    or self.outbox.exchanging)

    def enqueue_request(self, request: Request) -> bool:
        """Queue a request in the shared frontier (buffered, sent with the next exchange).

        Returns False when it was not queued (a duplicate this worker already
        sent); the engine then fires ``request_dropped``. Duplicates found by
        the filter in Redis are counted in ``dupefilter/filtered`` when the
        exchange returns. A request the frontier cannot share stays with this
        worker (:meth:`_keep`). A ``dont_filter`` start request goes through
        the filter under the crawl's id: each start URL once per crawl,
        whichever workers start it.
        """
        if self.tool is not None:
            return bool(self.tool.enqueue_request(request))
        meta = request.meta
        if meta.pop(LOCAL_META_KEY, False):
            partition, token = meta[LEASE_META_KEY]
            self._local.append((Lease(partition, token, b""), request))
            return True
        lease = meta.pop(LEASE_META_KEY, None)
        host = host_of(request.url)
        fp = normalise_fingerprint(self.fingerprinter.fingerprint(request))
        dont_filter = request.dont_filter
        if dont_filter and meta.get("is_start_request") and self.crawl_id:
            fp = hashlib.sha1(b"start:" + self.crawl_id + fp).digest()
            dont_filter = False
        fp = filter_fingerprint(fp, host, self._frontier().bloom.params.partition_by)
        if not dont_filter and fp in self._seen:
            self.outbox.held.append(request)  # until Redis answered from the same server
            self.outbox.counts["filtered"] += 1
            self.stats.inc_value("dupefilter/filtered")
            self.stats.inc_value("bloomcrawl/filtered_locally")
            if lease is not None:
                self._ack_later(lease)
            return False
        try:
            payload = request_to_json(request, self._spider(), self.allowed)
        except UnserializableRequest as exc:
            return self._keep(request, lease, fp, dont_filter, exc)
        self.outbox.outgoing.append(Outgoing(fp, dont_filter, priority_score(request), payload,
                                             host))
        if lease is not None:
            # a retry or redirect of a leased request: ack the original once this is queued
            self._ack_later(lease)
        if HOLD_META_KEY in meta:
            # a retry of a held request that can be shared now: queued, it holds no page
            self.pages.release(request)
        self.stats.inc_value("scheduler/enqueued")
        self.stats.inc_value("scheduler/enqueued/redis")
        if len(self.outbox.outgoing) >= MAX_BATCH:
            self._exchange()
        return True

    def _keep(self, request: Request, lease: Any, fp: bytes, dont_filter: bool,
              exc: UnserializableRequest) -> bool:
        """A request the frontier cannot share: this worker crawls it itself.

        Nothing is dropped for how it is stored. The page that yielded it
        keeps its lease until it is done (:meth:`PageTracker.hold`): a worker
        killed before leaves that page to be crawled again, which makes the
        request again. It is filtered against what this worker kept, not the
        shared filter. With FRONTIER_STRICT the spider closes instead.
        """
        spider = self._spider()
        if self.config.strict:
            logger.error("%s; closing the spider (FRONTIER_STRICT)", exc, extra={"spider": spider})
            self.stats.inc_value("bloomcrawl/unserializable")
            self.outbox.counts["unserializable"] += 1
            if lease is not None:
                request.meta[LEASE_META_KEY] = lease  # not acked: it goes back to the queue
            self._close_engine("unshareable_request")
            return False
        if exc.kind not in self._held_kinds:
            self._held_kinds.add(exc.kind)
            logger.warning("%s: this worker crawls it itself (not shared with other workers,"
                           " filtered only against what this worker kept); further requests"
                           " like it are counted in bloomcrawl/local_requests. Make it"
                           " shareable (FRONTIER_SAFE_CLASSES, a spider method as callback),"
                           " or set FRONTIER_STRICT to refuse it", exc, extra={"spider": spider})
        if not dont_filter:
            if fp in self._held_seen:
                self.stats.inc_value("dupefilter/filtered")
                if lease is not None:
                    self._ack_later(lease)
                return False
            self._held_seen.add(fp)
        if lease is not None:
            # a retry or redirect of a leased request: it carries the lease until done
            request.meta[LEASE_META_KEY] = lease
        else:
            self.pages.hold(request)
        heapq.heappush(self._held, (priority_score(request), next(self._held_numbers), request))
        self.stats.inc_value("bloomcrawl/local_requests")
        self.outbox.counts["local"] += 1
        self.stats.inc_value("scheduler/enqueued")
        self.stats.inc_value("scheduler/enqueued/memory")
        return True

    def next_request(self) -> Request | None:
        """The next leased request, or None when there is none right now.

        None starts an exchange that sends what this worker owes Redis and
        leases the next request in the same round trip; the lease reaches the
        engine through ``engine.crawl()``. (Before :meth:`open` started the
        I/O thread the exchange runs inline and its lease is returned here.)
        Requests this worker keeps (:meth:`_keep`) come after its leases.
        """
        if self.tool is not None:
            request: Request | None = self.tool.next_request()
            return request
        if not self._local:
            if self._held:
                self.stats.inc_value("scheduler/dequeued")
                self.stats.inc_value("scheduler/dequeued/memory")
                return heapq.heappop(self._held)[2]
            self._starved = True
            self._exchange(lease=bool(self._ready_now()))
        if self._local:
            lease, request = self._local.popleft()
            request.meta[LEASE_META_KEY] = (lease.partition, lease.token)
            self.stats.inc_value("scheduler/dequeued")
            self.stats.inc_value("scheduler/dequeued/redis")
            self._starved = False
            return request
        return None

    def _join_crawl(self, spider: str) -> bytes:
        """The id of the crawl this worker joins: FRONTIER_CRAWL_ID, or the one in Redis.

        The first worker of a crawl sets ``<spider>:crawl``; the others read
        it; it is deleted when a worker closes with the frontier finished, so
        the next crawl starts its start URLs again.
        """
        if self.config.crawl_id:
            return self.config.crawl_id.encode()
        (value,) = run_scripts(self.server, [ScriptCall(
            _CRAWL_ID, [keys.crawl_key(spider)], ["join", uuid.uuid4().hex])])
        return value.encode() if isinstance(value, str) else bytes(value or b"")

    def _end_crawl(self) -> None:
        if self.config.crawl_id or not self.crawl_id:
            return
        key = keys.crawl_key(self._spider().name)
        try:
            if self._frontier().size(with_leases=True) == 0:
                run_scripts(self.server, [ScriptCall(_CRAWL_ID, [key], ["end", self.crawl_id])])
        except REDIS_ERRORS as exc:
            logger.warning("could not end the crawl %s (%s): the next crawl's start URLs"
                           " count as seen", self.crawl_id.decode(), exc,
                           extra={"spider": self.spider})

    def __len__(self) -> int:
        """Requests queued in Redis for this spider (all workers); asks Redis."""
        if self.tool is not None:
            return len(self.tool)
        return self._frontier().size()

    # -- exchanges --------------------------------------------------------------------

    def send_pending(self) -> None:
        """Send the buffered requests, acks and shared stats now, and wait for Redis.

        Raises the Redis error when the send fails; what was buffered is kept
        for the next try. Tools call this; the scheduler itself never waits.
        """
        self.outbox.send_now()

    def _exchange(self, *, lease: bool = True, check_idle: bool = False) -> None:
        """Start an exchange of all that is owed, leasing when this worker wants work.

        Nothing starts while one is under way (its reply starts the next) or
        while a retry waits out its back-off (it will).
        """
        if self.outbox.busy() or self.frontier is None:
            return
        if self.watch.epoch != self._epoch_seen:
            self._server_changed()
        if self._restate_needed:
            # the stats Redis lost go first, in order, before any newer number
            if not self._restating:
                self._restating = True
                d = self.io.run(self.frontier.applied_stats_number)
                d.addCallbacks(self._restate, self._restate_failed).addErrback(self._bug)
            return
        lease_from = None
        probe: list[int] = []
        ready = self._ready_now()
        if lease and not self._local and ready:
            # a partition with acks first (they ride with its lease), then round robin
            first = self.outbox.ack_partition()
            start = self._rotation % len(self._ready_at)
            self._rotation += 1
            order = sorted(ready, key=lambda p: (p != first, (p - start) % len(self._ready_at)))
            lease_from, probe = order[0], order[1:]
        elif lease and not self._local:
            self._wake_when_ready()  # no host is ready yet: ask when the first one is
        self.outbox.send(lease_from, want=self._demand(), check_idle=check_idle, probe=probe)

    def _ready_now(self) -> list[int]:
        """The partitions whose hosts may be leased now, as far as this worker knows."""
        now = time.monotonic()
        return [p for p, at in enumerate(self._ready_at) if at <= now]

    def _may_have_work(self, partitions: Any = None) -> None:
        """Something may be ready in ``partitions`` (all: None): ask them at the next lease."""
        for p in range(len(self._ready_at)) if partitions is None else partitions:
            self._ready_at[p] = 0.0

    def _wake_when_ready(self) -> None:
        """Starved and no partition ready now: lease when the soonest host is ready."""
        if self._closing or not self._starved or not self._ready_at or not self.io.threaded:
            return
        soonest = min(self._ready_at)
        if soonest == float("inf"):
            return
        if self._wake_call is not None:
            if self._wake_at <= soonest + 0.001:
                return
            self._wake_call.cancel()
        self._wake_at = soonest
        self._wake_call = call_later(max(0.0, soonest - time.monotonic()), self._wake)

    def _wake(self) -> None:
        self._wake_call = None
        self._exchange(lease=self._starved)

    def _demand(self) -> int:
        """How many requests to lease: SCHEDULER_PREFETCH, or the engine's free slots.

        The engine asks for one request at a time and waits for the lease to
        reach it; leasing only one per exchange would leave download slots
        idle for a round trip each.
        """
        if not self.io.threaded:
            return self.config.prefetch
        try:
            downloader = self.crawler.engine.downloader
        except (AttributeError, RuntimeError):  # no engine (yet)
            return self.config.prefetch
        free = self.config.concurrency - len(getattr(downloader, "active", ()))
        return max(self.config.prefetch, min(free - len(self._local), MAX_LEASE))

    def _exchanged(self, reply: Reply, batch: Batch) -> None:
        frontier = self._frontier()
        if frontier.filter_generation != self._seen_generation:
            logger.warning("the Bloom filter %s was deleted; it was created again",
                           frontier.keys.filter, extra={"spider": self.spider})
            self._seen.clear()
            self._seen_generation = frontier.filter_generation
        if self.config.seen_cache:
            if len(self._seen) + len(batch.outgoing) > self.config.seen_cache:
                self._seen.clear()
            self._seen.update(e.fingerprint for e in batch.outgoing if not e.dont_filter)
        done = reply.done
        if done.filtered:
            self.stats.inc_value("dupefilter/filtered", done.filtered)
            self.stats.inc_value("bloomfilter/filtered", done.filtered)
            self.outbox.counts["filtered"] += done.filtered
        if reply.frontier_size is not None:
            self._frontier_size = reply.frontier_size
            if reply.frontier_size == 0 and self._starved:
                self._check_idle_in(IDLE_RECHECK_S)
        got = self._take(reply.leases)
        now = time.monotonic()
        if batch.lease_from is not None:
            # a partition that gave all it was asked for may have more; one that gave
            # less is ready when its soonest host is
            for p, wait in reply.ready_in.items():
                self._ready_at[p] = float("inf") if wait is None else now + wait
        if done.queued:
            self._may_have_work({partition_of(e.fingerprint, frontier.partitions)
                                 for e in batch.outgoing})
        # acks free their hosts' slots
        self._may_have_work(p for p, tokens in batch.acks.items() if tokens)
        if got:
            self._frontier_size = None
            self._poll_delay = 0.05
            self._wake_engine()
        # a starved engine gets its next lease now (with what piled up meanwhile: acks,
        # new links); else what piled up rides with the next lease, or the ack timer's
        # exchange. After an empty lease, looking for work again is the poller's job.
        if not self._closing and (
                (self._starved and self._ready_now() and not self._local)
                or len(self.outbox.outgoing) >= MAX_BATCH):
            self._exchange()
        elif not self._closing and self.outbox.feedback:
            # what holds a host back (a late request, a 429) goes now, not with the next lease
            self._exchange(lease=self._starved)
        elif not self._local:
            self._wake_when_ready()

    def _filter_full(self, exc: FilterFullError) -> None:
        """The filter refuses new items: stop the crawl, loudly, rather than drop URLs."""
        self.stats.inc_value("bloomcrawl/filter_full")
        logger.error("%s; stopping the crawl (%d new requests of this worker were not"
                     " queued)", exc, len(self.outbox.outgoing), extra={"spider": self.spider})
        self.outbox.outgoing.clear()
        self._close_engine("bloomfilter_full")

    def _close_engine(self, reason: str) -> None:
        try:
            engine = self.crawler.engine
        except RuntimeError:  # Scrapy >= 2.14 before the crawl started: nothing to close
            return
        if engine is None or self._closing:
            return
        close_async = getattr(engine, "close_spider_async", None)
        if close_async is not None:  # Scrapy >= 2.14
            d = deferred_from_coro(close_async(reason=reason))
        else:
            d = engine.close_spider(self._spider(), reason)
        d.addErrback(self._bug)

    def _take(self, leases: list[Lease]) -> int:
        """Turn leases into requests in the local buffer; returns how many."""
        got = 0
        for lease in leases:
            self._inflight[lease.token] = lease.partition
            self._leased_at[lease.token] = lease.at
            try:
                request = request_from_json(lease.payload, self._spider(), self.allowed)
            except Exception as exc:  # a corrupt or hostile entry must not stop the crawl
                logger.error("dropping an unreadable queue entry %r: %s", lease.payload[:200],
                             exc, extra={"spider": self.spider})
                self.stats.inc_value("bloomcrawl/unreadable_requests")
                self.outbox.counts["errors"] += 1
                self._ack_later((lease.partition, lease.token))
                continue
            self._local.append((lease, request))
            got += 1
        return got

    def _wake_engine(self) -> None:
        """Hand one leased request to the engine through its public crawl()."""
        if not self.io.threaded or not self._local or not self._starved:
            return
        engine = self.crawler.engine
        if engine is None:
            return
        lease, request = self._local.popleft()
        request.meta[LEASE_META_KEY] = (lease.partition, lease.token)
        request.meta[LOCAL_META_KEY] = True
        engine.crawl(request)

    def _ack_later(self, lease: Any) -> None:
        partition, token = lease
        self._leased_at.pop(token, None)
        responded = self._responded_at.pop(token, None)
        if self._inflight.pop(token, None) is not None:
            # with when its response came: the host's next lease counts from no earlier
            self.outbox.acks[int(partition)].append(
                token if responded is None else "%s|%r" % (token, responded))

    # -- renewal and reaping (on the I/O thread) ------------------------------------------

    def renew(self) -> None:
        """Extend the deadlines of every lease this worker still holds."""
        if self._inflight and self.frontier is not None:
            d = self.io.run(self.frontier.renew, dict(self._inflight))
            d.addCallbacks(self._renewed, self._failed).addErrback(self._bug)

    def _renewed(self, lost: list[str]) -> None:
        self.errors.ok()
        for token in lost:  # counted once: a lost lease is no longer ours to renew or ack
            self._inflight.pop(token, None)
            self._leased_at.pop(token, None)
            self._responded_at.pop(token, None)
        if lost:
            self.stats.inc_value("bloomcrawl/leases_lost", len(lost))
            logger.warning("%d leases expired before renewal; their requests may be crawled"
                           " twice (raise SCHEDULER_LEASE_TIMEOUT?)", len(lost),
                           extra={"spider": self.spider})

    def reap(self) -> None:
        """Put expired leases (any worker's) back into the queue."""
        if self.frontier is not None:
            d = self.io.run(self._reap, self.frontier)
            d.addCallbacks(self._count_requeued, self._failed).addErrback(self._bug)

    def _reap(self, frontier: Frontier) -> int:
        if self.watch.cluster:
            # a replica promoted over a connection opened before: see ServerWatch
            self.watch.check_masters(server_infos(self.server))
        return frontier.reap()

    def _count_requeued(self, requeued: int) -> None:
        if requeued:
            self.stats.inc_value("bloomcrawl/requeued", requeued)
            self._may_have_work()
            logger.info("requeued %d expired leases", requeued, extra={"spider": self.spider})

    def _bug(self, failure: Failure) -> None:
        log_unexpected(failure, logger, {"spider": self.spider})

    def _failed(self, failure: Failure) -> None:
        self.stats.inc_value("bloomcrawl/redis_errors")
        self.errors.failed(failure.value or RuntimeError(failure))

    # -- outcomes ---------------------------------------------------------------------

    def _on_finished(self, request: Request, outcome: str) -> None:
        lease = request.meta.pop(LEASE_META_KEY, None)
        if outcome == "response":
            self.outbox.counts["pages"] += 1
        elif outcome == "download_error":
            # a raising callback is counted once, by the spider_error signal
            self.outbox.counts["errors"] += 1
        if lease is not None:
            # sent with the next lease (next_request), or within ACK_DELAY anyway:
            # a worker killed now must not leave finished pages to be crawled again
            self._ack_later(lease)
            if self._ack_call is None and self._loops:
                self._ack_call = call_later(ACK_DELAY, self._flush_acks)

    def _on_reached_downloader(self, request: Request, spider: Spider) -> None:
        """The cluster keeps the host's delay: the leased request goes out now.

        The downloader's slot would add the process's own DOWNLOAD_DELAY (or
        DOWNLOAD_SLOTS' or AutoThrottle's) on top, late by a delay another
        worker may already have used.
        """
        lease = request.meta.get(LEASE_META_KEY)
        if lease is None:
            return
        try:
            slot = self.crawler.engine.downloader.slots.get(request.meta.get("download_slot", ""))
        except AttributeError:
            slot = None
        if slot is not None:
            slot.delay = 0.0
        self._went_out(request, lease[1], time.monotonic())

    def _went_out(self, request: Request, token: str, when: float) -> None:
        """A leased request went out at ``when``: late after its lease, its host is told.

        The host's delay counts from when a request left; a request that waited
        in this worker (a busy reactor) would otherwise come too close after
        the host's next one, leased to another worker on time.
        """
        leased_at = self._leased_at.get(token)
        if leased_at is None or self.frontier is None:
            return
        if when - leased_at <= LAG_REPORTED_S:
            return
        self._leased_at[token] = when  # reported up to here
        self.stats.max_value("bloomcrawl/lease_lag_max_ms", round((when - leased_at) * 1000))
        host = host_of(request.url)
        seen = self._feedback(host)
        seen.sent[host] = max(seen.sent.get(host, 0.0), when)
        if self._ack_call is None and self._loops:
            self._ack_call = call_later(0, self._flush_acks)

    def _on_response(self, response: Any, request: Request, spider: Spider) -> None:
        """What a response says about its host's budget, for every worker."""
        if self.frontier is None:
            return
        host = host_of(request.url)
        if LEASE_META_KEY not in request.meta:
            if request.url.endswith("/robots.txt") and response.status == 200:
                self._robots(host, response)
            return
        self._responded_at[request.meta[LEASE_META_KEY][1]] = time.monotonic()
        latency = request.meta.get("download_latency")
        if isinstance(latency, float | int):
            # the request went out this long before its response: later than its lease?
            self._went_out(request, request.meta[LEASE_META_KEY][1], time.monotonic() - latency)
        seen: Feedback | None = None
        if response.status in (429, 503):
            seen = self._feedback(host)
            seen.backoff[host] = max(seen.backoff.get(host, 0.0), retry_after(response))
        if self.politeness.autothrottle is not None and isinstance(latency, float | int):
            seen = seen or self._feedback(host)
            seen.latency.append((host, float(latency), 200 <= response.status < 300))

    def _robots(self, host: str, response: Any) -> None:
        """robots.txt's Crawl-delay for our user agent becomes the host's cluster delay."""
        try:
            from protego import Protego

            settings = self.crawler.settings
            agent = settings.get("ROBOTSTXT_USER_AGENT") or settings.get("USER_AGENT") or "*"
            delay = Protego.parse(response.text).crawl_delay(agent)
        except Exception as exc:  # a robots.txt we cannot read sets nothing
            logger.debug("no Crawl-delay from %s: %s", response.url, exc)
            return
        self._feedback(host).robots[host] = float(delay or 0.0)

    def _feedback(self, host: str) -> Feedback:
        frontier = self._frontier()
        fp = filter_fingerprint(bytes(20), host, frontier.bloom.params.partition_by)
        p = partition_of(fp, frontier.partitions)
        return self.outbox.feedback.setdefault(p, Feedback())

    def _flush_acks(self) -> None:
        self._ack_call = None
        self._exchange(lease=self._starved)

    def _on_item(self, item: Any, response: Any, spider: Spider) -> None:
        self.outbox.counts["items"] += 1

    def _on_spider_error(self, failure: Any, response: Any, spider: Spider) -> None:
        self.outbox.counts["errors"] += 1

    # -- start URLs, polling and idling -------------------------------------------------

    def _schedule_poll(self, delay: float) -> None:
        if not self._closing:
            self._poll_call = call_later(delay, self._poll)

    def _poll(self) -> None:
        """Read start URLs and, when the engine is starved, look for work.

        Polls every 50 ms while it finds something, backing off to
        MAX_POLL_DELAY while it does not.
        """
        self._poll_call = None
        # other workers' new requests and acks are not seen here: ask again
        self._may_have_work(p for p, at in enumerate(self._ready_at) if at == float("inf"))
        self.start_urls.read()
        self._exchange(lease=self._starved, check_idle=self._starved)
        self._schedule_poll(self._poll_delay)
        self._poll_delay = min(MAX_POLL_DELAY, self._poll_delay * 2)

    def _found_start_urls(self) -> None:
        self.errors.ok()
        self._poll_delay = 0.05
        self._exchange(lease=self._starved)

    def _server_changed(self) -> None:
        """Redis restarted or failed over: find out whether it lost this worker's writes.

        The first call to the new server failed (ServerChangedError) before
        it was sent; its batch is back in the buffers. No exchange starts
        until the new server said which of this worker's numbered exchanges
        it holds (:meth:`_restate`).
        """
        self._epoch_seen = self.watch.epoch
        self._restate_needed = True
        self.stats.inc_value("bloomcrawl/redis_restarts")
        self.io.run(self._frontier().reverify).addErrback(self._failed)

    def _restate(self, applied: int) -> None:
        """The new server holds this worker's exchanges up to number ``applied``."""
        self._restate_needed = self._restating = False
        outbox = self.outbox
        if applied >= outbox.confirmed_number and not self.watch.cluster:
            # a restart or failover that kept every write of ours (AOF, a caught-up
            # replica): what this worker remembers still holds
            logger.warning("Redis at %s is another server now (run_id %s) and kept this"
                           " worker's writes", describe_redis(self.server),
                           self.watch.run_id, extra={"spider": self.spider})
            outbox.held.clear()
        else:
            # on Redis Cluster the stats' slot may have kept everything while the
            # promoted master of other partitions lost what it had not replicated
            self._rolled_back(applied)
        self._exchange(lease=self._starved)

    def _rolled_back(self, applied: int) -> None:
        """Redis lost writes of ours (a rollback, a lagging replica, no persistence).

        * the seen cache may remember fingerprints Redis lost: forget it, and
          send again what was dropped against it since the last exchange;
        * on Redis Cluster, the requests of the exchanges confirmed in the
          last :data:`~bloomcrawl.crawl.outbox.REPLAY_S` seconds go again
          (the filter drops those Redis kept): a page's ack and its links
          live on different masters, and a failover may keep the ack and
          lose the links. (One Redis loses a suffix of what it was sent: a
          page whose links were lost lost its ack too, and is crawled again.)
        * the leases this worker holds, and the acks it has not sent, are for
          work whose items or links may have gone to the lost state: they are
          not acked; the leases that still exist expire and are crawled again;
        * the counts Redis lost go again, each once.
        """
        outbox = self.outbox
        held, outbox.held = outbox.held, []
        dropped = len(self._inflight) + sum(len(t) for t in outbox.acks.values())
        again = outbox.restate(applied)
        replayed = outbox.replay()
        logger.warning("Redis at %s is another server now (run_id %s) and may have lost writes"
                       " of this worker: forgetting the %d fingerprints it remembered, sending"
                       " %d requests (%d of them from the last %.0f s) and the counts of %d"
                       " exchanges again, leaving %d leases to expire",
                       describe_redis(self.server), self.watch.run_id, len(self._seen),
                       len(held) + replayed, replayed, outbox.replay_s, again, dropped,
                       extra={"spider": self.spider})
        self.stats.inc_value("bloomcrawl/redis_rollbacks")
        self._seen.clear()
        self._inflight.clear()
        self._leased_at.clear()
        self._responded_at.clear()
        outbox.acks.clear()
        self._may_have_work()
        for request in held:
            self.enqueue_request(request)

    def _restate_failed(self, failure: Failure) -> None:
        self._restating = False  # still needed: the next exchange asks again
        self._failed(failure)

    def _on_idle(self, spider: Spider) -> None:
        if self._local or self.outbox.owes() or self.outbox.exchanging:
            self._exchange(lease=self._starved)
            self._check_idle_in(IDLE_RECHECK_S)
            raise DontCloseSpider
        self._starved = True
        if self._frontier_size is None or self._frontier_size > 0:
            # others are crawling and may queue more (or we do not know yet): look soon
            self._idle_since = None
            if self._poll_delay > 0.2:
                self._poll_delay = 0.05
                if self._poll_call is not None:
                    self._poll_call.cancel()
                self._schedule_poll(0)
            raise DontCloseSpider
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if self.config.max_idle <= 0 or now - self._idle_since < self.config.max_idle:
            self._check_idle_in(self._idle_since + self.config.max_idle - now)
            raise DontCloseSpider
        logger.info("frontier empty for %.0f s: closing", now - self._idle_since,
                    extra={"spider": spider})

    def _check_idle_in(self, delay: float) -> None:
        """Ask whether the spider is idle in ``delay`` s (when it may close by then)."""
        if self.config.max_idle > 0 and not self._closing and self._idle_call is None:
            self._idle_call = call_later(max(0.0, delay), self._check_idle)

    def _check_idle(self) -> None:
        """What the engine does on its 5 s heartbeat when nothing is in flight, now.

        Sends ``spider_idle`` (so :meth:`_on_idle` and every other receiver
        decide, as they would for the engine) and closes the spider as the
        engine would when no receiver raised DontCloseSpider.
        """
        self._idle_call = None
        engine = self.crawler.engine
        if self._closing or engine is None or engine.spider is None:
            return
        try:
            if not engine.spider_is_idle():
                return  # busy: the engine calls spider_idle itself when it is idle again
        except RuntimeError:  # the engine's slot is gone: the spider is closing
            return
        results = self.crawler.signals.send_catch_log(
            signals.spider_idle, spider=engine.spider, dont_log=(DontCloseSpider, CloseSpider))
        raised = [value for _, value in results if isinstance(value, Failure)]
        if any(isinstance(f.value, DontCloseSpider) for f in raised):
            return
        reasons = [f.value.reason for f in raised if isinstance(f.value, CloseSpider)]
        self._close_engine(reasons[0] if reasons else "finished")

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
