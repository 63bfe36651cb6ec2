"""Item 5's changing site crawled in runs under a revisit window, with real workers.

W = 20 s in 10 generations: a page queued less than 20 s ago is a duplicate,
one queued more than 22 s ago (the bound, W (1 + 1/g)) is fetched again. W is
wide enough for a worker's start and crawl (a few seconds, more on a loaded
machine) to fit well within it; the test checks that they did. Each run
is one ``scrapy crawl site`` worker with its own FRONTIER_CRAWL_ID, so its
start URL (the index) is fetched once per run; the index's own URL, linked
from every article, is a page like the others.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import redis

from kit.changing_site import ChangingSite
from kit.checks import stored_items
from kit.redis import redis_now
from kit.wait import wait_until
from kit.workers import WorkerPool, check_exits, run_workers

WINDOW = 20.0
GENERATIONS = 10
BOUND = WINDOW * (1 + 1 / GENERATIONS)
#: run 1.5 starts this long before the bound of run 1: its crawl is within W of run 1's,
#: and run 2 (after the bound) finds run 1.5's pages within W too
BEFORE_BOUND = 12.0
#: a page's links are queued after it was fetched: at most this long after, here
PARSE_S = 1.0



def crawl_run(pool: WorkerPool, redis_url: str, client: redis.Redis, site: ChangingSite,
              run: str) -> tuple[Counter[str], list[float]]:
    """One run of one worker; the pages it fetched (URL -> times) and when."""
    client.rpush("site:start_urls", json.dumps(
        {"url": site.url, "dont_filter": True, "meta": {"is_start_request": True}}))
    since = redis_now(client)
    worker = pool.start(run, redis_url, {
        "FRONTIER_CRAWL_ID": run,
        "BLOOMFILTER_REVISIT_AFTER": "%gs" % WINDOW,
        "BLOOMFILTER_GENERATIONS": str(GENERATIONS),
    })
    run_workers([worker], timeout=120)
    check_exits([worker])
    fetches = site.fetches(since)
    return Counter(url for _, url in fetches), [t for t, _ in fetches]


@pytest.mark.long
def test_runs_fetch_the_pages_past_the_bound_and_the_new_ones(
        redis_server, redis_client: redis.Redis, worker_pool: WorkerPool) -> None:
    with ChangingSite(articles=10) as site:
        first = site.urls()[1:]
        run1, times1 = crawl_run(worker_pool, redis_server.url, redis_client, site, "run1")
        # the start request and the index's own URL (linked from the articles): twice
        assert run1 == Counter({site.url: 2, **{url: 1 for url in first}})
        run1_last = max(times1)

        # within W of run 1: only what was published since
        wait_until(lambda: redis_now(redis_client) >= run1_last + BOUND - BEFORE_BOUND, 30,
                   what="run 1.5's time")
        middle = site.publish(3)
        run15_start = redis_now(redis_client)
        run15, times15 = crawl_run(worker_pool, redis_server.url, redis_client, site, "run15")
        assert run15 == Counter({site.url: 1, **{url: 1 for url in middle}})
        assert max(times15) + PARSE_S - min(times1) < WINDOW

        # past the bound of run 1: its pages again, and what is new; not run 1.5's
        wait_until(lambda: redis_now(redis_client) > run1_last + PARSE_S + BOUND, 30,
                   what="the bound after run 1")
        late = site.publish(2)
        run2, times2 = crawl_run(worker_pool, redis_server.url, redis_client, site, "run2")
        assert run2 == Counter({site.url: 2, **{url: 1 for url in first + late}})
        # a revisit stores its page's item again (the first visit's is kept): within
        # REDIS_ITEMS_DEDUP_WINDOW only a page crawled twice for one queue entry stores once
        items = Counter(item["url"] for item in stored_items(redis_client))
        assert [items[url] for url in first] == [2] * len(first), items
        assert [items[url] for url in middle + late] == [1] * len(middle + late), items
        # run 1.5's pages were queued after its index was fetched: within W of run 2
        assert max(times2) + PARSE_S - min(times15) < WINDOW

        # a run within W of run 2: nothing it fetched again, the new page; run 1.5's pages
        # are fetched again only if they are past the bound by now
        newest = site.publish(1)
        since = redis_now(redis_client)
        run3, times3 = crawl_run(worker_pool, redis_server.url, redis_client, site, "run3")
        assert max(times3) + PARSE_S - min(times2) < WINDOW
        assert set(run3).isdisjoint(first + late)
        assert run3[site.url] == 1 and all(run3[url] == 1 for url in newest)
        for url in middle:
            queued = (fetch_time(site, site.url, run15_start), fetch_time(site, url, run15_start))
            decided = (fetch_time(site, site.url, since), max(times3) + PARSE_S)
            if decided[0] - queued[1] > BOUND:
                assert run3[url] == 1, (url, queued, decided)
            if decided[1] - queued[0] < WINDOW:
                assert url not in run3, (url, queued, decided)
        assert set(run3) <= {site.url, *middle, *newest}


def fetch_time(site: ChangingSite, url: str, since: float) -> float:
    """When ``url`` was first fetched at or after ``since``."""
    return min(t for t, fetched in site.fetches(since) if fetched == url)
