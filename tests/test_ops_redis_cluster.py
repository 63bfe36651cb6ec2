"""The operations layer on a real Redis Cluster (3 masters, 3 replicas): the exporter,
``bloomcrawl status``, ``filter-info`` and ``clear`` over a ``redis+cluster://`` URL.

The frontier is written by :func:`kit.data.populate_frontier` through a
``RedisCluster`` client (every key of a partition carries its hash tag, so it
works unchanged); every figure the exporter reports is compared with what each
master holds, read through a plain client of that master (no redirections), so
a figure read from one master only, or summed twice, shows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bloomcrawl.core.sizing import BLOCK_BITS
from bloomcrawl.ops import inspection
from bloomcrawl.ops.cluster.processes import free_port
from bloomcrawl.ops.exporter import ClusterCollector, build_registry
from bloomcrawl.ops.exporter import redis_client as exporter_client

from kit import CRAWLER
from kit.cli import run_cli
from kit.cluster import HOST, RedisClusterProcesses
from kit.data import Frontier, populate_frontier
from kit.exporter import Exporter
from kit.redis import RedisServer
from kit.wait import wait_until

T = TypeVar("T")
#: spiders whose meta hashes land on different masters (checked, not assumed)
SPIDERS = ("site", "news", "shop", "blog", "docs", "wiki")
PARTITIONS = 12
FILTER_SAMPLES = ("bloomcrawl_filter_items", "bloomcrawl_filter_bits_set",
                  "bloomcrawl_filter_bits", "bloomcrawl_filter_checked_total",
                  "bloomcrawl_filter_duplicates_total", "bloomcrawl_filter_partitions")


@pytest.fixture
def scrape() -> Iterator[Callable[[str], CollectorRegistry]]:
    """The exporter's collector over a URL, as tests/test_exporter.py builds it; its
    clients are closed at teardown."""
    clients: list[redis.Redis] = []

    def build(url: str) -> CollectorRegistry:
        clients.append(exporter_client(url))
        return build_registry(ClusterCollector(clients[-1]))

    yield build
    for client in clients:
        client.close()


def on_node(cluster: RedisClusterProcesses, port: int, call: Callable[[redis.Redis], T]) -> T:
    """``call`` with a plain client of node ``port`` (no redirections), closed after."""
    client = cluster.node_client(port)
    try:
        return call(client)
    finally:
        client.close()


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Labels -> value of every sample called ``name`` in one scrape."""
    return {tuple(sorted(s.labels.items())): s.value
            for family in registry.collect() for s in family.samples if s.name == name}


def by_node(registry: CollectorRegistry, name: str, **labels: str) -> dict[str, float]:
    """node label -> value of ``name`` (samples with ``labels`` only)."""
    out = {}
    for key, value in samples(registry, name).items():
        found = dict(key)
        if all(found.get(k) == v for k, v in labels.items()):
            out[found["node"]] = value
    return out


def owner_port(cluster: RedisClusterProcesses, key: str) -> int:
    return cluster.owner_of_slot(cluster.slot_of(key))


def node_label(port: int) -> str:
    return f"{HOST}:{port}"


def partition_counters(cluster: RedisClusterProcesses, front: Frontier
                       ) -> list[tuple[int, int, int, int]]:
    """(owner port, items, bits, bits set) of each partition, read from its master alone."""
    out = []
    for p in range(PARTITIONS):
        key = front.frontier.state(p)
        port = owner_port(cluster, key)
        state = {k.decode(): v.decode()
                 for k, v in on_node(cluster, port, lambda c, key=key: c.hgetall(key)).items()}
        slices = int(state.get("slices", 1))
        assert slices == 1 and "plan:0" in state, state  # the figures below assume it
        blocks = int(state["plan:0"].split()[2])
        out.append((port, int(state.get("items:0", 0)), blocks * BLOCK_BITS,
                    int(state.get("bits_set:0", 0))))
    return out


@pytest.fixture
def populated(clean_cluster: RedisClusterProcesses) -> Iterator[dict[str, Frontier]]:
    client = clean_cluster.cluster_client()
    try:
        yield {spider: populate_frontier(client, spider, partitions=PARTITIONS, urls=300)
               for spider in SPIDERS}
    finally:
        client.close()


# --- the exporter --------------------------------------------------------------------------


def test_exporter_reports_every_spider_and_every_master_as_the_masters_hold_them(
    clean_cluster: RedisClusterProcesses, populated: dict[str, Frontier],
    scrape: Callable[[str], CollectorRegistry],
) -> None:
    cluster = clean_cluster
    masters = cluster.masters()
    assert len(masters) == 3
    # the meta hashes lie on several masters: a SCAN of one master would miss spiders
    assert len({owner_port(cluster, f.frontier.meta) for f in populated.values()}) > 1
    registry = scrape(cluster.startup_url)
    get = registry.get_sample_value

    assert get("bloomcrawl_up") == 1
    assert get("bloomcrawl_spiders") == len(SPIDERS)
    client = cluster.cluster_client()
    try:
        for spider, front in populated.items():
            labels = {"spider": spider}
            info = front.bloom.info()
            assert (info.items, info.filtered, info.partitions) == (300, 100, PARTITIONS)
            for name in FILTER_SAMPLES:
                field = {"bloomcrawl_filter_checked_total": "checked",
                         "bloomcrawl_filter_duplicates_total": "filtered"}.get(
                    name, name.removeprefix("bloomcrawl_filter_"))
                assert get(name, labels) == getattr(info, field), (spider, name)
            queued = sum(client.zcard(front.frontier.queue_part(p)) for p in range(PARTITIONS))
            leased = sum(client.hlen(front.frontier.leases(p)) for p in range(PARTITIONS))
            assert get("bloomcrawl_queue_requests", labels) == queued == front.queue_length
            assert get("bloomcrawl_leased_requests", labels) == leased == front.leased
            assert get("bloomcrawl_leases_expired", labels) == front.leases_expired
            assert get("bloomcrawl_start_urls", labels) == client.llen(front.frontier.start_urls)
            assert get("bloomcrawl_stored_items", labels) == client.llen(front.frontier.items)
            assert get("bloomcrawl_pages_total", labels) == int(
                client.hget(front.frontier.stats, "pages"))
            assert get("bloomcrawl_spider_read_errors", labels) == 0
    finally:
        client.close()

    # one series per master, none for a replica, each with that master's own figures
    expected = {node_label(port) for port in masters}
    assert set(by_node(registry, "bloomcrawl_redis_node_up")) == expected
    assert get("bloomcrawl_redis_nodes") == 3
    # a maxmemory of its own on each master: one master's INFO reported as all shows
    for i, port in enumerate(masters):
        on_node(cluster, port, lambda c, i=i: c.config_set("maxmemory", (i + 1) * 2**30))
    try:
        up = by_node(registry, "bloomcrawl_redis_node_up")
        keys = by_node(registry, "bloomcrawl_redis_node_keys")
        used = by_node(registry, "bloomcrawl_redis_node_memory_used_bytes")
        limit = by_node(registry, "bloomcrawl_redis_node_memory_max_bytes")
        total_limit = get("bloomcrawl_redis_memory_max_bytes")
    finally:
        for port in masters:
            on_node(cluster, port, lambda c: c.config_set("maxmemory", 0))
    assert total_limit == 6 * 2**30
    for i, port in enumerate(masters):
        assert limit[node_label(port)] == (i + 1) * 2**30
        assert up[node_label(port)] == 1
        assert keys[node_label(port)] == on_node(cluster, port, lambda c: c.dbsize()) > 0
        memory = on_node(cluster, port, lambda c: c.info("memory"))
        assert used[node_label(port)] == pytest.approx(memory["used_memory"], rel=0.1)
    assert sum(keys.values()) == sum(on_node(cluster, p, lambda c: c.dbsize()) for p in masters)
    assert get("bloomcrawl_redis_memory_used_bytes") == pytest.approx(sum(used.values()),
                                                                      rel=0.1)


def test_filter_figures_per_master_follow_the_slots_of_its_partitions(
    clean_cluster: RedisClusterProcesses, populated: dict[str, Frontier],
    scrape: Callable[[str], CollectorRegistry],
) -> None:
    cluster = clean_cluster
    front = populated["site"]
    parts = partition_counters(cluster, front)
    assert len({port for port, *_ in parts}) > 1, "the partitions should span masters"
    expected: dict[str, list[int]] = {}
    for port, items, bits, bits_set in parts:
        figures = expected.setdefault(node_label(port), [0, 0, 0, 0])
        for i, value in enumerate((1, items, bits, bits_set)):
            figures[i] += value
    registry = scrape(cluster.startup_url)
    labels = {"spider": "site"}
    for i, name in enumerate(("bloomcrawl_filter_node_partitions", "bloomcrawl_filter_node_items",
                              "bloomcrawl_filter_node_bits", "bloomcrawl_filter_node_bits_set")):
        assert by_node(registry, name, **labels) == {
            node: figures[i] for node, figures in expected.items()}, name
    fill = by_node(registry, "bloomcrawl_filter_node_fill_ratio", **labels)
    assert fill == pytest.approx({node: f[3] / f[2] for node, f in expected.items()})
    assert sum(by_node(registry, "bloomcrawl_filter_node_items", **labels).values()) == 300
    fullest = max(bits_set / bits for _, _, bits, bits_set in parts)
    assert registry.get_sample_value("bloomcrawl_filter_max_partition_fill_ratio",
                                     labels) == pytest.approx(fullest)

    # a hot partition shows in the maximum, not in the filter's mean fill
    hot = next(p for p in range(PARTITIONS) if parts[p][3] > 0)
    client = cluster.cluster_client()
    try:
        client.hincrby(front.frontier.state(hot), "bits_set:0", parts[hot][2] // 2)
    finally:
        client.close()
    hot_fill = (parts[hot][3] + parts[hot][2] // 2) / parts[hot][2]
    assert registry.get_sample_value("bloomcrawl_filter_max_partition_fill_ratio",
                                     labels) == pytest.approx(hot_fill)
    assert registry.get_sample_value("bloomcrawl_filter_fill_ratio", labels) < hot_fill / 4


def test_a_single_redis_is_reported_as_one_master(
    redis_server: RedisServer, redis_client: redis.Redis,
    scrape: Callable[[str], CollectorRegistry],
) -> None:
    populate_frontier(redis_client, "site", partitions=4)
    registry = scrape(redis_server.url)
    node = f"127.0.0.1:{redis_server.port}"
    assert by_node(registry, "bloomcrawl_redis_node_up") == {node: 1}
    assert by_node(registry, "bloomcrawl_redis_node_keys") == {node: redis_client.dbsize()}
    assert by_node(registry, "bloomcrawl_filter_node_partitions", spider="site") == {node: 4}
    assert by_node(registry, "bloomcrawl_filter_node_items", spider="site") == {node: 300}
    assert registry.get_sample_value("bloomcrawl_redis_nodes") == 1


def test_inspection_finds_spiders_on_every_master_and_only_reads(
    clean_cluster: RedisClusterProcesses, populated: dict[str, Frontier],
) -> None:
    cluster = clean_cluster
    client = exporter_client(cluster.startup_url)
    try:
        assert inspection.find_meta_keys(client) == sorted(
            f.frontier.meta for f in populated.values())
        for port in cluster.masters():
            on_node(cluster, port, lambda c: c.config_resetstat())
        snap = inspection.snapshot(client)
    finally:
        client.close()
    assert [s.spider for s in snap.spiders] == sorted(SPIDERS)
    assert all(s.problems == [] for s in snap.spiders)
    for port in cluster.masters():
        used = {k.removeprefix("cmdstat_").split("|")[0]
                for k in on_node(cluster, port, lambda c: c.info("commandstats"))}
        assert "scan" in used and "dbsize" in used, (port, used)  # every master was read
        reads = {"scan", "hgetall", "hget", "hmget", "time", "info", "strlen", "llen", "zcard",
                 "hlen", "zcount", "get", "scard", "dbsize", "cluster", "command", "config",
                 # the politeness summary's script (frontier_hosts.lua): Redis counts the
                 # commands a script calls too, so a write inside it would show here
                 "evalsha_ro", "zrevrange", "hscan", "zrangebyscore", "zscore", "hvals"}
        # and what a replica sends its master
        connection = {"client", "hello", "ping", "select", "auth", "readonly", "replconf",
                      "psync", "script"}
        assert used - reads - connection == set(), (port, used)


# --- the command line ----------------------------------------------------------------------


def test_status_and_filter_info_over_a_cluster_url(
    clean_cluster: RedisClusterProcesses, populated: dict[str, Frontier],
    cli_env: dict[str, str],
) -> None:
    url = clean_cluster.startup_url
    done = run_cli("status", "--redis-url", url, env=cli_env).assert_ok()
    lines = done.stdout.splitlines()
    assert any(line.startswith("redis: redis+cluster://") and "3 masters" in line
               for line in lines), lines
    for port in clean_cluster.masters():
        keys = on_node(clean_cluster, port, lambda c: c.dbsize())
        row = next(line.split() for line in lines if line.startswith(node_label(port)))
        assert row[1] == "yes" and row[-1] == str(keys), row
    header = next(line.split() for line in lines if line.startswith("spider "))
    for spider, front in populated.items():
        row = next(line.split() for line in lines if line.split()[:1] == [spider])
        # spider, start urls, start leased, queue, leased, pages, items, filtered, filter items
        assert row[3:9] == [str(front.queue_length), str(front.leased),
                            str(front.stats["pages"]), str(front.stats["items"]),
                            str(front.stats["filtered"]), "300"], (header, row)

    done = run_cli("filter-info", "--spider", "site", "--redis-url", url, env=cli_env).assert_ok()
    info = json.loads(done.stdout)
    assert (info["items"], info["partitions"], info["name"]) == (300, PARTITIONS,
                                                                 "site:bloomfilter")


def test_clear_deletes_a_spider_on_every_master_and_nothing_else(
    clean_cluster: RedisClusterProcesses, populated: dict[str, Frontier],
    cli_env: dict[str, str],
) -> None:
    def keys_on_masters() -> dict[int, set[str]]:
        return {port: on_node(clean_cluster, port,
                              lambda c: {k.decode() for k in c.scan_iter()})
                for port in clean_cluster.masters()}

    before = keys_on_masters()
    of_site = {port: {k for k in names if "site" in k} for port, names in before.items()}
    assert sum(1 for names in of_site.values() if names) == 3, "site's keys on every master"
    done = run_cli("clear", "--spider", "site", "--yes", "--redis-url",
                   clean_cluster.startup_url, env=cli_env).assert_ok()
    total = sum(len(names) for names in of_site.values())
    assert done.stdout.strip() == f"deleted {total} key(s) of site"
    after = keys_on_masters()
    assert after == {port: names - of_site[port] for port, names in before.items()}


def test_a_cluster_url_nobody_answers_is_one_line(cli_env: dict[str, str]) -> None:
    url = f"redis+cluster://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    done = run_cli("status", "--redis-url", url, env=cli_env)
    assert done.code == 1 and "Traceback" not in done.output, done.output
    assert done.stderr.startswith("bloomcrawl status: cannot reach Redis Cluster at "), done.stderr
    exported = subprocess.run([sys.executable, "-m", "bloomcrawl.ops.exporter", "--redis-url",
                               url, "--once"], env={**cli_env, "PYTHONPATH": str(CRAWLER)},
                              text=True, capture_output=True, timeout=60)
    assert exported.returncode == 1, exported.stderr
    assert "cannot reach Redis Cluster" in exported.stderr, exported.stderr
    assert "Traceback" not in exported.stderr


# --- a master killed -------------------------------------------------------------------------


def fetch(exporter: Exporter) -> tuple[int, dict[str, dict[tuple[tuple[str, str], ...], float]]]:
    """Status and name -> labels -> value of one scrape of the exporter over HTTP."""
    scraped = exporter.scrape()
    assert scraped.status is not None, scraped.error
    values: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    if scraped.status != 200:
        return scraped.status, values
    for family in text_string_to_metric_families(scraped.body):
        for s in family.samples:
            values.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return scraped.status, values


def node_up(values: dict[str, dict[tuple[tuple[str, str], ...], float]]) -> dict[str, float]:
    return {dict(labels)["node"]: value
            for labels, value in values.get("bloomcrawl_redis_node_up", {}).items()}


def populate_and_choose_victim(cluster: RedisClusterProcesses) -> tuple[list[int], int]:
    """A populated spider on the cluster; its masters and the one a fault test takes down."""
    client = cluster.cluster_client()
    try:
        populate_frontier(client, "site", partitions=PARTITIONS)
    finally:
        client.close()
    masters = cluster.masters()
    return masters, masters[1]


@pytest.mark.slow
def test_metrics_answer_through_a_dead_master_and_its_failover(
    private_cluster: RedisClusterProcesses, tmp_path: Path,
) -> None:
    cluster = private_cluster
    masters, victim = populate_and_choose_victim(cluster)
    # the replica holds every write before its master dies: the figures survive the failover
    assert on_node(cluster, victim, lambda c: c.wait(1, 5000)) == 1
    with Exporter(cluster.startup_url, tmp_path) as exporter:
        status, values = fetch(exporter)
        assert status == 200 and values["bloomcrawl_up"][()] == 1
        assert node_up(values) == {node_label(p): 1 for p in masters}

        # no failover until the three scrapes are done, however long a loaded machine
        # takes over them: the replica may not take over until told (then it does by
        # itself, as after any master's death)
        replica = cluster.replica_of(victim)
        on_node(cluster, replica, lambda c: c.config_set("cluster-replica-no-failover", "yes"))
        cluster.nodes[victim].kill()
        for _ in range(3):
            status, values = fetch(exporter)
            assert status == 200
            assert values["bloomcrawl_up"][()] == 0
            assert node_up(values) == {node_label(p): 0 if p == victim else 1 for p in masters}
            assert "bloomcrawl_filter_items" not in values or not values["bloomcrawl_filter_items"]
            assert values["bloomcrawl_scrape_duration_seconds"][()] < 5

        on_node(cluster, replica, lambda c: c.config_set("cluster-replica-no-failover", "no"))
        promoted = cluster.wait_failover(victim)

        def up_again() -> dict[str, dict[tuple[tuple[str, str], ...], float]] | None:
            status, values = fetch(exporter)
            assert status == 200
            return values if values["bloomcrawl_up"][()] == 1 else None

        values = wait_until(up_again, 30, interval=0.2, what="bloomcrawl_up back to 1")
        survivors = {node_label(p): 1 for p in masters if p != victim}
        assert node_up(values) == {**survivors, node_label(promoted): 1}
        assert values["bloomcrawl_filter_items"][(("spider", "site"),)] == 300
    log = (tmp_path / "exporter.log").read_text()
    assert log.count(f"Redis master {node_label(victim)} unreachable") == 1, log
    assert "Traceback" not in log


@pytest.mark.slow
def test_a_master_down_with_no_replica_to_take_over(
    private_cluster: RedisClusterProcesses, cli_env: dict[str, str],
    scrape: Callable[[str], CollectorRegistry],
) -> None:
    cluster = private_cluster
    masters, victim = populate_and_choose_victim(cluster)
    cluster.nodes[cluster.replica_of(victim)].kill()
    cluster.nodes[victim].kill()  # and nothing can take over: the cluster stays down

    registry = scrape(cluster.startup_url)
    for _ in range(2):
        assert registry.get_sample_value("bloomcrawl_up") == 0
        assert by_node(registry, "bloomcrawl_redis_node_up") == {
            node_label(p): 0 if p == victim else 1 for p in masters}
        assert by_node(registry, "bloomcrawl_redis_node_keys") == {
            node_label(p): on_node(cluster, p, lambda c: c.dbsize())
            for p in masters if p != victim}
        assert registry.get_sample_value("bloomcrawl_filter_items", {"spider": "site"}) is None

    done = run_cli("status", "--redis-url", cluster.startup_url, env=cli_env)
    assert done.code == 1 and "Traceback" not in done.output, done.output
    rows = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()
            if line.startswith(f"{HOST}:")}
    assert rows == {node_label(p): "NO" if p == victim else "yes" for p in masters}
    assert done.stderr.startswith("bloomcrawl status: cannot reach Redis"), done.stderr
    assert f"{HOST}:{victim}" in done.stderr
