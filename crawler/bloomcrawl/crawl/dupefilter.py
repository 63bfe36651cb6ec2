"""DUPEFILTER_CLASS = "bloomcrawl.crawl.dupefilter.RedisBloomDupeFilter".

Works under Scrapy's own scheduler (the filter outlives the process: a second
run only crawls what is new) and under ``scrapy_redis.scheduler.Scheduler``
as a drop-in replacement for scrapy_redis_bloomfilter's RFPDupeFilter.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from scrapy.dupefilters import BaseDupeFilter

from bloomcrawl.core.bloom import normalise_fingerprint
from bloomcrawl.core.errors import SettingError
from bloomcrawl.core.politeness import filter_fingerprint, host_of
from bloomcrawl.crawl.config import FilterConfig, redis_from_settings
from bloomcrawl.crawl.windows import RevisitWindows

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.request import RequestFingerprinterProtocol

    from bloomcrawl.core.bloom import BloomFilter


logger = logging.getLogger(__name__)


class RedisBloomDupeFilter(BaseDupeFilter):
    """Request duplicates filter backed by :class:`bloomcrawl.core.bloom.BloomFilter`.

    Settings: REDIS_URL, REDIS_PARAMS, DUPEFILTER_DEBUG and the BLOOMFILTER_*
    settings (BLOOMFILTER_KEY, default ``%(spider)s:bloomfilter``).
    """

    def __init__(
        self,
        bloomfilter: BloomFilter,
        fingerprinter: RequestFingerprinterProtocol,
        *,
        debug: bool = False,
        stats: StatsCollector | None = None,
        spider: Spider | None = None,
    ) -> None:
        self.bloom = bloomfilter
        # a call sent again after its reply was lost answers what it first decided: a new
        # request is never dropped as seen because its own lost call added it
        bloomfilter.record_calls()
        self.server = bloomfilter.server
        self.key = bloomfilter.key
        self.fingerprinter = fingerprinter
        self.debug = debug
        self.stats = stats
        self.logdupes = True
        #: which revisit window a request goes in (meta["revisit"], the spider's default)
        self.windows = RevisitWindows(bloomfilter.params, spider)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisBloomDupeFilter:
        settings = crawler.settings
        name = crawler.spider.name if crawler.spider is not None else settings.get("BOT_NAME")
        config = FilterConfig.from_settings(settings, name)
        server = redis_from_settings(settings)
        return cls(
            config.open(server, name),
            crawler.request_fingerprinter,
            debug=settings.getbool("DUPEFILTER_DEBUG"),
            stats=crawler.stats,
            spider=crawler.spider,
        )

    @classmethod
    def from_spider(cls, spider: Spider) -> RedisBloomDupeFilter:
        """What ``scrapy_redis.scheduler.Scheduler`` calls."""
        return cls.from_crawler(spider.crawler)

    def request_fingerprint(self, request: Request) -> bytes:
        """The filter's fingerprint: on a host-partitioned filter, bytes 17-20 are the host's
        (in a named revisit window, mixed with its name)."""
        return self._fingerprint(request)[0]

    def _fingerprint(self, request: Request) -> tuple[bytes, str | None]:
        """The filter's fingerprint and the request's window (None: the default one)."""
        fp = normalise_fingerprint(self.fingerprinter.fingerprint(request))
        fp, flag, name = self.windows.fingerprint(fp, request)
        window = None if flag == "0" else name
        return (filter_fingerprint(fp, host_of(request.url), self.bloom.params.partition_by),
                window)

    def request_seen(self, request: Request) -> bool:
        if request.dont_filter:
            return False
        seen = not self.bloom.add(*self._fingerprint(request))
        if seen and self.stats is not None:
            self.stats.inc_value("bloomfilter/filtered")
        return seen

    def requests_seen(self, requests: Sequence[Request]) -> list[bool]:
        """:meth:`request_seen` for many requests in one round trip per partition."""
        todo = [i for i, r in enumerate(requests) if not r.dont_filter]
        pairs = [self._fingerprint(requests[i]) for i in todo]
        named = any(window is not None for _, window in pairs)
        answers = self.bloom.add_many([fp for fp, _ in pairs],
                                      [window for _, window in pairs] if named else None)
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


#: duplicate filters that decide by fingerprint alone: under bloomcrawl's scheduler the
#: cluster's Bloom filter does their work, so they are not called
FINGERPRINT_ONLY = frozenset({
    "scrapy.dupefilters.BaseDupeFilter", "scrapy.dupefilters.RFPDupeFilter",
    "bloomcrawl.crawl.dupefilter.RedisBloomDupeFilter", "scrapy_redis.dupefilter.RFPDupeFilter",
})


def project_dupefilter(crawler: Crawler) -> BaseDupeFilter | None:
    """The project's own DUPEFILTER_CLASS, built as Scrapy's scheduler builds it, when it
    decides more than a fingerprint seen before (a subclass with its own ``request_seen``,
    say): bloomcrawl's scheduler asks it first, and drops what it says was seen. None
    for the filters of :data:`FINGERPRINT_ONLY`."""
    from scrapy.utils.misc import build_from_crawler, load_object

    setting = crawler.settings.get("DUPEFILTER_CLASS")
    cls = load_object(setting) if isinstance(setting, str) else setting
    if cls is None or "%s.%s" % (cls.__module__, cls.__qualname__) in FINGERPRINT_ONLY:
        return None
    if issubclass(cls, RedisBloomDupeFilter):
        # its request_seen() would mark in the Bloom filter what the frontier then finds
        # seen, and drop every request
        raise SettingError(
            "DUPEFILTER_CLASS %s.%s subclasses RedisBloomDupeFilter, which bloomcrawl's"
            " scheduler cannot ask first: drop requests of your own in a downloader"
            " middleware's process_request (raise IgnoreRequest), or subclass Scrapy's"
            " RFPDupeFilter" % (cls.__module__, cls.__qualname__))
    dupefilter: BaseDupeFilter = build_from_crawler(cls, crawler)
    logger.info("DUPEFILTER_CLASS %s.%s is asked first: what its request_seen() drops is"
                " dropped (in this worker), the rest goes through the cluster's Bloom"
                " filter", cls.__module__, cls.__qualname__)
    return dupefilter
