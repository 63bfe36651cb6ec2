"""A news site's CrawlSpider: its index is a listing that changes, its articles do not.

The articles are crawled once for good (the spider's ``revisit_window``);
the index, a listing, is fetched again once its window has passed, which
is how new articles are found in a crawl that runs on a schedule. The
windows are the project's BLOOMFILTER_REVISIT_WINDOWS.
"""

from __future__ import annotations

from typing import Any

from scrapy import Request
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class NewsSpider(CrawlSpider):
    name = "news"
    allowed_domains = ["127.0.0.1"]
    revisit_window = "article"
    rules = (
        Rule(LinkExtractor(allow=r"/a/\d+$"), callback="parse_article", follow=True),
        Rule(LinkExtractor(allow=r"/$"), process_request="as_listing", follow=True),
    )

    def __init__(self, site_url: str = "http://127.0.0.1:8000/", *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [site_url]

    def as_listing(self, request: Request, response: Any) -> Request:
        request.meta["revisit"] = "listing"
        return request

    def parse_article(self, response: Any) -> Any:
        yield {"url": response.url, "title": response.css("h1::text").get(),
               "version": response.css("p::text").get()}
