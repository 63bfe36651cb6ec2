"""RedisBloomDupeFilter under Scrapy's own scheduler and scrapy-redis's."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from bloomcrawl.core.errors import RedisUnavailableError, SettingError
from bloomcrawl.crawl.dupefilter import RedisBloomDupeFilter

from conftest import disconnect_at_teardown
from kit.workers import WorkerPool, run_workers


class QueryBlindFingerprinter:
    """Ignores the query string: a custom REQUEST_FINGERPRINTER_CLASS."""

    def fingerprint(self, request: Request) -> bytes:
        import hashlib

        return hashlib.sha1(request.url.split("?")[0].encode()).digest()


class OneSpider(Spider):
    name = "one"


def make_dupefilter(redis_url: str, **settings: Any) -> RedisBloomDupeFilter:
    crawler = get_crawler(OneSpider, settings_dict={"REDIS_URL": redis_url,
                                                    "BLOOMFILTER_CAPACITY": 10_000, **settings})
    crawler._apply_settings()
    crawler.spider = OneSpider.from_crawler(crawler)
    df = build_from_crawler(RedisBloomDupeFilter, crawler)
    disconnect_at_teardown(df.server)
    return df


def test_request_seen_and_dont_filter(redis_server, redis_client) -> None:
    df = make_dupefilter(redis_server.url)
    assert df.request_seen(Request("http://a.test/?b=2&a=1")) is False
    assert df.request_seen(Request("http://a.test/?a=1&b=2#x")) is True  # same fingerprint
    assert df.request_seen(Request("http://a.test/?a=1&b=2", dont_filter=True)) is False
    assert df.stats.get_value("bloomfilter/filtered") == 1
    assert df.key == "one:bloomfilter"
    assert df.requests_seen([Request("http://a.test/new"), Request("http://a.test/?a=1&b=2"),
                             Request("http://a.test/new", dont_filter=True)]) == [
        False, True, False]


def test_custom_fingerprinter_is_honoured(redis_server, redis_client) -> None:
    df = make_dupefilter(redis_server.url,
                         REQUEST_FINGERPRINTER_CLASS=f"{__name__}.QueryBlindFingerprinter")
    assert df.request_seen(Request("http://a.test/page?session=1")) is False
    assert df.request_seen(Request("http://a.test/page?session=2")) is True


def test_seed_recipe_settings_still_work(redis_server, redis_client) -> None:
    df = make_dupefilter(redis_server.url, BLOOMFILTER_BIT=20, BLOOMFILTER_HASH_NUMBER=6)
    info = df.bloom.info()
    assert (info.bits, info.hashes) == (1 << 20, 6)


@pytest.mark.parametrize(("settings", "message"), [
    ({"BLOOMFILTER_CAPACITY": 0}, "BLOOMFILTER_CAPACITY must be >= 1, got 0"),
    ({"BLOOMFILTER_ERROR_RATE": "2"}, r"BLOOMFILTER_ERROR_RATE must be in \(0, 1\)"),
    ({"BLOOMFILTER_ERROR_RATE": "one percent"}, "BLOOMFILTER_ERROR_RATE must be a number"),
    ({"BLOOMFILTER_BIT": 70}, "BLOOMFILTER_BIT"),
    ({"BLOOMFILTER_KEY": "%(spider)s:{bf}"}, "hash tags"),
    ({"REDIS_URL": "localhost:6379"}, "REDIS_URL 'localhost:6379'"),
])
def test_invalid_settings_fail_before_touching_redis(closed_port_url, settings, message) -> None:
    with pytest.raises(SettingError, match=message):
        make_dupefilter(closed_port_url, **settings)


def test_unreachable_redis_names_the_url(closed_port_url) -> None:
    with pytest.raises(RedisUnavailableError,
                       match=r"cannot reach Redis at redis://127\.0\.0\.1"):
        make_dupefilter(closed_port_url)


@pytest.mark.slow
@pytest.mark.parametrize("demo_site", [{"pages": 400}], indirect=True)
def test_incremental_crawl_with_scrapys_own_scheduler(redis_server, redis_client, demo_site,
                                                      worker_pool: WorkerPool) -> None:
    settings = {
        "SPIDER_MODULES": "testspiders",
        "SCHEDULER": "scrapy.core.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "bloomcrawl.crawl.dupefilter.RedisBloomDupeFilter",
        "SPIDER_MIDDLEWARES": "{}",
        "DOWNLOADER_MIDDLEWARES": "{}",
        "ITEM_PIPELINES": "{}",
    }
    # the start page is an index whose links the first run only partly followed
    first = worker_pool.start("first", redis_server.url, {**settings, "DEPTH_LIMIT": "1"},
                              spider="links",
                              args={"start_url": demo_site.url, "max_links": "8"})
    run_workers([first], timeout=120)
    after_first = demo_site.hits()
    crawled_first = {i for i, h in enumerate(after_first) if h}
    linked = set(demo_site.site.targets(0)) | {0}
    assert crawled_first < linked
    second = worker_pool.start("second", redis_server.url, {**settings, "DEPTH_LIMIT": "1"},
                               spider="links", args={"start_url": demo_site.url})
    run_workers([second], timeout=120)
    hits = demo_site.hits()
    assert hits[0] == after_first[0] + 1  # the start page is dont_filter: fetched again
    # the second run fetched exactly the linked pages the first one had not
    assert {i for i, h in enumerate(hits) if h} == linked
    assert all(hits[i] == 1 for i in linked - {0})
    stats = second.stats()
    assert stats["response_received_count"] == len(linked - crawled_first) + 1
    assert stats["dupefilter/filtered"] > 0
    assert stats["bloomfilter/filtered"] == stats["dupefilter/filtered"]


@pytest.mark.slow
@pytest.mark.parametrize("demo_site", [{"pages": 400}], indirect=True)
def test_drop_in_under_scrapy_redis_scheduler(redis_server, redis_client, demo_site,
                                              worker_pool: WorkerPool) -> None:
    settings = {
        "SPIDER_MODULES": "testspiders",
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "SCHEDULER_PERSIST": "True",
        "DUPEFILTER_CLASS": "bloomcrawl.crawl.dupefilter.RedisBloomDupeFilter",
        "SPIDER_MIDDLEWARES": "{}",
        "DOWNLOADER_MIDDLEWARES": "{}",
        "ITEM_PIPELINES": "{}",
    }
    worker = worker_pool.start("w", redis_server.url, settings, spider="links",
                               args={"start_url": demo_site.url})
    run_workers([worker], timeout=120)
    hits = demo_site.hits()
    assert hits[0] == 2  # the dont_filter start request, then the first link back to it
    assert hits[1:] == [1] * (len(hits) - 1)
    stats = worker.stats()
    assert stats["dupefilter/filtered"] > len(demo_site.hits())
    assert redis_client.exists("links:bloomfilter:meta")
