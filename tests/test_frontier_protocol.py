"""core.frontier.Frontier against a real redis-server: every call may be sent twice."""

from __future__ import annotations

import dataclasses
import time

import pytest
import redis

from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.frontier import Frontier, open_exchanges, stats_call
from bloomcrawl.core.keys import FrontierKeys
from bloomcrawl.core.scripts import transactions_allowed

from kit.data import outgoing
from kit.redis import RedisServer


@pytest.fixture
def frontier(redis_client: redis.Redis) -> Frontier:
    bloom = BloomFilter(redis_client, "t:bloomfilter", capacity=1000, error_rate=0.01,
                        partitions=1, backend="bitmap")
    return make(redis_client, bloom, "w1", lease_timeout=0.3)


def make(client: redis.Redis, bloom: BloomFilter, worker: str,
         lease_timeout: float = 30.0) -> Frontier:
    return Frontier(client, bloom, FrontierKeys("t", partitions=1), queue_type="fifo",
                    lease_timeout=lease_timeout, worker_id=worker, node="host")


def queued(client: redis.Redis, f: Frontier) -> int:
    return f.size()


def test_a_lease_call_sent_twice_loses_nothing(frontier: Frontier,
                                               redis_client: redis.Redis) -> None:
    frontier.exchange(outgoing("http://a.test/1", "http://a.test/2"), {})
    first = frontier.lease(0, 1)
    again = frontier.lease(0, 1)  # what a resend after a lost reply does
    assert len(first) == len(again) == 1
    assert first[0].token != again[0].token  # the resend did not overwrite the first lease
    time.sleep(0.4)  # both leases expire: their requests go back
    assert frontier.reap() == 2
    assert queued(redis_client, frontier) == 2


def test_an_exchange_with_the_lease_partition_and_no_want_only_acks(
        frontier: Frontier) -> None:
    """``lease_from`` with ``want`` and ``ahead`` 0: the acks ride in that partition's
    call, nothing is leased, and the reply says when a host of the partition is ready,
    after the acks: a.test/2 now. Every call of an exchange says it for its partition.
    (``want`` 0 with ``ahead``: test_politeness.py)"""
    frontier.exchange(outgoing("http://a.test/1", "http://a.test/2"), {})
    [lease] = frontier.lease(0, 1)
    done = frontier.exchange([], {0: [lease.token]}, lease_from=0, want=0, ahead=0)
    assert (done.leases, done.ready_in, done.waits) == ([], 0.0, {})
    [lease] = frontier.lease(0, 1)  # the want-0 exchange leased nothing
    assert lease.payload == b'{"url": "http://a.test/2"}'
    done = frontier.exchange([], {0: [lease.token]})  # acks only: nothing queued is left
    assert (done.leases, done.waits) == ([], {0: None})
    assert frontier.reap() == 0  # the acks ended the leases: nothing is left to expire
    assert frontier.lease(0, 5) == []


def test_a_recorded_fingerprint_is_never_queued_and_filters_what_comes_after(
        frontier: Frontier) -> None:
    """What a start request's own fingerprint gets beside the entry that queues it."""
    new, again = outgoing("http://a.test/start"), outgoing("http://a.test/start")
    record = [dataclasses.replace(new[0], payload="", record_only=True)]
    done = frontier.exchange([*record, *outgoing("http://a.test/other")], {})
    assert (done.queued, done.filtered, frontier.size()) == (1, 0, 1)
    assert done.queued_fingerprints == [outgoing("http://a.test/other")[0].fingerprint]
    done = frontier.exchange(again, {})  # the same URL as a link: a duplicate now
    assert (done.queued, done.filtered, frontier.size()) == (0, 1, 1)
    assert [lease.payload for lease in frontier.lease(0, 5)] == [b'{"url": "http://a.test/other"}']


def test_stats_of_one_exchange_count_once_however_often_sent(frontier: Frontier,
                                                             redis_client: redis.Redis) -> None:
    for _ in range(3):
        frontier.exchange((), {}, [(1, {"pages": 2, "items": 2})])
    frontier.exchange((), {}, [(1, {"pages": 2, "items": 2}), (2, {"pages": 1})])
    stats = {k.decode(): int(v) for k, v in redis_client.hgetall(frontier.keys.stats).items()}
    assert stats == {"pages": 3, "items": 2}
    assert int(redis_client.hget(frontier.keys.pages_by_node, "host")) == 3
    # another worker numbers its own exchanges
    other = make(redis_client, frontier.bloom, "w2")
    other.exchange((), {}, [(1, {"pages": 5})])
    assert int(redis_client.hget(frontier.keys.stats, "pages")) == 8


def test_a_batch_numbers_go_in_one_call_whatever_the_script_cache(
        frontier: Frontier, redis_client: redis.Redis) -> None:
    """After a restart or failover the script cache is empty, and other clients load
    scripts between a pipeline's calls: with one call per number, a NOSCRIPT reply
    to the lower number let the higher apply first and the lower be refused."""
    call = stats_call(frontier.keys, "w1", "host", [(1, {"pages": 1}), (2, {"pages": 2})])
    assert call.args == ["w1", "host", 1, 1, "pages", 1, 2, 1, "pages", 2]
    redis_client.script_flush()
    frontier.exchange(outgoing("http://a.test/1"), {},
                      [(1, {"pages": 1, "items": 1}), (2, {"pages": 2})])
    # resent with a newer number: only the newer one counts
    frontier.exchange((), {}, [(2, {"pages": 2}), (3, {"pages": 4, "errors": 1})])
    frontier.exchange((), {}, [(1, {"pages": 1, "items": 1})])
    stats = {k.decode(): int(v) for k, v in redis_client.hgetall(frontier.keys.stats).items()}
    assert stats == {"pages": 7, "items": 1, "errors": 1}
    assert int(redis_client.hget(frontier.keys.stats_applied, "w1")) == 3


def test_renewal_names_the_leases_that_were_lost(frontier: Frontier) -> None:
    frontier.exchange(outgoing("http://a.test/1", "http://a.test/2"), {})
    leases = frontier.lease(0, 2)
    held = {lease.token: 0 for lease in leases}
    assert frontier.renew(held) == []
    time.sleep(0.4)
    frontier.reap()
    assert sorted(frontier.renew(held)) == sorted(held)


def test_start_entries_are_leased_and_come_back_unless_acked(frontier: Frontier,
                                                             redis_client: redis.Redis) -> None:
    redis_client.rpush(frontier.keys.start_urls, "http://a.test/", "http://b.test/")
    taken = frontier.take_start_entries(10)
    assert [entry for _, entry in taken] == [b"http://a.test/", b"http://b.test/"]
    assert redis_client.llen(frontier.keys.start_urls) == 0
    assert frontier.size(with_leases=True) == 2  # taken, not done: the crawl is not idle
    # the worker queued a.test's request and acked it, then died holding b.test
    frontier.take_start_entries(0, [taken[0][0]])
    time.sleep(0.4)
    again = frontier.take_start_entries(10)
    assert [entry for _, entry in again] == [b"http://b.test/"]


def test_a_user_refused_multi_gets_its_exchanges_call_by_call(
        frontier: Frontier, redis_client: redis.Redis, redis_server: RedisServer) -> None:
    """An ACL user of before MULTI/EXEC was needed: told apart before any exchange (a
    refused MULTI runs the calls outside it and loses their replies)."""
    assert transactions_allowed(frontier.server)
    redis_client.execute_command(
        "ACL", "SETUSER", "old-worker", "on", ">pw", "~t:*", "~{t:*", "-@all", "+ping",
        "+script|load", "+evalsha", "+hget", "+hmget", "+hset", "+time", "+incr", "+incrby")
    try:
        client = redis.Redis(port=redis_server.port, username="old-worker", password="pw")
        old = make(client, frontier.bloom, "w2")
        assert not transactions_allowed(client)
        assert not open_exchanges(old) and not old.whole  # the scheduler warns then
        done = old.exchange(outgoing("http://a.test/1", "http://b.test/2"), {},
                            [(1, {"pages": 1})])
        assert (done.queued, frontier.size()) == (2, 2)
        client.close()
        # MULTI allowed, EXEC not: refused too (EXEC aborts the transaction)
        redis_client.execute_command("ACL", "SETUSER", "old-worker", "+multi")
        client = redis.Redis(port=redis_server.port, username="old-worker", password="pw")
        assert not transactions_allowed(client)
        client.close()
    finally:
        redis_client.execute_command("ACL", "DELUSER", "old-worker")
