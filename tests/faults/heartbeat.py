"""A Scrapy extension measuring how late the reactor runs a 50 ms timer.

``-s EXTENSIONS={"faults.heartbeat.Heartbeat": 0} -s FAULTS_HEARTBEAT_FILE=path``:
from spider_opened on, a LoopingCall ticks every 50 ms; each tick's lag is
how much later than its schedule it ran. Lags above 20 ms are kept with the
``time.monotonic()`` they ended at (system-wide on Linux, so the test
process can line them up with its own clock), in the file as JSON
(``max_lag``, ``ticks``, ``lags``: [[at, lag], ...]), written when the
spider opens, whenever a lag is kept, and when it closes. A reactor blocked
on a Redis call shows up as one tick that lags by the whole call.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from twisted.internet.task import LoopingCall

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

INTERVAL_S = 0.05
KEEP_ABOVE_S = 0.02


class Heartbeat:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.loop = LoopingCall(self.tick)
        self.last = 0.0
        self.ticks = 0
        self.max_lag = 0.0
        self.lags: list[tuple[float, float]] = []

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Heartbeat:
        path = crawler.settings.get("FAULTS_HEARTBEAT_FILE")
        if not path:
            raise NotConfigured("FAULTS_HEARTBEAT_FILE is not set")
        ext = cls(Path(path))
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_opened(self, spider: Any) -> None:
        self.write()  # the file exists from the start, lags or not
        self.last = time.monotonic()
        self.loop.start(INTERVAL_S, now=False)

    def tick(self) -> None:
        now = time.monotonic()
        lag = now - self.last - INTERVAL_S
        self.last = now
        self.ticks += 1
        if lag > KEEP_ABOVE_S:
            self.lags.append((now, lag))
            self.max_lag = max(self.max_lag, lag)
            self.write()

    def spider_closed(self, spider: Any, reason: str) -> None:
        if self.loop.running:
            self.loop.stop()
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"max_lag": self.max_lag, "ticks": self.ticks,
                                   "lags": self.lags}))
        tmp.replace(self.path)
