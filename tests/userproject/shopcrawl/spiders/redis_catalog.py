"""A spider written for scrapy-redis: start URLs from Redis, CrawlSpider rules."""

from __future__ import annotations

from typing import Any

from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import Rule
from scrapy_redis.spiders import RedisCrawlSpider

from shopcrawl.items import ProductItem


class RedisCatalogSpider(RedisCrawlSpider):
    name = "redis_catalog"
    redis_key = "redis_catalog:start_urls"
    rules = (
        Rule(LinkExtractor(allow=r"/category/"), follow=True),
        Rule(LinkExtractor(allow=r"/product/\d+$"), callback="parse_product", follow=True),
        Rule(LinkExtractor(allow=r"/search$"), callback="parse_search", follow=False),
    )

    def parse_product(self, response: Any) -> Any:
        yield ProductItem(url=response.url, name=response.css("h1.name::text").get(),
                          spider=self.name)
        yield response.follow(response.css("a.reviews::attr(href)").get(),
                              callback=self.parse_reviews, meta={"product": response.url})

    def parse_reviews(self, response: Any) -> Any:
        yield {"reviews_of": response.meta["product"], "count": len(response.css("li.review"))}

    def parse_search(self, response: Any) -> Any:
        """The search form, posted once per category.

        @shop_url /search
        @returns requests 3 3
        """
        for category in response.css("option::attr(value)").getall():
            from scrapy import FormRequest

            yield FormRequest.from_response(response, formdata={"q": category},
                                            callback=self.parse_results,
                                            cb_kwargs={"category": category})

    def parse_results(self, response: Any, category: str) -> Any:
        for href in response.css("a.result::attr(href)").getall():
            yield {"search": category, "result": response.urljoin(href)}
