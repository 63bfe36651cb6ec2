"""A spider that reads each product page twice: once for the product, and again, later and
on purpose (``dont_filter``), for its stock, with another callback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy


class StockSpider(scrapy.Spider):
    name = "stock"

    def __init__(self, shop_url: str = "http://127.0.0.1:8000", *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [shop_url.rstrip("/") + "/"]

    def parse(self, response: Any) -> Iterator[Any]:
        yield from response.follow_all(css="a[href^='/category/']", callback=self.parse_listing)

    def parse_listing(self, response: Any) -> Iterator[Any]:
        yield from response.follow_all(css="a[href^='/product/']", callback=self.parse_product)
        yield from response.follow_all(css="a[rel=next]", callback=self.parse_listing)

    def parse_product(self, response: Any) -> Iterator[Any]:
        yield {"url": response.url, "kind": "product",
               "name": response.css("h1.name::text").get()}
        # the same URL again: without dont_filter the duplicate filter would drop it
        yield scrapy.Request(response.url, callback=self.parse_stock, dont_filter=True,
                             priority=-1)

    def parse_stock(self, response: Any) -> Iterator[Any]:
        yield {"url": response.url, "kind": "stock",
               "price": response.css(".price::text").get()}
