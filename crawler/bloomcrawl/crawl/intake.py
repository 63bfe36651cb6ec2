"""What happens to a request the engine gives the scheduler.

:meth:`Intake.enqueue` fingerprints it (Scrapy's request fingerprinter; a
``dont_filter`` start request under the crawl's id), drops it when this
worker already sent that fingerprint through the filter
(:class:`~bloomcrawl.crawl.seen.SeenCache`), and otherwise serializes it
into the outbox, to be enqueued-if-new with the next exchange. A request
the frontier cannot share stays with this worker
(:class:`~bloomcrawl.crawl.held.HeldRequests`).
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

from bloomcrawl.core.bloom import normalise_fingerprint
from bloomcrawl.core.frontier import Outgoing
from bloomcrawl.core.politeness import filter_fingerprint, host_of
from bloomcrawl.crawl.exchanges import MAX_BATCH
from bloomcrawl.crawl.lease import HOLD_META_KEY, LEASE_META_KEY, LOCAL_META_KEY, LeaseRef
from bloomcrawl.crawl.serialization import UnserializableRequest, priority_score, request_to_json

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.statscollectors import StatsCollector

    from bloomcrawl.crawl.engine import EngineInterface
    from bloomcrawl.crawl.exchanges import ExchangeLoop
    from bloomcrawl.crawl.held import HeldRequests
    from bloomcrawl.crawl.lease_book import LeaseBook
    from bloomcrawl.crawl.pages import PageTracker
    from bloomcrawl.crawl.seen import SeenCache
    from bloomcrawl.crawl.serialization import ClassAllowList
    from bloomcrawl.crawl.windows import RevisitWindows

logger = logging.getLogger(__name__)


class BufferedStats:
    """Counts for Scrapy's stats collector, added to it in one call per name (:meth:`flush`).

    A worker counts a few stats for every link a page yields, and each
    ``StatsCollector.inc_value`` call costs several microseconds (Scrapy
    2.19 checks every call's arguments for a deprecated ``spider``): a dict
    here, flushed whenever the engine asks for a request, costs a tenth.
    """

    def __init__(self, stats: StatsCollector) -> None:
        self.stats = stats
        self._counts: dict[str, int] = {}

    def inc(self, name: str, count: int = 1) -> None:
        counts = self._counts
        counts[name] = counts.get(name, 0) + count

    def flush(self) -> None:
        if self._counts:
            counts, self._counts = self._counts, {}
            inc_value = self.stats.inc_value
            for name, count in counts.items():
                inc_value(name, count)


class Intake:
    def __init__(self, *, loop: ExchangeLoop, book: LeaseBook, seen: SeenCache,
                 held: HeldRequests, pages: PageTracker, engine: EngineInterface,
                 stats: StatsCollector, fingerprinter: Any, spider: Spider,
                 allowed: ClassAllowList | None, partition_by: str, crawl_id: bytes,
                 strict: bool, windows: RevisitWindows,
                 project_filter: BaseDupeFilter | None = None) -> None:
        self.loop = loop
        self.outbox = loop.outbox
        self.duplicates = loop.duplicates
        self.book = book
        self.seen = seen
        self.held = held
        self.pages = pages
        self.engine = engine
        self.stats = stats
        #: the counts of every request's path, added to ``stats`` by :meth:`flush_counts`
        self.counts = BufferedStats(stats)
        # duplicates the seen cache dropped since the last flush_counts
        self._filtered_here = 0
        self.fingerprinter = fingerprinter
        self.spider = spider
        self.allowed = allowed
        self.partition_by = partition_by
        #: dont_filter start requests are deduplicated among the workers of this crawl
        self.crawl_id = crawl_id
        #: FRONTIER_STRICT: a request the frontier cannot share closes the spider
        self.strict = strict
        #: which revisit window each request goes in
        self.windows = windows
        #: the project's own DUPEFILTER_CLASS, asked first (None: none of its own)
        self.project_filter = project_filter

    def enqueue(self, request: Request) -> bool:
        """Queue a request in the shared frontier (buffered, sent with the next exchange).

        Returns False when it was not queued (a duplicate this worker already
        sent). Duplicates found by
        the filter in Redis are counted in ``dupefilter/filtered`` when the
        exchange returns. A request the frontier cannot share stays with this
        worker (:meth:`_keep`). A ``dont_filter`` start request goes through
        the filter under the crawl's id: each start URL once per crawl,
        whichever workers start it.
        """
        meta = request.meta
        if meta.pop(LOCAL_META_KEY, False):
            # a leased request handed to the engine by the loop comes back here
            self.book.put_back(LeaseRef(*meta[LEASE_META_KEY]), request)
            return True
        lease = meta.pop(LEASE_META_KEY, None)
        outbox = self.outbox
        project_filter = self.project_filter
        if project_filter is not None and not request.dont_filter and (
                project_filter.request_seen(request)):
            project_filter.log(request, self.spider)  # counts it, as under Scrapy's scheduler
            if lease is not None:
                self.loop.ack(lease)
            return False
        fp = normalise_fingerprint(self.fingerprinter.fingerprint(request))
        dont_filter = request.dont_filter
        # a start request (start_urls, start(), a SitemapSpider's sitemap_urls): once per
        # crawl, under the crawl's id; one that is not dont_filter is also recorded under
        # its own fingerprint, as Scrapy's dupefilter records it (a link back to it is a
        # duplicate), but never queued by that. A retry of one copies its meta and carries
        # the lease it was downloaded under (or is held), dont_filter (Scrapy's retries
        # are): its own fingerprint, not the start request's again, which the filter
        # holds for this crawl. A redirect (not dont_filter) is a start request of its
        # own URL: once per crawl too
        record = None
        if (meta.get("is_start_request") and self.crawl_id and HOLD_META_KEY not in meta
                and (lease is None or not dont_filter)):
            if not dont_filter:
                record = fp
            fp = hashlib.sha1(b"start:" + self.crawl_id + fp).digest()
            dont_filter = False
        window = "0"
        if not dont_filter:
            fp, window, _ = self.windows.fingerprint(fp, request)
        # most links a page yields were sent before: the seen cache answers from the
        # fingerprint's own bytes, before the host is parsed out of the URL
        if not dont_filter and fp in self.seen:
            # kept until Redis answered from the same server, unless its page makes it again
            page = self.pages.parent_of(request)
            outbox.dropped(request, page is not None and page.token is not None)
            self._filtered_here += 1  # counted by flush_counts
            if self.duplicates.active:
                self.duplicates.local(request)
            if lease is not None:
                self.loop.ack(lease)
            return False
        host = host_of(request.url)
        fp = filter_fingerprint(fp, host, self.partition_by)
        try:
            payload = request_to_json(request, self.spider, self.allowed)
        except UnserializableRequest as exc:
            return self._keep(request, lease, fp, dont_filter, exc)
        score = priority_score(request)
        buffered = outbox.add(Outgoing(fp, dont_filter, score, payload, host, window))
        if record is not None:
            outbox.add(Outgoing(filter_fingerprint(record, host, self.partition_by), False,
                                score, "", host, record_only=True))
        if lease is not None:
            # a retry or redirect of a leased request: ack the original once this is queued
            self.loop.ack(lease)
        if HOLD_META_KEY in meta:
            # a retry of a held request that can be shared now: queued, it holds no page
            self.pages.release(request)
        counts = self.counts
        counts.inc("scheduler/enqueued")
        counts.inc("scheduler/enqueued/redis")
        if buffered >= MAX_BATCH:
            self.loop.exchange()
        return True

    def flush_counts(self) -> None:
        """Add the counts buffered since the last call to Scrapy's stats (and the shared
        ``filtered`` count to the outbox)."""
        filtered, self._filtered_here = self._filtered_here, 0
        if self.windows.unknown:
            self.counts.inc("bloomcrawl/unknown_revisit_window", self.windows.unknown)
            self.windows.unknown = 0
        if filtered:
            self.outbox.count("filtered", filtered)
            self.counts.inc("dupefilter/filtered", filtered)
            self.counts.inc("bloomcrawl/filtered_locally", filtered)
        self.counts.flush()

    def _keep(self, request: Request, lease: Any, fp: bytes, dont_filter: bool,
              exc: UnserializableRequest) -> bool:
        """A request the frontier cannot share: this worker crawls it itself.

        Nothing is dropped for how it is stored. The page that yielded it
        keeps its lease until it is done (:meth:`PageTracker.hold`): a worker
        killed before leaves that page to be crawled again, which makes the
        request again. It is filtered against what this worker kept, not the
        shared filter. With FRONTIER_STRICT the spider closes instead.
        """
        outbox = self.outbox
        extra = {"spider": self.spider}
        if self.strict:
            logger.error("%s; closing the spider (FRONTIER_STRICT)", exc, extra=extra)
            self.stats.inc_value("bloomcrawl/unserializable")
            outbox.count("unserializable")
            if lease is not None:
                request.meta[LEASE_META_KEY] = lease  # not acked: it goes back to the queue
            if not self.loop.closing:
                self.engine.close_spider("unshareable_request")
            return False
        if self.held.first_of_kind(exc.kind):
            logger.warning("%s: this worker crawls it itself (not shared with other workers,"
                           " filtered only against what this worker kept); further requests"
                           " like it are counted in bloomcrawl/local_requests. Make it"
                           " shareable (FRONTIER_SAFE_CLASSES, a spider method as callback),"
                           " or set FRONTIER_STRICT to refuse it", exc, extra=extra)
        if not dont_filter and self.held.seen_before(fp):
            self.stats.inc_value("dupefilter/filtered")
            if lease is not None:
                self.loop.ack(lease)
            return False
        if lease is not None:
            # a retry or redirect of a leased request: it carries the lease until done
            request.meta[LEASE_META_KEY] = lease
        else:
            self.pages.hold(request)
        self.held.push(request)
        self.stats.inc_value("bloomcrawl/local_requests")
        outbox.count("local")
        self.stats.inc_value("scheduler/enqueued")
        self.stats.inc_value("scheduler/enqueued/memory")
        return True
