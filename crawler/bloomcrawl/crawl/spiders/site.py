"""``site``: follow links within the allowed domains, one item per page.

Start URLs come from the Redis list ``site:start_urls`` (see
:mod:`bloomcrawl.crawl.scheduler`). Spider arguments (scrapyd passes them too):

``allowed_domains``
    comma-separated; by default, the domains of the start URLs
``depth_limit``
    links deeper than this are not followed (0: no limit)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import scrapy
from scrapy.http import Response, TextResponse
from scrapy.linkextractors import LinkExtractor

DOMAINS_META_KEY = "site_domains"


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


def _in_domains(host: str, domains: list[str]) -> bool:
    return any(host == d or host.endswith("." + d) for d in domains)


class SiteSpider(scrapy.Spider):
    name = "site"

    def __init__(self, *args: Any, allowed_domains: str | list[str] | None = None,
                 depth_limit: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(allowed_domains, str):
            allowed_domains = [d.strip().lower() for d in allowed_domains.split(",") if d.strip()]
        self.allowed_domains = list(allowed_domains or [])
        try:
            self.depth_limit = int(depth_limit or 0)
        except ValueError:
            raise ValueError("depth_limit must be an integer, got %r" % (depth_limit,)) from None
        if self.depth_limit < 0:
            raise ValueError("depth_limit must be >= 0, got %r" % (depth_limit,))
        self.link_extractor = LinkExtractor()

    async def start(self) -> AsyncIterator[Any]:
        """Nothing here: the scheduler reads the start URLs from Redis."""
        return
        yield  # an async generator that yields nothing

    def make_request_from_start_entry(self, entry: dict[str, Any]) -> scrapy.Request:
        """A start-URL entry from Redis; its domain bounds the crawl unless allowed_domains."""
        meta = dict(entry.get("meta") or {})
        meta.setdefault(DOMAINS_META_KEY, self.allowed_domains or [_host(entry["url"])])
        return scrapy.Request(entry["url"], meta=meta, priority=entry.get("priority", 0),
                              dont_filter=entry.get("dont_filter", False))

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        depth = int(response.meta.get("depth", 0))
        title = ""
        if isinstance(response, TextResponse):
            title = (response.css("title::text").get() or "").strip()
        yield {
            "url": response.url,
            "status": response.status,
            "title": title,
            "depth": depth,
            "fetched_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
        }
        if not isinstance(response, TextResponse):
            return
        if self.depth_limit and depth >= self.depth_limit:
            return
        domains = response.meta.get(DOMAINS_META_KEY) or self.allowed_domains or [
            _host(response.url)]
        for link in self.link_extractor.extract_links(response):
            if _in_domains(_host(link.url), domains):
                yield response.follow(link.url, meta={DOMAINS_META_KEY: domains})
