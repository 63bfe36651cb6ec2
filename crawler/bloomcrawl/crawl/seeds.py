"""Start URLs from ``<spider>:start_urls``, leased like requests, acked once queued.

Each entry (a URL, or JSON ``{"url", "meta", "priority", "dont_filter"}``,
checked by :func:`bloomcrawl.core.start_entries.parse_start_entry`) is leased; the
request the spider makes of it (``make_request_from_start_entry`` when the
spider has one) is enqueued, and the lease acked once the exchange carrying
that request went through. A worker that dies in between leaves the lease to
expire: the entry goes back to the list. A bad entry is logged, counted and
acked; the others of its batch are queued.

A spider written for scrapy-redis (``RedisSpider``, ``RedisCrawlSpider``: it has
``redis_key`` and ``make_request_from_data``) keeps its own list and its own
format: its ``redis_key`` is the list leased, each entry goes to its
``make_request_from_data`` as scrapy-redis gives it (the raw bytes: a URL, or
scrapy-redis's JSON ``{"url", "meta", "method", ...}``, or whatever an override
reads), and every request that returns is queued. scrapy-redis's own reader of
that list is switched off (:func:`take_over_reader`), so each entry is leased
once, whichever worker reads it. A start key kept as a set or a sorted set
(``REDIS_START_URLS_AS_SET``/``AS_ZSET``) is left to scrapy-redis's reader.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.spiders import SitemapSpider
from twisted.internet.defer import succeed

from bloomcrawl.core import keys
from bloomcrawl.core.connection import REDIS_ERRORS
from bloomcrawl.core.frontier import RENEW
from bloomcrawl.core.scripts import Script, ScriptCall, run_scripts
from bloomcrawl.core.start_entries import check_seed, parse_start_entry
from bloomcrawl.crawl.lease import HOLD_META_KEY

if TYPE_CHECKING:
    import redis
    from scrapy import Spider
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.defer import Deferred
    from twisted.python.failure import Failure

    from bloomcrawl.core.frontier import Frontier
    from bloomcrawl.crawl.outbox import Outbox
    from bloomcrawl.crawl.redis_io import RedisIO

logger = logging.getLogger(__name__)

BATCH = 100
#: start URLs found filtered that are logged one by one; the rest are counted only
FILTERED_LOGGED = 20

_CRAWL_ID = Script("crawl_id.lua")


def is_scrapy_redis_spider(spider: Spider) -> bool:
    """A spider of scrapy-redis's RedisMixin: it reads its start URLs from ``redis_key``."""
    return hasattr(spider, "redis_key") and callable(getattr(spider, "make_request_from_data",
                                                             None))


def scrapy_redis_start_key(spider: Spider, settings: Any) -> str | None:
    """The list a scrapy-redis spider reads its start URLs from; None when its start key
    is a set or a sorted set (scrapy-redis's reader keeps it) or it is no such spider."""
    if not is_scrapy_redis_spider(spider):
        return None
    if (settings.getbool("REDIS_START_URLS_AS_SET")
            or settings.getbool("REDIS_START_URLS_AS_ZSET")):
        return None
    key = (getattr(spider, "redis_key", None) or settings.get("REDIS_START_URLS_KEY")
           or "%(name)s:start_urls")
    key = str(key) % {"name": spider.name}  # setup_redis has done it, unless not run yet
    keys.check_key(key)
    return key


def claim_start_list(frontier: Frontier, spider: Spider,
                     settings: Any) -> tuple[bool, keys.FrontierKeys | None]:
    """Point ``frontier`` at the list the spider's start URLs come from; returns what
    :class:`StartUrls` takes: whether it reads that list (not when scrapy-redis keeps a
    start set or sorted set), and the keys of ``<spider>:start_urls`` when that is
    another list, whose entries are then moved to it."""
    extra = {"spider": spider}
    start_key = scrapy_redis_start_key(spider, settings)
    if start_key is None:
        if is_scrapy_redis_spider(spider):
            logger.info("start URLs of a set or sorted set (REDIS_START_URLS_AS_SET/AS_ZSET)"
                        " are read by scrapy-redis, not leased", extra=extra)
            return False, None
        return True, None
    default = frontier.keys.start_urls
    frontier.keys.use_start_urls(start_key)
    take_over_reader(spider)
    logger.info("start URLs of %s are leased by the scheduler and made by the spider's"
                " make_request_from_data", start_key, extra=extra)
    return True, None if start_key == default else keys.FrontierKeys(spider.name)


def take_over_reader(spider: Spider) -> None:
    """Switch off scrapy-redis's own reader of the spider's start list: its
    ``start_requests`` and ``spider_idle`` then pop nothing, and the scheduler's
    leased reader is the only one (scrapy-redis's idle handling, ``MAX_IDLE_TIME_BEFORE_CLOSE``,
    stays as it was)."""
    spider.fetch_data = _nothing  # type: ignore[attr-defined]


def _nothing(key: Any, batch_size: Any) -> list[bytes]:
    return []


class StartHolds:
    """Start entries whose requests this worker crawls itself (the frontier cannot share
    them: :meth:`~bloomcrawl.crawl.intake.Intake.enqueue`). An entry's lease is kept, and
    renewed with the worker's leases, until they are done; then it is acked after the next
    exchange, which carries what they yielded. A worker that closes first gives the lease
    back, and one killed leaves it to expire: the entry goes back to the list."""

    def __init__(self) -> None:
        self._token_of: dict[int, str] = {}  # hold number -> the entry's lease token
        self._left: dict[str, int] = {}  # lease token -> its held requests not done

    def add(self, token: str, hold: int) -> None:
        if hold not in self._token_of:
            self._token_of[hold] = token
            self._left[token] = self._left.get(token, 0) + 1

    def done(self, hold: int) -> str | None:
        """The token whose last held request this was (None: another is not done yet,
        or the hold is no start entry's)."""
        token = self._token_of.pop(hold, None)
        if token is None:
            return None
        self._left[token] -= 1
        if self._left[token]:
            return None
        del self._left[token]
        return token

    def tokens(self) -> list[str]:
        return list(self._left)

    def clear(self) -> list[str]:
        tokens = list(self._left)
        self._token_of.clear()
        self._left.clear()
        return tokens


def renew_start_leases(frontier: Frontier, tokens: list[str]) -> list[str]:
    """Extend the start leases ``tokens`` (as :meth:`Frontier.renew` does leases); returns
    those that were lost (expired and put back in the list)."""
    if not tokens:
        return []
    call = ScriptCall(RENEW, [frontier.keys.start_deadlines],
                      [frontier.lease_ms, *tokens])
    return [token.decode() for token in frontier.bloom.run_scripts([call])[0]]


def give_back_start_leases(frontier: Frontier, tokens: list[str]) -> None:
    """Closing with held start requests not done: their entries go back to the list at the
    next read (their leases' deadline is now), for whichever worker reads it."""
    if tokens:
        frontier.server.zadd(frontier.keys.start_deadlines, dict.fromkeys(tokens, 0), xx=True)


class StartUrls:
    def __init__(self, io: RedisIO, frontier: Frontier, outbox: Outbox, spider: Spider,
                 stats: StatsCollector, enqueue: Callable[[Request], bool], *,
                 enabled: bool = True, forward_from: keys.FrontierKeys | None = None) -> None:
        self.io = io
        self.frontier = frontier
        self.outbox = outbox
        self.spider = spider
        self.stats = stats
        self.enqueue = enqueue
        #: False: another reader has the start key (a scrapy-redis set or sorted set)
        self.enabled = enabled
        #: entries go to the spider's make_request_from_data (scrapy-redis's format)
        self.from_data = is_scrapy_redis_spider(spider)
        #: the keys of ``<spider>:start_urls`` when the spider reads another list: what
        #: ``bloomcrawl seed`` or ``crawl`` pushed there before any worker of the spider
        #: recorded its list is moved to it (:meth:`_forward`)
        self.forward_from = forward_from
        # start URLs found filtered so far (the first FILTERED_LOGGED are logged)
        self._filtered = 0
        self.holds = StartHolds()

    def hold_done(self, hold: int) -> None:
        """A request this worker held is done (its outcome is final): the last of a start
        entry's acks the entry, after the exchange that carries what it yielded."""
        token = self.holds.done(hold)
        if token is not None:
            self.outbox.start_waiting(token)

    def read(self) -> Deferred[int]:
        """Lease the next batch of entries (and ack those whose requests were sent).

        Fires with how many entries were read; on a Redis failure the acks go
        back to the outbox and the failure is passed on.
        """
        if not self.enabled:
            return succeed(0)
        acks = self.outbox.take_start_acks()
        d = self.io.run(self._take, acks)
        d.addCallbacks(self._got, self._failed, errbackArgs=(acks,))
        return d

    def _take(self, acks: list[str]) -> list[tuple[str, bytes]]:
        if self.forward_from is not None:
            self._forward(self.forward_from)
        return self.frontier.take_start_entries(BATCH, acks)

    def _forward(self, source: keys.FrontierKeys) -> None:
        """Move ``source``'s entries to the spider's list: leased there, pushed here, then
        acked. A worker that dies in between leaves them to go back to ``source`` (or,
        pushed already, to be read twice: their requests are then filtered, or queued
        twice if the spider made them ``dont_filter``)."""
        frontier = self.frontier
        taken = frontier.take_start_entries(BATCH, (), source=source)
        if not taken:
            return
        frontier.server.rpush(frontier.keys.start_urls, *[entry for _, entry in taken])
        frontier.take_start_entries(0, [token for token, _ in taken], source=source)
        logger.info("moved %d start URL entr%s from %s to %s, the list this spider reads",
                    len(taken), "y" if len(taken) == 1 else "ies", source.start_urls,
                    frontier.keys.start_urls, extra={"spider": self.spider})

    def _got(self, entries: list[tuple[str, bytes]]) -> int:
        for token, raw in entries:
            self._queue(token, raw)
        return len(entries)

    def _failed(self, failure: Failure, acks: list[str]) -> Failure:
        self.outbox.give_back_start_acks(acks)
        return failure

    def _queue(self, token: str, raw: bytes) -> None:
        """Queue the requests an entry makes; its lease is acked once they are sent."""
        try:
            if self.from_data:
                requests = self.requests_from_data(raw)
            else:
                requests = [self.make_request(parse_start_entry(raw))]
        except Exception as exc:  # one poisoned seed must not stop the others
            logger.warning("bad start URL entry %r in %s: %s", raw[:200],
                           self.frontier.keys.start_urls, exc, extra={"spider": self.spider})
            self.stats.inc_value("bloomcrawl/bad_start_urls")
            self.outbox.count("bad_start_urls")
            self.outbox.start_done(token)
            return
        queued = held = 0
        for request in requests:
            since = self.outbox.requests()
            if self.enqueue(request):
                hold = request.meta.get(HOLD_META_KEY)
                if hold is not None:  # this worker crawls it: the entry waits for it
                    self.holds.add(token, hold[1])
                    held += 1
                else:
                    queued += 1
                    self.outbox.watch_seeds(since, request.url)
            else:
                self.filtered(request.url)  # this worker sent its fingerprint before
        if held:
            return  # acked when they are done (hold_done)
        if queued:
            # the exchange that carries the last of them acks the entry (one that an
            # earlier exchange already carried is safe in Redis by then)
            self.outbox.start_waiting(token)
        else:
            self.outbox.start_done(token)

    def filtered(self, url: str) -> None:
        """A start URL's request was not queued: the filter has its fingerprint (crawled
        or queued before). Said in the log, since nothing else happens: the first
        FILTERED_LOGGED each, then counted only."""
        self.stats.inc_value("bloomcrawl/start_urls_filtered")
        self._filtered += 1
        if self._filtered <= FILTERED_LOGGED:
            logger.info("start URL %s from %s not queued: the Bloom filter has seen it"
                        " (crawled or queued before). To crawl it again, push"
                        ' {"url": "%s", "dont_filter": true}%s', url,
                        self.frontier.keys.start_urls, url,
                        "; further ones are counted in bloomcrawl/start_urls_filtered"
                        if self._filtered == FILTERED_LOGGED else "",
                        extra={"spider": self.spider})

    def requests_from_data(self, raw: bytes) -> list[Request]:
        """What a scrapy-redis spider's ``make_request_from_data`` makes of an entry: a
        request, several, or none (scrapy-redis skips such an entry too)."""
        made = getattr(self.spider, "make_request_from_data")(raw)  # noqa: B009
        if made is None:
            made = []
        elif isinstance(made, Request):
            made = [made]
        requests = list(made)
        for request in requests:
            if not isinstance(request, Request):
                raise ValueError("make_request_from_data returned %r, not a Request" % (request,))
            check_seed(request.url, request.meta)
        return requests

    def make_request(self, data: dict[str, Any]) -> Request:
        """The request of a start entry: the spider's ``make_request_from_start_entry(data)``
        when it has one, else a request to its default callback (:func:`seed_callback`)."""
        make = getattr(self.spider, "make_request_from_start_entry", None)
        if callable(make):
            request: Request = make(data)
            return request
        return Request(data["url"], callback=seed_callback(self.spider),
                       meta=data.get("meta") or {}, priority=data.get("priority", 0),
                       dont_filter=data.get("dont_filter", False))


def seed_callback(spider: Spider) -> Callable[..., Any] | None:
    """Where a URL pushed to a spider's start list goes, as Scrapy would send it.

    A ``SitemapSpider``'s are sitemaps (or robots.txt), like its ``sitemap_urls``: its
    sitemap parser. Else the default callback (None): ``parse``, or a ``CrawlSpider``'s
    rules. A spider with neither takes no start URLs: ValueError, so the entry is
    refused and counted (``bad_start_urls``), not sent to a ``parse`` that raises on
    every page.
    """
    if isinstance(spider, SitemapSpider):
        parse_sitemap: Callable[..., Any] = spider._parse_sitemap
        return parse_sitemap
    cls = type(spider)
    if cls.parse is Spider.parse and cls._parse is Spider._parse:
        raise ValueError(
            "spider %r has no parse() callback, so a start URL pushed to its list has"
            " nowhere to go: crawl it without start URLs (its own start requests:"
            " bloomcrawl crawl --spider %s), or give it a parse() or a"
            " make_request_from_start_entry(data)" % (spider.name, spider.name))
    return None


def join_crawl(server: redis.Redis, spider: str, configured: str) -> bytes:
    """The id of the crawl this worker joins: FRONTIER_CRAWL_ID, or the one in Redis.

    dont_filter start requests go through the filter under this id, so each
    start URL is fetched once per crawl whichever workers start it. The
    first worker of a crawl sets ``<spider>:crawl``; the others read it; it
    is deleted when a worker closes with the frontier finished
    (:func:`end_crawl`), so the next crawl starts its start URLs again.
    """
    if configured:
        return configured.encode()
    (value,) = run_scripts(server, [ScriptCall(
        _CRAWL_ID, [keys.crawl_key(spider)], ["join", uuid.uuid4().hex])])
    return value.encode() if isinstance(value, str) else bytes(value or b"")


def take_start_items(server: redis.Redis, spider: str, crawl_id: bytes, worker: str) -> bool:
    """Whether the items ``start()`` yields in crawl ``crawl_id`` are this worker's.

    Every worker of a crawl runs ``start()``; the first to yield an item takes
    them all, and the others drop theirs, so each goes through the item
    pipelines once per crawl, as start requests are fetched once.
    """
    (holder,) = run_scripts(server, [ScriptCall(
        _CRAWL_ID, [keys.crawl_key(spider)], ["items", crawl_id, worker])])
    return bool((holder.decode() if isinstance(holder, bytes) else holder) == worker)


def end_crawl(server: redis.Redis, frontier: Frontier, spider: Spider, crawl_id: bytes) -> None:
    """The crawl is over when nothing is queued, leased or seeded anywhere."""
    key = keys.crawl_key(spider.name)
    try:
        if frontier.size(with_leases=True) == 0:
            run_scripts(server, [ScriptCall(_CRAWL_ID, [key], ["end", crawl_id])])
    except REDIS_ERRORS as exc:
        logger.warning("could not end the crawl %s (%s): the next crawl's start URLs"
                       " count as seen", crawl_id.decode(), exc, extra={"spider": spider})
