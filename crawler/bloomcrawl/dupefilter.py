"""DUPEFILTER_CLASS = "bloomcrawl.dupefilter.RedisBloomDupeFilter".

Works under Scrapy's own scheduler (the filter outlives the process: a second
run only crawls what is new) and under ``scrapy_redis.scheduler.Scheduler``
as a drop-in replacement for scrapy_redis_bloomfilter's RFPDupeFilter.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from scrapy.dupefilters import BaseDupeFilter

from bloomcrawl import bloom, keys
from bloomcrawl.connection import (
    SettingError,
    get_float,
    get_int,
    get_optional_int,
    redis_from_settings,
)

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)


def filter_options(settings: BaseSettings) -> dict[str, Any]:
    """The BLOOMFILTER_* settings, checked; raises before anything touches Redis."""
    capacity = get_int(settings, "BLOOMFILTER_CAPACITY", bloom.DEFAULT_CAPACITY, minimum=1)
    error_rate = get_float(settings, "BLOOMFILTER_ERROR_RATE", bloom.DEFAULT_ERROR_RATE, 0, 1)
    bit_exponent = get_optional_int(settings, "BLOOMFILTER_BIT")
    hashes = get_optional_int(settings, "BLOOMFILTER_HASH_NUMBER")
    if (bit_exponent is None) != (hashes is None):
        # the seeds' recipe defaults the other one; so do we
        bit_exponent = 30 if bit_exponent is None else bit_exponent
        hashes = 6 if hashes is None else hashes
    options: dict[str, Any] = {
        "capacity": capacity,
        "error_rate": error_rate,
        "partitions": get_int(settings, "BLOOMFILTER_PARTITIONS", bloom.DEFAULT_PARTITIONS, 1),
        "growth": get_float(settings, "BLOOMFILTER_GROWTH", bloom.DEFAULT_GROWTH, 1, None),
        "tightening": get_float(settings, "BLOOMFILTER_TIGHTENING", bloom.DEFAULT_TIGHTENING,
                                0, 1),
        "bit_exponent": bit_exponent,
        "hashes": hashes,
        "backend": settings.get("BLOOMFILTER_BACKEND") or "auto",
    }
    if options["backend"] not in (*bloom.BACKENDS, "auto"):
        raise SettingError("BLOOMFILTER_BACKEND must be bitmap, redisbloom or auto, got %r"
                           % (options["backend"],))
    checked_backend = options["backend"] if options["backend"] != "auto" else "bitmap"
    tightening = (bloom.REDISBLOOM_TIGHTENING if checked_backend == "redisbloom"
                  else options["tightening"])
    try:
        if bit_exponent is not None and hashes is not None:
            bloom.FilterParams.fixed(bit_exponent, hashes, partitions=options["partitions"],
                                     growth=options["growth"], tightening=tightening,
                                     backend=checked_backend)
        else:
            bloom.FilterParams(capacity=capacity, error_rate=error_rate,
                               partitions=options["partitions"], growth=options["growth"],
                               tightening=tightening, backend=checked_backend)
    except bloom.InvalidFilterParameters as exc:
        raise SettingError("BLOOMFILTER_* settings: %s" % exc) from exc
    return options


def filter_key(settings: BaseSettings, spider_name: str) -> str:
    pattern = settings.get("BLOOMFILTER_KEY") or keys.DEFAULT_FILTER_KEY
    try:
        return keys.spider_key(pattern, spider_name)
    except (KeyError, ValueError, TypeError) as exc:
        raise SettingError("BLOOMFILTER_KEY %r: %s" % (pattern, exc)) from exc


def bloom_from_settings(server: Any, settings: BaseSettings, spider_name: str) -> bloom.BloomFilter:
    """Open (or create) the spider's filter as the BLOOMFILTER_* settings say."""
    return bloom.BloomFilter(server, filter_key(settings, spider_name), **filter_options(settings))


class RedisBloomDupeFilter(BaseDupeFilter):
    """Request duplicates filter backed by :class:`bloomcrawl.bloom.BloomFilter`."""

    def __init__(
        self,
        bloomfilter: bloom.BloomFilter,
        fingerprinter: Any,
        *,
        debug: bool = False,
        stats: StatsCollector | None = None,
    ) -> None:
        self.bloom = bloomfilter
        self.server = bloomfilter.server
        self.key = bloomfilter.key
        self.fingerprinter = fingerprinter
        self.debug = debug
        self.stats = stats
        self.logdupes = True

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisBloomDupeFilter:
        settings = crawler.settings
        name = crawler.spider.name if crawler.spider is not None else settings.get("BOT_NAME")
        filter_options(settings)
        filter_key(settings, name)
        server = redis_from_settings(settings)
        return cls(
            bloom_from_settings(server, settings, name),
            crawler.request_fingerprinter,
            debug=settings.getbool("DUPEFILTER_DEBUG"),
            stats=crawler.stats,
        )

    @classmethod
    def from_spider(cls, spider: Spider) -> RedisBloomDupeFilter:
        """What ``scrapy_redis.scheduler.Scheduler`` calls."""
        return cls.from_crawler(spider.crawler)

    def request_fingerprint(self, request: Request) -> bytes:
        fp: bytes = self.fingerprinter.fingerprint(request)
        return fp

    def request_seen(self, request: Request) -> bool:
        if request.dont_filter:
            return False
        seen = not self.bloom.add(self.request_fingerprint(request))
        if seen and self.stats is not None:
            self.stats.inc_value("bloomfilter/filtered")
        return seen

    def requests_seen(self, requests: Sequence[Request]) -> list[bool]:
        """:meth:`request_seen` for many requests in one round trip per partition."""
        todo = [i for i, r in enumerate(requests) if not r.dont_filter]
        answers = self.bloom.add_many([self.request_fingerprint(requests[i]) for i in todo])
        seen = [False] * len(requests)
        for i, new in zip(todo, answers, strict=True):
            seen[i] = not new
        dupes = len(todo) - sum(answers)
        if dupes and self.stats is not None:
            self.stats.inc_value("bloomfilter/filtered", dupes)
        return seen

    def log(self, request: Request, spider: Spider) -> None:
        if self.debug:
            logger.debug("Filtered duplicate request: %(request)s", {"request": request},
                         extra={"spider": spider})
        elif self.logdupes:
            logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be shown"
                " (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
                extra={"spider": spider},
            )
            self.logdupes = False
        if self.stats is not None:
            self.stats.inc_value("dupefilter/filtered")

    def clear(self) -> None:
        """Forget every fingerprint (scrapy-redis calls this unless SCHEDULER_PERSIST)."""
        self.bloom.clear()

    def close(self, reason: str = "") -> None:
        """The filter stays in Redis: that is what makes the next run incremental."""
