"""A wrong setting value is a SettingError naming the setting and the value.

Each is raised as the scheduler or the items pipeline is built and opened on a
real Redis, before anything is written there: the server holds no key after.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import redis
from scrapy import Spider
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from bloomcrawl.core.errors import SettingError
from bloomcrawl.crawl.config import FrontierConfig
from bloomcrawl.crawl.pipelines import RedisItemsPipeline
from bloomcrawl.crawl.timing import MAX_LEASE

from test_scheduler import make_scheduler

#: what a number setting set to "inf" or "nan" is told
INF = "must be a finite number, got 'inf'"
NAN = "must be a finite number, got 'nan'"

#: settings the scheduler reads (its frontier, its filter, politeness, Redis)
SCHEDULER_CASES = [
    # the seeds' recipe: FilterParams.fixed computed with these before checking them
    ({"BLOOMFILTER_BIT": -3}, "BLOOMFILTER_BIT must be >= 10 and <= 40, got -3"),
    ({"BLOOMFILTER_BIT": "2000"}, "BLOOMFILTER_BIT must be >= 10 and <= 40, got '2000'"),
    ({"BLOOMFILTER_HASH_NUMBER": 0}, "BLOOMFILTER_HASH_NUMBER must be >= 1 and <= 64, got 0"),
    ({"BLOOMFILTER_BIT": 20, "BLOOMFILTER_HASH_NUMBER": "-2"},
     "BLOOMFILTER_HASH_NUMBER must be >= 1 and <= 64, got '-2'"),
    ({"BLOOMFILTER_PARTITIONS": 20000},
     "BLOOMFILTER_PARTITIONS must be >= 1 and <= 16384, got 20000"),
    ({"BLOOMFILTER_GENERATIONS": "1000"},
     "BLOOMFILTER_GENERATIONS must be >= 1 and <= 64, got '1000'"),
    ({"BLOOMFILTER_ERROR_RATE": "nan"}, "BLOOMFILTER_ERROR_RATE " + NAN),
    ({"BLOOMFILTER_ERROR_RATE": "5e-324"},
     "no filter can be sized with BLOOMFILTER_ERROR_RATE=5e-324"),
    ({"BLOOMFILTER_TIGHTENING": "1e-300"}, "BLOOMFILTER_TIGHTENING=1e-300 (math domain error)"),
    ({"BLOOMFILTER_GROWTH": "1e300"}, "BLOOMFILTER_GROWTH=1e+300,"),
    ({"BLOOMFILTER_GROWTH": "inf"}, "BLOOMFILTER_GROWTH " + INF),
    ({"BLOOMFILTER_STRICT_PARAMS": "yes"},
     "BLOOMFILTER_STRICT_PARAMS must be true or false (or 1 or 0), got 'yes'"),
    ({"SCHEDULER_PERSIST": "no"}, "SCHEDULER_PERSIST must be true or false (or 1 or 0), got 'no'"),
    ({"SCHEDULER_FLUSH_ON_START": "please"},
     "SCHEDULER_FLUSH_ON_START must be true or false (or 1 or 0), got 'please'"),
    ({"REDIS_ALLOW_EVICTION": "sure"},
     "REDIS_ALLOW_EVICTION must be true or false (or 1 or 0), got 'sure'"),
    ({"FRONTIER_STRICT": "on"}, "FRONTIER_STRICT must be true or false (or 1 or 0), got 'on'"),
    ({"SCHEDULER_LEASE_TIMEOUT": "nan"}, "SCHEDULER_LEASE_TIMEOUT " + NAN),
    ({"SCHEDULER_LEASE_TIMEOUT": "inf"}, "SCHEDULER_LEASE_TIMEOUT " + INF),
    ({"SCHEDULER_REAP_INTERVAL": "nan"}, "SCHEDULER_REAP_INTERVAL " + NAN),
    ({"MAX_IDLE_TIME_BEFORE_CLOSE": "nan"},
     "MAX_IDLE_TIME_BEFORE_CLOSE " + NAN),
    ({"MAX_IDLE_TIME_BEFORE_CLOSE": "inf"}, "MAX_IDLE_TIME_BEFORE_CLOSE " + INF),
    ({"SCHEDULER_PREFETCH": "0"}, "SCHEDULER_PREFETCH"),
    ({"REDIS_PARAMS": "{socket_timeout: 5}"},
     "REDIS_PARAMS must be a dict (or its JSON), got '{socket_timeout: 5}'"),
    ({"DOWNLOAD_DELAY": "nan"}, "DOWNLOAD_DELAY " + NAN),
    ({"DOWNLOAD_DELAY": "inf"}, "DOWNLOAD_DELAY " + INF),
    ({"DOWNLOAD_SLOTS": {"a.test": {"delay": "inf"}}},
     "DOWNLOAD_SLOTS['a.test']: delay must be a finite number >= 0"),
    ({"RANDOMIZE_DOWNLOAD_DELAY": "maybe"},
     "RANDOMIZE_DOWNLOAD_DELAY must be true or false (or 1 or 0), got 'maybe'"),
    ({"AUTOTHROTTLE_ENABLED": True, "AUTOTHROTTLE_MAX_DELAY": "inf"},
     "AUTOTHROTTLE_MAX_DELAY " + INF),
    ({"AUTOTHROTTLE_ENABLED": True, "AUTOTHROTTLE_START_DELAY": "nan"},
     "AUTOTHROTTLE_START_DELAY " + NAN),
]

#: settings the items pipeline reads
PIPELINE_CASES = [
    ({"REDIS_ITEMS_DEDUP_WINDOW": "nan"},
     "REDIS_ITEMS_DEDUP_WINDOW " + NAN),
    ({"REDIS_ITEMS_DEDUP_WINDOW": "inf"}, "REDIS_ITEMS_DEDUP_WINDOW " + INF),
    ({"REDIS_ITEMS_RETRY_TIMEOUT": "inf"}, "REDIS_ITEMS_RETRY_TIMEOUT " + INF),
    ({"REDIS_ITEMS_RETRY_TIMEOUT": "nan"},
     "REDIS_ITEMS_RETRY_TIMEOUT " + NAN),
    ({"SCHEDULER_LEASE_TIMEOUT": "nan"}, "SCHEDULER_LEASE_TIMEOUT " + NAN),
    ({"REDIS_ITEMS_KEY": "%(name)s:items"}, "REDIS_ITEMS_KEY '%(name)s:items'"),
]


def case_id(case: tuple[dict[str, Any], str]) -> str:
    return ",".join("%s=%s" % item for item in case[0].items())


@pytest.mark.parametrize(("settings", "fragment"), SCHEDULER_CASES,
                         ids=[case_id(c) for c in SCHEDULER_CASES])
def test_the_scheduler_names_a_wrong_setting(redis_server, redis_client: redis.Redis,
                                             settings: dict[str, Any], fragment: str) -> None:
    with pytest.raises(SettingError, match=re.escape(fragment)):
        make_scheduler(redis_server.url, **settings)
    assert redis_client.keys("*") == []


class ItemsSpider(Spider):
    name = "items"


@pytest.mark.parametrize(("settings", "fragment"), PIPELINE_CASES,
                         ids=[case_id(c) for c in PIPELINE_CASES])
def test_the_items_pipeline_names_a_wrong_setting(redis_server, redis_client: redis.Redis,
                                                  settings: dict[str, Any],
                                                  fragment: str) -> None:
    crawler = get_crawler(ItemsSpider, settings_dict={"REDIS_URL": redis_server.url, **settings})
    crawler.spider = ItemsSpider.from_crawler(crawler)
    with pytest.raises(SettingError, match=re.escape(fragment)):
        build_from_crawler(RedisItemsPipeline, crawler).open_spider()
    assert redis_client.keys("*") == []


def test_a_prefetch_beyond_what_a_worker_can_use_is_leased_as_its_most(
        caplog: pytest.LogCaptureFixture) -> None:
    """Values up to CONCURRENT_REQUESTS or one exchange's most are kept; more ran before,
    and runs on, leasing that most, with a warning naming the setting."""
    def prefetch(**settings: Any) -> int:
        return FrontierConfig.from_settings(Settings(settings), "demo").prefetch

    caplog.set_level(logging.WARNING, logger="bloomcrawl.crawl.config")
    assert prefetch(SCHEDULER_PREFETCH=MAX_LEASE) == MAX_LEASE  # beyond the default 16
    assert prefetch(SCHEDULER_PREFETCH=256, CONCURRENT_REQUESTS=256) == 256
    assert not caplog.records
    assert prefetch(SCHEDULER_PREFETCH=1_000_000) == MAX_LEASE
    assert prefetch(SCHEDULER_PREFETCH="65", CONCURRENT_REQUESTS=64) == 64
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and warned[0].startswith("SCHEDULER_PREFETCH=1000000 is more"), warned
    assert "at most 64 a call" in warned[1], warned
