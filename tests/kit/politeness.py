"""Politeness crawls: workers the hosts site tells apart, and what it recorded of them.

The workers of a politeness crawl (:func:`start_polite_workers`) each send
their own User-Agent (:func:`polite_agent`), which the hosts site
(:mod:`bloomcrawl.ops.hosts_site`) records with every arrival; they are all up
before the test pushes its seeds, so all compete from the first request on.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable

import redis

from bloomcrawl.ops.hosts_site import (
    Arrival,
    RunningHostsSite,
    by_host,
    fetch_counts,
    pages_only,
)

from kit.checks import assert_each_once
from kit.workers import Worker, WorkerPool, wait_opened

#: workers of a politeness crawl
POLITE_WORKERS = 3
#: seconds they get to open their spiders (3 Scrapy processes on 2 cores)
POLITE_START_TIMEOUT_S = 30.0
#: seconds a politeness crawl gets, idle close included
POLITE_CRAWL_TIMEOUT_S = 60.0


def polite_agent(i: int) -> str:
    """Worker ``i``'s User-Agent: the site records it, and so tells who fetched what."""
    return "bloomcrawl-politeness-test/w%d" % i


def start_polite_workers(pool: WorkerPool, redis_url: str,
                         settings: dict[str, str]) -> list[Worker]:
    """POLITE_WORKERS ``scrapy crawl site`` processes, each with its own User-Agent
    (:func:`polite_agent`); returns once every one has opened its spider."""
    workers = [pool.start("w%d" % i, redis_url, {**settings, "USER_AGENT": polite_agent(i)})
               for i in range(POLITE_WORKERS)]
    wait_opened(workers, POLITE_START_TIMEOUT_S)
    return workers


def assert_pages_once(site: RunningHostsSite, arrivals: list[Arrival],
                      skip: frozenset[tuple[str, str]] = frozenset(),
                      also: Iterable[str] = ()) -> None:
    """Each page of every host (but ``skip``) was served exactly once, and nothing else
    was asked for but arrivals of the kinds ``also`` (``"robots"``, a 429's kind)."""
    expected = [(name, path) for name, spec in site.specs.items()
                for path in spec.page_paths() if (name, path) not in skip]
    assert_each_once(fetch_counts(pages_only(arrivals)), expected)
    allowed = {"page", *also}
    assert [a for a in arrivals if a.kind not in allowed] == []


def closest(arrivals: list[Arrival], host: str,
            count: int = 5) -> list[tuple[float, float | None, str, str, str, str, float]]:
    """The ``count`` shortest gaps of ``host``, for messages: (gap, from the answer before
    to the next arrival (None: no answer yet), agent and path before, agent and path
    after, seconds from the host's first request to the gap)."""
    records = by_host(arrivals)[host]
    gaps = [(round(b.start - a.start, 4), None if a.end is None else round(b.start - a.end, 4),
             a.agent[-2:], b.agent[-2:], a.path, b.path, round(a.start - records[0].start, 3))
            for a, b in itertools.pairwise(records)]
    return sorted(gaps)[:count]


class ClockCheck:
    """Whether Redis's clock (its TIME, which the frontier's delays are counted in) kept
    pace with this process's monotonic clock (which the site's arrivals are): a step of
    the wall clock would move every host's next lease by as much."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.start = self._pair()

    def _pair(self) -> tuple[float, float]:
        seconds, micros = self.client.time()
        return seconds + micros / 1e6, time.monotonic()

    def drift(self) -> float:
        """Seconds Redis's clock gained on the monotonic clock since this check began."""
        redis_now, mono_now = self._pair()
        return round((redis_now - self.start[0]) - (mono_now - self.start[1]), 4)
