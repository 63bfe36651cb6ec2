"""One Prometheus exporter for the whole cluster: ``bloomcrawl-exporter``.

Scrapyd runs every job in its own process, so per-process metrics ports
would clash; this exporter reads the shared state instead: each scrape takes
a fresh :mod:`bloomcrawl.ops.inspection` snapshot of Redis (filters, queues,
leases, shared crawl stats) and asks every scrapyd node's ``daemonstatus.json``
(:mod:`bloomcrawl.ops.scrapyd`); :mod:`bloomcrawl.ops.metrics` turns both into
metric families.

It answers every scrape: Redis down is ``bloomcrawl_up 0`` (logged through
:class:`~bloomcrawl.core.connection.RedisErrorPolicy`: each kind of failure
once, the recovery once), and one spider whose keys are malformed is reported
with what could be read, counted in ``bloomcrawl_spider_read_errors`` and
logged once per kind of problem, while every other spider is reported as usual.

On Redis Cluster (``--redis-url redis+cluster://host:port,...``) every master
is read (``SCAN`` on each, ``INFO memory`` and ``DBSIZE`` of each): the
``bloomcrawl_redis_node_*`` gauges are per master, labelled ``host:port``
(the one server of a single Redis alike). A master that does not answer is
``bloomcrawl_redis_node_up{node=...} 0`` and logged once; the spiders need
every master, so ``bloomcrawl_up`` is 0 meanwhile, and the scrape still answers.

Pages per node come from ``<spider>:pages_by_node`` (worker host name ->
pages); a host name that exactly one scrapyd node reports as its
``node_name`` is labelled with that node's ``host:port``, as the other node
metrics are, any other with the host name itself.

Politeness: per spider, the hosts with queued requests and the requests held
back (their host waits for its delay, its concurrency or a back-off); per host,
queued and in-flight requests, delay and concurrency for the spider's
``--top-domains`` busiest hosts only (``BLOOMCRAWL_TOP_DOMAINS``, default 10;
0: none), so the number of ``domain`` labels stays bounded.

Recurring crawls: each schedule's last and next fire and last outcome, and
its last runs (:mod:`bloomcrawl.ops.schedule_metrics`), read with the rest.

Its command line and the environment variables it reads are
:mod:`bloomcrawl.ops.exporter_parser`.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import FrameType

import redis
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.backoff import NoBackoff
from redis.retry import Retry

from bloomcrawl import __version__
from bloomcrawl.core.connection import (
    REDIS_ERRORS,
    RedisErrorPolicy,
    describe_redis,
    is_cluster,
    redis_from_url,
)
from bloomcrawl.core.errors import RedisUnavailableError, SettingError
from bloomcrawl.ops import inspection, metrics, remote_nodes, schedule_metrics, scrapyd
from bloomcrawl.ops.exporter_parser import (
    DEFAULT_BIND,
    DEFAULT_PORT,
    DEFAULT_REDIS_TIMEOUT,
    DEFAULT_TOP_DOMAINS,
    parse_args,
)

__all__ = [
    "DEFAULT_BIND",
    "DEFAULT_PORT",
    "DEFAULT_REDIS_TIMEOUT",
    "DEFAULT_TOP_DOMAINS",
    "ClusterCollector",
    "ScrapydNodes",
    "build_registry",
    "main",
    "parse_args",
    "redis_client",
]

logger = logging.getLogger(__name__)


class _Outages:
    """Log each problem once when it appears and once when it is gone, not on every scrape.

    ``consequence`` says what the exporter reports meanwhile; ``resolved``
    ends the line logged when a problem is gone.
    """

    def __init__(self, consequence: str, resolved: str) -> None:
        self.consequence = consequence
        self.resolved = resolved
        self._open: dict[str, str] = {}
        self._lock = threading.Lock()

    def failed(self, part: str, reason: str) -> None:
        with self._lock:
            previous = self._open.get(part)
            self._open[part] = reason
        if previous is None:
            logger.warning("%s: %s (%s)", part, reason, self.consequence)
        else:
            logger.debug("%s still: %s", part, reason)

    def recovered(self, part: str) -> None:
        with self._lock:
            previous = self._open.pop(part, None)
        if previous is not None:
            logger.info("%s %s", part, self.resolved)

    def now(self, problems: dict[str, str]) -> None:
        """Exactly ``problems`` (key -> the line to log) are open now."""
        with self._lock:
            new = [key for key in problems if key not in self._open]
            gone = [key for key in self._open if key not in problems]
            self._open = dict(problems)
        for key in new:
            logger.warning("%s (%s)", problems[key], self.consequence)
        for key in gone:
            logger.info("%s: %s", key, self.resolved)


@dataclass
class ScrapydNodes:
    """Where the scrapyd nodes are: a fixed list, every address of a DNS name, or both."""

    urls: Sequence[str] = ()
    service: str | None = None
    port: int = scrapyd.DEFAULT_PORT
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = scrapyd.STATUS_TIMEOUT

    @property
    def configured(self) -> bool:
        return bool(self.urls) or bool(self.service)

    def discover(self, outages: _Outages) -> list[str]:
        """The node URLs now; a service name is resolved again on every call (scaling)."""
        found = [scrapyd.normalise_node_url(u) for u in self.urls if u.strip()]
        if self.service:
            part = f"DNS name {self.service!r} of the scrapyd service"
            try:
                found += scrapyd.resolve_service(self.service, self.port)
            except OSError as exc:
                outages.failed(part, f"does not resolve ({exc}); no nodes from it")
            else:
                outages.recovered(part)
        return list(dict.fromkeys(found))

    def nodes(self, urls: Iterable[str]) -> list[scrapyd.Node]:
        """A client for each of ``urls``, with these credentials."""
        return [scrapyd.Node(url, self.username or "", self.password or "") for url in urls]


class ClusterCollector(Collector):
    """Reads Redis and the scrapyd nodes on every scrape; keeps no metric objects between.

    ``top_domains``: how many of each spider's busiest hosts the
    ``bloomcrawl_domain_*`` gauges report.
    """

    def __init__(self, client: redis.Redis, *, scrapyd: ScrapydNodes | None = None,
                 top_domains: int = DEFAULT_TOP_DOMAINS) -> None:
        self.client = client
        self.scrapyd = scrapyd or ScrapydNodes()
        self.top_domains = top_domains
        # Redis failing goes through the package's one policy (each kind logged once,
        # the recovery once); the scrape interval is Prometheus's, so its delay is unused
        self._redis_errors = RedisErrorPolicy(logger, client, "bloomcrawl_up is 0 until it"
                                              " answers")
        self._redis_errors_lock = threading.Lock()
        self._outages = _Outages("reported as down until it answers again", "answers again")
        self._spider_problems = _Outages("its other metrics are still reported",
                                         "readable again")
        self._recurring_problems = _Outages("the other schedules and runs are still"
                                            " reported", "readable again")
        self._masters = _Outages("bloomcrawl_redis_node_up is 0 for it until it answers",
                                 "answers again (or is no master any more)")
        # node URL -> the node_name it last reported, so that a node's pages keep
        # their label while it does not answer
        self._node_names: dict[str, str] = {}
        self._node_names_lock = threading.Lock()

    def describe(self) -> Iterable[Metric]:
        # registering must not scrape Redis
        return ()

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        families: list[Metric] = []
        statuses: list[scrapyd.NodeStatus] = []
        nodes = self._scrapyd_nodes()
        if nodes or self.scrapyd.configured:
            with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes))),
                                    thread_name_prefix="scrapyd-status") as pool:
                futures = [pool.submit(node.status, self.scrapyd.timeout) for node in nodes]
                redis_families, spiders = self._redis_families()
                statuses = [future.result() for future in futures]
            families += redis_families
            families += self._node_families(statuses)
        else:
            redis_families, spiders = self._redis_families()
            families += redis_families
        host_labels = self._host_labels(statuses)
        if spiders is not None:
            families.append(metrics.node_pages_family(spiders, host_labels))
        build_info = GaugeMetricFamily(
            "bloomcrawl_exporter_build_info", "The exporter's version.", labels=["version"])
        build_info.add_metric([__version__], 1)
        families.append(build_info)
        duration = GaugeMetricFamily(
            "bloomcrawl_scrape_duration_seconds",
            "Time this scrape took to read Redis and ask the scrapyd nodes.",
            value=time.perf_counter() - started)
        families.append(duration)
        yield from families

    # -- Redis -----------------------------------------------------------------

    def _redis_families(self) -> tuple[list[Metric], list[inspection.SpiderState] | None]:
        """The Redis metrics, and the spiders they report (``None``: Redis is down)."""
        up = GaugeMetricFamily("bloomcrawl_up", "1 when Redis answered this scrape, else 0.")
        nodes = self._redis_nodes()
        try:
            snap = inspection.snapshot(self.client, nodes, top_domains=self.top_domains)
            recurring = schedule_metrics.read(self.client, snap.redis_time_ms / 1000)
        except REDIS_ERRORS as exc:
            with self._redis_errors_lock:
                self._redis_errors.failed(exc)
            up.add_metric([], 0)
            return [up, *metrics.redis_node_families(nodes)], None
        with self._redis_errors_lock:
            self._redis_errors.ok()
        up.add_metric([], 1)
        unique = self._unique_spiders(snap.spiders)
        self._recurring_problems.now(recurring.problems)
        return [up, *metrics.redis_families(snap), *metrics.spider_families(unique),
                *schedule_metrics.families(recurring)], unique

    def _redis_nodes(self) -> list[inspection.RedisNode]:
        """Each master's figures; a cluster's masters that did not answer logged once each.

        A single Redis down is the policy's one line already (``bloomcrawl_up``).
        """
        try:
            nodes = inspection.redis_nodes(self.client)
        except REDIS_ERRORS as exc:  # not one master's failure: the client's own
            logger.debug("reading the Redis masters failed: %s", exc)
            return []
        if is_cluster(self.client):
            self._masters.now({f"Redis master {node.name}":
                               f"Redis master {node.name} unreachable: {node.error}"
                               for node in nodes if not node.up})
        return nodes

    def _unique_spiders(
        self, spiders: list[inspection.SpiderState]
    ) -> list[inspection.SpiderState]:
        """The first filter of each spider name; each problem logged once, and its end."""
        seen: set[str] = set()
        unique = []
        problems: dict[str, str] = {}
        for state in spiders:
            part = f"spider {state.spider!r} (filter {state.filter_name!r})"
            if state.spider in seen:
                problems[f"{part}: duplicate"] = (
                    f"{part}: another filter already reports this spider; skipped")
                continue
            seen.add(state.spider)
            unique.append(state)
            for issue in state.issues:
                problems.setdefault(f"{part}: {issue.kind}", f"{part}: {issue.message}")
        self._spider_problems.now(problems)
        return unique

    # -- scrapyd ---------------------------------------------------------------

    def _scrapyd_nodes(self) -> list[scrapyd.Node]:
        """The configured or resolved nodes, and those on other hosts listed in Redis
        (``bloomcrawl nodes add``), asked for again on every scrape."""
        nodes = self.scrapyd.nodes(self.scrapyd.discover(self._outages)) \
            if self.scrapyd.configured else []
        try:
            remote = remote_nodes.listed(self.client)
        except REDIS_ERRORS as exc:
            # Redis down: bloomcrawl_up says so, and the Redis policy logs it
            logger.debug("the remote nodes in %s unread: %s", remote_nodes.KEY, exc)
            remote = []
        known = {node.url for node in nodes}
        nodes += [entry.node(self.scrapyd.username or "", self.scrapyd.password or "")
                  for entry in remote if entry.url not in known]
        return nodes

    def _host_labels(self, statuses: list[scrapyd.NodeStatus]) -> dict[str, str]:
        """Worker host name -> node label, from the node names the nodes report.

        A node that does not answer keeps the name it reported last, as long as it
        is still configured or resolved; its pages keep their label meanwhile.
        """
        with self._node_names_lock:
            names = {}
            for status in statuses:
                name = status.node_name if status.up else self._node_names.get(status.url)
                if name:
                    names[status.url] = name
            self._node_names = names
        return scrapyd.node_labels_by_host(
            (scrapyd.node_label(url), name) for url, name in names.items())

    def _node_families(self, statuses: list[scrapyd.NodeStatus]) -> list[Metric]:
        for status in statuses:
            part = f"scrapyd node {status.node}"
            if status.up:
                self._outages.recovered(part)
            else:
                self._outages.failed(part, status.error or "no answer")
        return metrics.node_families(statuses)


def build_registry(collector: Collector) -> CollectorRegistry:
    """A registry holding ``collector`` alone (no global state)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    return registry


def redis_client(url: str, timeout: float = DEFAULT_REDIS_TIMEOUT) -> redis.Redis:
    """A client that fails fast: one immediate reconnect, then the scrape reports Redis down.

    A ``redis+cluster://`` URL gives a ``RedisCluster``, which reads the slot
    map at once (:class:`~bloomcrawl.core.errors.RedisUnavailableError` when no
    node answers); the ops code uses the commands both clients have.
    """
    client: redis.Redis = redis_from_url(
        url,
        socket_connect_timeout=min(timeout, 1.0),
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 1),
        health_check_interval=0,
    )
    return client


# --- command line -----------------------------------------------------------------


def _warm_up(collector: ClusterCollector) -> None:
    for _ in collector.collect():
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser, args = parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        client = redis_client(args.redis_url, args.redis_timeout)
    except SettingError as exc:
        parser.error(str(exc))
    except RedisUnavailableError as exc:  # a cluster client reads the slot map at once
        logger.error("%s", exc)
        return 1
    nodes = ScrapydNodes(
        urls=args.scrapyd_nodes,
        service=args.scrapyd_service,
        port=args.scrapyd_port,
        username=args.scrapyd_username,
        password=args.scrapyd_password,
        timeout=args.scrapyd_timeout,
    )
    collector = ClusterCollector(client, scrapyd=nodes, top_domains=args.top_domains)
    registry = build_registry(collector)
    if args.once:
        sys.stdout.write(generate_latest(registry).decode())
        client.close()
        return 0

    # A filter's slice plan takes a few hundred ms to compute the first time (then it
    # is cached): one collect before listening keeps that out of the first scrape.
    _warm_up(collector)
    try:
        server, thread = start_http_server(args.port, addr=args.bind, registry=registry)
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", args.bind, args.port, exc)
        client.close()
        return 1
    logger.info(
        "serving http://%s:%d/metrics for Redis at %s; scrapyd nodes: %s",
        args.bind, args.port, describe_redis(client),
        ", ".join([*nodes.urls, *([f"every address of {nodes.service}:{nodes.port}"]
                                  if nodes.service else [])]) or "none",
    )
    stop = threading.Event()

    def shut_down(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    stop.wait()
    logger.info("shutting down")
    server.shutdown()
    server.server_close()
    thread.join(5)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
