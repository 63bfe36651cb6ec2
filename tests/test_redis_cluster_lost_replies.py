"""The drop-in dupefilter on Redis Cluster when a reply is lost after Redis applied the
call: the cluster client sends the call again on its own, before bloomcrawl sees any
error. The partition's record of the dupefilter's last call answers that second send
with what the first decided, so a new request is not dropped as seen.

The fault is the reply read from the socket, then the connection failing: the client's
connection drops the reply it has just read (a real cluster, a real call applied)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import redis
import redis.connection
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.connection import redis_from_url
from bloomcrawl.crawl.dupefilter import RedisBloomDupeFilter

from kit.cluster import RedisClusterProcesses


@contextlib.contextmanager
def next_reply_lost(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The next reply the client reads is read (Redis applied the command), then its
    connection fails as if the reply had never come."""
    read = redis.connection.AbstractConnection.read_response
    lost = [0]

    def read_then_fail(self: redis.connection.AbstractConnection, *args: object,
                       **kwargs: object) -> object:
        reply = read(self, *args, **kwargs)  # type: ignore[arg-type]
        if not lost[0]:
            lost[0] = 1
            self.disconnect()
            raise redis.ConnectionError("the reply was lost")
        return reply

    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", read_then_fail)
    try:
        yield lost
    finally:
        monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", read)


def answered_from_records(cluster: RedisClusterProcesses) -> int:
    """Add calls answered from their record: sent again, not decided again (each call
    decided writes its record with one SET; one answered from it does not)."""
    def calls(port: int, command: str) -> int:
        stats = cluster.node_client(port).info("commandstats").get("cmdstat_" + command)
        return int((stats or {}).get("calls", 0))
    return sum(calls(port, "evalsha") - calls(port, "set") for port in cluster.masters())


@pytest.mark.parametrize("partitions", [1, 4])
def test_a_new_request_whose_reply_is_lost_is_not_dropped_on_a_cluster(
        clean_cluster: RedisClusterProcesses, monkeypatch: pytest.MonkeyPatch,
        partitions: int) -> None:
    client = redis_from_url(clean_cluster.startup_url)
    bloom = BloomFilter(client, "lost%d:bloomfilter" % partitions, capacity=1000,
                        error_rate=0.01, partitions=partitions, backend="bitmap")
    dupefilter = RedisBloomDupeFilter(bloom, RequestFingerprinter())
    seen_before = [Request("http://seen%d.test/" % i) for i in range(8)]
    assert dupefilter.requests_seen(seen_before) == [False] * 8  # the scripts loaded
    for port in clean_cluster.masters():
        clean_cluster.node_client(port).config_resetstat()
    if partitions == 1:
        with next_reply_lost(monkeypatch) as lost:
            seen = [dupefilter.request_seen(Request("http://a.test/new-page"))]
        expected = [False]
    else:
        batch = [Request("http://new%d.test/" % i) for i in range(8)] + seen_before[:2]
        with next_reply_lost(monkeypatch) as lost:
            seen = dupefilter.requests_seen(batch)
        expected = [False] * 8 + [True, True]
    assert lost[0] == 1, "no reply was lost: no fault"
    assert answered_from_records(clean_cluster) == 1, "the call was not sent again"
    assert seen == expected
    client.close()
