"""An older spider's habit: some requests handed to the engine from the callback itself."""

from __future__ import annotations

import re
from typing import Any

import scrapy


class DirectSpider(scrapy.Spider):
    """Every other link goes to ``self.crawler.engine.crawl()`` instead of being yielded,
    with the page's meta copied, as spiders written for older Scrapy versions (and
    scrapy-redis's idle handler) do: those requests skip the spider middlewares."""

    name = "direct"
    allowed_domains = ["127.0.0.1"]

    def __init__(self, shop_url: str = "http://127.0.0.1:8000", *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [shop_url.rstrip("/") + "/"]

    def parse(self, response: Any) -> Any:
        for n, href in enumerate(response.css("a::attr(href)").getall()):
            request = response.follow(href, callback=self.parse, meta=dict(response.meta))
            if n % 2:
                self.crawler.engine.crawl(request)
            else:
                yield request
        if re.search(r"/product/\d+$", response.url):
            yield {"url": response.url}
