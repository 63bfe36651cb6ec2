"""A spider that records, from its errback, the pages it could not fetch, and tries a
mirror of each."""

from __future__ import annotations

from typing import Any

import scrapy


class OutageSpider(scrapy.Spider):
    name = "outage"
    custom_settings = {"RETRY_ENABLED": False}

    def __init__(self, shop_url: str = "http://127.0.0.1:8000",
                 down_url: str = "http://127.0.0.1:9/", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.urls = [shop_url.rstrip("/") + "/deals", down_url]
        self.mirror_url = shop_url.rstrip("/") + "/deals?mirror=1"

    async def start(self) -> Any:
        for url in self.urls:
            yield scrapy.Request(url, errback=self.unreachable)

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "deals": response.css("li.deal::text").getall()}

    def unreachable(self, failure: Any) -> Any:
        yield {"url": failure.request.url, "error": failure.type.__name__}
        if failure.request.url != self.mirror_url:
            # the same request at another address: its meta (and errback) come with it
            yield failure.request.replace(url=self.mirror_url)
