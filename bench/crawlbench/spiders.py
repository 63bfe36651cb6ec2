"""``site`` for the contenders whose scheduler does not read ``site:start_urls``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from bloomcrawl.crawl.spiders.site import SiteSpider


class StartArgumentSiteSpider(SiteSpider):
    """The project's ``site`` spider, started from the ``start_url`` spider argument.

    Same link following and items; only the start differs: the request is
    yielded from ``start()`` like any Scrapy spider's, so the engine hands it
    to whichever scheduler is configured (a shared one filters the copies
    other workers yield).
    """

    name = "site"

    def __init__(self, *args: Any, start_url: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not start_url:
            raise ValueError("give the start URL: -a start_url=http://...")
        self.start_url = start_url

    async def start(self) -> AsyncIterator[Any]:
        yield self.make_request_from_start_entry({"url": self.start_url})
