"""What a worker sees of hosts, for every worker's politeness.

The cluster keeps each host's delay and concurrency (:mod:`bloomcrawl.core.politeness`);
the frontier leases a request only when its host may be fetched, so a leased
request goes out at once. What this worker then sees goes to Redis with its
next exchange (:meth:`Outbox.feedback_for`):

* a leased request of a host with a delay that left late (a busy reactor): the
  host's delay counts from when it really left (for a host without a delay there
  is nothing to move, and no exchange is spent on it);
* a 429 or 503, with its Retry-After: the host waits that long;
* robots.txt's Crawl-delay for our user agent: the host's delay;
* latencies, for AutoThrottle's cluster-wide delay.
"""

from __future__ import annotations

import email.utils
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy.utils.httpobj import urlparse_cached

from bloomcrawl.core.bloom import partition_of
from bloomcrawl.core.politeness import (
    DEFAULT_BACKOFF_S,
    LAG_REPORTED_S,
    MAX_BACKOFF_S,
    Feedback,
    filter_fingerprint,
    host_of,
)
from bloomcrawl.crawl.lease import LEASE_META_KEY

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

    from bloomcrawl.core.frontier import Frontier
    from bloomcrawl.crawl.engine import EngineInterface
    from bloomcrawl.crawl.exchanges import ExchangeLoop
    from bloomcrawl.crawl.lease_book import LeaseBook

logger = logging.getLogger(__name__)

#: a late send's report waits at most this long for an exchange to ride with (and at
#: most a quarter of what is left before its host's next lease)
REPORT_LATE_WITHIN_S = 0.05


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


def named_slot(request: Request, *, per_ip: bool = False) -> str | None:
    """The download slot ``request`` names, when it is no host's slot; else None.

    Scrapy sets ``meta["download_slot"]`` to the host on every request it
    downloads, and a redirect keeps the slot of the URL it came from. With
    CONCURRENT_REQUESTS_PER_IP (``per_ip``) the slots are the hosts' addresses: None.
    """
    slot = request.meta.get("download_slot")
    if slot is None or per_ip or slot == (urlparse_cached(request).hostname or ""):
        return None
    if any(slot == urlsplit(url).hostname for url in request.meta.get("redirect_urls", ())):
        return None
    return str(slot)


class HostFeedback:
    """Turns the engine's signals about leased requests into :class:`Feedback` for Redis."""

    def __init__(self, frontier: Frontier, book: LeaseBook, loop: ExchangeLoop,
                 engine: EngineInterface, stats: StatsCollector, settings: BaseSettings, *,
                 autothrottle: bool) -> None:
        self.frontier = frontier
        self.book = book
        self.loop = loop
        self.engine = engine
        self.stats = stats
        self.settings = settings
        self.autothrottle = autothrottle
        #: Scrapy keys the downloader's slots by IP address, not by host
        self._per_ip = settings.getint("CONCURRENT_REQUESTS_PER_IP") > 0
        #: the named download slots seen (each logged once)
        self._named_slots: set[str] = set()

    def reached_downloader(self, request: Request, spider: Spider) -> None:
        """The cluster keeps the host's delay: the leased request goes out now.

        The downloader's slot would add the process's own DOWNLOAD_DELAY (or
        DOWNLOAD_SLOTS' or AutoThrottle's) on top, late by a delay another
        worker may already have used. A slot the spider named
        (``meta["download_slot"]``, not the host) keeps its delay: the cluster
        spaces requests by host, and such a slot may span hosts.
        """
        lease = request.meta.get(LEASE_META_KEY)
        if lease is None:
            return
        slot = named_slot(request, per_ip=self._per_ip)
        if slot is None:
            self.engine.clear_slot_delay(request)
        elif slot not in self._named_slots:
            self._named_slots.add(slot)
            self.stats.inc_value("bloomcrawl/named_download_slots")
            logger.warning(
                "Requests name the download slot %r (meta download_slot, not their host):"
                " its delay and concurrency are kept by each worker, as one Scrapy process"
                " keeps them, so N workers may send N times its rate. The cluster-wide"
                " budget is per host (DOWNLOAD_DELAY, DOWNLOAD_SLOTS keyed by host name)",
                slot, extra={"spider": spider})
        self.went_out(request, lease[1], time.monotonic())

    def went_out(self, request: Request, token: str, when: float) -> None:
        """A leased request went out at ``when``: late after its lease, its host is told.

        The host's delay counts from when a request left; a request that waited
        in this worker (a busy reactor) would otherwise come too close after
        the host's next one, leased to another worker on time.
        """
        leased_at = self.book.leased_at(token)
        if leased_at is None:
            return
        self.book.sending(token, when)
        lag = when - leased_at
        # the host's next lease comes a margin after its delay (polite_common.lua): a lag
        # within half of it changes nothing (measured from when the lease call left,
        # before Redis leased, so never less than the real one; the other half is for
        # the way to the site, which nothing reports); a report is due before that next
        # lease. A host of one slot: never (its ack carries when the request ended)
        slack, room, _ = self.book.room(token)
        if lag <= max(LAG_REPORTED_S, slack / 2):
            return
        self.book.went_out(token, when)  # reported up to here
        self.stats.max_value("bloomcrawl/lease_lag_max_ms", round(lag * 1000))
        self.stats.inc_value("bloomcrawl/late_sends_reported")
        host = host_of(request.url)
        seen = self._for(host)
        seen.sent[host] = max(seen.sent.get(host, 0.0), when)
        self.loop.flush_soon(min(REPORT_LATE_WITHIN_S, max(0.0, (room - lag) / 4)))

    def response(self, response: Any, request: Request, spider: Spider) -> None:
        """What a response says about its host's budget, for every worker."""
        host = host_of(request.url)
        lease = request.meta.get(LEASE_META_KEY)
        if lease is None:
            if request.url.endswith("/robots.txt") and response.status == 200:
                self._robots(host, response)
            return
        self.book.responded(lease[1], time.monotonic())
        latency = request.meta.get("download_latency")
        if isinstance(latency, float | int):
            # the request went out this long before its response: later than its lease?
            self.went_out(request, lease[1], time.monotonic() - latency)
        seen: Feedback | None = None
        if response.status in (429, 503):
            seen = self._for(host)
            seen.backoff[host] = max(seen.backoff.get(host, 0.0), retry_after(response))
        if self.autothrottle and isinstance(latency, float | int):
            seen = seen or self._for(host)
            seen.latency.append((host, float(latency), 200 <= response.status < 300))

    def _robots(self, host: str, response: Any) -> None:
        """robots.txt's Crawl-delay for our user agent becomes the host's cluster delay."""
        try:
            from protego import Protego

            agent = (self.settings.get("ROBOTSTXT_USER_AGENT")
                     or self.settings.get("USER_AGENT") or "*")
            delay = Protego.parse(response.text).crawl_delay(agent)
        except Exception as exc:  # a robots.txt we cannot read sets nothing
            logger.debug("no Crawl-delay from %s: %s", response.url, exc)
            return
        self._for(host).robots[host] = float(delay or 0.0)

    def _for(self, host: str) -> Feedback:
        """The feedback buffer of the partition ``host`` lives in."""
        fp = filter_fingerprint(bytes(20), host, self.frontier.bloom.params.partition_by)
        return self.loop.outbox.feedback_for(partition_of(fp, self.frontier.partitions))
