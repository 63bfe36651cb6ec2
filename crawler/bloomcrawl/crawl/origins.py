"""Where each item came from: the request whose response yielded it, and its position.

:class:`~bloomcrawl.crawl.middleware.FrontierSpiderMiddleware` tags each item
as the callback yields it; :class:`~bloomcrawl.crawl.pipelines.RedisItemsPipeline`
stores the item under that id, once. A page crawled twice (its worker died
before the ack) yields the same items in the same order, under the same ids.
"""

from __future__ import annotations

from typing import Any

#: item origins by id(item): an item object lives from the callback to the pipeline
_ORIGINS: dict[int, str] = {}


def tag(item: Any, origin: str) -> None:
    _ORIGINS[id(item)] = origin


def pop(item: Any) -> str | None:
    """The item's origin, forgotten from here on (None: not yielded by a tracked callback)."""
    return _ORIGINS.pop(id(item), None)


def forget(item: Any, *args: Any, **kwargs: Any) -> None:
    """Signal handler: an item dropped or failed before the pipeline took it."""
    _ORIGINS.pop(id(item), None)
