"""A CrawlSpider as Scrapy's tutorial writes one: rules, and a half-filled item passed on."""

from __future__ import annotations

import datetime
from typing import Any

from pricefmt import parse_price
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule

from shopcrawl.items import Listing, ProductItem


class CatalogSpider(CrawlSpider):
    name = "catalog"
    allowed_domains = ["127.0.0.1"]
    rules = (
        Rule(LinkExtractor(allow=r"/category/"), follow=True),
        Rule(LinkExtractor(allow=r"/product/\d+$"), callback="parse_product", follow=True),
    )

    def __init__(self, shop_url: str = "http://127.0.0.1:8000", *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [shop_url.rstrip("/") + "/"]

    def parse_product(self, response: Any) -> Any:
        item = ProductItem()
        item["url"] = response.url
        item["name"] = response.css("h1.name::text").get()
        item["currency"], item["price"] = parse_price(response.css(".price::text").get())
        item["category"] = response.css("a.category::attr(data-name)").get()
        listing = Listing(category=item["category"], page=1,
                          found_at=datetime.datetime.now(datetime.UTC))
        yield response.follow(response.css("a.reviews::attr(href)").get(),
                              callback=self.parse_reviews,
                              cb_kwargs={"item": item, "tags": ("new", item["category"])},
                              meta={"listing": listing, "seen": {response.url}})

    def parse_reviews(self, response: Any, item: ProductItem, tags: tuple[str, ...]) -> Any:
        # what the callback gets back must be what it put in, with its types
        listing = response.meta["listing"]
        if not (isinstance(item, ProductItem) and isinstance(listing, Listing)
                and isinstance(tags, tuple) and isinstance(response.meta["seen"], set)
                and isinstance(listing.found_at, datetime.datetime)):
            raise TypeError("lost types: %r %r %r %r" % (type(item), type(listing), tags,
                                                          response.meta["seen"]))
        item["reviews"] = len(response.css("li.review"))
        item["seen_at"] = listing.found_at.isoformat()
        item["spider"] = self.name
        item["price"] = str(item["price"])
        yield item
