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

from collections.abc import Iterable
from typing import Any

#: item origins by id(item): (the item, its origin)
_ORIGINS: dict[int, tuple[Any, str]] = {}
#: whether this process tagged an item (an item without a tag then was replaced)
tagged_any = False


def tag(item: Any, origin: str) -> int:
    """Tag ``item``; returns the key :func:`forget` takes."""
    global tagged_any
    _ORIGINS[id(item)] = (item, origin)
    tagged_any = True
    return id(item)


def pop(item: Any) -> str | None:
    """The item's origin, forgotten from here on (None: no tracked callback yielded
    this object)."""
    entry = _ORIGINS.pop(id(item), None)
    # the tag holds its item: an entry under this id is this item's
    return None if entry is None else entry[1]


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


def joined(crawler: Any, crawl_id: bytes) -> None:
    """The scheduler joined the crawl ``crawl_id``: the items ``start()`` yields are
    tagged with it (every worker of the crawl yields them: stored once per crawl)."""
    crawler._bloomcrawl_crawl_id = crawl_id


def start_prefix(crawler: Any) -> str | None:
    """The start of the ids of the items ``start()`` yields in this crawl (None: no crawl
    joined, not tagged)."""
    crawl_id: bytes | None = getattr(crawler, "_bloomcrawl_crawl_id", None)
    return "start:" + crawl_id.decode("ascii", "replace") if crawl_id else None
