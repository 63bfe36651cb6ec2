"""What a benchmark worker measures about itself.

* :class:`RoundTrips`: counts network round trips, i.e. packets of commands
  sent before their replies are read: one per plain command, one per
  pipeline (``MULTI``/``EXEC`` or not), one per master a Redis Cluster
  pipeline reaches. :meth:`RoundTrips.install` (run when
  ``crawlbench.settings`` is imported) wraps redis-py's
  ``AbstractConnection.send_packed_command``, so every connection of the
  worker process counts, bloomcrawl's and scrapy-redis's, plain Redis and
  Redis Cluster alike (a ``connection_class`` in REDIS_PARAMS would do for
  ``redis.Redis`` only: RedisCluster refuses that argument).
* :class:`Probe`: writes the worker's numbers to ``BENCH_PROBE_FILE`` (JSON)
  when the spider closes: responses, the time of the first and last one, the
  process's CPU time between them, and the round trips counted up to the last
  response (so the idle wait before closing is not charged to the crawl).
  While crawling, it keeps the response count in ``BENCH_PROBE_FILE`` +
  ``.progress`` (every 10 responses), so the benchmark can tell which workers
  are busy.
* :class:`IdlePoll` (enabled for the scrapy-redis contenders): keeps the spider open for
  MAX_IDLE_TIME_BEFORE_CLOSE seconds of idleness and asks the engine for the
  next request every 50 ms meanwhile. scrapy-redis's RedisSpider would
  re-check its queue only at the engine's 5 s heartbeat; polling lets a
  worker that found the shared queue empty join in as soon as another worker
  fills it, so the comparison measures the per-page cost, not that wait.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.connection import AbstractConnection
from scrapy import signals
from scrapy.exceptions import DontCloseSpider, NotConfigured
from scrapy.utils.asyncio import call_later

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

IDLE_POLL_S = 0.05
PROGRESS_EVERY = 10
REPORTED_STATS = (
    "response_received_count", "item_scraped_count", "scheduler/enqueued/redis",
    "scheduler/dequeued/redis", "dupefilter/filtered", "bloomfilter/filtered",
    "bloomcrawl/requeued", "bloomcrawl/leases_lost", "finish_reason",
)


class RoundTrips:
    """The round trips of every redis-py connection of this process."""

    count = 0  # per process
    _installed = False

    @classmethod
    def install(cls) -> None:
        """Count from now on; idempotent."""
        if cls._installed:
            return
        send = AbstractConnection.send_packed_command

        def counting(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
            cls.count += 1
            send(self, command, check_health)

        AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
        cls._installed = True


class Probe:
    """Per-worker numbers for the benchmark, written as JSON when the spider closes."""

    def __init__(self, crawler: Crawler, path: Path) -> None:
        self.crawler = crawler
        self.path = path
        self.progress_path = path.with_name(path.name + ".progress")
        self.responses = 0
        self.first_response: float | None = None
        self.last_response: float | None = None
        self.round_trips_at_last_response = 0
        self.cpu_at_first_response = 0.0
        self.cpu_at_last_response = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Probe:
        path = crawler.settings.get("BENCH_PROBE_FILE")
        if not path:
            raise NotConfigured("BENCH_PROBE_FILE is not set")
        probe = cls(crawler, Path(path))
        crawler.signals.connect(probe.response_received, signal=signals.response_received)
        crawler.signals.connect(probe.spider_closed, signal=signals.spider_closed)
        return probe

    def response_received(self, response: Any, request: Any, spider: Any) -> None:
        now, cpu = time.monotonic(), time.process_time()
        if self.first_response is None:
            self.first_response = now
            self.cpu_at_first_response = cpu
        self.last_response = now
        self.cpu_at_last_response = cpu
        self.responses += 1
        self.round_trips_at_last_response = RoundTrips.count
        if self.responses % PROGRESS_EVERY == 1:
            self.progress_path.write_text(str(self.responses))

    def spider_closed(self, spider: Any, reason: str) -> None:
        stats = self.crawler.stats
        assert stats is not None
        report = {
            "responses": self.responses,
            "first_response": self.first_response,
            "last_response": self.last_response,
            "round_trips_at_last_response": self.round_trips_at_last_response,
            "round_trips": RoundTrips.count,
            "cpu_s": self.cpu_at_last_response - self.cpu_at_first_response,
            "stats": {name: stats.get_value(name) for name in REPORTED_STATS},
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report))
        tmp.replace(self.path)


class IdlePoll:
    """Stay open while idle for MAX_IDLE_TIME_BEFORE_CLOSE s, polling the scheduler every 50 ms."""

    def __init__(self, crawler: Crawler, max_idle: float) -> None:
        self.crawler = crawler
        self.max_idle = max_idle
        self.idle_since: float | None = None
        self.pending: Any = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> IdlePoll:
        poller = cls(crawler, crawler.settings.getfloat("MAX_IDLE_TIME_BEFORE_CLOSE"))
        crawler.signals.connect(poller.spider_idle, signal=signals.spider_idle)
        crawler.signals.connect(poller.response_received, signal=signals.response_received)
        return poller

    def response_received(self, response: Any, request: Any, spider: Any) -> None:
        self.idle_since = None

    def spider_idle(self, spider: Any) -> None:
        now = time.monotonic()
        if self.idle_since is None:
            self.idle_since = now
        if now - self.idle_since >= self.max_idle:
            return
        if self.pending is None:
            self.pending = call_later(IDLE_POLL_S, self._wake)
        raise DontCloseSpider

    def _wake(self) -> None:
        self.pending = None
        engine = self.crawler.engine
        # the engine's own "look at the scheduler again" call (it runs every 5 s otherwise)
        slot = getattr(engine, "_slot", None)
        if slot is not None and slot.closing is None:
            slot.nextcall.schedule()
