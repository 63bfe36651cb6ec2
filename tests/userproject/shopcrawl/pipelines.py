"""An item pipeline that takes its time, as one that calls an outside service does."""

from __future__ import annotations

import asyncio
from typing import Any


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
