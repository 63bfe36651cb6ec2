"""A spider that starts itself: an async ``start()`` (Scrapy 2.13) that yields an item too,
and no ``parse()``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import scrapy


class StarterSpider(scrapy.Spider):
    name = "starter"
    categories = ("books", "games", "tools")

    def __init__(self, shop_url: str = "http://127.0.0.1:8000", *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.base = shop_url.rstrip("/")

    async def start(self) -> AsyncIterator[Any]:
        # an item of its own first, as Scrapy 2.13 lets start() yield items
        yield {"category": "*", "categories": len(self.categories)}
        for name in self.categories:
            yield scrapy.Request("%s/category/%s" % (self.base, name),
                                 callback=self.parse_category, cb_kwargs={"category": name})

    def parse_category(self, response: Any, category: str) -> Any:
        yield {"category": category, "links": len(response.css("a::attr(href)").getall())}
