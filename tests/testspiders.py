"""Spiders used by the tests only."""

from __future__ import annotations

from typing import Any

import scrapy

from bloomcrawl.spiders.site import SiteSpider


class SiteWithBadRequest(SiteSpider):
    """The site spider, plus one request whose meta cannot be JSON."""

    name = "site_with_bad_request"

    def parse(self, response: scrapy.http.Response, **kwargs: Any) -> Any:
        yield from super().parse(response, **kwargs)
        if response.meta.get("depth", 0) == 0:
            yield scrapy.Request(response.urljoin("/never"), meta={"handle": object()})
