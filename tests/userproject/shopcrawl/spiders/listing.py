"""A spider that scrapes the category listings: an item for every product a page lists."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy


class ListingSpider(scrapy.Spider):
    name = "listing"

    def __init__(self, shop_url: str = "http://127.0.0.1:8000", *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [shop_url.rstrip("/") + "/"]

    def parse(self, response: Any) -> Iterator[Any]:
        # the start page's meta passed on, as many spiders do (is_start_request with it)
        yield from response.follow_all(css="a[href^='/category/']", callback=self.parse_listing,
                                       meta=dict(response.meta, source="home"))

    def parse_listing(self, response: Any) -> Iterator[Any]:
        for link in response.css("a[href^='/product/']"):
            yield {"url": response.urljoin(link.attrib["href"]),
                   "name": link.css("::text").get(),
                   "listed_on": response.url}
        yield from response.follow_all(css="a[rel=next]", callback=self.parse_listing)
