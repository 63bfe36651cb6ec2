"""A spider that records, from its errback, the pages it could not fetch, and tries a
mirror of each.

``-a down_pages=N``: also N pages of the unreachable address, each of whose errbacks
tries a mirror page of its own again on purpose (``dont_filter``)."""

from __future__ import annotations

from typing import Any

import scrapy


class OutageSpider(scrapy.Spider):
    name = "outage"
    custom_settings = {"RETRY_ENABLED": False}

    def __init__(self, shop_url: str = "http://127.0.0.1:8000",
                 down_url: str = "http://127.0.0.1:9/", down_pages: str = "0", *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.urls = [shop_url.rstrip("/") + "/deals", down_url]
        self.urls += ["%s?page=%d" % (down_url, i) for i in range(int(down_pages))]
        self.mirror_url = shop_url.rstrip("/") + "/deals?mirror=1"

    async def start(self) -> Any:
        for url in self.urls:
            yield scrapy.Request(url, errback=self.unreachable)

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "deals": response.css("li.deal::text").getall()}

    def unreachable(self, failure: Any) -> Any:
        yield {"url": failure.request.url, "error": failure.type.__name__}
        if "?page=" in failure.request.url:
            page = failure.request.url.rsplit("=", 1)[1]
            # its meta comes with it too
            yield failure.request.replace(url="%s&page=%s" % (self.mirror_url, page),
                                          dont_filter=True)
        elif failure.request.url != self.mirror_url:
            # the same request at another address: its meta (and errback) come with it
            yield failure.request.replace(url=self.mirror_url)
