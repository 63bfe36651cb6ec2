"""Real crawls: several ``scrapy crawl site`` processes, one real redis-server, the demo site."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import redis

from conftest import RedisServer
from crawl_helpers import BASE_SETTINGS, Worker, frontier_left, run_workers, wait_until

pytestmark = pytest.mark.slow


def frontier_is_empty(client: redis.Redis, spider: str = "site") -> bool:
    return frontier_left(client, spider) == 0


def test_three_workers_crawl_every_page_exactly_once(redis_server, redis_client, demo_site,
                                                     tmp_path: Path) -> None:
    redis_client.rpush("site:start_urls", demo_site.url)
    workers = [Worker("w%d" % i, redis_server.url, tmp_path, {}) for i in range(3)]
    run_workers(workers, timeout=300)
    stats = demo_site.stats()
    assert stats["missing"] == 0, stats
    assert stats["duplicates"] == 0, stats
    assert demo_site.hits() == [1] * len(demo_site.hits())
    per_worker = [w.stats().get("response_received_count", 0) for w in workers]
    assert sum(per_worker) == len(demo_site.hits())
    assert all(n > 0 for n in per_worker), per_worker  # each did part of the work
    assert redis_client.llen("site:items") == len(demo_site.hits())
    item = json.loads(redis_client.lindex("site:items", 0))
    assert set(item) == {"url", "status", "title", "depth", "fetched_at"}
    shared = {k.decode(): int(v) for k, v in redis_client.hgetall("site:stats").items()}
    assert shared["pages"] == len(demo_site.hits())
    assert shared["items"] == len(demo_site.hits())
    assert shared["filtered"] > len(demo_site.hits())  # the site links to each page many times
    assert frontier_is_empty(redis_client)
    max_idle = float(BASE_SETTINGS["MAX_IDLE_TIME_BEFORE_CLOSE"])
    for w in workers:
        assert w.proc.returncode == 0
        assert "Traceback" not in w.text(), w.text()[-3000:]
        # each closed MAX_IDLE_TIME_BEFORE_CLOSE after the frontier emptied, not at one of
        # the engine's 5 s idle checks (which made a 3 s idle close take 5 or 10 s)
        idle = re.findall(r"frontier empty for (\d+) s: closing", w.text())
        assert len(idle) == 1 and int(idle[0]) <= max_idle + 1, (w.name, idle)


def test_sigkilled_worker_loses_nothing(redis_server, redis_client, demo_site,
                                        tmp_path: Path) -> None:
    concurrent = 8
    settings = {
        "SCHEDULER_LEASE_TIMEOUT": "3",
        "SCHEDULER_REAP_INTERVAL": "1",
        "CONCURRENT_REQUESTS": str(concurrent),
        "MAX_IDLE_TIME_BEFORE_CLOSE": "5",
    }
    redis_client.rpush("site:start_urls", demo_site.url)
    workers = [Worker("w%d" % i, redis_server.url, tmp_path, settings) for i in range(3)]
    total = len(demo_site.hits())
    assert wait_until(lambda: sum(1 for h in demo_site.hits() if h) >= total // 3, 180)
    workers[0].kill()
    run_workers(workers[1:], timeout=300)
    hits = demo_site.hits()
    assert min(hits) >= 1, [i for i, h in enumerate(hits) if h == 0][:20]  # nothing lost
    twice = sum(h - 1 for h in hits if h > 1)
    shared = {k.decode(): int(v) for k, v in redis_client.hgetall("site:stats").items()}
    # every page fetched twice is one the killed worker held a lease on: its
    # downloads in flight and the responses it had not finished processing
    assert twice <= shared.get("requeued", 0), (twice, shared)
    assert shared.get("requeued", 0) > 0  # it really held work when it died
    # a page's count goes with its ack: the dead worker's finished pages are counted
    assert shared["pages"] >= total, shared
    assert frontier_is_empty(redis_client)
    # every page's item stored exactly once, pages crawled twice included
    items = [json.loads(i)["url"] for i in redis_client.lrange("site:items", 0, -1)]
    assert len(items) == total, (len(items), total, twice)


def test_redis_restart_mid_crawl(demo_site, tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", appendonly=True)
    server.start()
    try:
        client = server.client()
        client.rpush("site:start_urls", demo_site.url)
        workers = [Worker("w%d" % i, server.url, tmp_path, {"MAX_IDLE_TIME_BEFORE_CLOSE": "5"})
                   for i in range(2)]
        total = len(demo_site.hits())
        assert wait_until(lambda: sum(1 for h in demo_site.hits() if h) >= total // 3, 180)
        run_id = client.info("server")["run_id"]
        server.restart()
        crawled_at_restart = sum(1 for h in demo_site.hits() if h)
        assert server.client().info("server")["run_id"] != run_id  # a real restart
        run_workers(workers, timeout=300)
        stats = demo_site.stats()
        assert stats["missing"] == 0, stats
        assert stats["duplicates"] == 0, stats
        assert frontier_is_empty(server.client())
        assert crawled_at_restart < total  # the crawl went on after the restart
        items = server.client().lrange("site:items", 0, -1)
        assert len({json.loads(i)["url"] for i in items}) == total  # no item lost either
        for w in workers:
            assert w.proc.returncode == 0
            assert "Traceback" not in w.text(), w.text()[-3000:]
    finally:
        server.stop()


@pytest.mark.parametrize("demo_site", [{"pages": 300}], indirect=True)
def test_bad_start_urls_are_counted_and_unshareable_requests_crawled(
    redis_server, redis_client, demo_site, tmp_path: Path
) -> None:
    spider = "site_with_bad_request"
    redis_client.rpush(spider + ":start_urls", "not a url", '{"url": 5}', '{"oops',
                       demo_site.url, "ftp://example.invalid/")
    worker = Worker("w", redis_server.url, tmp_path, {"SPIDER_MODULES": "testspiders"},
                    spider=spider)
    run_workers([worker], timeout=120)
    assert worker.proc.returncode == 0
    stats = demo_site.stats()
    assert stats["missing"] == 0 and stats["duplicates"] == 0, stats
    shared = {k.decode(): int(v) for k, v in redis_client.hgetall(spider + ":stats").items()}
    assert shared["bad_start_urls"] == 4
    # a request whose meta the queue cannot hold is crawled by its worker, not dropped
    assert shared["local"] == 1 and "unserializable" not in shared, shared
    assert demo_site.server.not_found == 1  # its /never was fetched
    log = worker.text()
    assert "meta['handle']" in log and "this worker crawls it itself" in log
    assert "bad start URL entry b'not a url'" in log
