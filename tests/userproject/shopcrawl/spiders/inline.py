"""A spider that downloads from its callback (``engine.download``), as Scrapy 2.13 lets
an ``async def`` callback do, with its page's meta: a stock service that is down."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy.utils.defer import maybe_deferred_to_future


class InlineSpider(scrapy.Spider):
    name = "inline"
    custom_settings = {"RETRY_ENABLED": False}

    def __init__(self, shop_url: str = "http://127.0.0.1:8000",
                 stock_url: str = "http://127.0.0.1:9/", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [shop_url.rstrip("/") + "/"]
        self.stock_url = stock_url

    def parse(self, response: Any) -> Iterator[Any]:
        yield from response.follow_all(css="a[href^='/category/']", callback=self.parse_listing)

    def parse_listing(self, response: Any) -> Iterator[Any]:
        yield from response.follow_all(css="a[href^='/product/']", callback=self.parse_product)
        yield from response.follow_all(css="a[rel=next]", callback=self.parse_listing)

    async def parse_product(self, response: Any) -> AsyncIterator[Any]:
        stock = scrapy.Request(self.stock_url + response.url.rsplit("/", 1)[1],
                               meta=response.meta, dont_filter=True)
        engine = self.crawler.engine
        try:
            if hasattr(engine, "download_async"):  # Scrapy 2.14
                await engine.download_async(stock)
            else:
                await maybe_deferred_to_future(engine.download(stock))
            status = "in stock"
        except Exception as exc:
            status = type(exc).__name__
        yield {"url": response.url, "stock": status}
