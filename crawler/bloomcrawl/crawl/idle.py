"""MAX_IDLE_TIME_BEFORE_CLOSE: close the spider once the whole cluster's frontier stayed empty.

Scrapy's engine sends ``spider_idle`` only on its 5 s heartbeat, which made
a 2 s idle close take 5-10 s. Like Scrapy's ``CloseSpider`` extension, the
closer keeps its own clock and asks again itself when the spider may close
by then (:meth:`IdleCloser.recheck_in`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import DontCloseSpider

from bloomcrawl.crawl.redis_io import call_later

if TYPE_CHECKING:
    from bloomcrawl.crawl.engine import EngineInterface
    from bloomcrawl.crawl.exchanges import ExchangeLoop

logger = logging.getLogger(__name__)

#: how soon the worker asks whether it is idle again after owing Redis something or
#: seeing the frontier empty
IDLE_RECHECK_S = 0.25


class IdleCloser:
    def __init__(self, engine: EngineInterface, max_idle: float,
                 log_extra: dict[str, Any]) -> None:
        self.engine = engine
        #: seconds the frontier must stay empty; 0: never close
        self.max_idle = max_idle
        self.log_extra = log_extra
        self._since: float | None = None
        self._call: Any = None
        self._stopped = False

    def spider_idle(self, loop: ExchangeLoop) -> None:
        """The engine is idle: raises DontCloseSpider while this worker owes Redis or
        holds work, or the cluster's frontier (as ``loop`` last saw it) is not empty,
        until it stayed empty for ``max_idle`` s; returns when the spider may close."""
        if loop.busy_here():
            loop.exchange(lease=loop.starved)
            self.recheck_in(IDLE_RECHECK_S)
            raise DontCloseSpider
        loop.starved = True
        if loop.frontier_size is None or loop.frontier_size > 0:
            # others are crawling and may queue more (or we do not know yet): look soon
            self.not_empty()
            loop.poller.look_soon()
            raise DontCloseSpider
        self.empty()

    def not_empty(self) -> None:
        """Something is queued or leased somewhere (or unknown): the clock starts over."""
        self._since = None

    def empty(self) -> None:
        """The frontier is empty everywhere: raises DontCloseSpider until it stayed so
        for ``max_idle`` s; returns when the spider may close."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if self.max_idle <= 0 or now - self._since < self.max_idle:
            self.recheck_in(self._since + self.max_idle - now)
            raise DontCloseSpider
        logger.info("frontier empty for %.0f s: closing", now - self._since,
                    extra=self.log_extra)

    def recheck_in(self, delay: float) -> None:
        """Ask whether the spider is idle in ``delay`` s (when it may close by then)."""
        if self.max_idle > 0 and not self._stopped and self._call is None:
            self._call = call_later(max(0.0, delay), self._check)

    def _check(self) -> None:
        self._call = None
        if not self._stopped:
            self.engine.close_if_idle()

    def stop(self) -> None:
        self._stopped = True
        if self._call is not None:
            self._call.cancel()
            self._call = None
