"""An older spider's habit: some requests handed to the engine from the callback itself."""

from __future__ import annotations

import re
import threading
from typing import Any

import scrapy


class DirectSpider(scrapy.Spider):
    """Every other link goes to ``self.crawler.engine.crawl()`` instead of being yielded,
    with the page's meta copied, as spiders written for older Scrapy versions (and
    scrapy-redis's idle handler) do: those requests skip the spider middlewares.

    With ``held=1`` the links carry a lock in their meta, which no queue can hold: the
    worker that crawls the start page crawls every page itself."""

    name = "direct"
    allowed_domains = ["127.0.0.1"]

    def __init__(self, shop_url: str = "http://127.0.0.1:8000", held: str = "", *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [shop_url.rstrip("/") + "/"]
        self.held = bool(held)

    def parse(self, response: Any) -> Any:
        meta = dict(response.meta)
        if self.held and "lock" not in meta:
            meta["lock"] = threading.Lock()
        for n, href in enumerate(response.css("a::attr(href)").getall()):
            request = response.follow(href, callback=self.parse, meta=dict(meta))
            if n % 2:
                self.crawler.engine.crawl(request)
            else:
                yield request
        if re.search(r"/product/\d+$", response.url):
            yield {"url": response.url}
