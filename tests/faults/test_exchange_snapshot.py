"""One exchange is in a snapshot of Redis whole or not at all.

A page's ack and its links go in one exchange, but in calls of their own
when they fall in different partitions. Redis runs a pipeline's calls as
it reads them: a pipeline that arrives in several reads (any exchange of
more than 16 KiB), or a worker killed while sending it, leaves Redis with
its first calls run and the rest not. A snapshot taken then (BGSAVE, an AOF
cut short, what a replica had at a failover), or the worker's death, kept
the page's ack and lost its links: the page was done, its links were
never queued, and nothing would ever crawl them. The fault suite's
rollback test once ended so: one page fetched, its item gone with the
rollback, never fetched again.

Here the fault proxy forwards an exchange's first call and holds the rest
while Redis takes a snapshot, then the exchange goes on and returns. Redis
is then killed and started from that snapshot.

And a lease token given after a snapshot is never given again once Redis
is back at it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import redis

from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.connection import ServerChangedError, ServerWatch
from bloomcrawl.core.frontier import Exchanged, Frontier, partition_of
from bloomcrawl.core.keys import FrontierKeys
from faults.proxy import FaultProxy

from kit.data import outgoing
from kit.redis import RedisServer
from kit.wait import wait_until

PARTITIONS = 2


def url_in(partition: int, path: str) -> str:
    """A URL of a.test, under ``path``, whose fingerprint falls in ``partition``."""
    for i in range(1000):
        url = "http://a.test/%s-%d" % (path, i)
        if partition_of(outgoing(url)[0].fingerprint, PARTITIONS) == partition:
            return url
    raise AssertionError("no URL of partition %d" % partition)


def frontier_at(url: str) -> Frontier:
    client = redis.Redis.from_url(url)
    bloom = BloomFilter(client, "t:bloomfilter", capacity=1000, error_rate=0.01,
                        partitions=PARTITIONS, backend="bitmap")
    return Frontier(client, bloom, FrontierKeys("t", partitions=PARTITIONS), queue_type="fifo",
                    lease_timeout=60, worker_id="w1", node="host")


def test_a_snapshot_taken_mid_exchange_holds_none_of_it(tmp_path: Path) -> None:
    page, sibling, link = url_in(0, "page"), url_in(0, "sibling"), url_in(1, "link")
    with RedisServer(tmp_path / "redis") as server, FaultProxy(server.port) as proxy:
        worker = frontier_at(proxy.url)
        worker.exchange(outgoing(page), {})
        [lease] = worker.lease(0, 1)
        # the page is done: one exchange acks it and queues its two links, the first
        # in the page's partition (one call with the ack), the other in partition 1
        proxy.hold_from(link.encode())
        done: list[Exchanged] = []
        thread = threading.Thread(target=lambda: done.append(worker.exchange(
            outgoing(sibling, link), {0: [lease.token]})))
        thread.start()
        try:
            wait_until(lambda: proxy.splits == 1, 10, what="the exchange held at its link")
            server.bgsave()
        finally:
            proxy.resume()
            thread.join(10)
        assert not thread.is_alive()
        assert done[0].queued == 2  # the exchange itself went through
        worker.server.close()

        server.kill()
        server.start()  # from the snapshot
        after = frontier_at(server.url)
        try:
            leased = after.server.hexists(after.keys.leases(0), lease.token)
            queued = after.size()
            linked = after.bloom.contains_many([e.fingerprint for e in outgoing(sibling, link)])
        finally:
            after.server.close()
    # all of the exchange (the lease acked, both links in the filter and queued), or
    # none of it (the page still leased: its lease expires and it is crawled again)
    assert (leased, queued, linked) in ((False, 2, [True, True]), (True, 0, [False, False]))
    assert (leased, queued, linked) == (True, 0, [False, False])  # the snapshot came first


def test_a_lease_after_a_rollback_never_takes_a_token_given_before(tmp_path: Path) -> None:
    """Redis numbers lease tokens with a counter, which a rollback puts back: the same
    worker would be given again a token it holds a request of. Acked when that request
    is done, it would end the new lease, whose request is not."""
    with RedisServer(tmp_path / "redis") as server:
        client = redis.Redis.from_url(server.url)
        worker = frontier_at(server.url)
        worker.server.close()
        worker.server = worker.bloom.server = client
        worker.watch = ServerWatch(client)
        worker.exchange(outgoing(url_in(0, "a"), url_in(0, "b")), {})
        server.bgsave()
        [before] = worker.lease(0, 1)  # lost with the rollback: its request is still out
        server.kill()
        server.start()  # from the snapshot: the counter as it was before that lease
        with pytest.raises(ServerChangedError):
            worker.lease(0, 1)
        [after] = worker.lease(0, 1)
        assert after.payload == before.payload  # the same request, leased again
        assert after.token != before.token
        # the request still out under the old token is done: its ack ends nothing
        worker.exchange([], {0: [before.token]})
        assert client.zcard(worker.keys.deadlines(0)) == 1
        client.close()
