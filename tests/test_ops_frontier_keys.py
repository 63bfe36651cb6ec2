"""The operations tooling over every key of a spider's frontier.

The exporter answers every scrape whatever one spider's keys hold; it and
``bloomcrawl status`` report what the frontier's newer keys say (start URLs
leased, lease counters, item ids, stats writers); ``bloomcrawl clear`` deletes
every one of them. Against a real redis-server, with the real Frontier writing
the keys, the real exporter process over HTTP and the real command line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from bloomcrawl.core import keys, presence
from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.frontier import Frontier
from bloomcrawl.core.keys import FrontierKeys
from bloomcrawl.core.scripts import Script, ScriptCall, run_scripts
from bloomcrawl.ops import inspection

from kit.cli import CliRun, run_cli
from kit.data import outgoing, populate_frontier
from kit.exporter import Exporter, collector_registry
from kit.redis import RedisServer

GOOD = {"spider": "good"}
BAD = {"spider": "bad"}
READ_ERRORS = "bloomcrawl_spider_read_errors"


def populate_bad(client: redis.Redis) -> None:
    populate_frontier(client, "bad", partitions=2)


def replace(client: redis.Redis, key: str, value: str) -> None:
    """``key`` becomes a string: a WRONGTYPE for whoever reads it as a hash, list or set."""
    client.delete(key)
    client.set(key, value)


def params_of(client: redis.Redis) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(client.hget("good:bloomfilter:meta", "params"))
    return loaded


BAD_META = "bad:bloomfilter:meta"
BAD_KEYS = FrontierKeys("bad", partitions=2)

#: name -> how one spider's keys are broken (the spider "good" is healthy each time)
MALFORMED: dict[str, Callable[[redis.Redis], object]] = {
    "params not JSON": lambda c: c.hset(BAD_META, mapping={"params": "{nope", "ready": "1"}),
    "params null": lambda c: c.hset(BAD_META, mapping={"params": "null", "ready": "1"}),
    "params a list": lambda c: c.hset(BAD_META, mapping={"params": "[1, 2]", "ready": "1"}),
    "partitions a string": lambda c: c.hset(BAD_META, mapping={
        "params": json.dumps({**params_of(c), "partitions": "4"}), "ready": "1"}),
    "queue key a string": lambda c: (populate_bad(c), replace(c, BAD_KEYS.queue_part(1), "x")),
    "lease counter not a number": lambda c: (populate_bad(c),
                                             c.set(BAD_KEYS.lease_counter(0), "many")),
    "filter state a string": lambda c: (populate_bad(c), replace(c, BAD_KEYS.state(0), "x")),
    "filter counters not numbers": lambda c: (populate_bad(c), c.hset(
        BAD_KEYS.state(1), mapping={"slices": "lots", "items:0": "x"})),
    "stats a string": lambda c: (populate_bad(c), replace(c, BAD_KEYS.stats, "x")),
    "a stat not a number": lambda c: (populate_bad(c), c.hset(BAD_KEYS.stats, "pages", "ten")),
    "start URLs a hash": lambda c: (populate_bad(c), c.delete(BAD_KEYS.start_urls),
                                    c.hset(BAD_KEYS.start_urls, "a", "b")),
    "start leases a list": lambda c: (populate_bad(c), c.rpush(BAD_KEYS.start_deadlines, "x")),
    "item ids a string": lambda c: (populate_bad(c), c.set("{bad:items}:ids", "x")),
    "stats writers a list": lambda c: (populate_bad(c), c.rpush(BAD_KEYS.stats_applied, "x")),
    "pages by node a list": lambda c: (populate_bad(c), replace(c, BAD_KEYS.pages_by_node, "x")),
    "queue name with a hash tag": lambda c: (populate_bad(c), c.hset(BAD_META, "queue", "q{x}")),
    "unknown queue type": lambda c: (populate_bad(c), c.hset(BAD_META, "queue_type", "heap")),
}


@pytest.mark.parametrize("breakage", list(MALFORMED))
def test_one_malformed_spider_never_hides_the_others(
    redis_server: RedisServer, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture,
    breakage: str,
) -> None:
    front = populate_frontier(redis_client, "good")
    MALFORMED[breakage](redis_client)
    registry = collector_registry(redis_server.url)
    get = registry.get_sample_value
    with caplog.at_level(logging.WARNING, logger="bloomcrawl.ops.exporter"):
        for _ in range(3):
            assert get("bloomcrawl_up") == 1
            assert get("bloomcrawl_spiders") == 2
            assert get("bloomcrawl_filter_items", GOOD) == 300
            assert get("bloomcrawl_queue_requests", GOOD) == front.queue_length
            assert get("bloomcrawl_pages_total", GOOD) == front.stats["pages"]
            assert get(READ_ERRORS, GOOD) == 0
            assert get(READ_ERRORS, BAD) == 1
            assert _info_labels(registry, "bad")  # reported, with what could be read
    about_bad = [r.getMessage() for r in caplog.records if "'bad'" in r.getMessage()]
    assert len(about_bad) == 1, f"logged once, not on every scrape: {about_bad}"
    assert "its other metrics are still reported" in about_bad[0]
    assert not [r for r in caplog.records if "'good'" in r.getMessage()]


def _info_labels(registry: CollectorRegistry, spider: str) -> dict[str, str]:
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "bloomcrawl_spider_info" and sample.labels["spider"] == spider:
                return dict(sample.labels)
    raise AssertionError(f"no bloomcrawl_spider_info for {spider}")


def test_what_can_be_read_of_a_broken_spider_is_reported_and_a_fix_is_logged(
    redis_server: RedisServer, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture,
) -> None:
    front = populate_frontier(redis_client, "bad", partitions=2)
    replace(redis_client, BAD_KEYS.queue_part(1), "x")
    redis_client.hset(BAD_KEYS.stats, "pages", "ten")
    registry = collector_registry(redis_server.url)
    get = registry.get_sample_value
    with caplog.at_level(logging.INFO, logger="bloomcrawl.ops.exporter"):
        assert get(READ_ERRORS, BAD) == 2  # two kinds: the queue keys, the stats
        assert get("bloomcrawl_filter_items", BAD) == 300
        assert get("bloomcrawl_queue_requests", BAD) is None  # unreadable: left out, not 0
        assert get("bloomcrawl_pages_total", BAD) is None  # no counter reset to 0
        assert get("bloomcrawl_items_total", BAD) == front.stats["items"]
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 2, warnings
        caplog.clear()
        redis_client.delete(BAD_KEYS.queue_part(1))
        redis_client.hset(BAD_KEYS.stats, "pages", 42)
        assert get(READ_ERRORS, BAD) == 0
        assert get("bloomcrawl_pages_total", BAD) == 42
        assert sorted(r.getMessage() for r in caplog.records) == [
            "spider 'bad' (filter 'bad:bloomfilter'): queue keys: readable again",
            "spider 'bad' (filter 'bad:bloomfilter'): stats: readable again",
        ]


def test_an_unforeseen_failure_of_one_spider_is_contained(
    redis_server: RedisServer, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    populate_frontier(redis_client, "good")
    populate_frontier(redis_client, "bad")
    real = inspection.frontier_keys

    def broken(filter_name: str, meta: dict[str, str], spider: str,
               partitions: int = 1) -> FrontierKeys:
        if spider == "bad":
            raise RuntimeError("something nobody thought of")
        return real(filter_name, meta, spider, partitions)

    monkeypatch.setattr(inspection, "frontier_keys", broken)
    state = inspection.spider_state(redis_client, BAD_META)
    assert state is not None
    assert state.problems == ["unreadable (RuntimeError: something nobody thought of)"]
    registry = collector_registry(redis_server.url)
    assert registry.get_sample_value("bloomcrawl_up") == 1
    assert registry.get_sample_value("bloomcrawl_filter_items", GOOD) == 300
    assert registry.get_sample_value(READ_ERRORS, BAD) == 1
    assert registry.get_sample_value("bloomcrawl_pages_total", BAD) is None


def test_the_exporter_process_answers_200_through_a_malformed_meta_hash(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path,
) -> None:
    populate_frontier(redis_client, "good")
    for name, params in (("nulled", "null"), ("listed", "[1]"), ("garbled", "{")):
        redis_client.hset(f"{name}:bloomfilter:meta", mapping={"params": params, "ready": "1"})
    MALFORMED["filter counters not numbers"](redis_client)
    with Exporter(redis_server.url, tmp_path) as process:
        for _ in range(3):
            scraped = process.scrape()
            assert scraped.status == 200, scraped
            assert "bloomcrawl_up 1.0" in scraped.body
            assert 'bloomcrawl_filter_items{spider="good"} 300.0' in scraped.body
            for spider in ("nulled", "listed", "garbled", "bad"):
                assert f'bloomcrawl_spider_read_errors{{spider="{spider}"}} 1.0' in scraped.body
    log = (tmp_path / "exporter.log").read_text()
    for spider in ("nulled", "listed", "garbled", "bad"):
        assert log.count(f"spider '{spider}'") == 1, log
    assert "Traceback" not in log


def test_a_redis_refusing_commands_goes_through_the_one_error_policy(
    redis_server: RedisServer, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture,
) -> None:
    populate_frontier(redis_client, "good")
    redis_client.acl_setuser("scraper", enabled=True, passwords=["+pw"], keys=["*"],
                             commands=["+@all", "-info"])
    try:
        registry = collector_registry(f"redis://scraper:pw@127.0.0.1:{redis_server.port}/0")
        with caplog.at_level(logging.INFO, logger="bloomcrawl.ops.exporter"):
            for _ in range(3):
                assert registry.get_sample_value("bloomcrawl_up") == 0
            refused = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(refused) == 1, [r.getMessage() for r in refused]
            assert "no permissions to run the 'info' command" in refused[0].getMessage()
            assert "bloomcrawl_up is 0 until it answers" in refused[0].getMessage()
            assert "pw@" not in refused[0].getMessage()
            caplog.clear()
            redis_client.acl_setuser("scraper", commands=["+info"])
            assert registry.get_sample_value("bloomcrawl_up") == 1
            assert registry.get_sample_value("bloomcrawl_filter_items", GOOD) == 300
            assert [r.getMessage().split(" is back")[0] for r in caplog.records] == [
                f"Redis at redis://127.0.0.1:{redis_server.port}/0"]
    finally:
        redis_client.acl_deluser("scraper")


# --- the frontier's newer keys ---------------------------------------------------------------


def real_frontier(client: redis.Redis, spider: str = "site", partitions: int = 2) -> Frontier:
    """A frontier the real core.frontier code wrote: queue, leases, start leases, stats."""
    frontier_keys = FrontierKeys(spider, partitions=partitions)
    bloom = BloomFilter(client, frontier_keys.filter, capacity=1000, error_rate=0.01,
                        partitions=partitions, backend="bitmap")
    front = Frontier(client, bloom, frontier_keys, queue_type="priority", lease_timeout=60,
                     worker_id="w1", node="host-a")
    front.record_layout()
    front.exchange(outgoing(*[f"http://a.test/{i}" for i in range(10)]), {},
                   [(1, {"pages": 2, "items": 1})])
    for p in range(partitions):
        front.lease(p, 2)
    other = Frontier(client, bloom, frontier_keys, queue_type="priority", lease_timeout=60,
                     worker_id="w2", node="host-b")
    other.exchange((), {}, [(1, {"pages": 1})])
    client.rpush(frontier_keys.start_urls, "http://a.test/", "http://b.test/",
                 "http://c.test/")
    front.take_start_entries(2)
    presence.here(front)  # a worker alive
    # the items pipeline's script: each item stored once, its id kept for the window
    push = Script("items_push.lua")
    record = keys.item_call_key(frontier_keys.items, "0a1b")
    for call, origin in enumerate(("f1:0", "f1:1", "f2:0", "f1:0")):
        run_scripts(client, [ScriptCall(push, [frontier_keys.items, frontier_keys.item_ids,
                                               frontier_keys.recent_item_ids, record],
                                        ["60000", str(call), "60000", origin,
                                         json.dumps({"o": origin})])])
    return front


def test_start_url_leases_lease_counters_item_ids_and_stats_writers(
    redis_server: RedisServer, redis_client: redis.Redis,
) -> None:
    real_frontier(redis_client)
    state = inspection.spider_state(redis_client, "site:bloomfilter:meta")
    assert state is not None and state.problems == []
    assert (state.start_urls, state.start_urls_leased) == (1, 2)
    assert state.leases_total == state.leased == 4
    assert (state.items_stored, state.item_ids, state.stats_workers) == (3, 3, 2)
    registry = collector_registry(redis_server.url)
    get = registry.get_sample_value
    site = {"spider": "site"}
    assert get("bloomcrawl_start_urls", site) == 1
    assert get("bloomcrawl_start_urls_leased", site) == 2
    assert get("bloomcrawl_leases_total", site) == 4
    assert get("bloomcrawl_leased_requests", site) == 4
    assert get("bloomcrawl_stored_items", site) == 3
    assert get("bloomcrawl_stored_item_ids", site) == 3
    assert get("bloomcrawl_stats_workers", site) == 2
    assert get("bloomcrawl_pages_total", site) == 3
    assert get(READ_ERRORS, site) == 0


# --- bloomcrawl clear --------------------------------------------------------------------------


def keys_of(client: redis.Redis) -> set[str]:
    return {k.decode() for k in client.scan_iter(count=1000)}


def clear(redis_url: str, env: dict[str, str]) -> CliRun:
    return run_cli("clear", "--yes", "--redis-url", redis_url, env=env)


def test_clear_leaves_no_key_of_the_spider_and_every_key_of_the_others(
    redis_server: RedisServer, redis_client: redis.Redis, cli_env: dict[str, str],
) -> None:
    real_frontier(redis_client, "other", partitions=3)
    others = keys_of(redis_client)
    front = real_frontier(redis_client, "site", partitions=4)
    front.reap()
    # a filter of its own (BLOOMFILTER_KEY) that the scheduler recorded for the spider
    custom = FrontierKeys("site", filter_pattern="custom-%(spider)s", partitions=2)
    custom_bloom = BloomFilter(redis_client, custom.filter, capacity=100, error_rate=0.01,
                               partitions=2, backend="bitmap")
    custom_front = Frontier(redis_client, custom_bloom, custom, queue_type="fifo",
                            lease_timeout=60, worker_id="w3", node="host-c")
    custom_front.record_layout()
    custom_front.exchange(outgoing("http://c.test/1", "http://c.test/2"), {})
    custom_front.lease(0, 1)
    custom_front.lease(1, 1)
    mine = keys_of(redis_client) - others
    for wanted in (front.keys.lease_counter(0), front.keys.start_leases,
                   front.keys.start_deadlines, front.keys.start_counter,
                   front.keys.stats_applied, "{site:items}:recent_ids", front.keys.pages_by_node,
                   front.keys.workers,
                   custom.meta, custom.lease_counter(1)):
        assert wanted in mine, f"the frontier did not write {wanted}: the test proves nothing"

    cleared = clear(redis_server.url, cli_env).assert_ok()
    assert cleared.stdout == f"deleted {len(mine)} key(s) of site\n"
    assert keys_of(redis_client) == others
    assert clear(redis_server.url, cli_env).stdout == "deleted 0 key(s) of site\n"


def test_status_counts_start_urls_waiting_and_leased(
    redis_server: RedisServer, redis_client: redis.Redis, cli_env: dict[str, str],
) -> None:
    real_frontier(redis_client)
    done = run_cli("status", "--redis-url", redis_server.url, env=cli_env).assert_ok()
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("spider "))
    row = next(line for line in lines if line.startswith("site "))
    assert header.split()[:8] == ["spider", "start", "urls", "start", "leased", "queue",
                                  "leased", "pages"]
    # site: 1 start URL waiting, 2 taken and not queued yet, 6 queued, 4 leased, 3 pages
    assert row.split()[:7] == ["site", "1", "2", "6", "4", "3", "1"]
