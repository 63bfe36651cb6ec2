"""The redisbloom backend: the same guarantees through the bf module's BF.MADD."""

from __future__ import annotations

import logging
import math

import pytest
import redis
from scrapy import Request

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.errors import BloomFilterError, FilterMismatchError
from bloomcrawl.core.scripts import Script, ScriptCall
from bloomcrawl.ops import acl

from kit.data import fill, fingerprints, measure_false_positives
from test_scheduler import drain, make_scheduler

pytestmark = pytest.mark.redismod


def test_auto_picks_redisbloom_when_loaded(redismod_client: redis.Redis) -> None:
    bf = BloomFilter(redismod_client, "a:bloomfilter", capacity=1000, error_rate=0.01,
                     backend="auto")
    assert bf.params.backend == "redisbloom"
    assert redismod_client.exists(keys.redisbloom_key("a:bloomfilter", 0))
    assert bf.add(b"x" * 20) is True
    assert bf.add(b"x" * 20) is False
    assert bf.add_many([b"y" * 20, b"x" * 20, b"y" * 20]) == [True, False, False]
    info = bf.info()
    assert (info.items, info.checked, info.filtered) == (2, 5, 3)


def test_auto_keeps_an_existing_bitmap_filter(redismod_client: redis.Redis) -> None:
    BloomFilter(redismod_client, "b:bloomfilter", capacity=1000, error_rate=0.01, backend="bitmap")
    bf = BloomFilter(redismod_client, "b:bloomfilter", capacity=1000, error_rate=0.01,
                     backend="auto")
    assert bf.params.backend == "bitmap"
    with pytest.raises(FilterMismatchError, match="backend: stored 'bitmap', asked for"):
        BloomFilter(redismod_client, "b:bloomfilter", capacity=1000, error_rate=0.01,
                    backend="redisbloom")


def test_redisbloom_backend_without_the_module_is_an_error(redis_client) -> None:
    with pytest.raises(BloomFilterError, match="no bf module loaded"):
        BloomFilter(redis_client, "c:bloomfilter", capacity=1000, error_rate=0.01,
                    backend="redisbloom")
    assert redis_client.keys("*") == []  # nothing stored: its parameters neither


def test_a_new_filter_starts_small_and_its_chain_keeps_the_error_rate(
        redismod_client: redis.Redis) -> None:
    """The default sizing on a server with the module: memory follows the items, and the
    compound rate of the grown chain stays under the error rate asked for."""
    p = 0.001
    bf = BloomFilter(redismod_client, "small:bloomfilter", capacity=100_000_000, error_rate=p,
                     backend="auto", partitions=1)
    assert bf.params.backend == "redisbloom"
    assert bf.params.initial_capacity == defaults.FILTER_INITIAL_CAPACITY
    info = bf.info()
    assert (info.slice_capacity, info.slices) == (defaults.FILTER_INITIAL_CAPACITY, 1), info
    assert info.memory_bytes < 4096, info
    fill(bf, 260_000)  # ten sub-filters of 256 to 131,072 items, the last nearly full
    info = bf.info()
    assert info.slices == 10, info
    assert info.memory_bytes < 260_000 * 10, info  # bytes: under 80 bits an item
    # reserved at the error rate itself, the module's chain measured 1.2-1.4 times it here
    measured = measure_false_positives(bf)
    assert measured <= p
    # the estimate counts the full sub-filters at their own rates, not at the newest's fill
    assert measured / 2 <= info.estimated_false_positive_rate <= measured * 2, (measured, info)


def test_auto_opens_a_redisbloom_filter_asked_for_bitmap_only_sizing(
        redismod_client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    made = BloomFilter(redismod_client, "g:bloomfilter", capacity=1000, error_rate=0.01,
                       backend="auto")
    assert made.params.backend == "redisbloom"
    assert made.add(b"g" * 20) is True
    caplog.set_level(logging.WARNING)
    for asked in ({"growth": 1.5}, {"bit_exponent": 20, "hashes": 6}):
        bf = BloomFilter(redismod_client, "g:bloomfilter", capacity=1000, error_rate=0.01,
                         backend="auto", **asked)  # type: ignore[arg-type]
        assert bf.params == made.params
        assert bf.add(b"g" * 20) is False
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("asked for growth 1.5" in m for m in logged), logged
    assert any("BLOOMFILTER_BIT=20" in m for m in logged), logged


@pytest.mark.slow
def test_capacity_and_growth_keep_the_error_rate(redismod_client: redis.Redis) -> None:
    """Sized up front (BLOOMFILTER_INITIAL_CAPACITY = capacity): one sub-filter, then more."""
    capacity, p = 100_000, 0.001
    bf = BloomFilter(redismod_client, "fp:bloomfilter", capacity=capacity, error_rate=p,
                     backend="redisbloom", partitions=1, initial_capacity=capacity)
    fill(bf, capacity)
    info = bf.info()
    assert info.slices == 1
    assert measure_false_positives(bf) <= 1.1 * p
    optimum = -math.log(p) / math.log(2) ** 2
    assert info.memory_bytes * 8 / capacity <= 1.25 * optimum
    fill(bf, 2 * capacity, salt="more-")
    assert bf.info().slices >= 2
    assert measure_false_positives(bf) <= 1.1 * p


def test_scheduler_enqueue_if_new_with_redisbloom(redismod_server, redismod_client) -> None:
    s = make_scheduler(redismod_server.url, BLOOMFILTER_BACKEND="auto")
    assert s.bloom is not None and s.bloom.params.backend == "redisbloom"
    for _ in range(2):
        s.enqueue_request(Request("http://a.test/1"))
        s.enqueue_request(Request("http://a.test/2", dont_filter=True))
    s.send_pending()
    assert sorted(r.url for r in drain(s)) == ["http://a.test/1", "http://a.test/2",
                                               "http://a.test/2"]
    # the filter the scheduler opened is RedisBloom's, and takes new fingerprints as new
    assert s.bloom.add_many(fingerprints(3, salt="new-")) == [True] * 3


def test_a_single_add_sent_again_answers_what_its_first_send_decided(
        redismod_client: redis.Redis) -> None:
    """request_seen's call of one item (which builds no list on RedisBloom): sent again
    after a lost reply it answers from the caller's record and counts nothing twice; a
    partition whose RedisBloom filter is gone is made again as it was reserved, never by
    BF.MADD with the module's defaults."""
    bf = BloomFilter(redismod_client, "r:bloomfilter", capacity=1000, error_rate=0.01,
                     partitions=1, backend="redisbloom")
    state = keys.state_key("r:bloomfilter", 0)
    record = keys.call_record_key("r:bloomfilter", 0, "caller")
    add = Script.for_backend("redisbloom", "bloom_add.lua")
    first = ScriptCall(add, [state, record], [b"n" * 20, "", "1"])
    assert bf.run_scripts([first]) == [b"1"]
    assert bf.run_scripts([first]) == [b"1"]  # the same token: answered from the record
    info = bf.info()
    assert (info.items, info.checked, info.filtered) == (1, 1, 0)
    again = ScriptCall(add, [state, record], [b"n" * 20, "", "2"])
    assert bf.run_scripts([again]) == [b"0"]
    info = bf.info()
    assert (info.items, info.checked, info.filtered) == (1, 2, 1)

    rb_key = keys.redisbloom_key("r:bloomfilter", 0)
    reserved = redismod_client.execute_command("BF.INFO", rb_key, "CAPACITY")
    redismod_client.delete(rb_key)
    assert bf.add(b"n" * 20) is True  # made again, empty
    assert redismod_client.execute_command("BF.INFO", rb_key, "CAPACITY") == reserved


def test_a_lost_redisbloom_filter_is_made_again_as_reserved_on_every_path(
        redismod_server, redismod_client: redis.Redis) -> None:
    """The scripts add with BF.INSERT NOCREATE (no EXISTS a call): a partition whose
    RedisBloom filter is gone is refused by the module itself, on a batch, a lookup and a
    crawl's exchange, and made again as it was reserved, never with the module's
    defaults; the exchange's requests are queued once."""
    bf = BloomFilter(redismod_client, "g:bloomfilter", capacity=1000, error_rate=0.01,
                     partitions=1, backend="redisbloom")
    rb_key = keys.redisbloom_key("g:bloomfilter", 0)
    reserved = redismod_client.execute_command("BF.INFO", rb_key, "CAPACITY")
    fps = fingerprints(5, salt="lost-")
    assert bf.add_many(fps) == [True] * 5
    redismod_client.delete(rb_key)
    assert bf.add_many(fps[:2] + fingerprints(1, salt="other-")) == [True] * 3
    assert redismod_client.execute_command("BF.INFO", rb_key, "CAPACITY") == reserved
    redismod_client.delete(rb_key)
    assert bf.contains_many(fps[:2]) == [False, False]
    assert redismod_client.execute_command("BF.INFO", rb_key, "CAPACITY") == reserved
    # a script's own error is not taken for a lost filter
    redismod_client.delete(rb_key)
    redismod_client.set(rb_key, "not a filter")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        bf.add(fps[0])
    assert redismod_client.get(rb_key) == b"not a filter"

    s = make_scheduler(redismod_server.url, BLOOMFILTER_BACKEND="redisbloom",
                       BLOOMFILTER_PARTITIONS=1)
    assert s.bloom is not None
    s.enqueue_request(Request("http://lost.test/1"))
    s.send_pending()
    assert [r.url for r in drain(s)] == ["http://lost.test/1"]
    crawl_rb = keys.redisbloom_key(s.bloom.key, 0)
    crawl_reserved = redismod_client.execute_command("BF.INFO", crawl_rb, "CAPACITY")
    redismod_client.delete(crawl_rb)
    s.enqueue_request(Request("http://lost.test/2"))
    s.enqueue_request(Request("http://lost.test/3"))
    s.send_pending()
    assert sorted(r.url for r in drain(s)) == ["http://lost.test/2", "http://lost.test/3"]
    assert redismod_client.execute_command("BF.INFO", crawl_rb, "CAPACITY") == crawl_reserved


def test_a_user_who_may_not_run_the_module_gets_the_bitmap_filter_under_auto(
        redismod_server, redismod_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    """The worker role of docs/scale.md lists no bf command (a Redis without the module
    refuses their names), so on a Redis with the module (redis-stack, Redis 8) its user
    could not make the filter auto chose: NOPERM on BF.RESERVE, and no crawl. auto now
    makes such a user a bitmap filter and says what to grant; asked for explicitly,
    redisbloom is refused with the same words; a user granted them gets RedisBloom."""
    rules = acl.rules("worker", ["perm"])
    redismod_client.execute_command("ACL", "SETUSER", "perm-worker", "reset", "on", ">pw",
                                    *rules)
    granted = [*rules, "+bf.reserve", "+bf.insert", "+bf.mexists", "+bf.info"]
    redismod_client.execute_command("ACL", "SETUSER", "perm-granted", "reset", "on", ">pw",
                                    *granted)
    worker = redis.Redis.from_url(redismod_server.url, username="perm-worker", password="pw")
    allowed = redis.Redis.from_url(redismod_server.url, username="perm-granted",
                                   password="pw")
    try:
        with caplog.at_level(logging.WARNING, logger="bloomcrawl.core.bloom_creation"):
            bf = BloomFilter(worker, "perm:bloomfilter", capacity=1000, error_rate=0.01,
                             backend="auto")
        assert bf.params.backend == "bitmap"
        assert "may not run BF.RESERVE, BF.INSERT, BF.MEXISTS, BF.INFO (grant +bf.reserve" \
            in caplog.text
        assert bf.add_many([b"p" * 20, b"p" * 20]) == [True, False]
        assert not redismod_client.keys("*bf-acl-probe*")  # the probes made nothing
        with pytest.raises(BloomFilterError, match=r"may not run BF\.RESERVE.*\+bf\.insert"):
            BloomFilter(worker, "perm:other", capacity=1000, error_rate=0.01,
                        backend="redisbloom")
        assert not redismod_client.exists(keys.meta_key("perm:other"))
        rb = BloomFilter(allowed, "perm:granted", capacity=1000, error_rate=0.01,
                         backend="auto")
        assert rb.params.backend == "redisbloom"
        assert rb.add_many([b"g" * 20, b"g" * 20]) == [True, False]
    finally:
        worker.close()
        allowed.close()
        for user in ("perm-worker", "perm-granted"):
            redismod_client.execute_command("ACL", "DELUSER", user)


def _rights_checks(client: redis.Redis) -> tuple[int, int]:
    """MODULE LIST calls and BF.MEXISTS calls so far: a check of the module and the
    user's rights runs one of each (the probes' lookup)."""
    stats = client.info("commandstats")
    return (stats.get("cmdstat_module|list", {}).get("calls", 0),
            stats.get("cmdstat_bf.mexists", {}).get("calls", 0))


def test_the_module_and_the_rights_are_checked_once_a_filter_handle(
        redismod_client: redis.Redis) -> None:
    """auto checks the module and the user's rights for a new filter; the opener used to
    ask again (five more round trips), and again at every re-creation of a lost
    partition. Once a handle now: a new filter, a stored one, a lost partition."""
    before = _rights_checks(redismod_client)
    bf = BloomFilter(redismod_client, "once:bloomfilter", capacity=1000, error_rate=0.01,
                     partitions=1, backend="auto")
    assert bf.params.backend == "redisbloom"
    made = _rights_checks(redismod_client)
    assert (made[0] - before[0], made[1] - before[1]) == (1, 1)
    again = BloomFilter(redismod_client, "once:bloomfilter", capacity=1000,
                        error_rate=0.01, partitions=1, backend="auto")
    opened = _rights_checks(redismod_client)
    assert (opened[0] - made[0], opened[1] - made[1]) == (1, 1)
    redismod_client.delete(keys.redisbloom_key("once:bloomfilter", 0))
    assert again.add_many([b"o" * 20, b"o" * 20]) == [True, False]
    assert again.params.backend == "redisbloom"
    assert _rights_checks(redismod_client) == opened
    explicit = BloomFilter(redismod_client, "once:explicit", capacity=1000,
                           error_rate=0.01, partitions=1, backend="redisbloom")
    assert explicit.params.backend == "redisbloom"
    assert _rights_checks(redismod_client)[0] - opened[0] == 1
