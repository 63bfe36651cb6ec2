"""Real crawls: several ``scrapy crawl site`` processes, one real redis-server, the demo site."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from scrapy import signals as scrapy_signals

from kit.checks import (
    assert_crawled_once,
    frontier_left,
    pages_crawled,
    shared_stats,
    stop_lease_holder,
)
from kit.redis import RedisServer
from kit.wait import wait_until
from kit.workers import BASE_SETTINGS, WorkerPool, check_exits, run_workers

pytestmark = pytest.mark.slow


def test_three_workers_crawl_every_page_exactly_once(redis_server, redis_client, demo_site,
                                                     worker_pool: WorkerPool) -> None:
    redis_client.rpush("site:start_urls", demo_site.url)
    workers = worker_pool.start_many(3, redis_server.url)
    run_workers(workers, timeout=300)
    # every page once, counted and stored once; the frontier empty; clean exits
    assert_crawled_once(demo_site, redis_client, workers)
    assert demo_site.hits() == [1] * len(demo_site.hits())
    per_worker = [w.stats().get("response_received_count", 0) for w in workers]
    assert sum(per_worker) == len(demo_site.hits())
    assert all(n > 0 for n in per_worker), per_worker  # each did part of the work
    item = json.loads(redis_client.lindex("site:items", 0))
    assert set(item) == {"url", "status", "title", "depth", "fetched_at"}
    shared = shared_stats(redis_client)
    assert shared["filtered"] > len(demo_site.hits())  # the site links to each page many times
    max_idle = float(BASE_SETTINGS["MAX_IDLE_TIME_BEFORE_CLOSE"])
    for w in workers:
        # each closed MAX_IDLE_TIME_BEFORE_CLOSE after the frontier emptied, not at one of
        # the engine's 5 s idle checks (which made a 3 s idle close take 5 or 10 s)
        idle = re.findall(r"frontier empty for (\d+) s: closing", w.text())
        assert len(idle) == 1 and int(idle[0]) <= max_idle + 1, (w.name, idle)


@pytest.mark.parametrize("demo_site", [{"pages": 30}], indirect=True)
def test_a_start_url_seen_before_is_said_in_the_log_and_crawled_again_with_dont_filter(
    redis_server, redis_client, demo_site, worker_pool: WorkerPool
) -> None:
    root = demo_site.url
    filtered = "start URL %s from site:start_urls not queued: the Bloom filter has seen it" % root
    # the same start URL twice in one push: the second is filtered within the worker
    redis_client.rpush("site:start_urls", root, root)
    first = worker_pool.start("first", redis_server.url)
    run_workers([first], timeout=120)
    assert demo_site.hits() == [1] * len(demo_site.hits())
    assert first.text().count(filtered) == 1
    assert first.stats()["bloomcrawl/start_urls_filtered"] == 1
    # a new worker (nothing in its own cache): the filter in Redis says it, and the same
    # URL pushed with dont_filter is crawled again
    redis_client.rpush("site:start_urls", root, json.dumps({"url": root, "dont_filter": True}))
    second = worker_pool.start("second", redis_server.url)
    run_workers([second], timeout=120)
    hits = demo_site.hits()
    assert hits[0] == 2 and hits[1:] == [1] * (len(hits) - 1), hits
    assert second.text().count(filtered) == 1, second.tail()
    assert second.stats()["bloomcrawl/start_urls_filtered"] == 1
    check_exits([first, second])


@pytest.mark.parametrize("window", [
    {},
    # under a revisit window an item's id is its page's visit (the queue entry, which a
    # requeued lease keeps) and position: a page crawled twice for one entry stores once
    {"BLOOMFILTER_REVISIT_AFTER": "1h", "BLOOMFILTER_GENERATIONS": "4"},
], ids=["no window", "revisit window"])
def test_sigkilled_worker_loses_nothing(redis_server, redis_client, demo_site,
                                        worker_pool: WorkerPool, window: dict[str, str]) -> None:
    concurrent = 8
    settings = {
        "SCHEDULER_LEASE_TIMEOUT": "3",
        "SCHEDULER_REAP_INTERVAL": "1",
        "CONCURRENT_REQUESTS": str(concurrent),
        **window,
    }
    redis_client.rpush("site:start_urls", demo_site.url)
    workers = worker_pool.start_many(3, redis_server.url, settings)
    total = len(demo_site.hits())
    wait_until(lambda: pages_crawled(demo_site) >= total // 3, 180,
               what="a third of the site crawled")
    # killed while it holds leases (the site is one host: its budget may leave a worker
    # with none for a moment): stopped first, so that none is acked between the look
    # and the kill
    wait_until(lambda: stop_lease_holder(workers[:1], redis_client), 60, interval=0.01,
               what="worker 0 to hold a lease")
    workers[0].kill()
    run_workers(workers[1:], timeout=300)
    hits = demo_site.hits()
    assert min(hits) >= 1, [i for i, h in enumerate(hits) if h == 0][:20]  # nothing lost
    twice = sum(h - 1 for h in hits if h > 1)
    shared = shared_stats(redis_client)
    # every page fetched twice is one the killed worker held a lease on: its
    # downloads in flight and the responses it had not finished processing
    assert twice <= shared.get("requeued", 0), (twice, shared)
    assert shared.get("requeued", 0) > 0  # it really held work when it died
    # a page's count goes with its ack: the dead worker's finished pages are counted
    assert shared["pages"] >= total, shared
    assert frontier_left(redis_client) == 0
    # every page's item stored exactly once, pages crawled twice included
    items = [json.loads(i)["url"] for i in redis_client.lrange("site:items", 0, -1)]
    assert len(items) == total, (len(items), total, twice)


def test_redis_restart_mid_crawl(demo_site, worker_pool: WorkerPool, tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis", appendonly=True) as server:
        client = server.client()
        client.rpush("site:start_urls", demo_site.url)
        workers = worker_pool.start_many(2, server.url)
        total = len(demo_site.hits())
        wait_until(lambda: pages_crawled(demo_site) >= total // 3, 180,
                   what="a third of the site crawled")
        run_id = client.info("server")["run_id"]
        client.close()
        server.restart()
        crawled_at_restart = pages_crawled(demo_site)
        client = server.client()
        assert client.info("server")["run_id"] != run_id  # a real restart
        run_workers(workers, timeout=300)
        stats = demo_site.stats()
        assert stats["missing"] == 0, stats
        assert stats["duplicates"] == 0, stats
        assert frontier_left(client) == 0
        assert crawled_at_restart < total  # the crawl went on after the restart
        items = client.lrange("site:items", 0, -1)
        assert len({json.loads(i)["url"] for i in items}) == total  # no item lost either
        check_exits(workers)
        client.close()


@pytest.mark.parametrize("demo_site", [{"pages": 300}], indirect=True)
def test_bad_start_urls_are_counted_and_unshareable_requests_crawled(
    redis_server, redis_client, demo_site, worker_pool: WorkerPool
) -> None:
    spider = "site_with_bad_request"
    redis_client.rpush(spider + ":start_urls", "not a url", '{"url": 5}', '{"oops',
                       demo_site.url, "ftp://example.invalid/")
    worker = worker_pool.start("w", redis_server.url, {"SPIDER_MODULES": "testspiders"},
                               spider=spider)
    run_workers([worker], timeout=120)
    assert worker.returncode == 0
    stats = demo_site.stats()
    assert stats["missing"] == 0 and stats["duplicates"] == 0, stats
    shared = shared_stats(redis_client, spider)
    assert shared["bad_start_urls"] == 4
    # a request whose meta the queue cannot hold is crawled by its worker, not dropped
    assert shared["local"] == 1 and "unserializable" not in shared, shared
    assert demo_site.server.not_found == 1  # its /never was fetched
    log = worker.text()
    assert "meta['handle']" in log and "this worker crawls it itself" in log
    assert "bad start URL entry b'not a url'" in log


@pytest.mark.parametrize("debug", [False, True])
def test_filtered_duplicates_are_logged_as_scrapys_dupefilter_logs_them(
        redis_server, redis_client, demo_site, worker_pool: WorkerPool, debug: bool) -> None:
    """The first duplicate at DEBUG; with DUPEFILTER_DEBUG every one, whether the worker's
    seen cache, the exchange or the filter in Redis found it."""
    redis_client.rpush("site:start_urls", demo_site.url)
    settings = {"LOG_LEVEL": "DEBUG", "DUPEFILTER_DEBUG": str(debug)}
    [worker] = worker_pool.start_many(1, redis_server.url, settings)
    run_workers([worker], timeout=180)
    check_exits([worker])
    filtered = worker.stats()["dupefilter/filtered"]
    assert filtered > 100
    lines = re.findall(r"Filtered duplicate request: <GET (\S+)>(.*)", worker.text())
    if debug:
        assert len(lines) == filtered, (len(lines), filtered)
        odd = [(url, rest) for url, rest in lines
               if not url.startswith(demo_site.url.rstrip("/")) or rest.strip()]
        assert not odd, (demo_site.url, odd[:3])
    else:
        assert len(lines) == 1 and "no more duplicates will be shown" in lines[0][1], lines


class InterruptWhenOpened:
    """A test extension: the worker sends itself SIGINT (Ctrl-C, or scrapyd's cancel) as
    its spider opens, before the engine has started."""

    @classmethod
    def from_crawler(cls, crawler: Any) -> InterruptWhenOpened:
        extension = cls()
        crawler.signals.connect(extension.opened, signal=scrapy_signals.spider_opened)
        return extension

    def opened(self, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)


def test_a_worker_interrupted_as_its_spider_opens_exits(
        redis_server, redis_client, demo_site, worker_pool: WorkerPool) -> None:
    """Its scheduler is open (the frontier's thread started) and the engine never starts:
    the process must still end, not wait on that thread for good."""
    redis_client.rpush("site:start_urls", demo_site.url)
    settings = {"EXTENSIONS": '{"test_frontier_crawl.InterruptWhenOpened": 0}'}
    [worker] = worker_pool.start_many(1, redis_server.url, settings)
    assert worker.wait(30) is not None, worker.tail()
    assert "Received SIGINT" in worker.text(), worker.tail()
