"""``site`` for the fault suite: the project's spider, telling when it is initialised.

``-s SPIDER_MODULES=faults.spiders``. Every call of ``__init__`` is logged
(``faults.spiders: SiteSpider.__init__ call N``), so a test can see a queue
entry whose callback named ``__init__`` re-initialise the spider.
"""

from __future__ import annotations

import logging
from typing import Any

from bloomcrawl.crawl.spiders.site import SiteSpider as ProjectSiteSpider

logger = logging.getLogger(__name__)

INIT_MARK = "faults.spiders: SiteSpider.__init__ call"


class SiteSpider(ProjectSiteSpider):
    name = "site"
    init_calls = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        type(self).init_calls += 1
        logger.warning("%s %d", INIT_MARK, type(self).init_calls)
        super().__init__(*args, **kwargs)
