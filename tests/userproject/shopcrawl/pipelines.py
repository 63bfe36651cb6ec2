"""Item pipelines: one that takes its time, as one that calls an outside service does, and
one that replaces each item with a dict."""

from __future__ import annotations

import asyncio
from typing import Any

from itemadapter import ItemAdapter


class EnrichPipeline:
    """Waits ENRICH_DELAY seconds per item (0: none), then marks the item enriched."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    @classmethod
    def from_crawler(cls, crawler: Any) -> EnrichPipeline:
        return cls(crawler.settings.getfloat("ENRICH_DELAY", 0.0))

    async def process_item(self, item: Any, spider: Any = None) -> Any:
        if self.delay:
            await asyncio.sleep(self.delay)
        item["enriched"] = True
        return item


class AsDictPipeline:
    """Hands on a plain dict instead of the Item, as many projects' export pipelines do."""

    def process_item(self, item: Any, spider: Any = None) -> Any:
        return dict(ItemAdapter(item).asdict(), exported=True)
