"""Scrapy's duplicate log under the frontier: what ``DUPEFILTER_DEBUG`` asks for.

Scrapy's dupefilter logs the first filtered request at DEBUG ("no more
duplicates will be shown"), and every one with DUPEFILTER_DEBUG. Under the
frontier a request is filtered in two places: by the worker's seen cache
(:class:`~bloomcrawl.crawl.seen.SeenCache`: a fingerprint this worker sent
before) and by the filter in Redis, when the exchange that carried it
returns. Both say so here, the same way.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request, Spider

    from bloomcrawl.core.frontier import Outgoing
    from bloomcrawl.crawl.outbox import Batch

logger = logging.getLogger(__name__)


def _described(payload: str) -> str:
    """``<METHOD url>`` of a serialized request, as Scrapy shows a request."""
    try:
        data = json.loads(payload)
        return "<%s %s>" % (data.get("method") or "GET", data["url"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return "<a request of %d bytes>" % len(payload)


class DuplicateLog:
    def __init__(self, debug: bool, spider: Spider) -> None:
        self.debug = debug
        self.extra: dict[str, Any] = {"spider": spider}
        #: whether the next duplicate is logged (checked before calling, on the hot path)
        self.active = True

    def _log(self, request: str) -> None:
        if self.debug:
            logger.debug("Filtered duplicate request: %s", request, extra=self.extra)
        else:
            logger.debug("Filtered duplicate request: %s - no more duplicates will be shown"
                         " (see DUPEFILTER_DEBUG to show all duplicates)", request,
                         extra=self.extra)
            self.active = False

    def local(self, request: Request) -> None:
        """``request`` was dropped by the seen cache."""
        self._log("<%s %s>" % (request.method, request.url))

    def entry(self, entry: Outgoing) -> None:
        """``entry`` was left out of an exchange: its fingerprint went in the last one,
        or twice in this one."""
        self._log(_described(entry.payload))

    def filtered(self, batch: Batch, queued: list[bytes]) -> None:
        """The requests of ``batch`` the filter in Redis did not queue."""
        left = Counter(queued)
        for entry in batch.outgoing:
            if entry.dont_filter or entry.record_only:
                continue
            if left[entry.fingerprint] > 0:
                left[entry.fingerprint] -= 1  # the same fingerprint twice: one was queued
                continue
            self._log(_described(entry.payload))
            if not self.active:
                return
