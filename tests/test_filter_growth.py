"""A filter's memory follows what it holds, and an existing filter keeps its parameters.

New filters start with a small first slice per partition and add slices as
they fill (:mod:`bloomcrawl.core.sizing`); filters stored by earlier releases
keep their sizing and bit layout. Opening a filter with other sizing
settings uses the stored filter and logs what differed once;
BLOOMFILTER_STRICT_PARAMS makes that an error, and other partitions,
partitioning, hashing or backend always are.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.settings import Settings
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.bloom import BloomFilter, partition_of
from bloomcrawl.core.bloom_creation import create_or_open, write_partitions
from bloomcrawl.core.errors import FilterMismatchError, SettingError
from bloomcrawl.core.sizing import BLOCK_BITS, FilterParams, SlicePlan
from bloomcrawl.crawl.config import FilterConfig
from bloomcrawl.crawl.scheduler import Scheduler

from conftest import disconnect_at_teardown
from kit.data import fingerprints

OPTIMAL_BITS_PER_ITEM = -math.log(0.001) / math.log(2) ** 2  # 14.38 at error rate 0.001


def add_all(bf: BloomFilter, fps: list[bytes], batch: int = 1000) -> int:
    return sum(sum(bf.add_many(fps[i:i + batch])) for i in range(0, len(fps), batch))


def false_positive_rate(bf: BloomFilter, n: int = 100_000) -> float:
    unseen = fingerprints(n, salt="unseen-")
    return sum(sum(bf.contains_many(unseen[i:i + 5000])) for i in range(0, n, 5000)) / n


def chunk_bytes(client: redis.Redis, name: str, partitions: int) -> int:
    """What the filter's bit chunks take in Redis (MEMORY USAGE, allocator included)."""
    total = 0
    for p in range(partitions):
        for key in client.scan_iter(match=keys.chunk_pattern(name, p), count=1000):
            total += int(client.memory_usage(key, samples=0) or 0)
    return total


def bit_positions(fp: bytes, plan: SlicePlan, hashing: int,
                  chunk_blocks: int) -> tuple[int, list[int]]:
    """(chunk, bit offsets in it) of ``fp`` in a slice: the layout bloom_common.lua writes."""
    block = int.from_bytes(fp[:6], "big") % plan.blocks
    chunk, in_chunk = divmod(block, chunk_blocks)
    width = BLOCK_BITS // plan.hashes
    if hashing == 2:
        a, b, c = (int.from_bytes(fp[i:i + 3], "big") for i in (6, 9, 12))
        lanes = [((a + t * b + t * t * c) % (1 << 24)) * width >> 24
                 for t in range(plan.hashes)]
    else:
        a, b, c = (int.from_bytes(fp[i:i + 2], "big") for i in (6, 8, 10))
        lanes = [(a + t * b + t * (t - 1) // 2 * c) % width for t in range(plan.hashes)]
    return chunk, [in_chunk * BLOCK_BITS + t * width + lane for t, lane in enumerate(lanes)]


def sizing_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "bloomcrawl.core.bloom_creation" and r.levelno == logging.WARNING]


# --- memory follows the items ---------------------------------------------------------


def test_a_new_filter_allocates_bits_as_it_fills(redis_client: redis.Redis) -> None:
    name = "grow:bloomfilter"
    bf = BloomFilter(redis_client, name)  # the defaults: 100 million, 0.001, 4 partitions
    assert bf.params.initial_capacity == defaults.FILTER_INITIAL_CAPACITY
    assert chunk_bytes(redis_client, name, 4) == 0  # nothing before the first item
    added = held = previous = 0
    for n in (1_000, 10_000, 50_000):
        held += add_all(bf, fingerprints(n - added, salt="n%d-" % n))
        added = n
        info = bf.info()
        memory = chunk_bytes(redis_client, name, 4)
        optimal_bytes = n * OPTIMAL_BITS_PER_ITEM / 8
        # within the growth of one slice of what the items need, allocator included
        assert optimal_bytes < memory < 4 * optimal_bytes, (n, memory, optimal_bytes)
        assert info.bits / 8 <= memory
        assert memory > previous
        previous = memory
    assert held == 50_000 - bf.info().filtered  # false positives only
    # a filter sized up front by the same settings: one 48 MB slice per partition
    up_front = FilterParams(capacity=100_000_000, error_rate=0.001, partitions=4)
    assert up_front.plan()[0].bits / 8 > 100 * previous


@pytest.mark.slow
def test_the_compound_error_rate_holds_as_it_grows(redis_client: redis.Redis) -> None:
    # 0.01 so that 100,000 unseen fingerprints measure it to a few percent; one
    # partition so that it grows through its slices fastest
    target = 0.01
    bf = BloomFilter(redis_client, "fp:bloomfilter", capacity=60_000, error_rate=target,
                     partitions=1)
    held = add_all(bf, fingerprints(60_000, salt="a-"))
    info = bf.info()
    assert info.slices >= 7  # every slice planned for the capacity is in use
    rate = false_positive_rate(bf)
    assert rate <= target, rate
    assert info.estimated_false_positive_rate <= target
    assert rate == pytest.approx(info.estimated_false_positive_rate, rel=0.25)
    # new items taken for seen while it filled: no more than the rate allows
    assert 60_000 - held <= target * 60_000
    # past the capacity the slices tighten: still under the target at twice as many
    add_all(bf, fingerprints(60_000, salt="b-"))
    assert bf.info().slices > info.slices
    assert false_positive_rate(bf) <= target


def test_answers_are_the_same_read_whole_or_block_by_block(redis_client: redis.Redis) -> None:
    """Small slices are read whole for a large batch, block by block for a small one."""
    bf = BloomFilter(redis_client, "whole:bloomfilter", capacity=10_000, error_rate=0.01,
                     partitions=1)
    items = fingerprints(20_000, salt="w-")
    add_all(bf, items, batch=500)
    assert bf.info().slices >= 5
    probe = items[::7] + fingerprints(3000, salt="never-")
    in_one_call = bf.contains_many(probe)
    one_by_one = [bf.contains_many([fp])[0] for fp in probe]
    assert in_one_call == one_by_one
    assert all(in_one_call[:len(items[::7])])
    # and adding them again, in one call or one by one, finds every one
    assert bf.add_many(items[:5000]) == [False] * 5000
    assert not any(bf.add(fp) for fp in items[5000:5300])


def test_new_filters_lay_their_bits_out_as_documented(redis_client: redis.Redis) -> None:
    name = "layout:bloomfilter"
    bf = BloomFilter(redis_client, name, capacity=10_000, error_rate=0.001, partitions=1)
    assert bf.params.hashing == 2
    fp = fingerprints(1, salt="layout-")[0]
    assert bf.add(fp)
    plan = bf.params.plan()[0]
    chunk_blocks = bf.params.chunk_bytes // (BLOCK_BITS // 8)
    chunk, bits = bit_positions(fp, plan, 2, chunk_blocks)
    key = keys.chunk_key(name, 0, 0, chunk)
    assert all(redis_client.getbit(key, b) for b in bits)
    assert bf.info().bits_set == len(set(bits))


# --- filters made before ---------------------------------------------------------------


def store_as_before(client: redis.Redis, name: str, **params: Any) -> FilterParams:
    """A filter as the release before growing filters stored it: no initial_capacity,
    no hashing in its parameters or partitions."""
    old = FilterParams(**params)
    stored = {k: v for k, v in json.loads(old.to_json()).items()
              if k not in ("initial_capacity", "hashing")}
    client.hset(keys.meta_key(name), "params", json.dumps(stored, sort_keys=True))
    write_partitions(client, name, old)
    for p in range(old.partitions):
        client.hdel(keys.state_key(name, p), "hashing")
    return old


def test_a_filter_made_before_opens_and_works_as_it_did(
        redis_client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    name = "old:bloomfilter"
    old = store_as_before(redis_client, name, capacity=100_000, error_rate=0.001,
                          partitions=2, partition_by="host")
    caplog.set_level(logging.WARNING)
    bf = BloomFilter(redis_client, name, capacity=100_000, error_rate=0.001, partitions=2)
    assert sizing_warnings(caplog) == []  # the same settings: nothing differs
    assert bf.params == old
    assert (bf.params.initial_capacity, bf.params.hashing) == (None, 1)
    # its first slice holds the capacity's share, as before
    assert bf.params.plan()[0].capacity > 50_000
    items = fingerprints(5000, salt="old-")
    assert add_all(bf, items) >= 4995
    assert bf.add_many(items) == [False] * 5000
    info = bf.info()
    assert info.slices == 1 and info.items + info.filtered == 10_000
    # its bits lie where the release before put them (triple hashing)
    fp = items[0]
    p = partition_of(fp, 2)
    chunk_blocks = old.chunk_bytes // (BLOCK_BITS // 8)
    chunk, bits = bit_positions(fp, old.plan()[0], 1, chunk_blocks)
    assert all(redis_client.getbit(keys.chunk_key(name, p, 0, chunk), b) for b in bits)
    # and the stored JSON was left as it was
    assert "initial_capacity" not in json.loads(redis_client.hget(keys.meta_key(name), "params"))


# --- other settings: the stored filter wins ----------------------------------------------


def config(**settings: Any) -> FilterConfig:
    return FilterConfig.from_settings(Settings(settings), "demo")


def test_other_sizing_opens_the_stored_filter_and_says_so(
        redis_client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    made = config(BLOOMFILTER_CAPACITY=100_000).open(redis_client, "demo")  # `make demo`
    made.add_many(fingerprints(100, salt="demo-"))
    caplog.set_level(logging.WARNING)
    bf = config().open(redis_client, "demo")  # `make crawl`: the default capacity
    assert bf.params == made.params
    assert bf.params.capacity == 100_000
    warnings = sizing_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "capacity: stored 100000, asked for 100000000" in warnings[0]
    assert "demo:bloomfilter" in warnings[0]
    assert bf.contains_many(fingerprints(100, salt="demo-")) == [True] * 100
    # deleted under it, the filter comes back as it was stored, and nothing more is said
    redis_client.flushall()
    assert bf.add_many(fingerprints(10, salt="again-")) == [True] * 10
    assert len(sizing_warnings(caplog)) == 1
    assert BloomFilter.open(redis_client, "demo:bloomfilter").params.capacity == 100_000


class GrowthSpider(Spider):
    name = "growth"

    def parse(self, response: Any, **kwargs: Any) -> None:
        pass


def open_job(redis_url: str, **settings: Any) -> Scheduler:
    """A scheduler as a scrapyd job opens it: Scrapy's factories, then open_frontier."""
    crawler = get_crawler(GrowthSpider, settings_dict={
        "REDIS_URL": redis_url, "SCHEDULER_LEASE_TIMEOUT": 5, **settings})
    crawler._apply_settings()
    spider = GrowthSpider.from_crawler(crawler)
    crawler.spider = spider
    scheduler = build_from_crawler(Scheduler, crawler)
    disconnect_at_teardown(scheduler.server)
    scheduler.open_frontier(spider)
    return scheduler


def test_a_job_with_other_sizing_settings_crawls_with_the_stored_filter(
        redis_server: Any, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    first = open_job(redis_server.url, BLOOMFILTER_CAPACITY=100_000)
    assert first.bloom is not None
    caplog.set_level(logging.WARNING)
    job = open_job(redis_server.url, BLOOMFILTER_ERROR_RATE=0.0001, BLOOMFILTER_GROWTH=3)
    assert job.bloom is not None and job.bloom.params == first.bloom.params
    warnings = sizing_warnings(caplog)
    assert len(warnings) == 1, warnings
    for difference in ("capacity: stored 100000, asked for 100000000",
                       "error_rate: stored 0.001, asked for 0.0001",
                       "growth: stored 2.0, asked for 3.0"):
        assert difference in warnings[0]
    job.enqueue_request(Request("http://growth.test/1"))
    job.enqueue_request(Request("http://growth.test/1"))
    job.send_pending()
    assert job.bloom.info().items == 1


def test_the_strict_setting_makes_other_sizing_an_error(redis_client: redis.Redis) -> None:
    config(BLOOMFILTER_CAPACITY=100_000).open(redis_client, "demo")
    before = {k: redis_client.dump(k) for k in redis_client.keys("*")}
    strict = config(BLOOMFILTER_STRICT_PARAMS=True)
    assert strict.strict_params
    with pytest.raises(FilterMismatchError, match="capacity: stored 100000, asked for 100000000"):
        strict.open(redis_client, "demo")
    with pytest.raises(FilterMismatchError, match=r"error_rate: stored 0\.001, asked for 0\.01"):
        BloomFilter(redis_client, "demo:bloomfilter", capacity=100_000, error_rate=0.01,
                    strict_params=True)
    assert {k: redis_client.dump(k) for k in redis_client.keys("*")} == before
    # the same settings are no mismatch, strict or not
    config(BLOOMFILTER_CAPACITY=100_000, BLOOMFILTER_STRICT_PARAMS=True).open(
        redis_client, "demo")


@pytest.mark.parametrize(("asked", "difference"), [
    ({"partitions": 8}, "partitions: stored 4, asked for 8"),
    ({"partition_by": "fingerprint"}, "partition_by: stored 'host', asked for 'fingerprint'"),
    ({"backend": "redisbloom"}, "backend: stored 'bitmap', asked for 'redisbloom'"),
])
def test_other_partitioning_or_backend_is_still_an_error(
        redis_client: redis.Redis, asked: dict[str, Any], difference: str) -> None:
    BloomFilter(redis_client, "strict:bloomfilter", capacity=1000, error_rate=0.01)
    before = {k: redis_client.dump(k) for k in redis_client.keys("*")}
    with pytest.raises(FilterMismatchError, match=difference):
        BloomFilter(redis_client, "strict:bloomfilter", capacity=1000, error_rate=0.01, **asked)
    assert {k: redis_client.dump(k) for k in redis_client.keys("*")} == before


@pytest.mark.parametrize(("changes", "difference"), [
    ({"block_bits": 4096}, "block_bits: stored 2048, asked for 4096"),
    ({"version": 2}, "version: stored 1, asked for 2"),
])
def test_another_hash_scheme_is_still_an_error(
        redis_client: redis.Redis, changes: dict[str, Any], difference: str) -> None:
    made = BloomFilter(redis_client, "scheme:bloomfilter", capacity=1000, error_rate=0.01)
    other = FilterParams(**{**json.loads(made.params.to_json()), **changes})
    with pytest.raises(FilterMismatchError, match=difference):
        create_or_open(redis_client, "scheme:bloomfilter", other)


def test_a_partition_whose_state_was_lost_goes_on_with_its_slices(
        redis_client: redis.Redis) -> None:
    """An eviction or a DEL of one partition's state, its bit chunks kept."""
    name = "lost:bloomfilter"
    bf = BloomFilter(redis_client, name, capacity=100_000, error_rate=0.001, partitions=1)
    items = fingerprints(20_000, salt="kept-")
    held = add_all(bf, items)
    before = bf.info()
    assert before.slices >= 5
    redis_client.delete(keys.state_key(name, 0))
    # the next call finds no state: the partition is written again, from its chunks
    assert bf.add_many(items[:2000]) == [False] * 2000
    after = bf.info()
    assert after.slices == before.slices
    assert after.bits_set == before.bits_set  # counted again, exactly
    assert after.items == pytest.approx(held, rel=0.02)
    # every slice is looked in, and new items go into the newest
    assert not any(bf.add_many(items))
    assert sum(bf.add_many(fingerprints(5000, salt="after-"))) >= 4990
    assert bf.info().slices >= before.slices


def test_a_job_without_partitions_set_opens_the_stored_count(
        redis_client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """BLOOMFILTER_PARTITIONS left unset means "what the filter has", on one Redis as on
    a cluster; set to another count, it is still refused (the bits would move)."""
    made = config(BLOOMFILTER_PARTITIONS=2).open(redis_client, "demo")
    made.add_many(fingerprints(100, salt="parts-"))
    caplog.set_level(logging.WARNING)
    bf = config().open(redis_client, "demo")
    assert bf.params == made.params and bf.params.partitions == 2
    assert not any(bf.add_many(fingerprints(100, salt="parts-")))
    assert sizing_warnings(caplog) == []
    with pytest.raises(FilterMismatchError, match="partitions: stored 2, asked for 4"):
        config(BLOOMFILTER_PARTITIONS=4).open(redis_client, "demo")


# --- BLOOMFILTER_INITIAL_CAPACITY: a crawl that knows its size ----------------------------


def test_an_initial_capacity_sizes_the_first_slice_over_all_partitions(
        redis_client: redis.Redis) -> None:
    """Set to the capacity, each partition's first slice holds its share of it: a new
    URL is looked up in one slice, not in one per doubling since 256."""
    cfg = config(BLOOMFILTER_CAPACITY=40_000, BLOOMFILTER_INITIAL_CAPACITY=40_000,
                 BLOOMFILTER_PARTITIONS=4)
    bf = cfg.open(redis_client, "sized")
    assert bf.params.initial_capacity == 10_000
    assert bf.params.plan()[0].capacity >= 10_000
    grown = config(BLOOMFILTER_CAPACITY=40_000, BLOOMFILTER_PARTITIONS=4).open(
        redis_client, "grown")
    assert grown.params.plan()[0].capacity < 1000
    items = fingerprints(20_000, salt="sized-")
    assert sum(bf.add_many(items)) >= 19_990
    assert sum(grown.add_many(items)) >= 19_990
    slices = [int(redis_client.hget(keys.state_key("sized:bloomfilter", p), "slices") or 0)
              for p in range(4)]
    assert slices == [1, 1, 1, 1]
    grown_slices = [int(redis_client.hget(keys.state_key("grown:bloomfilter", p), "slices")
                        or 0) for p in range(4)]
    assert min(grown_slices) >= 4, grown_slices
    assert bf.contains_many(items) == [True] * len(items)


def test_an_initial_capacity_of_another_filter_is_logged_and_the_stored_one_kept(
        redis_client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    made = config(BLOOMFILTER_PARTITIONS=4).open(redis_client, "demo")
    caplog.set_level(logging.WARNING)
    bf = config(BLOOMFILTER_PARTITIONS=4, BLOOMFILTER_INITIAL_CAPACITY=4000).open(
        redis_client, "demo")
    assert bf.params == made.params
    assert bf.params.initial_capacity == defaults.FILTER_INITIAL_CAPACITY
    warnings = sizing_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "initial_capacity: stored 256, asked for 1000" in warnings[0]


@pytest.mark.parametrize(("settings", "message"), [
    ({"BLOOMFILTER_INITIAL_CAPACITY": 0}, "BLOOMFILTER_INITIAL_CAPACITY"),
    ({"BLOOMFILTER_INITIAL_CAPACITY": "many"}, "BLOOMFILTER_INITIAL_CAPACITY"),
    ({"BLOOMFILTER_INITIAL_CAPACITY": 1000, "BLOOMFILTER_BIT": 20},
     "not of one that BLOOMFILTER_BIT sizes"),
])
def test_a_wrong_initial_capacity_is_refused_by_name(settings: dict[str, Any],
                                                     message: str) -> None:
    with pytest.raises(SettingError, match=message):
        config(**settings)


def test_a_job_with_an_initial_capacity_queues_into_one_slice(
        redis_server: Any, redis_client: redis.Redis) -> None:
    """As a scrapyd job opens it: the setting reaches the filter the scheduler makes."""
    job = open_job(redis_server.url, BLOOMFILTER_CAPACITY=8000,
                   BLOOMFILTER_INITIAL_CAPACITY=8000, BLOOMFILTER_PARTITIONS=2)
    assert job.bloom is not None and job.bloom.params.initial_capacity == 4000
    for i in range(3000):
        job.enqueue_request(Request("http://growth.test/%d" % i))
        job.enqueue_request(Request("http://growth.test/%d" % i))
    job.send_pending()
    info = job.bloom.info()
    assert info.items >= 2990, info
    assert info.partition_slices == [1, 1], info
