"""The exporter, bloomcrawl.ops.inspection and the scrapyd client against a real
redis-server and a real scrapyd."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from bloomcrawl.core import keys
from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.frontier import Frontier, Outgoing
from bloomcrawl.core.politeness import (
    Politeness,
    filter_fingerprint,
    host_of,
    host_partition,
    politeness_summary,
    set_policy,
)
from bloomcrawl.ops import exporter, metrics, scrapyd
from bloomcrawl.ops import inspection as inspect
from bloomcrawl.ops.cluster.processes import free_port, start_redis
from bloomcrawl.ops.exporter import ClusterCollector, ScrapydNodes, build_registry
from bloomcrawl.ops.exporter import redis_client as exporter_client
from bloomcrawl.ops.noproxy import OPENER

from kit import CRAWLER
from kit.data import fingerprints, populate_frontier
from kit.redis import RedisServer
from kit.scrapyd import ScrapydNode
from kit.wait import wait_until

FILTER_METRICS = {
    "bloomcrawl_filter_capacity": lambda f: f.capacity,
    "bloomcrawl_filter_items": lambda f: f.items,
    "bloomcrawl_filter_bits": lambda f: f.bits,
    "bloomcrawl_filter_bits_set": lambda f: f.bits_set,
    "bloomcrawl_filter_fill_ratio": lambda f: f.fill_ratio,
    "bloomcrawl_filter_slices": lambda f: f.slices,
    "bloomcrawl_filter_partitions": lambda f: f.partitions,
    "bloomcrawl_filter_hashes": lambda f: f.hashes,
    "bloomcrawl_filter_target_false_positive_ratio": lambda f: f.error_rate,
    "bloomcrawl_filter_estimated_false_positive_ratio": lambda f: f.estimated_false_positive_rate,
    "bloomcrawl_filter_memory_bytes": lambda f: f.memory_bytes,
    "bloomcrawl_filter_checked_total": lambda f: f.checked,
    "bloomcrawl_filter_duplicates_total": lambda f: f.filtered,
}
STATS_SAMPLES = {
    "pages": "bloomcrawl_pages_total",
    "items": "bloomcrawl_items_total",
    "filtered": "bloomcrawl_requests_filtered_total",
    "requeued": "bloomcrawl_leases_requeued_total",
    "errors": "bloomcrawl_errors_total",
    "bad_start_urls": "bloomcrawl_bad_start_urls_total",
    "unserializable": "bloomcrawl_unserializable_requests_total",
    "local": "bloomcrawl_local_requests_total",
}


DOMAIN_METRICS = ("bloomcrawl_domain_queued_requests", "bloomcrawl_domain_in_flight_requests",
                  "bloomcrawl_domain_delay_seconds", "bloomcrawl_domain_concurrency")


def collector(client_url: str, top_domains: int = exporter.DEFAULT_TOP_DOMAINS,
              **nodes: object) -> tuple[ClusterCollector, CollectorRegistry]:
    col = ClusterCollector(exporter_client(client_url),
                           scrapyd=ScrapydNodes(**nodes) if nodes else None,  # type: ignore[arg-type]
                           top_domains=top_domains)
    return col, build_registry(col)


def sample_names(registry: CollectorRegistry) -> set[str]:
    return {s.name for family in registry.collect() for s in family.samples}


def domain_samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, str], float]:
    """(spider, domain) -> value of every sample of one ``bloomcrawl_domain_*`` gauge."""
    return {(s.labels["spider"], s.labels["domain"]): s.value
            for family in registry.collect() for s in family.samples if s.name == name}


def polite_frontier(client: redis.Redis, spider: str, hosts: dict[str, int], *,
                    delay: float = 60.0, concurrency: int = 1,
                    partitions: int = 2) -> Frontier:
    """A spider whose workers keep ``delay`` and ``concurrency`` per host, with
    ``hosts[h]`` requests queued for each host ``h``, as a worker queues them."""
    frontier_keys = keys.FrontierKeys(spider, partitions=partitions)
    bloom = BloomFilter(client, frontier_keys.filter, capacity=10_000, error_rate=0.01,
                        partitions=partitions)
    front = Frontier(client, bloom, frontier_keys, queue_type="priority", lease_timeout=60,
                     worker_id="w1", node="worker-a",
                     politeness=Politeness(delay=delay, concurrency=concurrency))
    front.record_layout()
    outgoing = []
    for host, count in hosts.items():
        for i in range(count):
            url = f"http://{host}/{i}"
            fingerprint = filter_fingerprint(hashlib.sha1(url.encode()).digest(),
                                             host_of(url), bloom.params.partition_by)
            outgoing.append(Outgoing(fingerprint, False, 0.0, json.dumps({"url": url}),
                                     host_of(url)))
    assert front.exchange(outgoing, {}).queued == sum(hosts.values())
    return front


def node_pages(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    """(spider, node) -> value of every ``bloomcrawl_node_pages_total`` sample of a scrape."""
    return {(s.labels["spider"], s.labels["node"]): s.value
            for family in registry.collect() for s in family.samples
            if s.name == metrics.NODE_PAGES_METRIC}


# --- Redis -------------------------------------------------------------------------


def test_every_spider_metric_has_the_value_in_redis(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    front = populate_frontier(redis_client, "site")
    info = front.bloom.info()
    assert (info.items, info.checked, info.filtered, info.capacity) == (300, 400, 100, 10_000)
    _, registry = collector(redis_server.url)
    get = registry.get_sample_value
    labels = {"spider": "site"}

    for name, value in FILTER_METRICS.items():
        assert get(name, labels) == pytest.approx(value(info)), name
    assert get("bloomcrawl_filter_fill_ratio", labels) == pytest.approx(info.bits_set / info.bits)
    assert 0 < get("bloomcrawl_filter_fill_ratio", labels) < 1
    assert get("bloomcrawl_filter_memory_bytes", labels) > 0
    assert get("bloomcrawl_queue_requests", labels) == front.queue_length == 7
    assert get("bloomcrawl_leased_requests", labels) == front.leased == 3
    assert get("bloomcrawl_leases_expired", labels) == front.leases_expired == 1
    assert get("bloomcrawl_start_urls", labels) == 2
    assert get("bloomcrawl_stored_items", labels) == 5
    # a queue of before per-host queues: no host has requests yet (a worker moves them)
    assert get("bloomcrawl_politeness_hosts", labels) == 0
    assert get("bloomcrawl_politeness_held_back_requests", labels) == 0
    assert all(domain_samples(registry, name) == {} for name in DOMAIN_METRICS)
    for field, name in STATS_SAMPLES.items():
        assert get(name, labels) == front.stats[field], name
    # no scrapyd configured: each worker host is its own node label
    assert node_pages(registry) == {("site", host): pages
                                    for host, pages in front.pages_by_node.items()}
    assert get("bloomcrawl_spider_info", {"spider": "site", "filter": "site:bloomfilter",
                                          "queue_type": "priority", "backend": "bitmap"}) == 1
    assert get("bloomcrawl_up") == 1
    assert get("bloomcrawl_spiders") == 1
    used = redis_client.info("memory")["used_memory"]
    assert get("bloomcrawl_redis_memory_used_bytes") == pytest.approx(used, rel=0.2)
    assert get("bloomcrawl_redis_memory_max_bytes") == 0
    started = time.perf_counter()
    duration = get("bloomcrawl_scrape_duration_seconds")
    took = time.perf_counter() - started
    # the scrape reports its own duration: measured, and within the scrape that reported it
    assert 0 < duration <= took
    assert get("bloomcrawl_exporter_build_info", {"version": exporter.__version__}) == 1
    # no scrapyd configured: no node metrics at all
    assert get("bloomcrawl_scrapyd_nodes") is None


def test_values_follow_redis_between_scrapes(redis_server: RedisServer,
                                             redis_client: redis.Redis) -> None:
    front = populate_frontier(redis_client, "site", partitions=2)
    _, registry = collector(redis_server.url)
    labels = {"spider": "site"}
    assert registry.get_sample_value("bloomcrawl_filter_items", labels) == 300
    front.bloom.add_many(fingerprints(50, salt="more") + fingerprints(10, salt="site"))
    redis_client.hincrby(front.frontier.stats, "pages", 8)
    redis_client.zadd(front.frontier.queue_part(1), {"late": 0})
    assert registry.get_sample_value("bloomcrawl_filter_items", labels) == 350
    assert registry.get_sample_value("bloomcrawl_filter_duplicates_total", labels) == 110
    assert registry.get_sample_value("bloomcrawl_pages_total", labels) == 50
    assert registry.get_sample_value("bloomcrawl_queue_requests", labels) == 8


@pytest.mark.parametrize("queue_type", ["fifo", "lifo"])
def test_list_queues_are_counted(redis_server: RedisServer, redis_client: redis.Redis,
                                 queue_type: str) -> None:
    populate_frontier(redis_client, "listy", queue_type=queue_type, partitions=3)
    _, registry = collector(redis_server.url)
    assert registry.get_sample_value("bloomcrawl_queue_requests", {"spider": "listy"}) == 7
    assert registry.get_sample_value("bloomcrawl_leased_requests", {"spider": "listy"}) == 3


def test_several_spiders_and_a_dupefilter_only_filter(redis_server: RedisServer,
                                                      redis_client: redis.Redis) -> None:
    populate_frontier(redis_client, "alpha")
    populate_frontier(redis_client, "beta", partitions=1)
    # the dupefilter alone records no spider or queue in the meta hash
    plain = BloomFilter(redis_client, "gamma:bloomfilter", capacity=1000, error_rate=0.01)
    plain.add_many(fingerprints(20))
    # keys that look like a meta hash but are not a filter's
    redis_client.set("unrelated:meta", "x")
    redis_client.hset("other:meta", "owner", "someone else")
    _, registry = collector(redis_server.url)
    get = registry.get_sample_value
    assert get("bloomcrawl_spiders") == 3
    assert get("bloomcrawl_filter_items", {"spider": "alpha"}) == 300
    assert get("bloomcrawl_filter_partitions", {"spider": "beta"}) == 1
    assert get("bloomcrawl_filter_items", {"spider": "gamma"}) == 20
    assert get("bloomcrawl_pages_total", {"spider": "gamma"}) == 0
    assert get("bloomcrawl_queue_requests", {"spider": "gamma"}) is None
    assert get("bloomcrawl_spider_info", {"spider": "gamma", "filter": "gamma:bloomfilter",
                                          "queue_type": "", "backend": "bitmap"}) == 1
    assert ("gamma", "worker-a") not in node_pages(registry)
    assert node_pages(registry)[("beta", "worker-a")] == 30


def test_inspect_finds_spiders_with_scan_and_only_reads(redis_client: redis.Redis) -> None:
    populate_frontier(redis_client, "site")
    redis_client.config_resetstat()
    spiders = inspect.find_spiders(redis_client)
    assert [s.spider for s in spiders] == ["site"]
    state = spiders[0]
    assert state.filter is not None and state.filter.items == 300
    assert (state.queue_length, state.leased, state.leases_expired) == (7, 3, 1)
    assert state.requeued == 3
    assert state.queue_key == "site:requests" and state.queue_type == "priority"
    assert state.backend == "bitmap"
    assert set(state.stats) == set(keys.STATS_FIELDS)
    assert state.pages_by_node_key == "{site:stats}:pages_by_node"
    assert state.pages_by_node == {"worker-a": 30, "worker-b": 12}
    assert state.problems == []
    assert inspect.spider_state(redis_client, "nope:bloomfilter:meta") is None
    snap = inspect.snapshot(redis_client)
    assert snap.memory.used_bytes > 0 and [s.spider for s in snap.spiders] == ["site"]

    used = {k.removeprefix("cmdstat_").split("|")[0]
            for k in redis_client.info("commandstats")}
    reads = {"scan", "hgetall", "hget", "hmget", "time", "info", "strlen", "llen", "zcard", "hlen",
             "zcount", "config", "get", "scard", "dbsize",
             # the politeness summary's script (frontier_hosts.lua): Redis counts the
             # commands a script calls too, so a write inside it would show here
             "evalsha_ro", "zrevrange", "hscan", "zrangebyscore", "zscore", "hvals"}
    connection = {"client", "hello", "ping", "select", "auth", "script"}
    assert used - reads - connection == set(), "the snapshot must only read"
    assert "keys" not in used and "bitcount" not in used


def test_a_filter_being_created_is_reported_without_filter_figures(
    redis_client: redis.Redis,
) -> None:
    front = populate_frontier(redis_client, "site")
    redis_client.hdel(front.frontier.meta, "ready")
    state = inspect.spider_state(redis_client, front.frontier.meta)
    assert state is not None and state.filter is None
    assert state.queue_length == 7
    assert state.problems == ["filter is being created"]
    assert redis_client.hget(front.frontier.meta, "ready") is None, "the snapshot wrote"


def test_unreadable_parameters_do_not_break_the_scrape(redis_server: RedisServer,
                                                      redis_client: redis.Redis,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    populate_frontier(redis_client, "good")
    redis_client.hset("bad:bloomfilter:meta", mapping={"params": "{not json", "ready": "1"})
    _, registry = collector(redis_server.url)
    with caplog.at_level(logging.WARNING, logger="bloomcrawl.ops.exporter"):
        assert registry.get_sample_value("bloomcrawl_up") == 1
        assert registry.get_sample_value("bloomcrawl_filter_items", {"spider": "good"}) == 300
        assert registry.get_sample_value("bloomcrawl_filter_items", {"spider": "bad"}) is None
        registry.get_sample_value("bloomcrawl_up")
    warnings = [r for r in caplog.records if "'bad'" in r.getMessage()]
    assert len(warnings) == 1, "logged once, not on every scrape"
    assert "unreadable filter parameters" in warnings[0].getMessage()


def test_redis_down_reports_up_0_logs_once_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        populate_frontier(server.client(), "site")
        _, registry = collector(server.url)
        assert registry.get_sample_value("bloomcrawl_up") == 1

        server.stop()
        with caplog.at_level(logging.DEBUG, logger="bloomcrawl.ops.exporter"):
            for _ in range(3):
                started = time.monotonic()
                assert registry.get_sample_value("bloomcrawl_up") == 0
                assert time.monotonic() - started < 2
                assert registry.get_sample_value("bloomcrawl_filter_items",
                                                 {"spider": "site"}) is None
                assert registry.get_sample_value("bloomcrawl_scrape_duration_seconds") > 0
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert f"127.0.0.1:{server.port}" in warnings[0].getMessage()

        caplog.clear()
        server.start()  # same port, empty data
        with caplog.at_level(logging.INFO, logger="bloomcrawl.ops.exporter"):
            assert registry.get_sample_value("bloomcrawl_up") == 1
            assert registry.get_sample_value("bloomcrawl_spiders") == 0
            populate_frontier(server.client(), "site")
            assert registry.get_sample_value("bloomcrawl_filter_items", {"spider": "site"}) == 300
        # the package's one Redis error policy says it, once
        assert [re.sub(r"[0-9.]+ s$", "N s", r.getMessage()) for r in caplog.records] == [
            f"Redis at redis://127.0.0.1:{server.port}/0 is back after N s"]
    finally:
        server.stop()


def test_a_redis_that_wants_a_password_is_said_to_refuse_the_credentials(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis asks for a password the URL lacks: the log says so, as the CLI does, and not
    that Redis is unreachable."""
    server = start_redis(tmp_path / "redis", log=tmp_path / "redis.log", password="s3cret")
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        _, registry = collector(url)
        with caplog.at_level(logging.WARNING, logger="bloomcrawl.ops.exporter"):
            assert registry.get_sample_value("bloomcrawl_up") == 0
        [line] = [r.getMessage() for r in caplog.records]
        assert line.startswith(f"Redis at {url} refused the credentials: "), line
        assert line.endswith(": bloomcrawl_up is 0 until it answers"), line
        assert "unreachable" not in line and "cannot reach" not in line, line
    finally:
        server.stop()


def test_nothing_listening_on_the_redis_port(closed_port_url: str) -> None:
    _, registry = collector(closed_port_url)
    started = time.monotonic()
    assert registry.get_sample_value("bloomcrawl_up") == 0
    assert time.monotonic() - started < 2


def test_pages_by_node_without_the_meta_field_and_past_the_host_bound(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    front = populate_frontier(redis_client, "site")
    # a filter whose meta hash predates the field: the default key is read
    redis_client.hdel(front.frontier.meta, "pages_by_node")
    state = inspect.spider_state(redis_client, front.frontier.meta)
    assert state is not None and state.pages_by_node == front.pages_by_node
    assert state.problems == []

    monkeypatch.setattr(inspect, "MAX_NODES_PER_SPIDER", 3)
    redis_client.hset(front.frontier.pages_by_node,
                      mapping={"worker-c": 1, "worker-d": 50, "worker-e": 2})
    state = inspect.spider_state(redis_client, front.frontier.meta)
    assert state is not None
    assert state.pages_by_node == {"worker-a": 30, "worker-b": 12, "worker-d": 50}
    assert state.problems == ["{site:stats}:pages_by_node names 5 worker hosts; reporting the 3"
                              " with the most pages"]

    redis_client.delete(front.frontier.pages_by_node)
    redis_client.set(front.frontier.pages_by_node, "not a hash")
    state = inspect.spider_state(redis_client, front.frontier.meta)
    assert state is not None and state.pages_by_node == {}
    assert state.problems
    assert "pages by node {site:stats}:pages_by_node unreadable" in state.problems[0]
    assert state.filter is not None and state.queue_length == 7


def test_node_labels_by_host_skip_a_host_name_several_nodes_report() -> None:
    assert scrapyd.node_labels_by_host([
        ("10.0.0.5:6800", "a1b2c3"), ("10.0.0.6:6800", "d4e5f6"),
        ("127.0.0.1:6800", "laptop"), ("127.0.0.1:6801", "laptop"),
    ]) == {"a1b2c3": "10.0.0.5:6800", "d4e5f6": "10.0.0.6:6800"}


# --- politeness -------------------------------------------------------------------------


def test_politeness_metrics_follow_the_hosts_queues_and_leases(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    hosts = {"a.test": 5, "b.test": 3, "c.test": 1, "d.test": 2}
    front = polite_frontier(redis_client, "polite", hosts, delay=60.0, concurrency=1)
    _, registry = collector(redis_server.url)
    get = registry.get_sample_value
    labels = {"spider": "polite"}
    # every host may be fetched now: nothing is held back
    assert get("bloomcrawl_politeness_hosts", labels) == 4
    assert get("bloomcrawl_politeness_held_back_requests", labels) == 0
    assert get("bloomcrawl_queue_requests", labels) == 11  # the hosts' queues are counted
    assert domain_samples(registry, "bloomcrawl_domain_queued_requests") == {
        ("polite", host): count for host, count in hosts.items()}
    assert set(domain_samples(registry, "bloomcrawl_domain_in_flight_requests").values()) == {0}
    assert set(domain_samples(registry, "bloomcrawl_domain_delay_seconds").values()) == {60}
    assert set(domain_samples(registry, "bloomcrawl_domain_concurrency").values()) == {1}

    # the operator's override for one host; then a worker leases all it may
    set_policy(redis_client, front.keys, front.politeness,
               host_partition("b.test", front.partitions), "b.test", delay=30.0, concurrency=3)
    leased: dict[str, int] = {}
    for partition in range(front.partitions):
        for lease in front.lease(partition, 100):
            host = host_of(json.loads(lease.payload)["url"])
            leased[host] = leased.get(host, 0) + 1
    # one request per host: each host waits for its delay (and, but b.test, its one slot)
    assert leased == dict.fromkeys(hosts, 1)
    assert get("bloomcrawl_leased_requests", labels) == 4
    assert get("bloomcrawl_queue_requests", labels) == 7
    assert get("bloomcrawl_politeness_hosts", labels) == 3  # c.test has nothing queued
    assert get("bloomcrawl_politeness_held_back_requests", labels) == 7
    assert domain_samples(registry, "bloomcrawl_domain_queued_requests") == {
        ("polite", host): count - 1 for host, count in hosts.items()}
    assert domain_samples(registry, "bloomcrawl_domain_in_flight_requests") == {
        ("polite", host): 1 for host in hosts}
    assert domain_samples(registry, "bloomcrawl_domain_delay_seconds") == {
        ("polite", "a.test"): 60, ("polite", "b.test"): 30, ("polite", "c.test"): 60,
        ("polite", "d.test"): 60}
    assert get("bloomcrawl_domain_concurrency", {"spider": "polite", "domain": "b.test"}) == 3
    assert get("bloomcrawl_domain_concurrency", {"spider": "polite", "domain": "a.test"}) == 1
    # the exporter reports what the library reads
    summary = politeness_summary(redis_client, front.keys)
    assert (summary.hosts, summary.held_back) == (3, 7)
    assert domain_samples(registry, "bloomcrawl_domain_queued_requests") == {
        ("polite", d.host): d.queued for d in summary.domains}
    assert get("bloomcrawl_spider_read_errors", labels) == 0


def test_domain_metrics_report_only_the_busiest_hosts(redis_server: RedisServer,
                                                      redis_client: redis.Redis) -> None:
    # 25 hosts, host-<n> with n requests: the busiest are host-25, host-24, ...
    hosts = {f"host-{n}.test": n for n in range(1, 26)}
    polite_frontier(redis_client, "many", hosts, partitions=4)
    populate_frontier(redis_client, "site")
    busiest = [f"host-{n}.test" for n in range(25, 15, -1)]
    _, registry = collector(redis_server.url)  # the default: 10
    assert exporter.DEFAULT_TOP_DOMAINS == 10
    for name in DOMAIN_METRICS:
        assert set(domain_samples(registry, name)) == {("many", h) for h in busiest}, name
    assert registry.get_sample_value("bloomcrawl_domain_queued_requests",
                                     {"spider": "many", "domain": "host-25.test"}) == 25
    # the totals count every host, whatever the bound
    assert registry.get_sample_value("bloomcrawl_politeness_hosts", {"spider": "many"}) == 25
    _, three = collector(redis_server.url, top_domains=3)
    for name in DOMAIN_METRICS:
        assert set(domain_samples(three, name)) == {("many", h) for h in busiest[:3]}, name
    _, none = collector(redis_server.url, top_domains=0)
    assert all(domain_samples(none, name) == {} for name in DOMAIN_METRICS)
    assert none.get_sample_value("bloomcrawl_politeness_hosts", {"spider": "many"}) == 25
    assert none.get_sample_value("bloomcrawl_politeness_hosts", {"spider": "site"}) == 0


def test_unreadable_politeness_state_does_not_break_the_scrape(
    redis_server: RedisServer, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    front = polite_frontier(redis_client, "polite", {"a.test": 2})
    populate_frontier(redis_client, "good")
    redis_client.set(front.keys.polite(0, "depth"), "not a sorted set")
    _, registry = collector(redis_server.url)
    get = registry.get_sample_value
    with caplog.at_level(logging.WARNING, logger="bloomcrawl.ops.exporter"):
        assert get("bloomcrawl_up") == 1
        assert get("bloomcrawl_spider_read_errors", {"spider": "polite"}) == 1
        assert get("bloomcrawl_politeness_hosts", {"spider": "polite"}) is None
        assert get("bloomcrawl_politeness_held_back_requests", {"spider": "polite"}) is None
        # the queue's length is not known without the hosts' queues: left out, not 0
        assert get("bloomcrawl_queue_requests", {"spider": "polite"}) is None
        assert get("bloomcrawl_filter_items", {"spider": "polite"}) == 2
        assert get("bloomcrawl_politeness_hosts", {"spider": "good"}) == 0
        assert get("bloomcrawl_queue_requests", {"spider": "good"}) == 7
    warnings = [r.getMessage() for r in caplog.records if "'polite'" in r.getMessage()]
    assert len(warnings) == 1, "logged once, not on every scrape"
    assert "politeness state unreadable" in warnings[0]


# --- RedisBloom backend ---------------------------------------------------------------


@pytest.mark.redismod
def test_filter_metrics_of_a_redisbloom_filter(redismod_server: RedisServer,
                                               redismod_client: redis.Redis) -> None:
    front = populate_frontier(redismod_client, "site", backend="redisbloom")
    assert front.bloom.params.backend == "redisbloom"
    assert redismod_client.exists(keys.redisbloom_key(front.frontier.filter, 0))
    info = front.bloom.info()
    assert (info.items, info.checked, info.filtered, info.capacity) == (300, 400, 100, 10_000)
    redismod_client.config_resetstat()
    _, registry = collector(redismod_server.url)
    get = registry.get_sample_value
    labels = {"spider": "site"}

    for name, value in FILTER_METRICS.items():
        assert get(name, labels) == pytest.approx(value(info)), name
    assert 0 < get("bloomcrawl_filter_fill_ratio", labels) < 1
    assert get("bloomcrawl_filter_memory_bytes", labels) > 0
    assert get("bloomcrawl_filter_partitions", labels) == 4
    assert 0 < get("bloomcrawl_filter_estimated_false_positive_ratio", labels) < get(
        "bloomcrawl_filter_target_false_positive_ratio", labels) == 0.01
    assert get("bloomcrawl_spider_info", {"spider": "site", "filter": "site:bloomfilter",
                                          "queue_type": "priority",
                                          "backend": "redisbloom"}) == 1
    assert get("bloomcrawl_queue_requests", labels) == 7
    assert get("bloomcrawl_pages_total", labels) == front.stats["pages"]
    assert node_pages(registry) == {("site", host): pages
                                    for host, pages in front.pages_by_node.items()}
    used = {k.removeprefix("cmdstat_").split("|")[0] for k in redismod_client.info("commandstats")}
    assert "bf.info" in used
    # the politeness summary is a script (frontier_hosts.lua); Redis counts the commands a
    # script calls as well, so a write inside it would show here
    assert not used & {"bf.add", "bf.madd", "bf.reserve", "hset", "hsetnx", "hincrby", "zadd",
                       "zincrby", "incr", "incrby", "del", "unlink", "lpush", "rpush", "zpopmin",
                       "lpop", "rpop"}, "the scrape must only read"


# --- pages per node and the scrapyd nodes ---------------------------------------------


class FakeScrapyd:
    """A ``daemonstatus.json`` on 127.0.0.1 reporting a chosen ``node_name``."""

    def __init__(self, node_name: str) -> None:
        body = json.dumps({"node_name": node_name, "status": "ok", "pending": 0,
                           "running": 0, "finished": 0}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                logging.getLogger(__name__).debug(format, *args)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.node = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = "http://" + self.node
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.stopped = False

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(5)


@pytest.fixture
def fake_scrapyd() -> Iterator[Callable[[str], FakeScrapyd]]:
    started: list[FakeScrapyd] = []

    def start(node_name: str) -> FakeScrapyd:
        started.append(FakeScrapyd(node_name))
        return started[-1]

    yield start
    for node in started:
        node.stop()


def test_pages_per_node_are_labelled_with_the_scrapyd_node_of_their_host(
    scrapyd_node: ScrapydNode, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    front = populate_frontier(redis_client, "site")
    host = socket.gethostname()
    # scrapyd's node_name defaults to the host name the scheduler records
    assert scrapyd_node.get("daemonstatus.json")["node_name"] == host
    redis_client.hset(front.frontier.pages_by_node, host, 5)
    real = f"127.0.0.1:{scrapyd_node.port}"
    closed = f"127.0.0.1:{free_port()}"
    _, registry = collector(redis_server.url, urls=[scrapyd_node.url, closed],
                            username=scrapyd_node.username, password=scrapyd_node.password)
    assert node_pages(registry) == {("site", real): 5, ("site", "worker-a"): 30,
                                    ("site", "worker-b"): 12}
    redis_client.hincrby(front.frontier.pages_by_node, host, 3)
    assert registry.get_sample_value(metrics.NODE_PAGES_METRIC,
                                     {"spider": "site", "node": real}) == 8
    _, plain = collector(redis_server.url)  # no scrapyd nodes: the host name
    assert plain.get_sample_value(metrics.NODE_PAGES_METRIC,
                                  {"spider": "site", "node": host}) == 8


def test_a_silent_node_keeps_its_label_and_a_shared_host_name_keeps_the_host_name(
    fake_scrapyd: Callable[[str], FakeScrapyd], redis_server: RedisServer,
    redis_client: redis.Redis,
) -> None:
    populate_frontier(redis_client, "site")
    a = fake_scrapyd("worker-a")
    # two scrapyd on one machine report one node_name: their pages cannot be told apart
    b1, b2 = fake_scrapyd("worker-b"), fake_scrapyd("worker-b")
    col, registry = collector(redis_server.url, urls=[a.url, b1.url, b2.url])
    assert node_pages(registry) == {("site", a.node): 30, ("site", "worker-b"): 12}

    a.stop()
    assert registry.get_sample_value("bloomcrawl_scrapyd_node_up", {"node": a.node}) == 0
    assert node_pages(registry) == {("site", a.node): 30, ("site", "worker-b"): 12}

    col.scrapyd.urls = [b1.url]  # a is no longer a node; b1 alone reports worker-b
    assert node_pages(registry) == {("site", "worker-a"): 30, ("site", b1.node): 12}


# --- scrapyd ------------------------------------------------------------------------


def test_scrapyd_nodes_real_and_closed(scrapyd_node: ScrapydNode, redis_server: RedisServer,
                                       redis_client: redis.Redis,
                                       caplog: pytest.LogCaptureFixture) -> None:
    closed = f"127.0.0.1:{free_port()}"
    real = f"127.0.0.1:{scrapyd_node.port}"
    _, registry = collector(redis_server.url, urls=[scrapyd_node.url + "/", closed],
                            username=scrapyd_node.username, password=scrapyd_node.password,
                            timeout=2.0)
    get = registry.get_sample_value
    try:
        scrapyd_node.schedule(seconds=60)
        scrapyd_node.schedule(seconds=60)
        status = scrapyd_node.wait_for(running=1, pending=1)
        with caplog.at_level(logging.WARNING, logger="bloomcrawl.ops.exporter"):
            started = time.monotonic()
            assert get("bloomcrawl_scrapyd_nodes") == 2
            assert time.monotonic() - started < 3
            assert get("bloomcrawl_scrapyd_node_up", {"node": real}) == 1
            assert get("bloomcrawl_scrapyd_node_up", {"node": closed}) == 0
            assert get("bloomcrawl_scrapyd_jobs", {"node": real, "state": "running"}) == 1
            assert get("bloomcrawl_scrapyd_jobs", {"node": real, "state": "pending"}) == 1
            assert get("bloomcrawl_scrapyd_jobs",
                       {"node": real, "state": "finished"}) == status["finished"]
            assert get("bloomcrawl_scrapyd_jobs", {"node": closed, "state": "running"}) is None
            assert get("bloomcrawl_up") == 1  # Redis is fine; only a node is down
        down = [r.getMessage() for r in caplog.records if closed in r.getMessage()]
        assert len(down) == 1, down
    finally:
        scrapyd_node.cancel_all()
        scrapyd_node.wait_for(running=0, pending=0)


def test_scrapyd_wrong_password_is_down(scrapyd_node: ScrapydNode,
                                        redis_server: RedisServer) -> None:
    _, registry = collector(redis_server.url, urls=[scrapyd_node.url],
                            username=scrapyd_node.username, password="wrong")
    label = {"node": f"127.0.0.1:{scrapyd_node.port}"}
    assert registry.get_sample_value("bloomcrawl_scrapyd_node_up", label) == 0
    status = scrapyd.Node(scrapyd_node.url, "x", "y").status()
    assert not status.up and status.error is not None and "401" in status.error


def test_scrapyd_service_name_resolves_to_every_node(
    scrapyd_node: ScrapydNode, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, registry = collector(redis_server.url, service="localhost", port=scrapyd_node.port,
                            username=scrapyd_node.username, password=scrapyd_node.password)
    label = {"node": f"127.0.0.1:{scrapyd_node.port}"}
    assert registry.get_sample_value("bloomcrawl_scrapyd_node_up", label) == 1
    assert registry.get_sample_value("bloomcrawl_scrapyd_nodes") == 1

    def no_such_name(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    assert registry.get_sample_value("bloomcrawl_scrapyd_nodes") == 0
    assert registry.get_sample_value("bloomcrawl_up") == 1


def test_node_labels_are_host_and_port() -> None:
    assert scrapyd.node_label("http://10.0.0.5:6800/") == "10.0.0.5:6800"
    assert scrapyd.node_label("worker:6800") == "worker:6800"
    assert scrapyd.node_label("http://worker") == "worker:80"
    assert scrapyd.normalise_node_url("127.0.0.1:6800/") == "http://127.0.0.1:6800"


# --- naming ---------------------------------------------------------------------------


def test_metric_names_follow_prometheus_conventions(
    scrapyd_node: ScrapydNode, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    populate_frontier(redis_client, "site")
    _, registry = collector(redis_server.url, urls=[scrapyd_node.url],
                            username=scrapyd_node.username, password=scrapyd_node.password)
    families = list(registry.collect())
    assert families
    for family in families:
        assert family.name.startswith("bloomcrawl_"), family.name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), family.name
        if "_ratio" in family.name:
            assert family.name.endswith("_ratio")
            assert all(0 <= s.value <= 1 for s in family.samples)
        assert not re.search(r"_(milliseconds|kilobytes|megabytes|percent)$", family.name)
        for sample in family.samples:
            for value in sample.labels.values():
                assert "://" not in value and "/" not in value, (family.name, value)
                assert not re.fullmatch(r"[0-9a-f]{32}", value), "a job id as a label value"


def test_every_stats_field_is_exported() -> None:
    assert set(metrics.STATS_METRICS) == set(keys.STATS_FIELDS)
    assert metrics.STATS_METRICS.keys() == STATS_SAMPLES.keys()
    for field, (name, _) in metrics.STATS_METRICS.items():
        assert name == STATS_SAMPLES[field]


def test_registering_does_not_touch_redis() -> None:
    """A port that listens and never accepts: a connection made to it waits in the
    backlog, where the test finds it."""
    with socket.create_server(("127.0.0.1", 0), backlog=4) as listener:
        url = "redis://127.0.0.1:%d/0" % listener.getsockname()[1]
        build_registry(ClusterCollector(exporter_client(url, timeout=0.5)))
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()[0].close()


# --- command line ----------------------------------------------------------------------


def exporter_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SCRAPYD_", "BLOOMCRAWL_", "REDIS_"))}
    env["PYTHONPATH"] = str(CRAWLER)
    env.update(extra)
    return env


def test_once_reads_flags_from_the_environment(scrapyd_node: ScrapydNode,
                                               redis_server: RedisServer,
                                               redis_client: redis.Redis) -> None:
    populate_frontier(redis_client, "site")
    env = exporter_env(REDIS_URL=redis_server.url, SCRAPYD_NODES=scrapyd_node.url,
                       SCRAPYD_USERNAME=scrapyd_node.username,
                       SCRAPYD_PASSWORD=scrapyd_node.password)
    out = subprocess.run([sys.executable, "-m", "bloomcrawl.ops.exporter", "--once"], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "bloomcrawl_up 1.0" in out
    assert 'bloomcrawl_filter_items{spider="site"} 300.0' in out
    assert f'bloomcrawl_scrapyd_node_up{{node="127.0.0.1:{scrapyd_node.port}"}} 1.0' in out
    assert scrapyd_node.password not in out


def test_top_domains_from_the_environment(redis_server: RedisServer,
                                          redis_client: redis.Redis) -> None:
    polite_frontier(redis_client, "polite", {"a.test": 3, "b.test": 2, "c.test": 1})
    env = exporter_env(REDIS_URL=redis_server.url, BLOOMCRAWL_TOP_DOMAINS="2")
    out = subprocess.run([sys.executable, "-m", "bloomcrawl.ops.exporter", "--once"], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert 'bloomcrawl_politeness_hosts{spider="polite"} 3.0' in out
    for name in DOMAIN_METRICS:
        assert re.findall(rf'^{name}{{domain="([^"]+)",spider="polite"}}', out, re.M) == [
            "a.test", "b.test"], name
    # the flag over the environment
    out = subprocess.run([sys.executable, "-m", "bloomcrawl.ops.exporter", "--once",
                          "--top-domains", "0"], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert 'bloomcrawl_politeness_hosts{spider="polite"} 3.0' in out
    assert "bloomcrawl_domain_queued_requests{" not in out


def test_bad_settings_exit_with_a_message() -> None:
    for argv, message in [
        (["--redis-url", "http://nope"], "scheme must be redis://"),
        (["--port", "0"], "--port must be in 1..65535"),
        (["--top-domains", "-1"], "--top-domains must be >= 0"),
    ]:
        done = subprocess.run([sys.executable, "-m", "bloomcrawl.ops.exporter", *argv, "--once"],
                              env=exporter_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "bloomcrawl.ops.exporter", "--once"],
                          env=exporter_env(BLOOMCRAWL_EXPORTER_PORT="x"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "BLOOMCRAWL_EXPORTER_PORT='x'" in done.stderr
    done = subprocess.run([sys.executable, "-m", "bloomcrawl.ops.exporter", "--once"],
                          env=exporter_env(BLOOMCRAWL_TOP_DOMAINS="ten"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "BLOOMCRAWL_TOP_DOMAINS='ten'" in done.stderr


def test_entry_point_serves_metrics_and_stops_on_sigterm(redis_server: RedisServer,
                                                          redis_client: redis.Redis) -> None:
    populate_frontier(redis_client, "site")
    port = free_port()
    binary = Path(sys.executable).parent / "bloomcrawl-exporter"
    cmd = [str(binary)] if binary.exists() else [sys.executable, "-m", "bloomcrawl.ops.exporter"]
    proc = subprocess.Popen(
        [*cmd, "--redis-url", redis_server.url],
        env=exporter_env(BLOOMCRAWL_EXPORTER_PORT=str(port),
                         BLOOMCRAWL_EXPORTER_BIND="127.0.0.1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        body = fetch_metrics(f"http://127.0.0.1:{port}/metrics", proc)
        assert 'bloomcrawl_filter_items{spider="site"} 300.0' in body
        assert "bloomcrawl_scrape_duration_seconds" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    assert f"serving http://127.0.0.1:{port}/metrics" in out


def fetch_metrics(url: str, proc: subprocess.Popen[str], timeout: float = 30) -> str:
    """The body of ``url`` once the exporter ``proc`` answers (it must not exit first)."""

    def body() -> str | None:
        try:
            with OPENER.open(url, timeout=5) as response:
                return str(response.read().decode())
        except OSError:
            assert proc.poll() is None, "the exporter exited"
            return None

    return wait_until(body, timeout, interval=0.1, what=f"{url} answering")


def test_collect_is_fresh_on_every_scrape(redis_server: RedisServer,
                                          redis_client: redis.Redis) -> None:
    """Two registries over one Redis agree, and no metric object outlives a scrape."""
    populate_frontier(redis_client, "site")
    col, registry = collector(redis_server.url)
    first = list(col.collect())
    second = list(col.collect())
    assert not {id(f) for f in first} & {id(f) for f in second}
    other = CollectorRegistry()
    other.register(ClusterCollector(redis_client))
    name = "bloomcrawl_filter_items"
    assert other.get_sample_value(name, {"spider": "site"}) == registry.get_sample_value(
        name, {"spider": "site"})
