"""When a page is done: its callback output handled, its requests queued, its items stored.

A leased request's lease is acked only when its page is done. Scrapy's
scraper pulls a callback's output ahead of handling it (up to
2 x CONCURRENT_ITEMS outputs wait in a queue, and items go through the item
pipeline concurrently), so the end of the callback's output is not the end
of the page: an ack sent then could reach Redis before the page's items
were stored or its links queued, and a worker killed in that gap would lose
them. :class:`PageTracker` counts what each page still has in hand:

* each item until ``item_scraped``, ``item_dropped`` or ``item_error``
  names its response;
* each request until the engine took it: the engine's ``crawl()``, which
  :meth:`PageTracker.scheduling` wraps, sends ``request_scheduled`` and
  queues it with the scheduler (which may hold, drop or filter it) before it
  returns; a request a ``request_scheduled`` handler ignored (IgnoreRequest,
  as Scrapy's OffsiteMiddleware does) never reaches the scheduler, and is
  done with all the same once that call returned;
* each *held* request: a request the frontier cannot share, crawled by this
  worker (:mod:`bloomcrawl.crawl.scheduler`), which keeps its parent page's
  lease until it is itself done, so that a worker killed before then leaves
  the parent to be crawled again, and the held request made again.

When the output has ended and nothing is in hand, :data:`request_finished`
goes out for the page's request. A request whose download failed for good
and that has an errback is finished once the scraper handled what the
errback returned (:meth:`PageTracker.scraping`): Scrapy hands an errback's
output to no spider middleware, so it is waited for as a whole.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from scrapy import Request as ScrapyRequest
from scrapy import signals
from scrapy.exceptions import IgnoreRequest
from twisted.python.failure import Failure

from bloomcrawl.crawl import origins
from bloomcrawl.crawl.lease import (
    HOLD_META_KEY,
    INTERNAL_META_KEYS,
    LEASE_META_KEY,
    PARENT_META_KEY,
    VISIT_META_KEY,
    Outcome,
    request_finished,
)

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler


@dataclass
class Page:
    """One tracked response: its request and what it still has in hand."""

    request: Request
    number: int
    in_hand: int = 0
    ended: bool = False
    outcome: Outcome = Outcome.RESPONSE
    #: the response objects whose item signals count for this page (by id), and weak
    #: references to them, which forget each id when its response is gone
    responses: list[int] = field(default_factory=list)
    refs: list[Any] = field(default_factory=list)
    #: the tags of its items (:mod:`bloomcrawl.crawl.origins`), forgotten when it is done
    tags: list[int] = field(default_factory=list)
    #: RedisItemsPipeline sent an item of it to Redis (:func:`origins.sending`)
    items_sent: bool = False
    #: the token of the lease its request carries (None: held)
    token: str | None = None
    #: the number of its request's hold (None: leased)
    hold: int | None = None


def adopt(request: Request) -> None:
    """``request`` is a page's own link: drop what it copied of the page's meta (the
    lease and the other internal keys, ``is_start_request``). The spider middleware
    does it for the links a callback yields, :meth:`PageTracker.scheduling` for those
    it hands the engine itself."""
    meta = request.meta
    for key in INTERNAL_META_KEYS:
        meta.pop(key, None)
    meta.pop("is_start_request", None)


def adopted(output: Any) -> Any:
    """``output`` of a page; a request that copied the page's meta (``meta=response.meta``,
    ``failure.request.replace(...)``) goes through :func:`adopt` first."""
    if isinstance(output, ScrapyRequest):
        meta = output.meta
        if "is_start_request" in meta or not INTERNAL_META_KEYS.isdisjoint(meta):
            adopt(output)
    return output


def carries(other: Request, request: Request) -> bool:
    """Whether ``other`` carries the lease (or hold) of ``request``: a retry or redirect."""
    meta, own = other.meta, request.meta
    return ((LEASE_META_KEY in meta and meta[LEASE_META_KEY] == own.get(LEASE_META_KEY))
            or (HOLD_META_KEY in meta and meta[HOLD_META_KEY] == own.get(HOLD_META_KEY)))


def failure_outcome(exception: BaseException | None) -> Outcome:
    """The outcome of a download that failed for good with ``exception``."""
    return Outcome.IGNORED if isinstance(exception, IgnoreRequest) else Outcome.DOWNLOAD_ERROR


def tracked(request: Request | None) -> bool:
    """Whether the page of ``request`` must report when it is done (leased or held)."""
    return request is not None and (LEASE_META_KEY in request.meta
                                    or HOLD_META_KEY in request.meta)


def labels(crawler: Crawler, page: Page, after: str = "") -> Callable[[Any], Any]:
    """What names each output of ``page``'s visit, in order, the same way each time the
    page is crawled: an item's id (when items are tagged, :mod:`origins`), and the visit
    of a request that fetches a page again on purpose (``dont_filter``). ``after`` sets
    apart the ids of another output of the same visit (its errback's)."""
    tags = origins.wanted(crawler)
    position = requests = 0
    prefix = ""

    def label(output: Any) -> Any:
        nonlocal position, requests, prefix
        if isinstance(output, ScrapyRequest):
            if output.dont_filter:
                # a page fetched again on purpose: a visit of its own, the same one when
                # this page is crawled twice
                if not prefix:
                    prefix = origins.origin_of(crawler, page.request) + after
                output.meta[VISIT_META_KEY] = origins.visit_id(prefix, requests)
            requests += 1
        elif output is not None:
            if tags:
                if not prefix:
                    prefix = origins.origin_of(crawler, page.request) + after
                page.tags.append(origins.tag(output, "%s:%d" % (prefix, position), page))
            position += 1
        return output

    return label


def labelled(result: Iterable[Any] | AsyncIterator[Any],
             label: Callable[[Any], Any]) -> Iterable[Any] | AsyncIterator[Any]:
    """``result`` (an output as Scrapy iterates it), each element through ``label``."""
    if isinstance(result, AsyncIterator):
        return _labelled_async(result, label)
    return (label(output) for output in result)


class PageTracker:
    """Counts each tracked page's outputs in hand; one per crawler (:meth:`of`)."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._numbers = itertools.count(1)
        self._pages: dict[int, Page] = {}
        self._by_response: dict[int, Page] = {}
        # lease token -> the page of that lease, while it is tracked
        self._by_token: dict[str, Page] = {}
        # the same for held requests: the number of each hold -> its page
        self._by_hold: dict[int, Page] = {}
        self._holds = itertools.count(1)
        # requests the engine is scheduling now (in its crawl()): id -> (it, its parent)
        self._taking: dict[int, tuple[Request, Page | None]] = {}
        #: whether the engine's handler of download results is followed (downloads): it
        #: hears of every failed scheduled download
        self.follows_downloads = False
        # failed requests whose errback's output the scraper is handling: id -> their
        # page (ended once that output was handled), while the scraper is followed
        self._errbacks: dict[int, Page] | None = None
        #: called for each item scraped (the scheduler counts them): one receiver of
        #: ``item_scraped`` does both, as each receiver of an asynchronous signal costs
        #: a task per item
        self.on_item_scraped: Callable[[], None] | None = None
        s = crawler.signals
        s.connect(self._item_scraped, signal=signals.item_scraped)
        for signal in (signals.item_dropped, signals.item_error):
            s.connect(self._item_done, signal=signal)

    @classmethod
    def of(cls, crawler: Crawler) -> PageTracker:
        tracker: PageTracker | None = getattr(crawler, "_bloomcrawl_pages", None)
        if tracker is None:
            tracker = cls(crawler)
            crawler._bloomcrawl_pages = tracker  # type: ignore[attr-defined]
        return tracker

    def __len__(self) -> int:
        return len(self._pages)

    # -- the spider middleware -----------------------------------------------------

    def open(self, response: Any) -> Page:
        """The page of ``response``, tracked from now until it is done."""
        key = id(response)
        page = self._by_response.get(key)
        if page is None:
            page = self._track(response.request)
            self._by_response[key] = page
            page.responses.append(key)
            # a page can outlive its response (it waits for requests it holds): the id
            # is forgotten with the response, before another object can take it
            page.refs.append(weakref.ref(response, partial(self._gone, key)))
        return page

    def _gone(self, key: int, _ref: Any) -> None:
        self._by_response.pop(key, None)

    def _track(self, request: Request) -> Page:
        page = Page(request, next(self._numbers))
        self._pages[page.number] = page
        meta = request.meta
        lease = meta.get(LEASE_META_KEY)
        if lease is not None:
            page.token = lease[1]
            self._by_token[page.token] = page
        elif HOLD_META_KEY in meta:
            page.hold = meta[HOLD_META_KEY][1]
            self._by_hold[page.hold] = page
        return page

    def find(self, response: Any) -> Page | None:
        return self._by_response.get(id(response))

    def child_request(self, page: Page, request: Request) -> None:
        request.meta[PARENT_META_KEY] = page.number
        page.in_hand += 1

    def child_item(self, page: Page) -> None:
        page.in_hand += 1

    def ended(self, page: Page, outcome: Outcome) -> None:
        """The callback's output ended (or it raised: ``spider_error``)."""
        page.ended = True
        if outcome != Outcome.RESPONSE:
            page.outcome = outcome
        self._maybe_done(page)

    # -- held requests (the scheduler) --------------------------------------------

    def hold(self, request: Request) -> None:
        """``request`` stays with this worker: its parent page waits for it."""
        if HOLD_META_KEY in request.meta:  # a retry of a held request: already held
            return
        parent = self.parent_of(request)
        if parent is not None:
            parent.in_hand += 1
        # (the parent's number or 0: none, a start request, still tracked; this hold's own)
        request.meta[HOLD_META_KEY] = (parent.number if parent is not None else 0,
                                       next(self._holds))

    def parent_of(self, request: Request) -> Page | None:
        """The page ``request`` is a link of, while the engine schedules it (None: none)."""
        taking = self._taking.get(id(request))
        return taking[1] if taking is not None else None

    def release(self, request: Request) -> None:
        """A held request is done (its own page, or its download failed for good)."""
        hold = request.meta.pop(HOLD_META_KEY, None)
        parent = self._pages.get(hold[0]) if hold is not None else None
        if parent is not None:
            parent.in_hand -= 1
            self._maybe_done(parent)

    # -- signals ---------------------------------------------------------------------

    def _item_scraped(self, item: Any = None, response: Any = None, **kwargs: Any) -> None:
        if self.on_item_scraped is not None:
            self.on_item_scraped()
        self._item_done(item, response)

    def _item_done(self, item: Any = None, response: Any = None, **kwargs: Any) -> None:
        page = self._by_response.get(id(response))
        if page is not None:
            page.in_hand -= 1
            self._maybe_done(page)

    # -- the engine's crawl() ----------------------------------------------------------

    def scheduling(self, crawl: Callable[..., Any]) -> Callable[..., Any]:
        """The engine's ``crawl()``, wrapped: what each request it is given is to a page.

        Every request reaches the engine through ``crawl()`` (the scraper's, a
        downloader middleware's retry or redirect, the scheduler's leases, a
        callback's own call), which queues it or lets a ``request_scheduled``
        handler ignore it, all before it returns. So, when it returns:

        * a page's link (counted by the spider middleware) is done with, queued
          or ignored;
        * a request that carries a lease or a hold and that the scheduler did not
          take (:meth:`taken`) was ignored, as Scrapy's OffsiteMiddleware ignores
          a redirect off the allowed domains: its outcome is final, and its lease
          is acked. Left alone, the lease would be renewed for good and its
          host's budget never given back.

        A request with the meta of a page still being parsed (a callback that
        calls ``engine.crawl()`` with ``meta=response.meta`` skips the spider
        middleware), or of a failed request whose errback is running, is a link
        of that page, not a retry of it: it loses the page's lease (or hold) and
        the other keys the middleware would have dropped.
        (A call a request: a ``request_scheduled`` receiver cost 2 us, and a timer.)
        """
        pages = self._pages
        by_token, by_hold = self._by_token, self._by_hold
        taking = self._taking

        def crawl_counted(request: Request) -> Any:
            meta = request.meta
            # popped: a redirect or retry of this request copies its meta, and must not
            # count for the parent again
            parent = pages.get(meta.pop(PARENT_META_KEY, 0))
            if parent is None:
                lease = meta.get(LEASE_META_KEY)
                if lease is not None:
                    parent = by_token.get(lease[1])
                else:
                    hold = meta.get(HOLD_META_KEY)
                    if hold is None:
                        return crawl(request)
                    parent = by_hold.get(hold[1])
                if parent is not None:
                    adopt(request)
                    parent.in_hand += 1
            key = id(request)
            taking[key] = (request, parent)  # hold() reads its parent here
            try:
                return crawl(request)
            finally:
                if taking.pop(key, None) is not None and tracked(request):
                    self.finish(request, Outcome.IGNORED)  # no scheduler took it
                if parent is not None:
                    parent.in_hand -= 1
                    self._maybe_done(parent)

        return crawl_counted

    def taken(self, request: Request) -> None:
        """The scheduler took ``request`` (queued, held, dropped or filtered it)."""
        if self._taking:
            self._taking.pop(id(request), None)

    # -- failed downloads and their errbacks ----------------------------------------

    def failed(self, request: Request, outcome: Outcome) -> None:
        """The download of ``request`` failed for good (or was ignored): its outcome is
        final once its errback's output, if it has an errback, was handled."""
        errbacks = self._errbacks
        if errbacks is not None and request.errback is not None and tracked(request):
            # a page until then: a request the errback makes with the failed one's meta
            # (``failure.request.replace(url=...)``) is its link, not a retry of it
            page = errbacks[id(request)] = self._track(request)
            page.outcome = outcome
        else:
            self.finish(request, outcome)

    def scraping(self, enqueue_scrape: Callable[..., Any]) -> Callable[..., Any]:
        """The scraper's ``enqueue_scrape()``, wrapped: its Deferred fires once the
        callback's or errback's output was handled (items through the pipeline,
        requests given to the engine); a failed request waiting for its errback
        (:meth:`failed`) is finished then."""
        errbacks: dict[int, Page] = {}
        self._errbacks = errbacks

        def enqueue_scrape_followed(result: Any, request: Request, *args: Any,
                                    **kwargs: Any) -> Any:
            d = enqueue_scrape(result, request, *args, **kwargs)
            if errbacks and id(request) in errbacks:
                def handled(value: Any) -> Any:
                    page = errbacks.pop(id(request), None)
                    if page is not None:
                        self.ended(page, page.outcome)
                    return value
                d.addBoth(handled)
            return d

        return enqueue_scrape_followed

    def errback_output(self, handle: Callable[..., Any]) -> Callable[..., Any]:
        """The scraper's ``handle_spider_output_async()``, wrapped: what a tracked request's
        errback returns, which Scrapy hands to no spider middleware, is adopted and named
        as a callback's output is (:func:`adopted`, :func:`labels`; adopted first, or the
        label would go with copied meta), apart from it: stored once when the page is
        crawled twice, and apart from what its callback yields if it answers then."""
        def handle_labelled(result: Any, request: Request, response: Any, *args: Any,
                            **kwargs: Any) -> Any:
            errbacks = self._errbacks
            if errbacks and isinstance(response, Failure) and id(request) in errbacks:
                label = labels(self.crawler, errbacks[id(request)], origins.ERRBACK)
                result = labelled(result, lambda output: label(adopted(output)))
            return handle(result, request, response, *args, **kwargs)

        return handle_labelled

    def downloads(self, handle: Callable[..., Any]) -> Callable[..., Any]:
        """The engine's handler of each scheduled download's result, wrapped.

        * A failure is final: no downloader middleware turned it into a retry.
          It may come from the download or a middleware's ``process_request``
          (which ``process_exception`` hears of too), or from a middleware's
          ``process_response`` (which nothing else hears of: an IgnoreRequest
          there, as HttpCompressionMiddleware raises past DOWNLOAD_MAXSIZE). The
          request :meth:`failed`.
        * A tracked request a downloader middleware answered with a new request
          that does not carry its lease (or hold), as a copy made by
          ``replace()`` does, is finished once the new one was given to the
          engine: nothing else would ever finish it.

        ``engine.download()`` (a callback's own download, media pipelines) does
        not come here: such a request that copied its page's meta fails without
        finishing the page.
        """
        self.follows_downloads = True

        def handle_followed(result: Any, request: Request, *args: Any, **kwargs: Any) -> Any:
            if isinstance(result, Failure):
                if tracked(request):
                    self.failed(request, failure_outcome(result.value))
                return handle(result, request, *args, **kwargs)
            replaced = (isinstance(result, ScrapyRequest) and result is not request
                        and tracked(request) and not carries(result, request))
            out = handle(result, request, *args, **kwargs)
            if replaced:
                self.finish(request, Outcome.IGNORED)
            return out

        return handle_followed

    def _maybe_done(self, page: Page) -> None:
        if not page.ended or page.in_hand > 0 or page.number not in self._pages:
            return
        del self._pages[page.number]
        by_response = self._by_response
        for key in page.responses:
            if by_response.get(key) is page:
                del by_response[key]
        if page.token is not None:
            self._by_token.pop(page.token, None)
        elif page.hold is not None:
            self._by_hold.pop(page.hold, None)
        if page.tags:
            origins.forget(page.tags)
        self.finish(page.request, page.outcome)

    def finish(self, request: Request, outcome: Outcome) -> None:
        """The outcome of ``request`` is final: ack its lease, release its parent."""
        if tracked(request):
            self.crawler.signals.send_catch_log(request_finished, request=request,
                                                outcome=outcome)
            self.release(request)


async def _labelled_async(result: AsyncIterator[Any],
                          label: Callable[[Any], Any]) -> AsyncIterator[Any]:
    async for output in result:
        yield label(output)


def leases_with_items_sent(tracker: PageTracker) -> list[str]:
    """The lease tokens of the pages in hand that RedisItemsPipeline sent items of to
    Redis, or whose held links it did (they wait under their parent's lease): which
    server those items reached, the one before a restart or the one after, is not
    known. (Items that wait to be sent go to the server there is now.)"""
    pages = tracker._pages
    tokens = set()
    for page in pages.values():
        node: Page | None = page if page.items_sent else None
        while node is not None and node.token is None:
            hold = node.request.meta.get(HOLD_META_KEY)
            node = pages.get(hold[0]) if hold is not None else None
        if node is not None and node.token is not None:
            tokens.add(node.token)
    return sorted(tokens)
