"""An exchange whose reply is lost after Redis applied it is sent again, whole.

Its filtered requests are duplicates the second time. A ``dont_filter`` request (every
retry RetryMiddleware makes is one) skips the filter: the partition's ``sent`` record
keeps the second send from queueing it again, while a retry made later, a new entry of
the same URL, is queued as the request it is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import pytest
import redis
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.connection import redis_from_url
from bloomcrawl.core.errors import RedisUnavailableError
from bloomcrawl.core.frontier import _REAP, Frontier, Outgoing, flush, open_exchanges
from bloomcrawl.core.keys import FrontierKeys
from bloomcrawl.core.leases import RequeueCounts
from bloomcrawl.core.politeness import host_of
from bloomcrawl.crawl.dupefilter import RedisBloomDupeFilter
from faults.proxy import FaultProxy

from kit.data import outgoing
from kit.redis import RedisServer


def retry_of(url: str, entry_id: str) -> Outgoing:
    """What the worker sends for a retry: dont_filter, an entry id of its own."""
    payload = json.dumps({"url": url, "dont_filter": True, "_id": entry_id, "v": 2})
    return Outgoing(hashlib.sha1(url.encode()).digest(), True, 0.0, payload, host_of(url))


def entries_of(client: redis.Redis, frontier: Frontier, url: str) -> list[str]:
    """The queue entries and leases of ``url`` in partition 0."""
    f = frontier.keys
    leased = [v.decode() for v in client.hvals(f.leases(0))]
    queue = f.host_queue(0, host_of(url))
    if frontier.queue_type == "priority":
        queued = [m.decode() for m in client.zrange(queue, 0, -1)]
    else:
        queued = [m.decode() for m in client.lrange(queue, 0, -1)]
    return [e for e in leased + queued if url in e]


@pytest.mark.parametrize("queue_type", ["priority", "fifo"])
@pytest.mark.parametrize("lease", [False, True], ids=["enqueue", "enqueue-and-lease"])
def test_a_dont_filter_request_of_an_exchange_sent_again_is_queued_once(
        redis_server: RedisServer, redis_client: redis.Redis, lease: bool,
        queue_type: str) -> None:
    url = "http://a.test/retry-me"
    with FaultProxy(redis_server.port) as proxy:
        client = redis_from_url("redis://127.0.0.1:%d/0" % proxy.port)
        bloom = BloomFilter(client, "t:bloomfilter", capacity=1000, error_rate=0.01,
                            partitions=1, backend="bitmap")
        frontier = Frontier(client, bloom, FrontierKeys("t", partitions=1),
                            queue_type=queue_type, lease_timeout=60, worker_id="w1",
                            node="host")
        assert open_exchanges(frontier)
        retry = retry_of(url, "a1")
        plain = outgoing("http://a.test/plain-page")[0]
        options = {"lease_from": 0, "want": 1} if lease else {}
        proxy.drop_replies(b"retry-me", count=1)
        try:
            frontier.exchange([retry, plain], {}, **options)
        except (redis.RedisError, RedisUnavailableError):
            pass  # the worker's outbox sends the whole batch again, as here
        assert proxy.drops_pending == 0, "the reply was not dropped: the test proves nothing"
        frontier.exchange([retry, plain], {}, **options)
        assert len(entries_of(redis_client, frontier, url)) == 1
        assert len(entries_of(redis_client, frontier, "http://a.test/plain-page")) == 1
        # a retry of it made later is an entry of its own: queued
        frontier.exchange([dataclasses.replace(retry, payload=retry.payload.replace(
            '"a1"', '"b2"'))], {})
        assert len(entries_of(redis_client, frontier, url)) == 2
        client.close()


def test_leases_requeued_by_a_reap_whose_reply_is_lost_are_counted(
        redis_server: RedisServer, redis_client: redis.Redis) -> None:
    """A reap Redis applied but whose reply never came back (a socket timeout while
    Redis was stopped, a connection closed) still counts its requeued leases in the
    shared stats: every fetch of such a request again is covered by one."""
    urls = ["http://a.test/lost-%d" % i for i in range(3)]
    with FaultProxy(redis_server.port) as proxy:
        client = redis_from_url("redis://127.0.0.1:%d/0" % proxy.port)
        bloom = BloomFilter(client, "t:bloomfilter", capacity=1000, error_rate=0.01,
                            partitions=1, backend="bitmap")
        frontier = Frontier(client, bloom, FrontierKeys("t", partitions=1),
                            queue_type="priority", lease_timeout=0.2, worker_id="w1",
                            node="host")
        assert open_exchanges(frontier)
        leased = frontier.exchange(outgoing(*urls), {}, lease_from=0, want=3).leases
        assert len(leased) == 3
        assert frontier.reap() == 0  # the reap script loaded, as in any crawl by now
        time.sleep(0.4)  # the three leases run out
        proxy.drop_replies(_REAP.sha.encode(), count=1)
        try:
            frontier.reap()
        except (redis.RedisError, RedisUnavailableError):
            pass
        assert proxy.drops_pending == 0, "the reap's reply was not dropped: no fault"
        assert redis_client.hlen(frontier.keys.leases(0)) == 0, "the reap was not applied"
        frontier.reap()  # the next reap, by this worker or another, finds nothing to requeue
        assert int(redis_client.hget(frontier.keys.stats, "requeued") or 0) == 3
        # and counts nothing twice, nor an older count another worker sends late
        frontier.reap()
        epoch = redis_client.hget(frontier.keys.requeued(0), "epoch")
        RequeueCounts().add(bloom, frontier.keys, [[0, epoch, 1]])
        assert int(redis_client.hget(frontier.keys.stats, "requeued") or 0) == 3
        client.close()


def requeue(frontier: Frontier, host: str, n: int) -> int:
    """Lease ``n`` new requests of ``host``, let the leases run out, reap them."""
    urls = ["http://%s/%d" % (host, i) for i in range(n)]
    assert len(frontier.exchange(outgoing(*urls), {}, lease_from=0, want=n).leases) == n
    time.sleep(0.4)
    return frontier.reap()


def short_leases(url: str, filter_pattern: str = "%(spider)s:bloomfilter",
                 worker: str = "w") -> Frontier:
    client = redis_from_url(url)
    f = FrontierKeys("t", filter_pattern=filter_pattern, partitions=1)
    bloom = BloomFilter(client, f.filter, capacity=1000, error_rate=0.01, partitions=1,
                        backend="bitmap")
    frontier = Frontier(client, bloom, f, queue_type="priority", lease_timeout=0.2,
                        worker_id=worker + "-" + f.filter, node="host")
    assert open_exchanges(frontier)
    return frontier


def test_leases_requeued_again_after_a_restart_that_lost_them_are_counted(
        tmp_path: Path) -> None:
    """Redis restarts from a snapshot taken before a reap (its writes lost): the same
    leases expire and are requeued again, and counted again, as they were crawled again."""
    with RedisServer(tmp_path / "redis") as server:
        frontier = short_leases(server.url)
        client = frontier.server
        urls = ["http://a.test/r-%d" % i for i in range(3)]
        assert len(frontier.exchange(outgoing(*urls), {}, lease_from=0, want=3).leases) == 3
        server.bgsave()  # the snapshot holds the three leases, nothing requeued
        time.sleep(0.4)
        assert frontier.reap() == 3
        server.kill()  # no save at shutdown: the reap is lost
        server.start()
        client.connection_pool.disconnect()
        time.sleep(0.1)
        assert frontier.reap() == 3
        assert int(client.hget(frontier.keys.stats, "requeued") or 0) == 3
        client.close()


def test_two_filters_of_one_spider_count_their_requeued_leases_apart(
        redis_server: RedisServer, redis_client: redis.Redis) -> None:
    """BLOOMFILTER_KEY changed between runs: both filters' partition counters feed the
    spider's one stats hash, each in full."""
    first = short_leases(redis_server.url, "%(spider)s:bloomfilter-one")
    second = short_leases(redis_server.url, "%(spider)s:bloomfilter-two")
    assert requeue(first, "a.test", 3) == 3
    assert requeue(second, "b.test", 2) == 2
    assert int(redis_client.hget("t:stats", "requeued") or 0) == 5
    first.server.close()
    second.server.close()


def requeued(client: redis.Redis) -> int:
    return int(client.hget("t:stats", "requeued") or 0)


def test_a_counter_made_again_counts_from_zero(redis_server: RedisServer,
                                               redis_client: redis.Redis) -> None:
    """A partition's counter lost (its Redis Cluster master came back empty; the stats and
    their marks, on another master, kept) and made again by the same worker: what it
    counts then is added in full."""
    frontier = short_leases(redis_server.url)
    assert requeue(frontier, "a.test", 3) == 3
    redis_client.delete(frontier.keys.requeued(0))  # the partition's master lost it
    assert requeue(frontier, "b.test", 2) == 2
    assert requeued(redis_client) == 5
    frontier.server.close()


@pytest.mark.parametrize("lost", ["counter", "flush"])
def test_a_late_value_of_a_counter_made_again_adds_nothing(
        redis_server: RedisServer, redis_client: redis.Redis, lost: str) -> None:
    """Worker A's reap reply, counted already, is sent late, after the counter was lost
    (or flushed) and made again by worker B: it adds nothing, and B's next sends add only
    what B requeued."""
    a = short_leases(redis_server.url, worker="wa")
    b = short_leases(redis_server.url, worker="wb")
    assert requeue(a, "a.test", 3) == 3
    counter = redis_client.hgetall(a.keys.requeued(0))
    late = [[0, counter[b"epoch"], int(counter[b"n"])]]
    if lost == "flush":
        flush(b)
    else:
        redis_client.delete(a.keys.requeued(0))
    assert requeue(b, "b.test", 2) == 2
    RequeueCounts().add(a.bloom, a.keys, late)
    b.reap()
    assert requeued(redis_client) == 5
    a.server.close()
    b.server.close()


@pytest.mark.parametrize("batched", [False, True], ids=["request_seen", "requests_seen"])
def test_a_request_whose_filter_reply_is_lost_is_not_dropped_as_seen(
        redis_server: RedisServer, batched: bool) -> None:
    """The drop-in dupefilter (under Scrapy's or scrapy-redis's scheduler): Redis added the
    request's fingerprint and the reply never came back. The call is sent again and
    answers what the first send decided (the partition's record of this dupefilter's last
    call): the new request is let through, the duplicate beside it is still one."""
    fingerprinter = RequestFingerprinter()
    with FaultProxy(redis_server.port) as proxy:
        client = redis_from_url("redis://127.0.0.1:%d/0" % proxy.port)
        key = "seen-%s:bloomfilter" % ("many" if batched else "one")
        bloom = BloomFilter(client, key, capacity=1000, error_rate=0.01,
                            partitions=1, backend="bitmap")
        dupefilter = RedisBloomDupeFilter(bloom, fingerprinter)
        first = Request("http://a.test/first")
        assert not dupefilter.request_seen(first)  # the add script loaded
        new = Request("http://a.test/new-page")
        proxy.drop_replies(key.encode(), count=1)
        if batched:
            seen = dupefilter.requests_seen([new, Request("http://a.test/first")])
            assert seen == [False, True]
        else:
            assert not dupefilter.request_seen(new)
        assert proxy.replies_dropped == 1, "no reply was dropped: no fault"
        # Redis kept what the lost call added: the next time it is a duplicate
        assert dupefilter.request_seen(Request("http://a.test/new-page"))
        client.close()
