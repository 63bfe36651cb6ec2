"""Spiders used by the tests only."""

from __future__ import annotations

from typing import Any

import scrapy

from bloomcrawl.crawl.spiders.site import SiteSpider


class SiteWithBadRequest(SiteSpider):
    """The site spider, plus one request whose meta cannot be JSON."""

    name = "site_with_bad_request"

    def parse(self, response: scrapy.http.Response, **kwargs: Any) -> Any:
        yield from super().parse(response, **kwargs)
        if response.meta.get("depth", 0) == 0:
            yield scrapy.Request(response.urljoin("/never"), meta={"handle": object()})


class LinkSpider(scrapy.Spider):
    """Follows every link from ``start_url``; for the dupefilter under other schedulers."""

    name = "links"

    def __init__(self, *args: Any, start_url: str = "", max_links: str = "0",
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_url = start_url
        self.max_links = int(max_links)

    async def start(self) -> Any:
        yield scrapy.Request(self.start_url, dont_filter=True)

    def parse(self, response: scrapy.http.Response, **kwargs: Any) -> Any:
        from scrapy.linkextractors import LinkExtractor

        links = LinkExtractor().extract_links(response)
        if self.max_links:
            links = links[: self.max_links]
        for link in links:
            yield response.follow(link.url)


class SlottedSiteSpider(SiteSpider):
    """The site spider with every request in one download slot of its own naming
    (``meta["download_slot"]``, TEST_DOWNLOAD_SLOT), as a spider does to give several
    hosts one delay (DOWNLOAD_SLOTS)."""

    name = "slotted"

    def make_request_from_start_entry(self, entry: dict[str, Any]) -> scrapy.Request:
        return self._slotted(super().make_request_from_start_entry(entry))

    def parse(self, response: scrapy.http.Response, **kwargs: Any) -> Any:
        for out in super().parse(response, **kwargs):
            yield self._slotted(out) if isinstance(out, scrapy.Request) else out

    def _slotted(self, request: scrapy.Request) -> scrapy.Request:
        request.meta["download_slot"] = self.settings.get("TEST_DOWNLOAD_SLOT")
        return request
