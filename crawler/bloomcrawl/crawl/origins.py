"""Where each item came from: the request whose response yielded it, and its position.

Items ``start()`` yields have no request: their origin is the crawl (every
worker of a crawl runs ``start()``) and their position among them.

:class:`~bloomcrawl.crawl.middleware.FrontierSpiderMiddleware` tags each item
a tracked page yields, when :class:`~bloomcrawl.crawl.pipelines.RedisItemsPipeline`
is enabled (:func:`wanted`); the pipeline stores the item under that id,
once. A page crawled twice (its worker died before the ack) yields the same
items in the same order, under the same ids.

A tag holds its item, so no other object can take the item's id while the
tag lives, and lives until its page is done
(:class:`~bloomcrawl.crawl.pages.PageTracker` forgets the page's tags then):
an item a pipeline replaced, or dropped, leaves nothing behind.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

from bloomcrawl.crawl.lease import ENTRY_META_KEY, VISIT_META_KEY

#: after a failed request's origin: its errback's outputs, apart from what its callback
#: yields when the page is crawled again and answers
ERRBACK = "!errback"

#: item origins by id(item): (the item, its origin, its page or None)
_ORIGINS: dict[int, tuple[Any, str, Any]] = {}
#: whether this process tagged an item (an item without a tag then was replaced)
tagged_any = False


def origin_of(crawler: Any, request: Any) -> str:
    """The id of a page's visit, which its items' ids start with."""
    fingerprint: str = crawler.request_fingerprinter.fingerprint(request).hex()
    meta = request.meta
    if ENTRY_META_KEY in meta or VISIT_META_KEY in meta:
        # a page fetched again on purpose (a dont_filter request; under revisit
        # windows, any page queued again) is a new visit, whose items are stored
        # again; one crawled twice for one queue entry (its first worker died) is the
        # same visit, stored once
        # (a request this worker kept, not queued, has its visit's id only)
        fingerprint += "@" + (meta.get(ENTRY_META_KEY) or meta[VISIT_META_KEY])
    return fingerprint


def visit_id(origin: str, position: int) -> str:
    """The visit of the ``position``-th request a visit made that fetches a page again on
    purpose (``dont_filter``): the same one when that visit is crawled twice."""
    return hashlib.sha1(b"%s>%d" % (origin.encode(), position)).hexdigest()[:16]


def tag(item: Any, origin: str, page: Any = None) -> int:
    """Tag ``item`` (of ``page``, a :class:`~bloomcrawl.crawl.pages.Page`); returns the
    key :func:`forget` takes."""
    global tagged_any
    _ORIGINS[id(item)] = (item, origin, page)
    tagged_any = True
    return id(item)


def pop(item: Any) -> tuple[str, Any] | None:
    """The item's origin and page, forgotten from here on (None: no tracked callback
    yielded this object)."""
    entry = _ORIGINS.pop(id(item), None)
    # the tag holds its item: an entry under this id is this item's
    return None if entry is None else (entry[1], entry[2])


def sending(pages: Iterable[Any]) -> None:
    """Items of these pages (None: of no page) are sent to Redis now: each page's ack is
    right only on a server that kept them (see
    :func:`~bloomcrawl.crawl.pages.leases_with_items_sent`)."""
    for page in pages:
        if page is not None:
            page.items_sent = True


def forget(keys: Iterable[int]) -> None:
    """A page is done: its items' tags go (those the pipeline did not take)."""
    for key in keys:
        _ORIGINS.pop(key, None)


def held() -> int:
    """Tags held now (items of pages not yet done)."""
    return len(_ORIGINS)


def wanted(crawler: Any) -> bool:
    """Whether items are tagged in this crawl (RedisItemsPipeline is enabled)."""
    return bool(getattr(crawler, "_bloomcrawl_tag_items", False))


def want(crawler: Any) -> None:
    """RedisItemsPipeline is enabled in this crawl: tag its items."""
    crawler._bloomcrawl_tag_items = True


def joined(crawler: Any, crawl_id: bytes, take_start_items: Callable[[], bool]) -> None:
    """The scheduler joined the crawl ``crawl_id``. Every worker of the crawl runs
    ``start()``: ``take_start_items()`` (blocking on Redis) says whether the items it
    yields are this worker's, and they are tagged with the crawl."""
    crawler._bloomcrawl_crawl = (crawl_id, take_start_items)


def crawl_of(crawler: Any) -> tuple[bytes, Callable[[], bool]] | None:
    """What :func:`joined` was told (None: no bloomcrawl scheduler in this crawl)."""
    joined: tuple[bytes, Callable[[], bool]] | None = getattr(
        crawler, "_bloomcrawl_crawl", None)
    return joined
