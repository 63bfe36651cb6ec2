"""A SitemapSpider over the shop's sitemap.xml."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pricefmt import parse_price
from scrapy.spiders import SitemapSpider

from shopcrawl.items import ProductItem


class ShopSitemapSpider(SitemapSpider):
    name = "sitemap"
    sitemap_rules = [(r"/product/\d+$", "parse_product")]

    def __init__(self, shop_url: str = "http://127.0.0.1:8000",
                 sitemap_path: str = "/sitemap.xml", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sitemap_urls = [shop_url.rstrip("/") + sitemap_path]

    def parse_product(self, response: Any) -> Any:
        item = ProductItem(url=response.url, name=response.css("h1.name::text").get())
        _, price = parse_price(response.css(".price::text").get())
        yield response.follow(response.css("a.reviews::attr(href)").get(),
                              callback=self.parse_reviews,
                              cb_kwargs={"item": item, "price": price})

    def parse_reviews(self, response: Any, item: ProductItem, price: Decimal) -> Any:
        if not (isinstance(item, ProductItem) and isinstance(price, Decimal)):
            raise TypeError("lost types: %r %r" % (type(item), type(price)))
        item["price"] = str(price)
        item["reviews"] = len(response.css("li.review"))
        item["spider"] = self.name
        yield item
