"""``site`` for the fault suite: the project's spider, telling when it is initialised.

``-s SPIDER_MODULES=faults.spiders``. Every call of ``__init__`` is logged
(``faults.spiders: SiteSpider.__init__ call N``), so a test can see a queue
entry whose callback named ``__init__`` re-initialise the spider.

``-s FAULTS_REVISIT_WINDOWS=listing,article``: each link goes in one of these
named revisit windows (``meta["revisit"]``, chosen by the CRC-32 of its
canonical URL: the site spells a page several ways, and a page put in two
windows is rightly fetched once in each), and the spider
logs at close how many links it put in each (``WINDOWS_MARK``).
"""

from __future__ import annotations

import json
import logging
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

from scrapy import Request
from w3lib.url import canonicalize_url

from bloomcrawl.crawl.spiders.site import SiteSpider as ProjectSiteSpider

logger = logging.getLogger(__name__)

INIT_MARK = "faults.spiders: SiteSpider.__init__ call"
WINDOWS_MARK = "faults.spiders: links per revisit window"


class SiteSpider(ProjectSiteSpider):
    name = "site"
    init_calls = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        type(self).init_calls += 1
        logger.warning("%s %d", INIT_MARK, type(self).init_calls)
        super().__init__(*args, **kwargs)
        self.windows_used: Counter[str] = Counter()

    def make_request_from_start_entry(self, entry: dict[str, Any]) -> Request:
        return self._in_window(super().make_request_from_start_entry(entry))

    def parse(self, response: Any, **kwargs: Any) -> Iterator[Any]:
        for out in super().parse(response, **kwargs):
            yield self._in_window(out) if isinstance(out, Request) else out

    def _in_window(self, request: Request) -> Request:
        names = self.settings.getlist("FAULTS_REVISIT_WINDOWS")
        if names:
            name = names[zlib.crc32(canonicalize_url(request.url).encode()) % len(names)]
            request.meta["revisit"] = name
            self.windows_used[name] += 1
        return request

    def closed(self, reason: str) -> None:
        if self.settings.getlist("FAULTS_REVISIT_WINDOWS"):
            logger.warning("%s %s", WINDOWS_MARK, json.dumps(dict(self.windows_used)))
