"""Named revisit windows in a user's CrawlSpider, crawled in runs by real workers.

The project's ``news`` spider (tests/userproject) puts the index of the
changing site (:mod:`kit.changing_site`) in the "listing" window (4 s in 2
generations: new again 6 s after at most) through its rule's
``process_request``, and its articles in "article" (its ``revisit_window``),
which never forgets. A first run of two workers fetches every page once (the
index twice: as the start URL and as a listing linked from the articles); a
second run past the listing's bound fetches the index again, and of the
articles only those published since.
"""

from __future__ import annotations

import json
from collections import Counter

import redis

from kit import TESTS
from kit.changing_site import ChangingSite
from kit.checks import shared_stats
from kit.redis import redis_now
from kit.wait import wait_until
from kit.workers import WorkerPool, check_exits, run_workers

USERPROJECT = TESTS / "userproject"
#: the project's own dependency (requirements.txt)
PRICEFMT = USERPROJECT / "vendor" / "pricefmt"
LISTING = 4.0
GENERATIONS = 2
BOUND = LISTING * (1 + 1 / GENERATIONS)
#: a page's links are queued after it was fetched: at most this long after, here
PARSE_S = 1.0



def news_run(pool: WorkerPool, redis_url: str, client: redis.Redis, site: ChangingSite,
             run: str, workers: int) -> tuple[Counter[str], list[float]]:
    since = redis_now(client)
    started = pool.start_many(workers, redis_url, {
        "FRONTIER_CRAWL_ID": run,
        "BLOOMFILTER_REVISIT_WINDOWS": json.dumps({"listing": "%gs" % LISTING,
                                                   "article": "never"}),
        "BLOOMFILTER_GENERATIONS": str(GENERATIONS),
    }, prefix=run, spider="news", args={"site_url": site.url}, project=USERPROJECT,
        pythonpath=(PRICEFMT,))
    run_workers(started, timeout=120)
    check_exits(started)
    fetches = site.fetches(since)
    return Counter(url for _, url in fetches), [t for t, _ in fetches]


def test_listings_are_fetched_again_after_their_window_and_articles_never(
        redis_server, redis_client: redis.Redis, worker_pool: WorkerPool) -> None:
    with ChangingSite(articles=12) as site:
        articles = site.urls()[1:]
        run1, times1 = news_run(worker_pool, redis_server.url, redis_client, site, "one", 2)
        # the start request once per crawl, and the index as a listing once: linked from
        # every article, within its window
        assert run1 == Counter({site.url: 2, **{url: 1 for url in articles}})
        items = [json.loads(raw) for raw in redis_client.lrange("news:items", 0, -1)]
        assert sorted(item["url"] for item in items) == sorted(articles)

        late = site.publish(3)
        site.edit(0)  # an article that changed: in a window that never forgets, not fetched
        wait_until(lambda: redis_now(redis_client) > max(times1) + PARSE_S + BOUND, 30,
                   what="the listing window's bound after run one")
        run2, _ = news_run(worker_pool, redis_server.url, redis_client, site, "two", 1)
        assert run2 == Counter({site.url: 2, **{url: 1 for url in late}})
        # the articles' links to one another and to the index were found duplicates
        assert shared_stats(redis_client, "news")["filtered"] > 0
