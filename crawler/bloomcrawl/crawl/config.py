"""Scrapy settings read once, checked, and turned into the library's plain values.

Only ``from_crawler`` methods call these. Every error is a
:class:`~bloomcrawl.core.errors.SettingError` naming the setting and its value,
raised before anything touches Redis (one value's checks:
:mod:`bloomcrawl.crawl.setting_values`). Defaults come from
:mod:`bloomcrawl.core.defaults`.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.connection import (
    cluster_url,
    is_cluster,
    ping,
    redis_errors,
    redis_from_url,
)
from bloomcrawl.core.errors import InvalidFilterParameters, SettingError
from bloomcrawl.core.politeness import Politeness, host_of
from bloomcrawl.core.sizing import (
    BACKENDS,
    MAX_GENERATIONS,
    PARTITION_BY,
    REDISBLOOM_TIGHTENING,
    FilterParams,
    shortest_window,
)
from bloomcrawl.crawl.setting_values import (
    get_bool,
    get_dict,
    get_duration,
    get_float,
    get_int,
    get_optional_int,
    get_windows,
)
from bloomcrawl.crawl.setting_values import parse_duration as parse_duration
from bloomcrawl.crawl.timing import MAX_LEASE

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

#: SCHEDULER_QUEUE_CLASS values (bloomcrawl's names and scrapy-redis's classes)
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


def redis_from_settings(settings: BaseSettings) -> Any:
    """A client for REDIS_URL or REDIS_CLUSTER_NODES (plus REDIS_PARAMS), checked with a PING."""
    nodes = settings.get("REDIS_CLUSTER_NODES")
    if nodes:
        if settings.get("REDIS_URL"):
            raise SettingError("set REDIS_URL or REDIS_CLUSTER_NODES, not both")
        url = cluster_url(nodes)
    else:
        url = settings.get("REDIS_URL") or defaults.REDIS_URL
    params = get_dict(settings, "REDIS_PARAMS")
    params.pop("decode_responses", None)
    client = redis_from_url(url, **params)
    ping(client)
    return client


def spider_key(settings: BaseSettings, name: str, default: str, spider: str) -> str:
    """The key a ``%(spider)s`` pattern setting names for ``spider``."""
    pattern = settings.get(name) or default
    try:
        return keys.spider_key(pattern, spider)
    except (KeyError, ValueError, TypeError) as exc:
        raise SettingError("%s %r: %s" % (name, pattern, exc)) from exc


@dataclass(frozen=True)
class FilterConfig:
    """The BLOOMFILTER_* settings, checked: how to open a spider's filter.

    An existing filter is opened with the parameters stored with it: sizing
    settings that differ (BLOOMFILTER_CAPACITY, _ERROR_RATE, _GROWTH,
    _TIGHTENING, _INITIAL_CAPACITY, _BIT, _HASH_NUMBER) are logged once; BLOOMFILTER_STRICT_PARAMS
    makes them an error, as other partitions, partitioning or backend always are.
    """

    key_pattern: str
    capacity: int
    error_rate: float
    #: None: BLOOMFILTER_PARTITIONS not set (see :func:`default_partitions`)
    partitions: int | None
    growth: float
    tightening: float
    bit_exponent: int | None
    hashes: int | None
    backend: str
    #: None: what an existing filter has, "host" for a new one
    partition_by: str | None = None
    #: BLOOMFILTER_STRICT_PARAMS: a filter stored with other sizing is an error
    strict_params: bool = defaults.FILTER_STRICT_PARAMS
    #: BLOOMFILTER_REVISIT_AFTER in seconds: a URL is new again after it (0: never)
    revisit_after: float = defaults.FILTER_REVISIT_AFTER
    #: BLOOMFILTER_GENERATIONS: a revisit window forgets W to W (1 + 1/g) after
    generations: int = defaults.FILTER_GENERATIONS
    #: BLOOMFILTER_REVISIT_WINDOWS: named windows, (name, seconds) sorted by name
    windows: tuple[tuple[str, float], ...] = ()
    #: BLOOMFILTER_INITIAL_CAPACITY: URLs a new filter's first slices hold, all partitions
    initial_capacity: int | None = None

    @classmethod
    def from_settings(cls, settings: BaseSettings, spider: str | None = None) -> FilterConfig:
        """Check the settings (the key pattern against ``spider``'s name when known)."""
        key_pattern = settings.get("BLOOMFILTER_KEY") or defaults.FILTER_KEY
        if spider is not None:
            spider_key(settings, "BLOOMFILTER_KEY", defaults.FILTER_KEY, spider)
        capacity = get_int(settings, "BLOOMFILTER_CAPACITY", defaults.FILTER_CAPACITY, 1)
        error_rate = get_float(settings, "BLOOMFILTER_ERROR_RATE", defaults.FILTER_ERROR_RATE,
                               0, 1)
        # FilterParams' ranges, checked here: FilterParams.fixed computes with them first
        bit_exponent = get_optional_int(settings, "BLOOMFILTER_BIT", 10, 40)
        hashes = get_optional_int(settings, "BLOOMFILTER_HASH_NUMBER", 1, 64)
        if (bit_exponent is None) != (hashes is None):
            # the seeds' recipe defaults the other one; so do we
            bit_exponent = defaults.SEEDS_BIT_EXPONENT if bit_exponent is None else bit_exponent
            hashes = defaults.SEEDS_HASHES if hashes is None else hashes
        backend = settings.get("BLOOMFILTER_BACKEND") or defaults.FILTER_BACKEND
        if backend not in (*BACKENDS, "auto"):
            raise SettingError("BLOOMFILTER_BACKEND must be bitmap, redisbloom or auto, got %r"
                               % (backend,))
        initial_capacity = get_optional_int(settings, "BLOOMFILTER_INITIAL_CAPACITY", minimum=1)
        if initial_capacity is not None and bit_exponent is not None:
            raise SettingError("BLOOMFILTER_INITIAL_CAPACITY sizes the first slice of a filter"
                               " that grows, not of one that BLOOMFILTER_BIT sizes")
        partition_by = settings.get("BLOOMFILTER_PARTITION_BY") or None
        if partition_by is not None and partition_by not in PARTITION_BY:
            raise SettingError("BLOOMFILTER_PARTITION_BY must be host or fingerprint, got %r"
                               % (partition_by,))
        config = cls(
            key_pattern=key_pattern,
            capacity=capacity,
            error_rate=error_rate,
            partitions=get_optional_int(settings, "BLOOMFILTER_PARTITIONS", 1, 16384),
            growth=get_float(settings, "BLOOMFILTER_GROWTH", defaults.FILTER_GROWTH, 1, None),
            tightening=get_float(settings, "BLOOMFILTER_TIGHTENING",
                                 defaults.FILTER_TIGHTENING, 0, 1),
            bit_exponent=bit_exponent,
            hashes=hashes,
            backend=backend,
            partition_by=partition_by,
            strict_params=get_bool(settings, "BLOOMFILTER_STRICT_PARAMS",
                                   defaults.FILTER_STRICT_PARAMS),
            revisit_after=get_duration(settings, "BLOOMFILTER_REVISIT_AFTER",
                                       defaults.FILTER_REVISIT_AFTER),
            generations=get_int(settings, "BLOOMFILTER_GENERATIONS",
                                defaults.FILTER_GENERATIONS, 1, MAX_GENERATIONS),
            windows=get_windows(settings, "BLOOMFILTER_REVISIT_WINDOWS"),
            initial_capacity=initial_capacity,
        )
        config.check()
        return config

    def check(self) -> None:
        """Validate the parameters as the filter would, naming the settings."""
        concrete = self.backend if self.backend != "auto" else "bitmap"
        tightening = REDISBLOOM_TIGHTENING if concrete == "redisbloom" else self.tightening
        common: dict[str, Any] = dict(partitions=self.partitions or defaults.FILTER_PARTITIONS,
                                      growth=self.growth,
                                      tightening=tightening, backend=concrete,
                                      revisit_after=self.revisit_after,
                                      generations=self.generations, windows=self.windows)
        try:
            if self.bit_exponent is not None and self.hashes is not None:
                params = FilterParams.fixed(self.bit_exponent, self.hashes, **common)
            else:
                params = FilterParams(capacity=self.capacity, error_rate=self.error_rate,
                                      initial_capacity=self.first_slice(common["partitions"]),
                                      **common)
        except InvalidFilterParameters as exc:
            raise SettingError("BLOOMFILTER_* settings: %s" % exc) from exc
        try:  # values in range, but beyond what the slices' arithmetic can size
            params.plan()
        except (ArithmeticError, ValueError) as exc:
            raise SettingError(
                "BLOOMFILTER_* settings: no filter can be sized with BLOOMFILTER_ERROR_RATE=%r,"
                " BLOOMFILTER_GROWTH=%r, BLOOMFILTER_TIGHTENING=%r (%s)"
                % (self.error_rate, self.growth, self.tightening, exc)) from exc

    def first_slice(self, partitions: int) -> int | None:
        """Items each partition's first slice holds (None: not set, the filter's own)."""
        return None if self.initial_capacity is None else -(-self.initial_capacity // partitions)

    def shortest_window(self) -> float:
        """The shortest revisit window in seconds that forgets (0: nothing forgets)."""
        return shortest_window(self.revisit_after, self.windows)

    def key(self, spider: str) -> str:
        try:
            return keys.spider_key(self.key_pattern, spider)
        except (KeyError, ValueError, TypeError) as exc:
            raise SettingError("BLOOMFILTER_KEY %r: %s" % (self.key_pattern, exc)) from exc

    def open(self, server: Any, spider: str) -> BloomFilter:
        """Open (or create) ``spider``'s filter, with the parameters stored with it."""
        key = self.key(spider)
        partitions = self.partitions
        if partitions is None:
            partitions = default_partitions(server, key)
        return BloomFilter(
            server, key, self.capacity, self.error_rate, partitions=partitions,
            growth=self.growth, tightening=self.tightening, bit_exponent=self.bit_exponent,
            hashes=self.hashes, backend=self.backend, partition_by=self.partition_by,
            strict_params=self.strict_params, revisit_after=self.revisit_after,
            generations=self.generations, windows=dict(self.windows),
            initial_capacity=self.first_slice(partitions))


def default_partitions(server: Any, key: str) -> int:
    """BLOOMFILTER_PARTITIONS when not set: enough to spread over a Redis Cluster's masters.

    The partitions an existing filter has, else on one Redis
    :data:`~bloomcrawl.core.defaults.FILTER_PARTITIONS`, and on a Redis Cluster
    :data:`~bloomcrawl.core.defaults.CLUSTER_PARTITIONS_PER_MASTER` per master
    (each partition is one slot; slots are spread by hash, so a few per
    master even out, and the cluster can later grow to that many masters).
    """
    with redis_errors(server):
        raw = server.hget(keys.meta_key(key), "params")
        if raw is not None:
            try:
                return int(json.loads(raw)["partitions"])
            except (ValueError, KeyError, TypeError):
                pass  # unreadable: the filter names the problem when it opens
        if not is_cluster(server):
            return defaults.FILTER_PARTITIONS
        masters = len(server.get_primaries())
    return max(defaults.FILTER_PARTITIONS, defaults.CLUSTER_PARTITIONS_PER_MASTER * masters)


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


@dataclass(frozen=True)
class FrontierConfig:
    """The SCHEDULER_* settings, checked."""

    queue_pattern: str = defaults.QUEUE_KEY
    queue_type: str = defaults.QUEUE_TYPE
    persist: bool = defaults.SCHEDULER_PERSIST
    flush_on_start: bool = defaults.SCHEDULER_FLUSH_ON_START
    lease_timeout: float = defaults.LEASE_TIMEOUT
    reap_interval: float = defaults.REAP_INTERVAL
    max_idle: float = defaults.MAX_IDLE_TIME_BEFORE_CLOSE
    prefetch: int = defaults.PREFETCH
    seen_cache: int = defaults.SEEN_CACHE
    allow_eviction: bool = defaults.REDIS_ALLOW_EVICTION
    #: Scrapy's CONCURRENT_REQUESTS: how many leases the engine can use at once
    concurrency: int = 16
    #: FRONTIER_STRICT: a request the frontier cannot share closes the spider
    strict: bool = defaults.FRONTIER_STRICT
    #: FRONTIER_CRAWL_ID: the crawl this worker joins ("": the one recorded in Redis)
    crawl_id: str = ""

    @classmethod
    def from_settings(cls, settings: BaseSettings, spider: str | None) -> FrontierConfig:
        queue_pattern = settings.get("SCHEDULER_QUEUE_KEY") or defaults.QUEUE_KEY
        if spider is not None:
            spider_key(settings, "SCHEDULER_QUEUE_KEY", defaults.QUEUE_KEY, spider)
        concurrency = get_int(settings, "CONCURRENT_REQUESTS", 16, minimum=1)
        return cls(
            queue_pattern=queue_pattern,
            queue_type=queue_type_from_settings(
                settings.get("SCHEDULER_QUEUE_CLASS") or defaults.QUEUE_TYPE),
            persist=get_bool(settings, "SCHEDULER_PERSIST", defaults.SCHEDULER_PERSIST),
            flush_on_start=get_bool(settings, "SCHEDULER_FLUSH_ON_START",
                                    defaults.SCHEDULER_FLUSH_ON_START),
            lease_timeout=get_lease_timeout(settings),
            reap_interval=get_float(settings, "SCHEDULER_REAP_INTERVAL",
                                    defaults.REAP_INTERVAL, 0, None),
            max_idle=get_float(settings, "MAX_IDLE_TIME_BEFORE_CLOSE",
                               defaults.MAX_IDLE_TIME_BEFORE_CLOSE, -1e-9, None),
            prefetch=get_prefetch(settings, concurrency),
            seen_cache=get_int(settings, "SCHEDULER_SEEN_CACHE", defaults.SEEN_CACHE,
                               minimum=0),
            allow_eviction=get_bool(settings, "REDIS_ALLOW_EVICTION",
                                    defaults.REDIS_ALLOW_EVICTION),
            concurrency=concurrency,
            strict=get_bool(settings, "FRONTIER_STRICT", defaults.FRONTIER_STRICT),
            crawl_id=str(settings.get("FRONTIER_CRAWL_ID") or ""),
        )


def get_lease_timeout(settings: BaseSettings) -> float:
    """SCHEDULER_LEASE_TIMEOUT: seconds a leased request may go unacked, > 0."""
    return get_float(settings, "SCHEDULER_LEASE_TIMEOUT", defaults.LEASE_TIMEOUT, 0, None)


def get_prefetch(settings: BaseSettings, concurrency: int) -> int:
    """SCHEDULER_PREFETCH: 1 up to CONCURRENT_REQUESTS or MAX_LEASE, whichever is more.

    More is leased as that most, and logged once: the engine runs
    CONCURRENT_REQUESTS at once, and a lease beyond that leaves requests waiting
    in this worker, each keeping a slot of its host, cluster-wide, from every
    other worker; and one script leases them all, Redis serving no other client
    until it ends. Jobs that set more ran before: they run on, leasing less.
    """
    most = max(concurrency, MAX_LEASE)
    prefetch = get_int(settings, "SCHEDULER_PREFETCH", defaults.PREFETCH, minimum=1)
    if prefetch > most:
        logger.warning(
            "SCHEDULER_PREFETCH=%r is more than a worker can use: it leases at most %d a call"
            " (CONCURRENT_REQUESTS or %d, whichever is more); requests leased beyond what"
            " the engine runs at once would wait in this worker, keeping their hosts' slots"
            " from every other worker", settings.get("SCHEDULER_PREFETCH"), most, MAX_LEASE)
        return most
    return prefetch


def politeness_from_settings(settings: BaseSettings, spider: Any = None) -> Politeness:
    """Scrapy's own politeness settings, as one budget per host for the whole cluster.

    DOWNLOAD_DELAY (or the spider's ``download_delay``), CONCURRENT_REQUESTS_PER_DOMAIN
    (or its ``max_concurrent_requests``), the delay's jitter (DOWNLOAD_DELAY_JITTER, or
    RANDOMIZE_DOWNLOAD_DELAY's ±50 %), DOWNLOAD_SLOTS per host, and AUTOTHROTTLE_*.
    """
    delay_raw = getattr(spider, "download_delay", None)
    if delay_raw is None:
        delay = get_float(settings, "DOWNLOAD_DELAY", 0.0)
    else:
        try:
            delay = float(delay_raw)
        except (TypeError, ValueError, OverflowError):
            raise SettingError("the spider's download_delay must be a number, got %r"
                               % (delay_raw,)) from None
    if not 0 <= delay < math.inf:
        raise SettingError("%s must be a finite number >= 0, got %r" % (
            "DOWNLOAD_DELAY" if delay_raw is None else "the spider's download_delay", delay))
    concurrency = get_int(settings, "CONCURRENT_REQUESTS_PER_DOMAIN", 8, minimum=1)
    own = getattr(spider, "max_concurrent_requests", None)
    if own is not None:
        if isinstance(own, bool) or not isinstance(own, int) or own < 1:
            raise SettingError("the spider's max_concurrent_requests must be an integer >= 1,"
                               " got %r" % (own,))
        concurrency = own
    randomize_priority = settings.getpriority("RANDOMIZE_DOWNLOAD_DELAY") or 0
    jitter_priority = settings.getpriority("DOWNLOAD_DELAY_JITTER") or 0
    if settings.get("DOWNLOAD_DELAY_JITTER") is not None and jitter_priority >= randomize_priority:
        jitter = get_float(settings, "DOWNLOAD_DELAY_JITTER", 0.5)
        if not 0 <= jitter <= 1:
            raise SettingError("DOWNLOAD_DELAY_JITTER must be in [0, 1], got %r" % (jitter,))
    else:
        jitter = 0.5 if get_bool(settings, "RANDOMIZE_DOWNLOAD_DELAY", True) else 0.0
    slots = []
    for host, entry in get_dict(settings, "DOWNLOAD_SLOTS").items():
        if not isinstance(entry, dict):
            raise SettingError("DOWNLOAD_SLOTS[%r] must be a dict, got %r" % (host, entry))
        slot_delay = entry.get("delay")
        slot_conc = entry.get("concurrency")
        try:
            slot_delay = None if slot_delay is None else float(slot_delay)
            slot_conc = None if slot_conc is None else int(slot_conc)
        except (TypeError, ValueError, OverflowError):
            raise SettingError("DOWNLOAD_SLOTS[%r]: delay must be a number and concurrency an"
                               " integer, got %r" % (host, entry)) from None
        if (slot_delay is not None and not 0 <= slot_delay < math.inf) or (
                slot_conc is not None and slot_conc < 1):
            raise SettingError("DOWNLOAD_SLOTS[%r]: delay must be a finite number >= 0 and"
                               " concurrency >= 1, got %r" % (host, entry))
        slots.append((host_of("http://%s/" % host) or str(host), slot_delay, slot_conc))
    autothrottle = None
    if get_bool(settings, "AUTOTHROTTLE_ENABLED", False):
        start = get_float(settings, "AUTOTHROTTLE_START_DELAY", 5.0)
        most = get_float(settings, "AUTOTHROTTLE_MAX_DELAY", 60.0)
        target = get_float(settings, "AUTOTHROTTLE_TARGET_CONCURRENCY", 1.0, 0, None)
        if start < 0 or most < 0:
            raise SettingError("AUTOTHROTTLE_START_DELAY and AUTOTHROTTLE_MAX_DELAY must be"
                               " >= 0, got %r and %r" % (start, most))
        autothrottle = (start, most, target)
    return Politeness(delay=delay, concurrency=concurrency, jitter=jitter, slots=tuple(slots),
                      autothrottle=autothrottle)


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


def unused_settings(settings: Any) -> list[str]:
    """What the project set that the shared frontier does not use, to be logged once."""
    notes = []
    jobdir = settings.get("JOBDIR")
    if jobdir:
        notes.append("JOBDIR is set (%s), but this crawl's queue and filter are in Redis:"
                      " a worker resumes from there, not from JOBDIR. Scrapy still keeps the"
                      " spider's state (spider.state) in it, one file for every worker that"
                      " shares the directory" % jobdir)
    if settings.get("SCHEDULER_SERIALIZER"):
        notes.append("SCHEDULER_SERIALIZER is not used: the queue's entries are JSON that"
                     " bloomcrawl reads and writes itself (no pickle)")
    return notes
